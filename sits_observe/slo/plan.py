"""The SLO engine's evaluation plan, fixed by the specs at start-up, and one tick's arithmetic.

Every (SLO, window) pair the SLOs need (their alert windows and the SLO window) is one column of the
window sums; per SLO and burn tier the plan holds the columns of the tier's long and short windows, its
threshold, its flap guard (``keep_firing_for``) and how long it may be held behind a faster tier.
:meth:`Plan.evaluate` turns the sums at a time into one tick's :class:`Evaluation`: error ratio, burn
rate and events/s per pair, the error budget left per SLO, and which tiers are active, fire or are held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .burn import budget_remaining, burn_rate, error_ratio, fire, tier_active
from .spec import SloSpec
from .tiers import TIER_NAMES, Tier, error_budget
from .window import Levels, WindowRing

__all__ = ["Evaluation", "Plan"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One tick's results: per window pair ``sums (2, P)``; per SLO and tier ``active``, ``firing``, ``held``,
    ``last_true (n, T)`` (when a kept tier's condition last held, NaN when not kept) and ``held_until``
    (see :func:`.burn.fire`)."""

    ts: float
    sums: np.ndarray
    err: np.ndarray
    burn: np.ndarray
    rate: np.ndarray
    active: np.ndarray
    firing: np.ndarray
    held: np.ndarray
    last_true: np.ndarray
    budget: np.ndarray
    held_until: np.ndarray


class Plan:
    """Columns, thresholds and flap guards of every SLO's enabled tiers (``(n, T)`` arrays, T = all tier
    names; a disabled tier has an infinite threshold and never fires)."""

    def __init__(self, specs: Sequence[SloSpec]) -> None:
        n, T = len(specs), len(TIER_NAMES)
        pairs = [(i, w) for i, s in enumerate(specs) for w in sorted({*s.alert_windows(), s.window})]
        pair_of = {p: k for k, p in enumerate(pairs)}
        self.slo_pairs = [[k for k, (row, _) in enumerate(pairs) if row == i] for i in range(n)]
        self.rows = np.array([i for i, _ in pairs])
        self.windows = np.array([w for _, w in pairs], dtype=np.float64)
        self.levels = Levels.for_windows(self.windows.min(), self.windows.max())
        self.pair_levels = np.array([self.levels.level_of(w) for w in self.windows])
        self.tiers: list[dict[str, Tier]] = [{t.name: t for t in s.enabled_tiers()} for s in specs]
        self.t_long = np.zeros((n, T), dtype=np.int64)
        self.t_short = np.zeros((n, T), dtype=np.int64)
        self.t_threshold = np.full((n, T), np.inf)
        self.keep = np.zeros((n, T))
        self.hold_for = np.zeros((n, T))  # how long a held tier may lag a faster one: short window + keep
        for i, s in enumerate(specs):
            for j, name in enumerate(TIER_NAMES):
                t = self.tiers[i].get(name)
                if t is not None:
                    self.t_long[i, j], self.t_short[i, j] = pair_of[(i, t.long)], pair_of[(i, t.short)]
                    self.t_threshold[i, j] = t.threshold(s.window, s.objective)
                    self.keep[i, j] = t.keep_firing_for
                    self.hold_for[i, j] = t.short + t.keep_firing_for
        self.budget = np.array([error_budget(s.objective) for s in specs])
        self.min_rate = np.array([s.min_rate for s in specs])[:, None]
        self.budget_pair = np.array([pair_of[(i, s.window)] for i, s in enumerate(specs)])

    def evaluate(self, ring: WindowRing, ts: float, last_true: np.ndarray, held_until: np.ndarray) -> Evaluation:
        """The tick at ``ts``: ``last_true`` and ``held_until`` (``(n, T)``, NaN for none) are the previous
        tick's (see :func:`.burn.fire`)."""
        sums = ring.sums(ts, self.rows, self.windows, self.pair_levels)
        err = error_ratio(sums[0], sums[1])
        rate = sums[1] / self.windows
        active = tier_active(err[self.t_long], err[self.t_short], rate[self.t_short], self.t_threshold, self.min_rate)
        firing, held, last, until = fire(active, held_until, last_true, ts, self.keep, self.hold_for)
        return Evaluation(ts, sums, err, burn_rate(err, self.budget[self.rows]), rate, active, firing, held, last,
                          budget_remaining(err[self.budget_pair], self.budget), until)
