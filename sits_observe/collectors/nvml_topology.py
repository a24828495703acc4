"""The real GPU link matrix from NVML (behind :meth:`sits_observe.topology.Topology.from_nvml`).

For every GPU pair: NVLink when some of one GPU's active links end at the other GPU's PCI address (link
count from the links, generation from ``nvmlDeviceGetNvLinkVersion``); NVSwitch when both GPUs have links
ending at a switch; otherwise the PCIe common ancestor (``nvmlDeviceGetTopologyCommonAncestor``).
Bandwidth: NVLink links x per-link rate of the generation; PCIe paths the slower GPU's PCIe link (maximum
generation x width), capped at the nominal figure of the path.  NUMA node and CPU affinity per GPU come
from NVML, or from sysfs where the driver does not answer.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import CollectorError
from ..topology import DEFAULT_BANDWIDTH, GB, NUMA_UNKNOWN, NVLINK4_PER_LINK, Gpu, LinkKind, Topology
from .nvml_driver import is_unsupported, load_nvml

__all__ = ["topology_from_nvml", "ancestor_kind", "nvlink_per_link", "pcie_bandwidth", "parse_cpulist",
           "format_cpulist"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# pynvml NVML_NVLINK_VERSION_* name -> one-direction bytes/s per link
_NVLINK_RATE = {
    "NVML_NVLINK_VERSION_1_0": 20 * GB,  # P100
    "NVML_NVLINK_VERSION_2_0": 25 * GB,  # V100
    "NVML_NVLINK_VERSION_2_2": 25 * GB,
    "NVML_NVLINK_VERSION_3_0": 25 * GB,  # A100
    "NVML_NVLINK_VERSION_3_1": 25 * GB,
    "NVML_NVLINK_VERSION_4_0": 25 * GB,  # H100, H200
    "NVML_NVLINK_VERSION_5_0": 50 * GB,  # B200
}
# PCIe one-direction bytes/s per lane after line encoding, by generation
_PCIE_LANE = {1: 0.25 * GB, 2: 0.5 * GB, 3: 0.985 * GB, 4: 1.969 * GB, 5: 3.938 * GB, 6: 7.563 * GB}
_ANCESTOR = (
    ("NVML_TOPOLOGY_INTERNAL", LinkKind.PCIE_SWITCH),  # same board
    ("NVML_TOPOLOGY_SINGLE", LinkKind.PCIE_SWITCH),
    ("NVML_TOPOLOGY_MULTIPLE", LinkKind.PCIE_SWITCH),
    ("NVML_TOPOLOGY_HOSTBRIDGE", LinkKind.PCIE_HOST_BRIDGE),
    ("NVML_TOPOLOGY_NODE", LinkKind.PCIE_HOST_BRIDGE),  # host bridges of one NUMA node
    ("NVML_TOPOLOGY_SYSTEM", LinkKind.NUMA_INTERCONNECT),
)


def ancestor_kind(nvml: Any, level: int) -> LinkKind:
    """Link kind of an ``nvmlDeviceGetTopologyCommonAncestor`` level (unknown levels: the slowest)."""
    for name, kind in _ANCESTOR:
        if getattr(nvml, name) == level:
            return kind
    return LinkKind.NUMA_INTERCONNECT


def nvlink_per_link(nvml: Any, version: int) -> float:
    """One-direction bytes/s of one link of an NVML NVLink version (unknown versions: NVLink 4)."""
    for name, rate in _NVLINK_RATE.items():
        if getattr(nvml, name, None) == version:
            return rate
    return NVLINK4_PER_LINK


def pcie_bandwidth(generation: int, width: int) -> float:
    """One-direction bytes/s of a PCIe link (unknown generations: unlimited, the path's nominal figure applies)."""
    return _PCIE_LANE.get(generation, np.inf) * width


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> ``(0, 1, 2, 3, 8)`` (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
    return tuple(cpus)


def format_cpulist(cpus: tuple[int, ...]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and int(out[-1].rpartition("-")[2]) == c - 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def _bus(bus_id: str) -> str:
    """Canonical PCI address ``DDDDDDDD:BB:DD.F``: NVML gives 8- or 4-digit domains, either case."""
    parts = bus_id.strip().upper().split(":")
    domain = parts[0] if len(parts) == 3 else "0"
    return f"{int(domain, 16):08X}:{parts[-2]}:{parts[-1]}"


def _sysfs_dir(sysfs: Path, bus_id: str) -> Path:
    return sysfs / "bus/pci/devices" / _bus(bus_id)[4:].lower()


def _try(nv: Any, fn: Any, *args: Any) -> Any:
    """Call NVML; None when the driver or GPU does not offer it."""
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        if is_unsupported(nv, exc):
            return None
        raise


def _open(nv: Any, index: int, sysfs: Path) -> tuple[Gpu, Any]:
    """The GPU and its handle; a GPU that cannot be opened or read (lost, unpowered, IRQ trouble: the NVML source
    reports it unhealthy every sample; a GPU off the bus may still give its cached identity, then fail) keeps its
    index with no identity, memory or links, and None for its handle."""
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        ids = nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetName(h), nv.nvmlDeviceGetPciInfo(h).busId
        return _gpu(nv, index, h, ids, sysfs), h
    except nv.NVMLError as exc:
        log.warning("nvml: GPU %d cannot be opened (%s); in the topology without links or memory, so nothing is "
                    "placed on it until a restart", index, exc)
        return Gpu(index, "", "", "", NUMA_UNKNOWN, (), 0), None


def _gpu(nv: Any, index: int, h: Any, ids: tuple[str, str, str], sysfs: Path) -> Gpu:
    uuid, model, bus = ids
    numa = _try(nv, nv.nvmlDeviceGetNumaNodeId, h)
    if numa is None or numa < 0:
        path = _sysfs_dir(sysfs, bus) / "numa_node"
        numa = int(path.read_text()) if path.exists() else 0
    words = (max(1024, _cpu_count(sysfs)) + 63) // 64
    mask = _try(nv, nv.nvmlDeviceGetCpuAffinity, h, words)
    if mask is not None:
        cpus = tuple(64 * w + b for w, m in enumerate(mask) for b in range(64) if int(m) >> b & 1)
    else:
        path = _sysfs_dir(sysfs, bus) / "local_cpulist"
        cpus = parse_cpulist(path.read_text()) if path.exists() else ()
    return Gpu(index, uuid, model, bus, max(numa, 0), cpus, int(nv.nvmlDeviceGetMemoryInfo(h).total))


def _cpu_count(sysfs: Path) -> int:
    path = sysfs / "devices/system/cpu/possible"
    cpus = parse_cpulist(path.read_text()) if path.exists() else ()
    return max(cpus, default=0) + 1


def _switch(sysfs: Path, bus_id: str) -> bool:
    """Whether sysfs says the PCI device at ``bus_id`` is a bridge (an NVSwitch is one; a GPU is a display or 3D
    controller); False when it does not say."""
    path = _sysfs_dir(sysfs, bus_id) / "class"
    return path.exists() and path.read_text().strip().lower().startswith("0x06")


def _nvlinks(nv: Any, h: Any, bus_index: dict[str, int], every_gpu: bool, sysfs: Path
             ) -> tuple[Counter[int], int, float]:
    """(links per peer GPU, links to NVSwitches, per-link rate) of one GPU's active NVLinks (none unopened);
    ``every_gpu``: every GPU was opened, so an address that is no GPU's is a switch's (else sysfs is asked)."""
    peers: Counter[int] = Counter()
    switch, rate = 0, np.inf
    for link in range(nv.NVML_NVLINK_MAX_LINKS if h is not None else 0):
        if _try(nv, nv.nvmlDeviceGetNvLinkState, h, link) != nv.NVML_FEATURE_ENABLED:
            continue
        info = _try(nv, nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        if info is None:  # a link whose far end the driver will not name (some VMs): not counted
            continue
        remote = _bus(info.busId)
        kind = _try(nv, nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        if kind is None:  # older drivers: a peer GPU's address, else a switch (or an unopened GPU: not counted)
            if remote not in bus_index and not every_gpu and not _switch(sysfs, remote):
                continue
            kind = nv.NVML_NVLINK_DEVICE_TYPE_GPU if remote in bus_index else nv.NVML_NVLINK_DEVICE_TYPE_SWITCH
        if kind == nv.NVML_NVLINK_DEVICE_TYPE_GPU and remote in bus_index:
            peers[bus_index[remote]] += 1
        elif kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switch += 1
        else:
            continue  # a CPU (NPU) link: not between GPUs
        version = _try(nv, nv.nvmlDeviceGetNvLinkVersion, h, link)
        rate = min(rate, NVLINK4_PER_LINK if version is None else nvlink_per_link(nv, version))
    return peers, switch, rate


def _pcie(nv: Any, h: Any) -> float:
    gen = _try(nv, nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
    width = _try(nv, nv.nvmlDeviceGetMaxPcieLinkWidth, h)
    return np.inf if gen is None or width is None else pcie_bandwidth(gen, width)


def _per_gpu(nv: Any, index: int, what: str, read: Callable[[], T], default: T) -> T:
    """``read()``, or ``default`` (logged) when NVML fails on it: one GPU going bad while the topology is read (lost
    after it was opened, an unknown error on one of its calls) leaves that part out, not the whole host's topology."""
    try:
        return read()
    except nv.NVMLError as exc:
        log.warning("nvml: GPU %d: %s unreadable (%s); left out of the topology", index, what, exc)
        return default


def _read(nv: Any, sysfs: Path, name: str) -> Topology:
    opened = [_open(nv, i, sysfs) for i in range(nv.nvmlDeviceGetCount())]
    gpus, handles = [g for g, _ in opened], [h for _, h in opened]
    bus_index = {_bus(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}
    every_gpu, no_links = None not in handles, (Counter[int](), 0, np.inf)
    links = [_per_gpu(nv, i, "NVLinks", partial(_nvlinks, nv, h, bus_index, every_gpu, sysfs), no_links)
             for i, h in enumerate(handles)]
    pcie = [_per_gpu(nv, i, "PCIe link", partial(_pcie, nv, h), np.inf) if h is not None else np.inf
            for i, h in enumerate(handles)]
    n = len(gpus)
    kinds = [[LinkKind.SELF] * n for _ in range(n)]
    bw, nvl = np.zeros((n, n)), np.zeros((n, n), dtype=np.int64)
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            rate = min(links[a][2], links[b][2])
            if pair := max(links[a][0][b], links[b][0][a]):  # either end naming the other is enough
                kinds[a][b], nvl[a, b] = LinkKind.NVLINK, pair
                bw[a, b] = nvl[a, b] * rate
            elif links[a][1] and links[b][1]:
                kinds[a][b], nvl[a, b] = LinkKind.NVSWITCH, min(links[a][1], links[b][1])
                bw[a, b] = nvl[a, b] * rate
            else:  # an unopened GPU: the slowest path, as below
                level = (None if handles[a] is None or handles[b] is None else _per_gpu(
                    nv, a, f"PCIe path to GPU {b}",
                    partial(_try, nv, nv.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b]), None))
                # not offered (some VMs): the slowest path between two GPUs of one host, not no topology at all
                kind = LinkKind.NUMA_INTERCONNECT if level is None else ancestor_kind(nv, level)
                kinds[a][b], bw[a, b] = kind, min(DEFAULT_BANDWIDTH[kind], pcie[a], pcie[b])
    return Topology(name, tuple(gpus), tuple(tuple(r) for r in kinds), bw, nvl)


def topology_from_nvml(nvml: Any = None, *, sysfs: str | Path = "/sys", name: str = "nvml") -> Topology:
    """Read the GPUs and their pairwise links through NVML; :class:`CollectorError` when it cannot."""
    nv = load_nvml(nvml)
    try:
        return _read(nv, Path(sysfs), name)
    except nv.NVMLError as exc:
        raise CollectorError(f"nvml: cannot read the GPU topology: {exc}; check `nvidia-smi topo -m`") from exc
    finally:
        nv.nvmlShutdown()
