"""Helpers for the scheduler tests: frames with given GPU/host values, a pending actuator, state views."""

from __future__ import annotations

from typing import Any

from sits_observe.frame import Frame, GpuFrame, GpuInfo
from sits_observe.scheduler.actuators import StepOutcome
from sits_observe.scheduler.engine import Scheduler

GiB = 2**30


def frame(ts: float, util: list[float] | None = None, mem_gib: list[float] | None = None,
          cpu: float = 0.2, n: int = 8) -> Frame:
    """One tick with per-GPU utilization, memory used (GiB) and host CPU."""
    f = Frame(ts, 1.0)
    f.gpu = GpuFrame.empty([GpuInfo(i, f"GPU-{i}", "H100", f"0:{i}") for i in range(n)])
    for i in range(n):
        f.gpu.set(i, "utilization_ratio", (util or [0.2] * n)[i])
        f.gpu.set(i, "memory_used_bytes", (mem_gib or [0.0] * n)[i] * GiB)
        f.gpu.set(i, "memory_total_bytes", 80 * GiB)
    f.host["cpu_utilization_ratio"] = cpu
    return f


class PendingActuator:
    """Accepts every step and answers none: steps complete only through ``Scheduler.ack``."""

    name = "pending"

    def __init__(self) -> None:
        self.plans: list[dict[str, Any]] = []

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None:
        self.plans.append(plan)
        return None

    def poll(self) -> list[StepOutcome]:
        return []

    def close(self) -> None:
        pass


def live_gpus(s: Scheduler) -> dict[str, tuple[str, list[int]]]:
    """shard id -> (state, serving GPUs)."""
    return {v["shard"]["id"]: (v["state"], v["gpus"]) for v in s.shards_state()["shards"]}


