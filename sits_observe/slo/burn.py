"""Burn-rate maths as pure, vectorised functions (table-tested in tests/slo/test_burn.py).

Conventions shared with the generated Prometheus rules (:mod:`.rules`): a window with no events has
no error ratio (NaN), so it never fires; conditions compare with ``>`` for burn and ``>=`` for
``min_rate``, as the PromQL does.
"""

from __future__ import annotations

import numpy as np

__all__ = ["error_ratio", "burn_rate", "budget_remaining", "tier_active", "inhibit"]


def error_ratio(good: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``(total - good) / total``; NaN where there were no events."""
    good = np.asarray(good, dtype=np.float64)
    total = np.asarray(total, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, (total - good) / total, np.nan)


def burn_rate(err: np.ndarray, objective: np.ndarray | float) -> np.ndarray:
    """How many times faster than allowed the error budget is spent: ``err / (1 - objective)``."""
    return np.asarray(err, dtype=np.float64) / (1.0 - np.asarray(objective, dtype=np.float64))


def budget_remaining(err: np.ndarray, objective: np.ndarray | float) -> np.ndarray:
    """Fraction of the window's error budget left: ``1 - err / (1 - objective)``; 1 with no events, < 0 when overspent."""
    err = np.asarray(err, dtype=np.float64)
    return np.where(np.isnan(err), 1.0, 1.0 - burn_rate(np.nan_to_num(err), objective))


def tier_active(err_long: np.ndarray, err_short: np.ndarray, rate_long: np.ndarray, rate_short: np.ndarray,
                threshold: np.ndarray, min_rate: np.ndarray) -> np.ndarray:
    """Both windows' error ratios above ``threshold`` (= factor * (1 - objective)) and both event rates >= ``min_rate``."""
    with np.errstate(invalid="ignore"):
        return ((np.asarray(err_long) > threshold) & (np.asarray(err_short) > threshold)
                & (np.asarray(rate_long) >= min_rate) & (np.asarray(rate_short) >= min_rate))


def inhibit(active: np.ndarray) -> np.ndarray:
    """Keep, per row, only the first (fastest) active tier: ``(slos, tiers)`` bool -> same shape."""
    active = np.asarray(active, dtype=bool)
    earlier = np.cumsum(active, axis=-1) - active
    return active & (earlier == 0)
