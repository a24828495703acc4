"""Who uses a GPU: NVML's compute processes and per-process SM samples, attributed to configured workloads.

Two GPU fields come from it, both only when workloads are configured (otherwise every process would be
"other" and every GPU foreign-busy) and both or neither: ``serving_utilization_ratio`` (the GPU's
utilization where a process of a configured workload runs, absent elsewhere: an idle GPU with a serving
process on it is a frozen or starved serving loop) and ``foreign_utilization_ratio`` (the share of time
kernels of processes of no configured workload ran: a co-tenant, named directly instead of inferred
from slower iterations).

NVML returns per-process samples only for sample periods in which the process ran a kernel, each with
the share of that period (``smUtil``, percent).  The foreign share of the read interval is their sum
over the periods seen (distinct sample timestamps, from any process), capped at the GPU's own
utilization, which also covers the periods in which nothing ran.  Samples of a pid that is not in the
GPU's process list (a process that has exited, its samples still buffered) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OTHER_WORKLOAD", "GpuUsers", "attribute", "latest_sample_us"]

OTHER_WORKLOAD = "other"  # processes that match no configured workload


@dataclass
class GpuUsers:
    """One GPU's processes as the collector reports them."""

    memory: dict[str, float] = field(default_factory=dict)  # workload (or OTHER_WORKLOAD) -> bytes
    serving: bool = False  # a process of a configured workload is on the GPU
    foreign_util: float | None = None  # 0-1; None when NVML gave no per-process samples


def attribute(procs: Iterable[Any], samples: Iterable[Any] | None, resolve: Callable[[int], str | None],
              utilization: float = 1.0) -> GpuUsers:
    """``procs`` from ``nvmlDeviceGetComputeRunningProcesses``; ``samples`` from
    ``nvmlDeviceGetProcessUtilization`` since the last read (empty: no kernel ran; None: not available);
    ``utilization`` the GPU's own busy share (0-1; NaN or unknown: no cap)."""
    users = GpuUsers()
    owner: dict[int, str | None] = {}
    for p in procs:
        pid = int(p.pid)
        workload = owner[pid] = owner[pid] if pid in owner else resolve(pid)
        users.serving |= workload is not None
        if p.usedGpuMemory is not None:  # not reported under some virtualisation
            key = workload or OTHER_WORKLOAD
            users.memory[key] = users.memory.get(key, 0.0) + float(p.usedGpuMemory)
    if samples is not None:
        samples = list(samples)
        periods = len({int(s.timeStamp) for s in samples})
        foreign = sum(float(s.smUtil) for s in samples if int(s.pid) in owner and owner[int(s.pid)] is None)
        share = foreign / (100.0 * periods) if periods else 0.0
        cap = utilization if utilization == utilization else 1.0  # NaN: not read
        users.foreign_util = max(0.0, min(1.0, share, cap))
    return users


def latest_sample_us(samples: Iterable[Any], since: int) -> int:
    """The newest sample timestamp (microseconds), to ask NVML only for newer samples next time."""
    return max((int(s.timeStamp) for s in samples), default=since)
