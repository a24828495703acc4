"""Topology fixtures for the fake NVML: the two simulator presets and an 8x H100 SXM host read from the
`nvidia-smi topo -m` layout in ``h100_sxm8_topo.txt``."""

from __future__ import annotations

from pathlib import Path

from sits_observe.collectors.nvml_topology import parse_cpulist
from sits_observe.topology import Gpu, LinkKind, Topology, preset

__all__ = ["FIXTURES", "fixture", "parse_topo_text", "H100_TEXT"]

H100_TEXT = Path(__file__).with_name("h100_sxm8_topo.txt")
FIXTURES = ("nvswitch-8", "pcie-8", "h100-sxm8")
# `nvidia-smi topo -m` cell -> link kind for the PCIe paths
_PCIE_CELL = {"PIX": LinkKind.PCIE_SWITCH, "PXB": LinkKind.PCIE_SWITCH, "PHB": LinkKind.PCIE_HOST_BRIDGE,
              "NODE": LinkKind.PCIE_HOST_BRIDGE, "SYS": LinkKind.NUMA_INTERCONNECT}


def parse_topo_text(text: str, name: str) -> Topology:
    """A Topology from a `nvidia-smi topo -m` matrix plus ``# key: value`` header lines (see the fixture)."""
    meta: dict[str, list[str]] = {}
    rows: list[list[str]] = []
    header: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta.setdefault(key.strip(), []).append(value.strip())
        elif line.startswith("\tGPU0"):
            header = line.split("\t")
        elif line.startswith("GPU"):
            rows.append([c.strip() for c in line.split("\t")])
    bus = dict(v.split() for v in meta["pci_bus_id"])
    switched = meta.get("fabric") == ["nvswitch"]
    col = {h: i for i, h in enumerate(header)}
    gpus = [Gpu(i, f"GPU-{i:08x}-a1b2-c3d4-e5f6-0123456789ab", meta["model"][0], bus[r[0]],
                int(r[col["NUMA Affinity"]]), parse_cpulist(r[col["CPU Affinity"]]), int(meta["memory_total_bytes"][0]))
            for i, r in enumerate(rows)]

    def pair(a: Gpu, b: Gpu) -> tuple[LinkKind, int]:
        cell = rows[a.index][col[f"GPU{b.index}"]]
        if cell.startswith("NV"):
            return (LinkKind.NVSWITCH if switched else LinkKind.NVLINK), int(cell[2:])
        return _PCIE_CELL[cell], 0

    return Topology.build(name, gpus, pair)


def fixture(name: str) -> Topology:
    if name == "h100-sxm8":
        return parse_topo_text(H100_TEXT.read_text(), name)
    return preset(name)
