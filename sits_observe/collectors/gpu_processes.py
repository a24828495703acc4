"""Who uses a GPU: NVML's compute processes and per-process SM samples, attributed to configured workloads.

Two GPU fields come from it, both only when workloads are configured (otherwise every process would be
"other" and every GPU foreign-busy) and both or neither: ``serving_utilization_ratio`` (the GPU's
utilization where a process of a configured workload runs, absent elsewhere: an idle GPU with a serving
process on it is a frozen or starved serving loop) and ``foreign_utilization_ratio`` (the share of time
kernels of processes of no configured workload ran: a co-tenant, named directly instead of inferred
from slower iterations).

``nvmlDeviceGetProcessUtilization`` returns, per process that ran a kernel in its last sample period,
one sample (``smUtil``: percent of that period a kernel of the process ran) stamped with the wall clock
in microseconds; the collector asks for the samples of the last read interval.  The foreign share is
the sum over the GPU's listed processes of no configured workload of each one's mean ``smUtil``, capped
at the GPU's own utilization (one GPU cannot be busier than that).  Samples of a pid not in the GPU's
compute-process list (it exited, or it is not a compute context) and values above 100 % (reported for
defunct processes) are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OTHER_WORKLOAD", "GpuUsers", "Attribution", "attribute", "process_samples"]

log = logging.getLogger("sits_observe.collectors.nvml")

OTHER_WORKLOAD = "other"  # processes that match no configured workload
UNMATCHED_WARN = 3  # samples in a row with GPU processes but none of a workload before the warning


@dataclass
class GpuUsers:
    """One GPU's processes as the collector reports them."""

    memory: dict[str, float] = field(default_factory=dict)  # workload (or OTHER_WORKLOAD) -> bytes
    serving: bool = False  # a process of a configured workload is on the GPU
    foreign_util: float | None = None  # 0-1; None when NVML gave no per-process samples


def attribute(procs: Iterable[Any], samples: Iterable[Any] | None, resolve: Callable[[int], str | None],
              utilization: float) -> GpuUsers:
    """``procs`` from ``nvmlDeviceGetComputeRunningProcesses``; ``samples`` from
    ``nvmlDeviceGetProcessUtilization`` for the read interval (empty: no kernel ran; None: not available);
    ``utilization`` the GPU's own busy share (0-1), which caps the foreign share."""
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
        per_pid: dict[int, list[float]] = {}
        for s in samples:
            pid, sm = int(s.pid), float(s.smUtil)
            if pid in owner and owner[pid] is None and 0 <= sm <= 100:
                per_pid.setdefault(pid, []).append(sm)
        share = sum(sum(v) / len(v) for v in per_pid.values()) / 100.0
        users.foreign_util = max(0.0, min(1.0, share, utilization))
    return users


def process_samples(nv: Any, handle: Any, now: float, interval: float) -> list[Any]:
    """``nvmlDeviceGetProcessUtilization`` samples of the last ``interval`` seconds before wall-clock
    ``now``; [] when no process ran a kernel in it.  Samples stamped after ``now`` (the clock stepped
    back) are dropped; a process starting between pynvml's two calls (INSUFFICIENT_SIZE) is retried once."""
    now_us = int(now * 1e6)
    since = max(0, now_us - int(interval * 1e6))
    for attempt in (0, 1):
        try:
            out = nv.nvmlDeviceGetProcessUtilization(handle, since)
            break
        except nv.NVMLError as exc:  # NOT_FOUND: no sample since; SUCCESS: pynvml's answer to zero samples
            if exc.value in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS):
                return []
            if exc.value != nv.NVML_ERROR_INSUFFICIENT_SIZE or attempt:
                raise
    return [s for s in out if int(s.timeStamp) <= now_us]


class Attribution:
    """Whether this sample's attribution is usable: GPU processes but none of a configured workload means
    the pids do not resolve (another PID namespace, match rules that miss) or the serving engine is down,
    and every GPU would look foreign-busy.  Warned once after ``UNMATCHED_WARN`` such samples in a row,
    and again after attribution has worked in between."""

    def __init__(self) -> None:
        self._gpus = [0, 0]  # this sample: GPUs with compute processes, GPUs with a workload's process
        self._unmatched = 0

    def start(self) -> None:
        self._gpus = [0, 0]

    def add(self, with_processes: bool, serving: bool) -> None:
        self._gpus[0] += with_processes
        self._gpus[1] += serving

    def usable(self) -> bool:
        with_processes, serving = self._gpus
        if not with_processes:
            return True
        if serving:
            if self._unmatched >= UNMATCHED_WARN:
                log.info("nvml: GPU processes of configured workloads found again; serving and foreign GPU "
                         "utilization are reported")
            self._unmatched = 0
            return True
        self._unmatched += 1
        if self._unmatched == UNMATCHED_WARN:
            log.warning("nvml: no process on any GPU belongs to a configured workload (%d samples in a row); "
                        "serving and foreign GPU utilization are omitted. Check that the serving engine runs, "
                        "the workloads' match rules, and that the daemon shares the host's PID namespace "
                        "(pid: host), so NVML's pids are this daemon's", self._unmatched)
        return False
