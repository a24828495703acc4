"""What the pages read from the optional subsystems (SLO engine, classifier, scheduler), in one place.

Each reader returns plain data and an empty answer when the subsystem is not enabled, so a page never
needs to know which parts a daemon runs.  The shapes are those of the subsystems' ``*_state()``
methods, which also back the REST API.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import UiContext

__all__ = ["Move", "migrations", "slos", "alerts", "verdicts", "decisions", "last_move"]


@dataclass(frozen=True)
class Move:
    """A migration in flight: the shard, the GPUs it leaves and the GPUs it moves to."""

    shard: str
    source: tuple[int, ...]
    target: tuple[int, ...]
    state: str


def _records(data: Any, key: str) -> list[dict[str, Any]]:
    if isinstance(data, dict):
        data = data.get(key, [])
    return [d for d in data or [] if isinstance(d, dict)]


def migrations(ctx: UiContext) -> list[Move]:
    """Shards with a placement on its way: oldest live placement -> newest (no source on a first assignment)."""
    sched = ctx.part("scheduler")
    if sched is None:
        return []
    out = []
    for shard in _records(sched.shards_state(), "shards"):
        live = _records(shard.get("placements"), "placements")
        if not shard.get("migrating") or not live:
            continue
        source = tuple(live[0].get("gpus", ())) if len(live) > 1 else ()
        spec = shard.get("shard") or {}
        out.append(Move(str(spec.get("id", "?")), source, tuple(live[-1].get("gpus", ())), str(shard.get("state"))))
    return out


def slos(ctx: UiContext) -> list[dict[str, Any]]:
    """Each SLO's state: objective, windows (sli, burn_rate), error_budget, tiers, firing."""
    slo = ctx.part("slo")
    return [] if slo is None else _records(slo.slos_state(), "slos")


def alerts(ctx: UiContext) -> list[dict[str, Any]]:
    """Alerts firing now (``labels``, ``annotations``, ``starts_at``)."""
    slo = ctx.part("slo")
    return [] if slo is None else _records(slo.alerts_state(), "firing")


def verdicts(ctx: UiContext, limit: int) -> list[dict[str, Any]]:
    """Newest first."""
    rca = ctx.part("rca")
    return [] if rca is None else _records(rca.verdicts_state(limit), "verdicts")


def decisions(ctx: UiContext, limit: int) -> list[dict[str, Any]]:
    """Newest first."""
    sched = ctx.part("scheduler")
    return [] if sched is None else _records(sched.decisions_state(limit), "decisions")


def last_move(ctx: UiContext) -> dict[str, Any] | None:
    """The scheduler's newest migration since its start (None: none, or no scheduler), however many decisions came
    after it (the newest 64 were searched: a busy scheduler's "no action" decisions hid an older move)."""
    sched = ctx.part("scheduler")
    move = sched.decisions_state(0).get("last_move") if sched is not None else None
    return move if isinstance(move, dict) else None


XID_WINDOW_S = 300.0  # the status line names GPUs with XID errors in the last 5 minutes


def gpu_trouble(ctx: UiContext) -> str:
    """``GPU 3 lost · GPU 5: 2 XID errors in 5 min``: the GPUs the status line names, or ``""``.  A lost GPU (no
    answer to its last sample) only went blank on the pages, and an XID error showed nowhere."""
    store = ctx.store
    with store.reading():  # the GPUs of the latest tick and the window's columns are the same GPUs
        latest = store.gpu_latest()
        if latest is None:
            return ""
        xid = store.gpu_window("xid_errors_total", max(1, int(XID_WINDOW_S / ctx.tick_interval)))
    said = [f"GPU {g.index} lost" for g, ok in zip(latest.info, latest.healthy) if not ok]
    seen = ~np.isnan(xid)
    for c, g in enumerate(latest.info):
        if seen[:, c].any():
            new = int(np.nanmax(xid[:, c]) - np.nanmin(xid[:, c]))  # a counter: what it grew by in the window
            if new > 0:
                said.append(f"GPU {g.index}: {new} XID error{'s' if new != 1 else ''} in {XID_WINDOW_S / 60:.0f} min")
    return " · ".join(said)
