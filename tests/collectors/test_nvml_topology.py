"""Topology from NVML on the three fixtures (link kind and bandwidth per pair, NUMA per GPU) and `topo`."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pynvml
import pytest
from topologies import FIXTURES, H100_TEXT, fixture

from sits_observe.collectors.commands import format_topology, register
from sits_observe.collectors.nvml_fake import FakeNvml
from sits_observe.collectors.nvml_topology import (
    ancestor_kind,
    format_cpulist,
    nvlink_per_link,
    parse_cpulist,
    pcie_bandwidth,
    topology_from_nvml,
)
from sits_observe.errors import CollectorError
from sits_observe.topology import NUMA_UNKNOWN, Gpu, LinkKind, Topology

GB = 1e9
NVS, NVL = LinkKind.NVSWITCH, LinkKind.NVLINK
PHB, SYS = LinkKind.PCIE_HOST_BRIDGE, LinkKind.NUMA_INTERCONNECT


def _pcie8_pair(a: int, b: int) -> tuple[LinkKind, float]:
    if a // 2 == b // 2:
        return NVL, 12 * 25 * GB
    return (PHB, 40 * GB) if a // 4 == b // 4 else (SYS, 20 * GB)


# fixture -> (pair -> (kind, bandwidth), NUMA node per GPU, CPUs of GPU 0 and GPU 7)
EXPECTED = {
    "nvswitch-8": (lambda a, b: (NVS, 18 * 25 * GB), [0, 0, 0, 0, 1, 1, 1, 1], (range(0, 48), range(48, 96))),
    "pcie-8": (_pcie8_pair, [0, 0, 0, 0, 1, 1, 1, 1], (range(0, 32), range(32, 64))),
    "h100-sxm8": (lambda a, b: (NVS, 450 * GB), [0, 0, 0, 0, 1, 1, 1, 1],
                  ([*range(0, 56), *range(112, 168)], [*range(56, 112), *range(168, 224)])),
}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_pair_and_every_gpu(name: str, tmp_path) -> None:
    fake = FakeNvml(fixture(name))
    topo = topology_from_nvml(fake, sysfs=tmp_path)
    pair, numa, (cpus0, cpus7) = EXPECTED[name]
    assert topo.n == 8
    for a in range(8):
        for b in range(8):
            if a == b:
                assert topo.kinds[a][b] == LinkKind.SELF
                continue
            kind, bw = pair(a, b)
            assert (topo.kinds[a][b], topo.bandwidth[a, b]) == (kind, pytest.approx(bw)), (a, b)
            assert topo.nvlinks[a, b] == (int(round(bw / (25 * GB))) if kind in (NVS, NVL) else 0)
    assert [g.numa_node for g in topo.gpus] == numa
    assert topo.gpus[0].cpu_affinity == tuple(cpus0) and topo.gpus[7].cpu_affinity == tuple(cpus7)
    # the same answer the fixture itself gives: one Topology type for simulator and real boxes
    want = fixture(name)
    assert topo.kinds == want.kinds and np.array_equal(topo.nvlinks, want.nvlinks)
    assert np.allclose(topo.bandwidth, want.bandwidth) and topo.gpus == want.gpus
    assert fake.initialised == 0


def test_h100_fixture_has_real_bus_ids_and_memory() -> None:
    topo = topology_from_nvml(FakeNvml(fixture("h100-sxm8")))
    assert [g.pci_bus_id[9:11] for g in topo.gpus] == ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    assert {g.memory_total_bytes for g in topo.gpus} == {85520809984}


def test_from_nvml_delegates(fake: FakeNvml) -> None:
    assert Topology.from_nvml(fake).kinds == fixture("h100-sxm8").kinds


def test_nvlink_generation_sets_bandwidth() -> None:
    topo = topology_from_nvml(FakeNvml(fixture("nvswitch-8"), nvlink_version=pynvml.NVML_NVLINK_VERSION_5_0))
    assert topo.bandwidth[0, 1] == 18 * 50 * GB
    topo = topology_from_nvml(FakeNvml(fixture("pcie-8"), nvlink_version=pynvml.NVML_NVLINK_VERSION_3_0))
    assert topo.bandwidth[0, 1] == 12 * 25 * GB


def test_slow_pcie_link_caps_pcie_paths() -> None:
    fake = FakeNvml(fixture("pcie-8"))
    fake.gpus[2].pcie_gen, fake.gpus[2].pcie_width = 4, 8
    topo = topology_from_nvml(fake)
    assert topo.bandwidth[2, 0] == pytest.approx(8 * 1.969 * GB) and topo.bandwidth[0, 2] == topo.bandwidth[2, 0]
    assert topo.bandwidth[0, 4] == 20 * GB and topo.bandwidth[2, 3] == 300 * GB  # NVLink unchanged


def test_old_driver_fallbacks_sysfs_and_remote_type(tmp_path) -> None:
    fake = FakeNvml(fixture("pcie-8"))
    for g in fake.gpus:
        for call in ("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetNvLinkRemoteDeviceType"):
            g.fail[call] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        dev = tmp_path / "bus/pci/devices" / g.bus_id[4:].lower()
        dev.mkdir(parents=True)
        dev.joinpath("numa_node").write_text(f"{g.numa_node}\n")
        dev.joinpath("local_cpulist").write_text(format_cpulist(g.cpus) + "\n")
    for g in fake.gpus:  # remote PCI info in NVML's 4-digit-domain lower-case form still matches
        for link in g.links:
            link.remote_bus = link.remote_bus[4:].lower()
    topo = topology_from_nvml(fake, sysfs=tmp_path)
    want = fixture("pcie-8")
    assert topo.kinds == want.kinds and topo.gpus == want.gpus


def test_a_vm_that_will_not_name_link_ends_or_common_ancestors_still_has_a_topology(tmp_path) -> None:
    """Some VMs answer NOT_SUPPORTED there: the topology (and with it the scheduler) was off for the host."""
    fake = FakeNvml(fixture("pcie-8"))
    for g in fake.gpus:
        g.fail["nvmlDeviceGetTopologyCommonAncestor"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.gpus[2].fail["nvmlDeviceGetNvLinkRemotePciInfo"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    topo = topology_from_nvml(fake, sysfs=tmp_path)
    assert topo.kinds[0][4] == LinkKind.NUMA_INTERCONNECT  # no ancestor named: the slowest in-host path
    assert topo.kinds[2][3] == topo.kinds[3][2] == LinkKind.NVLINK  # GPU 3 names the bridge GPU 2 does not
    assert topo.kinds[0][1] == LinkKind.NVLINK


def test_gpus_without_any_numa_answer_are_node_0(tmp_path) -> None:
    fake = FakeNvml(fixture("nvswitch-8"))
    for g in fake.gpus:
        g.numa_node = -1
    assert {g.numa_node for g in topology_from_nvml(fake, sysfs=tmp_path).gpus} == {0}


def test_no_driver_and_failing_driver(fake: FakeNvml) -> None:
    with pytest.raises(CollectorError, match="NVIDIA driver not available"):
        topology_from_nvml(FakeNvml(fixture("pcie-8"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))

    def no_count() -> int:  # the driver fails the host-wide call (one GPU failing leaves the others: below)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetCount = no_count  # type: ignore[method-assign]
    with pytest.raises(CollectorError, match="cannot read the GPU topology: Unknown Error"):
        topology_from_nvml(fake)
    assert fake.initialised == 0


@pytest.mark.parametrize("level,kind", [
    ("NVML_TOPOLOGY_INTERNAL", LinkKind.PCIE_SWITCH), ("NVML_TOPOLOGY_SINGLE", LinkKind.PCIE_SWITCH),
    ("NVML_TOPOLOGY_MULTIPLE", LinkKind.PCIE_SWITCH), ("NVML_TOPOLOGY_HOSTBRIDGE", LinkKind.PCIE_HOST_BRIDGE),
    ("NVML_TOPOLOGY_NODE", LinkKind.PCIE_HOST_BRIDGE), ("NVML_TOPOLOGY_SYSTEM", LinkKind.NUMA_INTERCONNECT),
])
def test_ancestor_levels(level: str, kind: LinkKind) -> None:
    assert ancestor_kind(pynvml, getattr(pynvml, level)) == kind


@pytest.mark.parametrize("version,rate", [
    ("NVML_NVLINK_VERSION_1_0", 20), ("NVML_NVLINK_VERSION_2_0", 25), ("NVML_NVLINK_VERSION_3_0", 25),
    ("NVML_NVLINK_VERSION_4_0", 25), ("NVML_NVLINK_VERSION_5_0", 50), ("NVML_NVLINK_VERSION_INVALID", 25),
])
def test_nvlink_rates(version: str, rate: float) -> None:
    assert nvlink_per_link(pynvml, getattr(pynvml, version)) == rate * GB


@pytest.mark.parametrize("gen,width,gbs", [(3, 16, 15.76), (4, 16, 31.504), (5, 16, 63.008), (4, 8, 15.752)])
def test_pcie_rates(gen: int, width: int, gbs: float) -> None:
    assert pcie_bandwidth(gen, width) == pytest.approx(gbs * GB)


@pytest.mark.parametrize("text,cpus", [("0-3,8", (0, 1, 2, 3, 8)), ("5", (5,)), ("", ()),
                                       ("0-55,112-167", (*range(56), *range(112, 168)))])
def test_cpulist_round_trip(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus and format_cpulist(cpus) == text


def _topo_cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(argv)


def _matrix(text: str) -> dict[str, list[str]]:
    """GPU row -> cells (GPU columns, CPU affinity, NUMA affinity) of a topo -m style text."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("GPU") and "\t" in line and not rows.get(line.split("\t")[0]):
            cells = [c.strip() for c in line.split("\t")]
            rows[cells[0]] = cells[1:9] + [c for c in cells[9:] if c and c[0].isdigit()][-2:]
    return rows


def test_topo_prints_what_nvidia_smi_prints_for_the_h100_box(fake: FakeNvml) -> None:
    ours = format_topology(topology_from_nvml(fake))
    want = _matrix(H100_TEXT.read_text())
    assert _matrix(ours) == want
    assert "GPU0\t-\t450\t450" in ours and "NV#" in ours


def test_topo_command_preset_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = _topo_cli(["topo", "--preset", "pcie-8"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    rows = _matrix(out)
    assert rows["GPU0"][:8] == ["X", "NV12", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]
    assert rows["GPU5"][8:] == ["32-63", "1"]
    args = _topo_cli(["topo", "--preset", "nvswitch-8", "--json"])
    args.func(args)
    back = Topology.from_dict(json.loads(capsys.readouterr().out))
    assert back.kinds == fixture("nvswitch-8").kinds


def test_topo_command_without_a_driver_fails_with_one_line() -> None:
    args = _topo_cli(["topo"])
    with pytest.raises(CollectorError) as err:
        args.func(args)  # the real pynvml: no driver on this machine
    assert "\n" not in str(err.value)
    # the daemon's advice (set gpu.backend) is not this command's, which reads no config
    assert "gpu.backend" not in str(err.value) and "`sits-observe topo --preset nvswitch-8`" in str(err.value)


@pytest.mark.parametrize("call,code", [("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST),
                                       ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_INSUFFICIENT_POWER),
                                       ("nvmlDeviceGetPciInfo", pynvml.NVML_ERROR_IRQ_ISSUE)])
def test_a_gpu_that_cannot_be_opened_keeps_its_place_without_links_or_memory(fake: FakeNvml, call: str,
                                                                            code: int) -> None:
    """One dead GPU used to leave the host without a topology, so without a scheduler and a topology view."""
    if call == "nvmlDeviceGetHandleByIndex":
        fake.gpus[5].lost = True
    else:
        fake.gpus[5].fail[call] = code
    whole = topology_from_nvml(FakeNvml(fixture("h100-sxm8")))
    topo = topology_from_nvml(fake)
    assert topo.n == 8 and [g.index for g in topo.gpus] == list(range(8))
    dead = topo.gpus[5]
    assert (dead.uuid, dead.pci_bus_id, dead.memory_total_bytes) == ("", "", 0)
    assert topo.gpus[:5] == whole.gpus[:5] and topo.gpus[6:] == whole.gpus[6:]
    # its NUMA node is unknown, not node 0: null in the API, N/A in `topo`, in no node's GPU list
    assert dead.numa_node == NUMA_UNKNOWN and topo.to_dict()["gpus"][5]["numa_node"] is None
    assert Topology.from_dict(topo.to_dict()).gpus[5].numa_node == NUMA_UNKNOWN
    assert all(5 not in gs for gs in topo.numa_nodes().values())
    assert format_topology(topo).splitlines()[6].endswith("\tN/A\tN/A")
    others = [i for i in range(8) if i != 5]
    assert all(topo.kinds[5][b] == topo.kinds[b][5] == LinkKind.NUMA_INTERCONNECT for b in others)
    assert topo.nvlinks[5].sum() == topo.nvlinks[:, 5].sum() == 0
    assert all(topo.kinds[a][b] == whole.kinds[a][b] for a in others for b in others)  # the rest as they are
    assert fake.initialised == 0


@pytest.mark.parametrize("name,call,code", [
    ("h100-sxm8", "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST),
    ("h100-sxm8", "nvmlDeviceGetNumaNodeId", pynvml.NVML_ERROR_UNKNOWN),
    ("h100-sxm8", "nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_GPU_IS_LOST),
    ("h100-sxm8", "nvmlDeviceGetNvLinkRemotePciInfo", pynvml.NVML_ERROR_UNKNOWN),
    ("pcie-8", "nvmlDeviceGetMaxPcieLinkGeneration", pynvml.NVML_ERROR_UNKNOWN),
    ("pcie-8", "nvmlDeviceGetTopologyCommonAncestor", pynvml.NVML_ERROR_GPU_IS_LOST)])
def test_a_gpu_failing_after_it_opened_leaves_the_rest_of_the_topology(name: str, call: str, code: int) -> None:
    """A GPU off the bus can still give its cached identity and then fail every call: one such call after the
    GPU opened made the whole host's topology, the scheduler with it, unavailable."""
    whole = topology_from_nvml(FakeNvml(fixture(name)))
    fake = FakeNvml(fixture(name))
    fake.gpus[5].fail[call] = code
    topo = topology_from_nvml(fake)
    others = [i for i in range(8) if i != 5]
    assert all(topo.kinds[a][b] == whole.kinds[a][b] and topo.bandwidth[a, b] == whole.bandwidth[a, b]
               for a in others for b in others)
    assert [topo.gpus[i] for i in others] == [whole.gpus[i] for i in others]
    assert fake.initialised == 0


def test_the_scheduler_runs_on_a_host_with_a_dead_gpu_and_places_around_it(fake: FakeNvml, tmp_path) -> None:
    from sits_observe.collectors.nvml import NvmlSource
    from sits_observe.frame import Frame
    from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
    from sits_observe.scheduler.engine import Scheduler

    fake.gpus[5].lost = True
    topo = topology_from_nvml(fake)
    src = NvmlSource(fake, clock=lambda: 1000.0)
    sched = Scheduler(SchedulerConfig(shards=[{"id": "big", "gpus": 7, "memory_per_gpu": 30 * 2**30}]), OtlpConfig(),
                      topo, tmp_path, clock=lambda: 1000.0)
    try:
        frame = Frame(ts=1000.0, interval=1.0)
        src.collect(frame)
        assert not frame.gpu.healthy[5]
        sched.on_tick(frame)
        (big,) = sched.shards_state()["shards"]
        assert (big["state"], big["gpus"]) == ("launched", [0, 1, 2, 3, 4, 6, 7])
    finally:
        sched.close()
        src.close()


def test_links_to_an_unopened_gpu_on_an_old_driver_are_not_taken_for_switch_links() -> None:
    """Without the remote-type call a link ending at no known GPU counts as a switch's; with a GPU unopened its
    address is unknown, and two live GPUs bridged to dead ones became an 'NVSwitch' pair."""
    gpus = [Gpu(i, f"GPU-{i}", "NVIDIA A100-PCIE-40GB", f"00000000:{0x17 + i:02X}:00.0", i // 2, (), 40 << 30)
            for i in range(4)]
    fake = FakeNvml(Topology.build("a100-bridged", gpus, lambda a, b: (
        (LinkKind.NVLINK, 4) if a.index // 2 == b.index // 2 else (LinkKind.PCIE_HOST_BRIDGE, 0))), switches=0)
    for g in fake.gpus:
        g.fail["nvmlDeviceGetNvLinkRemoteDeviceType"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert topology_from_nvml(fake).kinds[0][1] == LinkKind.NVLINK
    fake.gpus[1].lost = fake.gpus[3].lost = True
    topo = topology_from_nvml(fake)
    assert topo.kinds[0][2] == LinkKind.PCIE_HOST_BRIDGE and topo.nvlinks[0, 2] == 0


def test_a_gpu_the_topology_could_not_open_but_the_source_reads_triggers_nothing(fake: FakeNvml) -> None:
    """The topology and the NVML source open the GPUs each on their own: memory used over a total of 0 was inf,
    a memory-saturation trigger naming that GPU."""
    from sits_observe.collectors.nvml import NvmlSource
    from sits_observe.frame import Frame
    from sits_observe.scheduler.observed import Observed

    fake.gpus[5].fail["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_IRQ_ISSUE
    topo = topology_from_nvml(fake)
    del fake.gpus[5].fail["nvmlDeviceGetUUID"]  # answers again when the source opens it
    src = NvmlSource(fake, clock=lambda: 1000.0)
    frame = Frame(ts=1000.0, interval=1.0)
    src.collect(frame)
    src.close()
    observed = Observed(topo, 1000.0)
    _util, memory = observed.windows(observed.read(frame))
    assert np.isnan(memory[5]) and np.isfinite(np.delete(memory, 5)).all()


def test_on_an_old_driver_with_a_gpu_unopened_sysfs_tells_switches_from_gpus(fake: FakeNvml, tmp_path) -> None:
    """Without the remote-type call and with GPU 7 lost, every NVSwitch link's far end was 'maybe a dead GPU':
    the whole HGX box read as PCIe until a restart.  The PCI class in sysfs says bridge (a switch) or not."""
    for g in fake.gpus:
        g.fail["nvmlDeviceGetNvLinkRemoteDeviceType"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    fake.gpus[7].lost = True
    assert topology_from_nvml(fake, sysfs=tmp_path).kinds[0][1] != LinkKind.NVSWITCH  # sysfs says nothing
    for k in range(4):  # the fake's switches
        dev = tmp_path / f"bus/pci/devices/0000:{0xC0 + k:02x}:00.0"
        dev.mkdir(parents=True)
        (dev / "class").write_text("0x068000\n")
    topo = topology_from_nvml(fake, sysfs=tmp_path)
    assert topo.kinds[0][1] == LinkKind.NVSWITCH and topo.bandwidth[0, 1] == 18 * 25e9
    assert topo.kinds[0][7] == LinkKind.NUMA_INTERCONNECT  # the lost GPU


def test_topo_and_doctor_give_up_on_a_driver_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sits-observe topo` and `doctor` hung with a driver hung by a GPU off the bus."""
    import threading

    from in_thread import in_thread

    from sits_observe import doctor
    from sits_observe.collectors import nvml, nvml_driver

    release = threading.Event()
    monkeypatch.setattr(nvml_driver, "START_TIMEOUT", 0.2)
    monkeypatch.setattr(Topology, "from_nvml", staticmethod(lambda: release.wait(30)))
    monkeypatch.setattr(nvml, "nvml_status", lambda: (release.wait(30), "")[::-1])
    try:
        args = _topo_cli(["topo"])
        raised, took = in_thread(lambda: args.func(args), 5)
        assert isinstance(raised, CollectorError) and took < 2.0
        assert str(raised).startswith("nvml topology: no answer from the NVIDIA driver within 0.2 s at start")
        check, took = in_thread(doctor._nvml, 5)
        assert took < 2.0 and not check.ok and check.detail.startswith("nvml: no answer from the NVIDIA driver")
    finally:
        release.set()


def test_a_gpu_not_opened_at_start_has_no_link_series(fake: FakeNvml, tmp_path) -> None:
    """Its placeholder paths (the slowest kind, nominal bandwidth) were exported as if measured."""
    from sits_observe.clock import WallClock
    from sits_observe.config import parse
    from sits_observe.daemon import Daemon

    fake.gpus[5].lost = True
    daemon = Daemon(config=parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}}, env={}),
                    clock=WallClock(1.0), topology=topology_from_nvml(fake))
    links = [dict(s.labels) for s in daemon.metrics() if s.name == "sits_gpu_link_bandwidth_bytes_per_second"]
    assert len(links) == 7 * 6 and not [lab for lab in links if "5" in (lab["gpu"], lab["peer_gpu"])]
