"""The GPU topology of a host: per-GPU identity and NUMA placement, and a link matrix between GPUs.

One type for every part that needs it: the simulator builds it from presets, the NVML collector from
the real box (:meth:`Topology.from_nvml`), the scheduler scores placements on it and the UI draws it.
Bandwidths are nominal unidirectional figures in bytes/s (see docs/topology.md for their sources).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from .errors import ConfigError

__all__ = ["LinkKind", "Gpu", "Link", "Topology", "NUMA_UNKNOWN", "PRESETS", "one_host", "preset"]

GB = 1e9


class LinkKind(str, Enum):
    """How two GPUs reach each other, fastest first (label ``link``)."""

    SELF = "self"
    NVSWITCH = "nvswitch"
    NVLINK = "nvlink"
    PCIE_SWITCH = "pcie_switch"
    PCIE_HOST_BRIDGE = "pcie_host_bridge"
    NUMA_INTERCONNECT = "numa_interconnect"
    NETWORK = "network"  # only between hosts of a synthetic multi-host fabric (scheduler benchmarks)


# Nominal per-direction bandwidth by kind (bytes/s) for presets; NVLink figures scale with link count.
NVLINK4_PER_LINK = 25 * GB
DEFAULT_BANDWIDTH = {
    LinkKind.PCIE_SWITCH: 50 * GB,
    LinkKind.PCIE_HOST_BRIDGE: 40 * GB,
    LinkKind.NUMA_INTERCONNECT: 20 * GB,
    LinkKind.NETWORK: 50 * GB,
}


NUMA_UNKNOWN = -1  # a GPU whose NUMA node nobody could read (NVML could not open it at start)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    numa_node: int
    cpu_affinity: tuple[int, ...]
    memory_total_bytes: int
    node: str = "localhost"


@dataclass(frozen=True, slots=True)
class Link:
    kind: LinkKind
    bandwidth: float  # bytes/s, one direction
    nvlinks: int


@dataclass(frozen=True)
class Topology:
    """GPUs and the pairwise link matrix (``kinds[i][j]``, ``bandwidth[i, j]``, ``nvlinks[i, j]``)."""

    name: str
    gpus: tuple[Gpu, ...]
    kinds: tuple[tuple[LinkKind, ...], ...]
    bandwidth: np.ndarray
    nvlinks: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if len(self.kinds) != n or self.bandwidth.shape != (n, n) or self.nvlinks.shape != (n, n):
            raise ConfigError(f"topology {self.name}: link matrix is not {n}x{n}")

    @property
    def n(self) -> int:
        return len(self.gpus)

    def link(self, a: int, b: int) -> Link:
        return Link(self.kinds[a][b], float(self.bandwidth[a, b]), int(self.nvlinks[a, b]))

    def numa_nodes(self) -> dict[int, list[int]]:
        """NUMA node -> GPU indices (GPUs whose node is unknown left out)."""
        out: dict[int, list[int]] = {}
        for g in self.gpus:
            if g.numa_node != NUMA_UNKNOWN:
                out.setdefault(g.numa_node, []).append(g.index)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model,
                    "pci_bus_id": g.pci_bus_id,
                    "numa_node": None if g.numa_node == NUMA_UNKNOWN else g.numa_node,
                    "cpu_affinity": list(g.cpu_affinity),
                    "memory_total_bytes": g.memory_total_bytes,
                    "node": g.node,
                }
                for g in self.gpus
            ],
            "links": [
                {"gpu": i, "peer_gpu": j, "link": self.kinds[i][j].value,
                 "bandwidth_bytes_per_second": float(self.bandwidth[i, j]), "nvlinks": int(self.nvlinks[i, j])}
                for i in range(self.n) for j in range(self.n) if i != j
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        gpus = tuple(
            Gpu(int(g["index"]), g["uuid"], g["model"], g["pci_bus_id"],
                NUMA_UNKNOWN if g["numa_node"] is None else int(g["numa_node"]),
                tuple(g.get("cpu_affinity", ())), int(g["memory_total_bytes"]), g.get("node", "localhost"))
            for g in data["gpus"]
        )
        n = len(gpus)
        kinds = [[LinkKind.SELF] * n for _ in range(n)]
        bw = np.zeros((n, n))
        nvl = np.zeros((n, n), dtype=np.int64)
        for link in data["links"]:
            i, j = int(link["gpu"]), int(link["peer_gpu"])
            kinds[i][j] = LinkKind(link["link"])
            bw[i, j] = float(link["bandwidth_bytes_per_second"])
            nvl[i, j] = int(link.get("nvlinks", 0))
        return cls(data["name"], gpus, tuple(tuple(r) for r in kinds), bw, nvl)

    @classmethod
    def build(cls, name: str, gpus: list[Gpu], pair: Any) -> Topology:
        """Build from ``pair(a, b) -> (LinkKind, nvlinks)``; bandwidth from the link count or kind."""
        n = len(gpus)
        kinds = [[LinkKind.SELF] * n for _ in range(n)]
        bw = np.zeros((n, n))
        nvl = np.zeros((n, n), dtype=np.int64)
        for a in range(n):
            for b in range(n):
                if a == b:
                    continue
                kind, links = pair(gpus[a], gpus[b])
                kinds[a][b] = kind
                nvl[a, b] = links
                bw[a, b] = links * NVLINK4_PER_LINK if links else DEFAULT_BANDWIDTH[kind]
        return cls(name, tuple(gpus), tuple(tuple(r) for r in kinds), bw, nvl)

    @classmethod
    def from_nvml(cls, nvml: Any = None) -> Topology:
        """Read the real box through NVML (``collectors/nvml_topology.py``)."""
        from .collectors.nvml_topology import topology_from_nvml

        return topology_from_nvml(nvml)


def _gpus(model: str, memory: int, per_numa: int, numa_nodes: int, cpus_per_numa: int,
          node: str = "localhost", first: int = 0, bus_ids: list[str] | None = None) -> list[Gpu]:
    out = []
    for i in range(per_numa * numa_nodes):
        numa = i // per_numa
        cpus = tuple(range(numa * cpus_per_numa, (numa + 1) * cpus_per_numa))
        bus = bus_ids[i] if bus_ids else f"00000000:{0x18 + 0x10 * i:02X}:00.0"
        uid = f"GPU-{node[:8]:0<8}-{first + i:04x}-4000-8000-{0x5175 + first + i:012x}"
        out.append(Gpu(first + i, uid, model, bus, numa, cpus, memory, node))
    return out


def _nvswitch8() -> Topology:
    gpus = _gpus("NVIDIA H100 80GB HBM3", 80 * 1024**3, 4, 2, 48)
    # HGX H100: every GPU has 18 NVLink4 links into the NVSwitch fabric.
    return Topology.build("nvswitch-8", gpus, lambda a, b: (LinkKind.NVSWITCH, 18))


def _pcie8() -> Topology:
    gpus = _gpus("NVIDIA H100 PCIe", 80 * 1024**3, 4, 2, 32)

    def pair(a: Gpu, b: Gpu) -> tuple[LinkKind, int]:
        if a.index // 2 == b.index // 2:  # same PCIe switch, joined by an NVLink bridge (12 links)
            return LinkKind.NVLINK, 12
        if a.numa_node != b.numa_node:
            return LinkKind.NUMA_INTERCONNECT, 0
        return LinkKind.PCIE_HOST_BRIDGE, 0  # two switches under the same socket

    return Topology.build("pcie-8", gpus, pair)


def synthetic(boxes: int) -> Topology:
    """``boxes`` nvswitch-8 hosts joined by a network fabric (for scheduler benchmarks)."""
    gpus: list[Gpu] = []
    for h in range(boxes):
        gpus += _gpus("NVIDIA H100 80GB HBM3", 80 * 1024**3, 4, 2, 48, node=f"host{h:03d}", first=8 * h)

    def pair(a: Gpu, b: Gpu) -> tuple[LinkKind, int]:
        return (LinkKind.NVSWITCH, 18) if a.node == b.node else (LinkKind.NETWORK, 0)

    return Topology.build(f"fabric-{boxes}x8", gpus, pair)


PRESETS = {"nvswitch-8": _nvswitch8, "pcie-8": _pcie8}


def one_host(topology: str) -> str:
    """``topology`` unless it is ``fabric-Nx8`` with N > 1, which the simulator refuses (it models one host): refused
    by its name, before the N x 8 GPUs' link matrices are built (fabric-99999x8 took 11 GB and minutes)."""
    boxes = topology[7:-2] if topology.startswith("fabric-") and topology.endswith("x8") else ""
    if boxes.isdigit() and int(boxes) > 1:
        raise ValueError(f"the simulator models one host and {topology} spans several; choose one of "
                         f"{', '.join(PRESETS)}")
    return topology


def preset(name: str) -> Topology:
    """A named simulator topology; ``fabric-Nx8`` builds N joined nvswitch-8 hosts."""
    if name.startswith("fabric-") and name.endswith("x8") and name[7:-2].isdigit():
        return synthetic(int(name[7:-2]))
    if name not in PRESETS:
        raise ConfigError(f"sim.topology: unknown topology {name!r}; choose one of {', '.join(PRESETS)} or fabric-Nx8")
    return PRESETS[name]()
