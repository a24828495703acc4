"""A shard as the engine and the API see it: its spec plus its live placements."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .config import ShardSpec
from .placement import GpuLoad, Request
from .states import ACTIVE, State
from .store import Placement

__all__ = ["ShardView", "shard_views", "locked_gpus", "in_flight", "gpu_load", "request_for", "spec_changes"]

NEW_SHARD_LOAD = 0.25  # utilization a shard with no history is assumed to add per GPU

_ORDER = (State.PENDING, State.PLACED, State.STAGED, State.LAUNCHED)


@dataclass(slots=True)
class ShardView:
    spec: ShardSpec
    live: list[Placement]   # non-terminal placements, oldest first

    @property
    def serving(self) -> Placement | None:
        """The newest launched placement."""
        return next((p for p in reversed(self.live) if p.state is State.LAUNCHED), None)

    @property
    def gpus(self) -> tuple[int, ...]:
        s = self.serving
        return s.gpus if s else ()

    @property
    def state(self) -> State | None:
        """``draining`` while an old placement drains, else the least advanced live state; None when none."""
        if any(p.state is State.DRAINING for p in self.live):
            return State.DRAINING
        states = [p.state for p in self.live]
        return min(states, key=_ORDER.index) if states else None

    @property
    def migrating(self) -> bool:
        """A placement is on its way (a re-shard, or a first assignment not launched yet)."""
        return len(self.live) > 1 or self.state not in (State.LAUNCHED, None)

    def to_dict(self) -> dict[str, object]:
        return {"shard": self.spec.model_dump(exclude={"placement"}),
                "state": self.state.value if self.state else "unplaced", "gpus": list(self.gpus),
                "migrating": self.migrating, "placements": [p.to_dict() for p in self.live]}


def shard_views(shards: Iterable[ShardSpec], live: Iterable[Placement]) -> dict[str, ShardView]:
    views = {s.id: ShardView(s, []) for s in shards}
    for p in live:
        if p.shard_id in views:
            views[p.shard_id].live.append(p)
    return views


def locked_gpus(views: dict[str, ShardView]) -> set[int]:
    """GPUs touched by a re-shard in flight (old and new placements): at most one migration per GPU.  The placing
    of a shard that serves nowhere yet is no migration: its GPUs take other shards (its memory and load count)."""
    return {g for v in views.values() if v.migrating and v.serving is not None for p in v.live for g in p.gpus}


def in_flight(views: dict[str, ShardView]) -> int:
    """Re-shards in flight (``scheduler.max_migrations``): not the placing of a shard that serves nowhere yet."""
    return sum(v.migrating and v.serving is not None for v in views.values())


def gpu_load(views: dict[str, ShardView], util: np.ndarray, mem_used: np.ndarray, healthy: np.ndarray,
             values_ts: float = float("inf"), dry_run: bool = False) -> GpuLoad:
    """What the planner needs: utilization, with the load of placements the reading cannot show yet on top,
    memory held by placements (placed through draining), memory used by anything else (observed minus what of
    the held memory the reading ``mem_used``, taken at ``values_ts``, can show), and which GPUs may take a shard
    (healthy, memory read, no migration in flight)."""
    reserved, shown = np.zeros(len(util)), np.zeros(len(util))
    busy = np.nan_to_num(np.asarray(util, dtype=np.float64), nan=0.0)  # not read: idle
    for v in views.values():
        for p in v.live:
            if p.state in ACTIVE:
                reserved[list(p.gpus)] += v.spec.memory_per_gpu
                if _loaded(p, values_ts, dry_run):
                    shown[list(p.gpus)] += v.spec.memory_per_gpu
                if not _serves(p, values_ts, dry_run):  # else the next shard would pile onto the same GPU
                    busy[list(p.gpus)] += NEW_SHARD_LOAD
    foreign = np.maximum(np.nan_to_num(mem_used, nan=0.0) - shown, 0.0)
    # a GPU whose memory was not read is no candidate: unread, it would look empty (utilization may be never
    # read at all: MIG, some vGPUs, a dcgm page without it; it then counts as idle, as before)
    eligible = np.asarray(healthy, dtype=bool) & ~np.isnan(mem_used)
    eligible[list(locked_gpus(views))] = False
    return GpuLoad(busy, reserved, foreign, eligible)


SHOWN_AFTER_S = 60.0  # GPU readings lag their frame: NVML is sampled every gpu.sample_interval (5 s), dcgm-exporter
# collects every 30 s by default, and each frame in between carries the last reading


def _loaded(p: Placement, values_ts: float, dry_run: bool) -> bool:
    """Whether ``p``'s memory shows in the GPU readings of a frame at ``values_ts``: one adopted where it runs, or
    one staged (weights loaded), launched or draining ``SHOWN_AFTER_S`` before; not one only placed, nor any the
    log actuator's dry run placed (nothing loads).  Until then it counts on top of the readings: for that minute
    a GPU may look fuller than it is, never emptier."""
    if p.kind == "adopt":
        return True
    return (not dry_run and p.state in (State.STAGED, State.LAUNCHED, State.DRAINING)
            and values_ts - p.updated_ts >= SHOWN_AFTER_S)


def _serves(p: Placement, values_ts: float, dry_run: bool) -> bool:
    """Whether ``p``'s load shows in the utilization of a frame at ``values_ts``: one adopted where it runs, one
    draining (it served until now), or one launched ``SHOWN_AFTER_S`` before; not one placed or staged (it serves
    nothing yet), nor any the log actuator's dry run placed."""
    if p.kind == "adopt" or p.state is State.DRAINING:
        return True
    return not dry_run and p.state is State.LAUNCHED and values_ts - p.updated_ts >= SHOWN_AFTER_S


def request_for(spec: ShardSpec, views: dict[str, ShardView], util: np.ndarray, source: tuple[int, ...] = (),
                exclude: frozenset[int] = frozenset()) -> Request:
    """A placement request; the shard's load is its share of its GPUs' utilization (shared evenly; GPUs not
    read are left out, and with none read it is that of a new shard)."""
    sharing: dict[int, int] = {}
    for v in views.values():
        for g in v.gpus:
            sharing[g] = sharing.get(g, 0) + 1
    shares = np.array([util[g] / max(sharing.get(g, 1), 1) for g in source], dtype=np.float64)
    read = shares[~np.isnan(shares)]  # a source GPU not read this tick says nothing about the load
    load = float(read.mean()) if read.size else NEW_SHARD_LOAD
    return Request(spec.gpus, float(spec.memory_per_gpu), spec.comm_intensity, spec.numa_node,
                   float(np.clip(load, 0.05, 1.0)), tuple(source), exclude)


def spec_changes(old: ShardSpec, new: ShardSpec) -> dict[str, str]:
    """Field -> "field old -> new" for each field of a shard's spec that differs (its ``placement`` aside)."""
    return {k: f"{k} {getattr(old, k)!r} -> {getattr(new, k)!r}" for k in type(new).model_fields
            if k != "placement" and getattr(old, k) != getattr(new, k)}
