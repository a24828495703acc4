"""`sits-observe topo`: the GPU link matrix as `nvidia-smi topo -m` prints it, plus bandwidth."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import CollectorError
from ..topology import NUMA_UNKNOWN, PRESETS, LinkKind, Topology, preset
from .nvml_driver import started
from .nvml_topology import format_cpulist

__all__ = ["register", "run_topo", "format_topology", "cell"]

_CELL = {LinkKind.PCIE_SWITCH: "PIX", LinkKind.PCIE_HOST_BRIDGE: "PHB", LinkKind.NUMA_INTERCONNECT: "SYS",
         LinkKind.NETWORK: "NET"}
_LEGEND = (
    "  X    = the GPU itself",
    "  NV#  = # NVLink links, direct or through NVSwitch (link=nvlink or nvswitch)",
    "  PIX  = through a PCIe switch (link=pcie_switch)",
    "  PHB  = through a PCIe host bridge, or host bridges of one NUMA node (link=pcie_host_bridge)",
    "  SYS  = across NUMA nodes over the CPU interconnect (link=numa_interconnect)",
    "  NET  = another host (link=network)",
)


# parts of an NVML error that speak of the daemon (its config, its later samples), not of this command
_DAEMON_WORDS = ("GPU metrics are off", "off until a restart", "gpu.backend")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("topo", help="print the GPU link matrix (like nvidia-smi topo -m) with bandwidth")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a simulator topology instead of this host's (NVML)")
    p.add_argument("--json", action="store_true", help="print the topology as JSON (the /api/v1/topology body)")
    p.set_defaults(func=run_topo)


def run_topo(args: argparse.Namespace) -> int:
    try:
        topo = preset(args.preset) if args.preset else started("nvml topology", Topology.from_nvml)
    except CollectorError as exc:  # the daemon's advice (gpu.backend) is not this command's: it reads no config
        said = [p for p in str(exc).split("; ") if not any(w in p for w in _DAEMON_WORDS)]
        raise CollectorError(f"{'; '.join(said)}; this host's topology needs NVML; "
                             f"`sits-observe topo --preset {sorted(PRESETS)[0]}` prints a simulated one") from None
    print(json.dumps(topo.to_dict(), indent=2) if args.json else format_topology(topo))
    return 0


def cell(topo: Topology, a: int, b: int) -> str:
    """The `nvidia-smi topo -m` cell for GPU ``a`` to GPU ``b``."""
    if a == b:
        return "X"
    kind = topo.kinds[a][b]
    if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
        return f"NV{int(topo.nvlinks[a, b])}"
    return _CELL[kind]


def format_topology(topo: Topology) -> str:
    """Tab-separated matrix with CPU and NUMA affinity, then bandwidth in GB/s, then the legend."""
    gpus = [f"GPU{g.index}" for g in topo.gpus]
    lines = ["\t" + "\t".join([*gpus, "CPU Affinity", "NUMA Affinity"])]
    for a, g in enumerate(topo.gpus):
        cells = [cell(topo, a, b) for b in range(topo.n)]
        lines.append("\t".join([gpus[a], *cells, format_cpulist(g.cpu_affinity) or "N/A",
                                "N/A" if g.numa_node == NUMA_UNKNOWN else str(g.numa_node)]))
    lines += ["", "Bandwidth, GB/s one direction:", "\t" + "\t".join(gpus)]
    for a in range(topo.n):
        row = ["-" if a == b else f"{topo.bandwidth[a, b] / 1e9:g}" for b in range(topo.n)]
        lines.append("\t".join([gpus[a], *row]))
    lines += ["", f"Topology: {topo.name}", "Legend:", *_LEGEND]
    return "\n".join(lines)
