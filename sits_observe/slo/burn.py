"""Burn-rate maths as pure, vectorised functions (table-tested in tests/slo/test_burn.py).

Conventions shared with the generated Prometheus rules (:mod:`.rules`): a window with no events has
no error ratio (NaN), so it never fires; conditions compare with ``>`` for burn and ``>=`` for
``min_rate``, as the PromQL does.
"""

from __future__ import annotations

import numpy as np

__all__ = ["error_ratio", "burn_rate", "budget_remaining", "tier_active", "fire"]


def error_ratio(good: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``1 - good / total`` (the rules' form); NaN where there were no events."""
    good = np.asarray(good, dtype=np.float64)
    total = np.asarray(total, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, 1.0 - good / total, np.nan)


def burn_rate(err: np.ndarray, budget: np.ndarray | float) -> np.ndarray:
    """How many times faster than allowed the error budget is spent: ``err / budget``, budget = 1 - objective."""
    return np.asarray(err, dtype=np.float64) / np.asarray(budget, dtype=np.float64)


def budget_remaining(err: np.ndarray, budget: np.ndarray | float) -> np.ndarray:
    """Fraction of the window's error budget left: ``1 - err / budget``; 1 with no events, < 0 when overspent."""
    err = np.asarray(err, dtype=np.float64)
    return np.where(np.isnan(err), 1.0, 1.0 - burn_rate(np.nan_to_num(err), budget))


def tier_active(err_long: np.ndarray, err_short: np.ndarray, rate_short: np.ndarray, threshold: np.ndarray,
                min_rate: np.ndarray) -> np.ndarray:
    """Both windows' error ratios above ``threshold`` (= factor * (1 - objective)) and the short window
    saw at least ``min_rate`` events/s (where few events make the ratio noisy)."""
    with np.errstate(invalid="ignore"):
        return ((np.asarray(err_long) > threshold) & (np.asarray(err_short) > threshold)
                & (np.asarray(rate_short) >= min_rate))


def fire(active: np.ndarray, held: np.ndarray, last_true: np.ndarray, ts: float,
         keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which tiers fire now, per SLO row and tier column (fastest first): ``(firing, held, last_true)``.

    A tier's condition is *kept* (the flap guard) while it is active or was active at an evaluation at
    most ``keep`` seconds ago; ``last_true`` is the time of that evaluation (NaN when not kept).  A tier
    is *held* while kept and a faster tier is kept, or it was held at the previous evaluation: once a
    faster tier took over an incident, the slower ones resolve at once and stay quiet until their own
    kept condition lapses, so one incident is one alert.  A tier fires when kept and not held.
    ``held`` and ``last_true`` are the previous evaluation's; rows are independent.
    """
    active = np.asarray(active, dtype=bool)
    with np.errstate(invalid="ignore"):
        kept = active | (ts - np.asarray(last_true) <= keep)
    last = np.where(active, ts, np.where(kept, last_true, np.nan))
    faster = (np.cumsum(kept, axis=-1) - kept) > 0
    out_held = kept & (faster | np.asarray(held, dtype=bool))
    return kept & ~out_held, out_held, last
