"""An SLO engine's state as the last run left it in ``slo.db``: window rings, kept and held tiers, the alerts
firing and announced (the start-up half of :class:`~.evaluate.SloEngine`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .tiers import TIER_NAMES

if TYPE_CHECKING:
    from .evaluate import SloEngine

__all__ = ["restore"]


def restore(engine: SloEngine) -> None:
    """Fill ``engine``'s rings and alert state from its ``slo.db``."""
    for lvl in range(len(engine.plan.levels.res)):
        stored = engine.state.edges(lvl)
        if stored is not None:
            engine.ring.restore(lvl, *stored)
    now = engine.state.now()
    if now is not None:
        engine.ring.resume(*now)
    # the last time the engine saw before the restart (None: a first start), also when the edges were dropped
    seen = [t for t in (engine.ring.ts, engine.state.seen()) if t is not None]
    engine.stopped_at = max(seen) if seen else None
    engine.notes = engine.state.notes()
    shape = (len(engine.specs), len(TIER_NAMES))
    engine.alerts = {}
    engine.firing_tiers = np.zeros(shape, dtype=bool)
    engine.last_true = np.full(shape, np.nan)
    engine.saved = np.full(shape, np.nan)  # as stored: NaN not kept, inf condition held at the last evaluation
    index = {s.name: i for i, s in enumerate(engine.specs)}
    engine.held_until = np.full(shape, np.nan)
    for name, until in engine.state.held().items():
        engine.held_until[index[name]] = [until.get(t, np.nan) for t in TIER_NAMES]
    for name, kept in engine.state.tiers().items():
        i = index[name]
        for tier, (since, last_true) in kept.items():
            if tier in engine.plan.tiers[i]:
                j = TIER_NAMES.index(tier)
                engine.saved[i, j] = np.inf if last_true is None else last_true
                if since is not None:
                    engine.firing_tiers[i, j] = True
                    engine.alerts[(i, tier)] = engine.alert(i, engine.plan.tiers[i][tier], since)
    engine.resume = np.isinf(engine.saved)  # held up to the restart: counted as held at the first evaluation
    # alerts the receivers may hold as firing that do not fire now (the configuration changed their labels
    # or dropped them; or killed after announcing one, before recording it), and every firing alert: the
    # outbox drops it for a receiver that has it already, a receiver added (or renamed) since gets it
    firing = {a.fingerprint for a in engine.alerts.values()}
    engine.reconcile = ([a for a in engine.state.announced() if a.fingerprint not in firing],
                        list(engine.alerts.values()))
    engine.last_true = np.where(engine.resume, np.nan, engine.saved)
