"""cuda and nccl probes: uprobe/uretprobe pairs on stub libcuda.so.1 / libnccl.so.2 in a workload process."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator

import pytest

from probe_helpers import DEFAULT_LAYOUT, OFF, Workload, drain, fallback, make_source
from sits_observe.probes import specs
from sits_observe.probes.source import ProbeSource

N = 10
# stage -> [(symbol, microseconds each call sleeps, calls)]. Each duration sits just above an edge of the
# default layout; the workload runs SCHED_FIFO so a busy machine cannot stretch its sleeps into the next.
PLAN = {
    "launch": [("cuLaunchKernel", 1100, N)],
    "h2d": [("cuMemcpyHtoD_v2", 2600, N // 2), ("cuMemcpyHtoDAsync_v2", 2600, N - N // 2)],
    "d2h": [("cuMemcpyDtoH_v2", 5200, N)],
    "sync": [("cuStreamSynchronize", 10200, N // 2), ("cuCtxSynchronize", 10200, N - N // 2)],
    "alloc": [("cuMemAlloc_v2", 26000, N)],  # the stub's allocation calls cuLaunchKernel: not counted as a launch
}
COMM = "sits-t-gpu"


@pytest.fixture(scope="module")
def source() -> Iterator[ProbeSource]:
    src, _ = make_source({
        "workloads": [{"name": "gpu", "comm": COMM}],
        "probes": {"runq": OFF, "syscalls": OFF, "block_io": OFF, "scan_interval": 3600,
                   "cuda": {"stages": {"launch": {"enabled": True}}}},
    })
    yield src
    src.close()


def _only_bucket(source: ProbeSource, us: int) -> int:
    """Index of the exported bucket holding ``us`` microseconds (the default layout)."""
    return int(DEFAULT_LAYOUT.counts_of([us / 1e6]).argmax())


def test_cuda_counts_every_call_in_its_bucket_and_nccl_reports_missing_library(
        source: ProbeSource, stubs: dict, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "sits_observe.probes")
    with Workload(COMM, [stubs["libcuda.so.1"]], realtime=True) as wl:
        source.rescan()
        drain(source)  # forget anything before the calls
        for calls in PLAN.values():
            for sym, us, n in calls:
                wl.run("call", 0, sym, us, n)
        frame = drain(source)

    for stage, calls in PLAN.items():
        hist = frame.hists[(stage, "gpu")]
        us = calls[0][1]
        k = _only_bucket(source, us)
        # every call counted, none faster than its sleep; a hypervisor stall can stretch one sleep (seen once
        # on this 2-core VM: a 2.6 ms sleep took over 5 ms), never shorten it, so one call may land higher
        assert hist.counts.sum() == N and hist.counts[:k].sum() == 0, (stage, hist.counts.tolist())
        assert hist.counts[k] >= N - 1, (stage, hist.counts.tolist())
        assert hist.sum >= N * us / 1e6
    assert {s for s, _ in frame.hists} == set(PLAN)

    status = {row["probe"]: row for row in source.status()}
    assert status["cuda"]["attached"] and status["cuda"]["problem"] is None
    assert status["nccl"]["attached"] is False
    assert "no workload process maps libnccl.so.2" in status["nccl"]["problem"]
    # said once, when the source started; the rescans since did not repeat it
    assert source.states["nccl"].said == {"not attached: no workload process maps libnccl.so.2 (yet)"}
    assert not [r for r in caplog.records if r.getMessage().startswith("probe nccl:")]
    attached = {s.labels: s.value for s in source.metrics() if s.name == "sits_probe_attached"}
    assert attached[(("probe", "cuda"),)] == 1.0 and attached[(("probe", "nccl"),)] == 0.0


def test_unknown_symbols_are_reported_not_fatal(source: ProbeSource, stubs: dict) -> None:
    status = {row["probe"]: row for row in source.status()}
    (missing,) = status["cuda"]["missing_symbols"].values()
    assert "cuMemAllocAsync" in missing and "cuLaunchKernelEx" in missing
    assert "cuMemAlloc_v2" not in missing
    assert status["cuda"]["files"][0].endswith("/libcuda.so.1")
    errors = {s.labels: s.value for s in source.metrics() if s.name == "sits_probe_errors_total"}
    assert errors[(("probe", "cuda"),)] == 1.0


def test_nccl_attaches_when_a_new_process_maps_it(source: ProbeSource, stubs: dict) -> None:
    with Workload(COMM, [stubs["libcuda.so.1"], stubs["libnccl.so.2"]], realtime=True) as wl:
        source.rescan()
        drain(source)
        wl.run("call", 1, "ncclAllReduce", 52000, N // 2)
        wl.run("call", 1, "ncclAllGather", 52000, N - N // 2)
        wl.run("call", 0, "cuStreamSynchronize", 10200, 3)
        frame = drain(source)
    coll = frame.hists[("collective", "gpu")]
    assert coll.count == N and coll.counts[_only_bucket(source, 52000)] == N
    assert frame.hists[("sync", "gpu")].count == 3
    status = {row["probe"]: row for row in source.status()}
    assert status["nccl"]["attached"] and status["nccl"]["problem"] is None


def test_untracked_process_is_not_timed(source: ProbeSource, stubs: dict) -> None:
    with Workload("sits-t-other", [stubs["libcuda.so.1"]]) as wl:
        source.rescan()
        drain(source)
        wl.run("call", 0, "cuStreamSynchronize", 100, 20)
        frame = drain(source)
    assert frame.hists == {}


def test_thread_hash_fallback_times_calls_too(stubs: dict) -> None:
    """Without task-local storage (kernels before 5.11) calls are paired through an LRU hash."""
    with fallback("cuda"):
        src, _ = make_source({
            "workloads": [{"name": "gpu", "comm": "sits-t-gpu-lru"}],
            "probes": {"runq": OFF, "syscalls": OFF, "block_io": OFF, "nccl": OFF, "scan_interval": 3600},
        })
    try:
        with Workload("sits-t-gpu-lru", [stubs["libcuda.so.1"]], realtime=True) as wl:
            src.rescan()
            wl.run("call", 0, "cuCtxSynchronize", 10200, 4)
            wl.run("call", 0, "cuMemcpyDtoH_v2", 5200, 3)
            frame = drain(src)
    finally:
        src.close()
    assert frame.hists[("sync", "gpu")].count == 4 and frame.hists[("d2h", "gpu")].count == 3
    assert frame.hists[("sync", "gpu")].counts[_only_bucket(src, 10200)] == 4


def test_missing_symbols_are_counted_once_over_workload_restarts(source: ProbeSource, stubs: dict) -> None:
    """Each restart attached the file afresh and counted its missing symbols again (one log line, errors 1..5):
    on a driver without a default symbol the error rate followed the restarts."""
    before = {s.labels: s.value for s in source.metrics() if s.name == "sits_probe_errors_total"}
    for _ in range(3):
        with Workload(COMM, [stubs["libcuda.so.1"]]):
            source.rescan()
        source.rescan()  # exited: detached
    after = {s.labels: s.value for s in source.metrics() if s.name == "sits_probe_errors_total"}
    assert after[(("probe", "cuda"),)] == before[(("probe", "cuda"),)] == 1.0


def test_a_uprobe_variant_the_verifier_refuses_falls_back_at_load(stubs: dict, tmp_path, monkeypatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """bcc loads a uprobe program's functions only at their first attach, so a task-storage variant this kernel's
    verifier refuses for uprobes (a helper it lacks there) loaded fine, then failed every attach for good, its
    verifier log printed at every retry: the fallback without task storage was never tried."""
    bpf = tmp_path / "bpf"
    shutil.copytree(specs.BPF_DIR, bpf)
    calls = bpf / "calls.bpf.c"
    text = calls.read_text()
    slot = "\treturn call_start.task_storage_get("  # inside call_slot, in the task-storage variant only
    assert text.count(slot) == 1
    # stands for a helper the kernel refuses for this program type: the verifier rejects an unknown call
    calls.write_text(text.replace(slot, "\t((long (*)(void))9999)();\n" + slot))
    monkeypatch.setattr(specs, "BPF_DIR", bpf)
    caplog.set_level(logging.INFO, "sits_observe.probes")
    src, _ = make_source({"workloads": [{"name": "gpu", "comm": COMM}],
                          "probes": {"runq": OFF, "syscalls": OFF, "block_io": OFF, "nccl": OFF,
                                     "scan_interval": 3600, "cuda": {"stages": {"launch": {"enabled": True}}}}})
    try:
        state = src.states["cuda"]
        assert state.program is not None
        assert any("probe cuda: loaded (uprobe) without HAVE_TASK_STORAGE" in r.message for r in caplog.records)
        with Workload(COMM, [stubs["libcuda.so.1"]]) as wl:
            src.rescan()
            drain(src)
            wl.run("call", 0, "cuLaunchKernel", 100, 3)
            frame = drain(src)
        assert frame.hists[("launch", "gpu")].counts.sum() == 3  # attached and timing
    finally:
        src.close()
