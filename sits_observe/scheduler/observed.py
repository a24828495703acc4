"""What the scheduler knows of the host now: the newest GPU values, host and NUMA CPU, and how old they are.

Every time is the source clock (``frame.ts``).  GPUs are chosen only on fresh values: without a GPU
sample for ``GPU_STALE_S`` (none yet after a start, or the GPU source silent) every GPU would look
empty, also one another tenant has filled.
"""

from __future__ import annotations

import numpy as np

from ..frame import GPU_FIELD_INDEX, Frame, numa_cpu_by_node
from ..topology import Topology
from .placement import GpuLoad
from .view import ShardView, gpu_load

__all__ = ["Observed", "GPU_STALE_S"]

GPU_STALE_S = 15.0  # GPU values older than this (the GPU source stopped reporting) are not decided on


class Observed:
    """The values of the last frames; ``now`` is the newest frame's time (the clock's until the first)."""

    def __init__(self, topology: Topology, now: float, dry_run: bool = False) -> None:
        """``dry_run``: the log actuator's; the memory of shards it places never shows in GPU readings."""
        n = self.n = topology.n
        self.now = now
        self.dry_run = dry_run
        self.util, self.mem, self.healthy = np.zeros(n), np.full(n, np.nan), np.ones(n, dtype=bool)
        self.total = np.array([g.memory_total_bytes for g in topology.gpus], dtype=np.float64)
        self.values: np.ndarray | None = None
        self.gpu_ts = float("-inf")  # source time of the GPU values above
        self.host_cpu = float("nan")
        self.numa_cpu: dict[int, float] = {}

    def read(self, frame: Frame) -> bool:
        """Take the frame's values; True when it carried a sample of every GPU.  A frame whose GPUs all read as
        missing (the GPU source hung: only their health and XIDs are known) is no sample: it updates health only,
        so a source hung past ``GPU_STALE_S`` is "not reporting", not a host with no GPU that qualifies."""
        self.now = frame.ts
        g = frame.gpu
        if g is None or len(g.info) != self.n:
            sampled = False
        else:
            self.healthy = np.asarray(g.healthy, dtype=bool)
            sampled = bool(np.isfinite(np.delete(g.values, GPU_FIELD_INDEX["xid_errors_total"], axis=1)).any())
        if sampled:
            self.values, self.gpu_ts = g.values, frame.ts
            self.util = g.values[:, GPU_FIELD_INDEX["utilization_ratio"]]  # NaN: not read (not idle)
            self.mem = g.values[:, GPU_FIELD_INDEX["memory_used_bytes"]]
        self.host_cpu = float(frame.host.get("cpu_utilization_ratio", float("nan")))
        self.numa_cpu = numa_cpu_by_node(frame.samples)
        return sampled

    def windows(self, sampled: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(utilization, memory fraction) per GPU for the trigger windows.  A tick without a GPU sample counts
        nothing (None); a source silent for longer than ``GPU_STALE_S`` re-arms them (NaN) rather than letting
        its last sample sustain a trigger; unhealthy GPUs have no utilization (NaN)."""
        if sampled:  # a GPU of no memory in the topology (unopened at start) has no memory fraction
            frac = np.divide(self.mem, self.total, out=np.full(self.n, np.nan), where=self.total > 0)
            return np.where(self.healthy, self.util, np.nan), frac
        if not self.fresh():
            nan = np.full(self.n, np.nan)
            return nan, nan
        return None, None

    def fresh(self) -> bool:
        return self.now - self.gpu_ts <= GPU_STALE_S

    def gpus_unknown(self) -> str:
        """Why no GPUs may be chosen now, "" when they may."""
        if self.fresh():
            return ""
        return (f"no GPU values for {GPU_STALE_S:g} s (the GPU source is not reporting, or reads every GPU as "
                "missing), so the targets' free memory is unknown")

    def load(self, views: dict[str, ShardView]) -> GpuLoad:
        return gpu_load(views, self.util, self.mem, self.healthy, self.gpu_ts, self.dry_run)
