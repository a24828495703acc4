"""Host CPU and memory from ``/proc``, per NUMA node from ``/sys``: the host gauges of a real machine.

CPU busy is the share of non-idle jiffies between two reads of ``/proc/stat`` (idle and iowait count as
idle), over all CPUs and over the CPUs of each NUMA node (``/sys/devices/system/node/node*/cpulist``;
a machine without that directory is one node).  Memory used is ``MemTotal - MemAvailable`` from
``/proc/meminfo``.  The first read has no interval, so it reports memory only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CollectorError
from ..frame import Frame, numa_cpu_sample
from .nvml_topology import parse_cpulist

__all__ = ["HostSource"]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CollectorError(f"host: cannot read {path}: {exc.strerror or exc}") from None


def numa_cpus(sys_root: Path) -> dict[int, tuple[int, ...]]:
    """NUMA node -> its CPUs, from ``node*/cpulist`` (empty when the kernel has no NUMA directory)."""
    out = {}
    for d in sorted(sys_root.glob("devices/system/node/node[0-9]*")):
        cpus = parse_cpulist(_read(d / "cpulist").strip())
        if cpus:
            out[int(d.name[4:])] = cpus
    return out


def _busy(delta: dict[int, np.ndarray], cpus: tuple[int, ...]) -> float | None:
    """Busy share of ``cpus`` over the interval (None when no jiffies passed)."""
    d = np.zeros(2)
    for c in cpus:
        if c in delta:
            d += delta[c]
    return float(d[0] / d[1]) if d[1] > 0 else None


class HostSource:
    """Reads ``/proc/stat`` and ``/proc/meminfo`` once per tick (two small files)."""

    name = "host"

    def __init__(self, proc_root: str | Path = "/proc", sys_root: str | Path = "/sys") -> None:
        self.proc = Path(proc_root)
        self._nodes = numa_cpus(Path(sys_root))
        self._last: dict[int, np.ndarray] | None = None

    def _cpu_jiffies(self) -> dict[int, np.ndarray]:
        """CPU number -> (busy, total) jiffies since boot."""
        out = {}
        for line in _read(self.proc / "stat").splitlines():
            head, _, rest = line.partition(" ")
            if head.startswith("cpu") and head[3:].isdigit():
                v = np.array([float(x) for x in rest.split()[:8]])
                idle = v[3] + (v[4] if len(v) > 4 else 0.0)
                out[int(head[3:])] = np.array([v.sum() - idle, v.sum()])
        if not out:
            raise CollectorError(f"host: {self.proc / 'stat'} has no per-CPU lines")
        return out

    def _memory(self) -> tuple[float, float]:
        kib = {}
        for line in _read(self.proc / "meminfo").splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                kib[key] = float(rest.split()[0])
        if len(kib) != 2 or kib["MemTotal"] <= 0:
            raise CollectorError(f"host: {self.proc / 'meminfo'} lacks MemTotal/MemAvailable")
        return kib["MemTotal"] * 1024, (kib["MemTotal"] - kib["MemAvailable"]) * 1024

    def collect(self, frame: Frame) -> None:
        total, used = self._memory()
        frame.host.update({"memory_total_bytes": total, "memory_used_bytes": used, "memory_used_ratio": used / total})
        now = self._cpu_jiffies()
        last, self._last = self._last, now
        if last is None:
            return
        delta = {c: now[c] - last[c] for c in now if c in last}
        if (all_cpus := _busy(delta, tuple(delta))) is not None:
            frame.host["cpu_utilization_ratio"] = all_cpus
        for node, cpus in (self._nodes or {0: tuple(delta)}).items():
            if (b := _busy(delta, cpus)) is not None:
                frame.samples.append(numa_cpu_sample(node, b))
