"""Who uses a GPU: NVML's compute processes and per-process SM samples, attributed to configured workloads.

Two GPU fields come from it, both only when workloads are configured (otherwise every process would be
"other" and every GPU foreign-busy): ``serving_utilization_ratio`` (the GPU's utilization where a process
of a configured workload runs, absent elsewhere: an idle GPU with a serving process on it is a frozen or
starved serving loop) and ``foreign_utilization_ratio`` (the share of time kernels of processes of no
configured workload ran: a co-tenant, named directly instead of inferred from slower iterations).
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


def attribute(procs: Iterable[Any], samples: Iterable[Any] | None, resolve: Callable[[int], str | None]) -> GpuUsers:
    """``procs`` from ``nvmlDeviceGetComputeRunningProcesses``; ``samples`` from
    ``nvmlDeviceGetProcessUtilization`` since the last read (empty: no kernel ran; None: not available).

    A process with several samples counts with their mean; the foreign share is the sum over processes
    of no configured workload, capped at 1.
    """
    users = GpuUsers()
    for p in procs:
        workload = resolve(int(p.pid))
        users.serving |= workload is not None
        if p.usedGpuMemory is not None:  # not reported under some virtualisation
            key = workload or OTHER_WORKLOAD
            users.memory[key] = users.memory.get(key, 0.0) + float(p.usedGpuMemory)
    if samples is not None:
        per_pid: dict[int, list[float]] = {}
        for s in samples:
            per_pid.setdefault(int(s.pid), []).append(float(s.smUtil))
        foreign = sum(sum(v) / len(v) for pid, v in per_pid.items() if resolve(pid) is None)
        users.foreign_util = min(1.0, foreign / 100.0)
    return users


def latest_sample_us(samples: Iterable[Any], since: int) -> int:
    """The newest sample timestamp (microseconds), to ask NVML only for newer samples next time."""
    return max((int(s.timeStamp) for s in samples), default=since)
