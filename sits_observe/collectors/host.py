"""Host CPU and memory from ``/proc``, per NUMA node from ``/sys``: the host gauges of a real machine.

CPU busy is the share of non-idle jiffies between two reads of ``/proc/stat`` (idle and iowait count as
idle), over all CPUs and over the CPUs of each NUMA node (``/sys/devices/system/node/node*/cpulist``;
a machine without that directory is one node; re-read when the set of CPUs changes, and at every read after
one of it failed, which fails that read after the all-CPU value).  Counters that went backwards (the kernel
allows it for iowait) count as no time.  Memory used is ``MemTotal - MemAvailable`` from ``/proc/meminfo``.
The first read has no interval, so it reports memory only.
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


def _numa_cpus(sys_root: Path) -> dict[int, tuple[int, ...]]:
    """NUMA node -> its CPUs, from ``node*/cpulist`` (empty when the kernel has no NUMA directory)."""
    out = {}
    for d in sorted(sys_root.glob("devices/system/node/node[0-9]*")):
        cpus = parse_cpulist(_read(d / "cpulist").strip())
        if cpus:
            out[int(d.name[4:])] = cpus
    return out


def _busy(delta: np.ndarray) -> float | None:
    """Busy share over rows of ``(busy, total)`` jiffy deltas (None when no jiffies passed)."""
    busy, total = delta.sum(axis=0)
    return float(busy / total) if total > 0 else None


class HostSource:
    """Reads ``/proc/stat`` and ``/proc/meminfo`` once per tick (two small files)."""

    name = "host"

    def __init__(self, proc_root: str | Path = "/proc", sys_root: str | Path = "/sys") -> None:
        self.proc = Path(proc_root)
        self.sys = Path(sys_root)
        self._nodes: dict[int, np.ndarray] = {}  # NUMA node -> which rows of the CPU table are its CPUs
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._mapped: np.ndarray | None = None  # the CPUs _nodes maps (None: not mapped, or its read failed)

    def _cpu_jiffies(self) -> tuple[np.ndarray, np.ndarray]:
        """CPU numbers and their ``(busy, total)`` jiffies since boot, one row per CPU."""
        path = self.proc / "stat"
        lines = [ln.split(None, 1) for ln in _read(path).splitlines() if ln.startswith("cpu") and ln[3:4].isdigit()]
        bodies = [body.strip() for _, body in lines]
        widths = {body.count(" ") + 1 for body in bodies}
        if len(widths) != 1 or min(widths) < 5:
            raise CollectorError(f"host: {path} has no per-CPU lines of at least 5 jiffy counts, all alike")
        width = widths.pop()
        try:  # numpy 2.x raises at a word that is not a number; 1.x warns and stops there
            v = np.fromstring(" ".join(bodies), sep=" ")
        except ValueError:
            v = np.zeros(0)
        if v.size != len(lines) * width:
            raise CollectorError(f"host: {path} has a per-CPU line that is not jiffy counts")
        ids = np.array([int(head[3:]) for head, _ in lines])
        v = v.reshape(len(lines), width)
        total = v[:, :8].sum(axis=1)
        return ids, np.stack([total - v[:, 3] - v[:, 4], total], axis=1)

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
        ids, now = self._cpu_jiffies()
        last, self._last = self._last, (ids, now)
        if last is not None:
            rows: np.ndarray | slice
            if not np.array_equal(ids, last[0]):  # CPU hotplug: compare the CPUs seen both times
                _, rows, was = np.intersect1d(ids, last[0], return_indices=True)
                delta = now[rows] - last[1][was]
            else:
                rows, delta = slice(None), now - last[1]
            delta = np.clip(delta, 0.0, None)
            if (all_cpus := _busy(delta)) is not None:
                frame.host["cpu_utilization_ratio"] = all_cpus
        if self._mapped is None or not np.array_equal(ids, self._mapped):
            # first read, CPU hotplug, or the map's last read failed: map the CPU table's rows to NUMA nodes again
            self._mapped = None
            nodes = _numa_cpus(self.sys) or {0: tuple(ids)}
            self._nodes, self._mapped = {n: np.isin(ids, cpus) for n, cpus in nodes.items()}, ids
        if last is None:
            return
        for node, mask in self._nodes.items():
            if (b := _busy(delta[mask[rows]])) is not None:
                frame.samples.append(numa_cpu_sample(node, b))
