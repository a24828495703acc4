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


def fire(active: np.ndarray, held_until: np.ndarray, last_true: np.ndarray, ts: float, keep: np.ndarray,
         hold_for: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which tiers fire now, per SLO row and tier column (fastest first): ``(firing, held, last_true, held_until)``.

    A tier's condition is *kept* (the flap guard) while it is active or was active at an evaluation at
    most ``keep`` seconds ago; ``last_true`` is the time of that evaluation (NaN when not kept).  While a
    faster tier is kept, a slower kept tier is *held* (it fires nothing: one incident, one alert) and
    ``held_until`` is the faster tiers' latest ``last_true`` plus the slower tier's ``hold_for`` (its short
    window plus its ``keep_firing_for``): until then its short window may still hold the faster
    incident's errors, or its flap guard bridge a dip back to them.  Once no faster tier is kept, it
    stays held while its condition last held no later than ``held_until``, and fires if it holds after
    that: the burn goes on below the faster rate (before, a held tier stayed quiet for as long as its
    own condition held, so a page burn that slowed from 20x to 8x resolved and was never paged again).
    A tier fires when kept and not held.  ``held_until`` and ``last_true`` are the previous
    evaluation's (NaN: none); rows are independent.
    """
    active = np.asarray(active, dtype=bool)
    with np.errstate(invalid="ignore"):
        kept = active | (ts - np.asarray(last_true) <= keep)
    last = np.where(active, ts, np.where(kept, last_true, np.nan))
    faster = (np.cumsum(kept, axis=-1) - kept) > 0
    latest = np.fmax.accumulate(np.where(kept, last, np.nan), axis=-1)  # NaN-ignoring running max
    latest = np.concatenate([np.full(latest.shape[:-1] + (1,), np.nan), latest[..., :-1]], axis=-1)
    until = np.where(kept, np.where(faster, latest + hold_for, held_until), np.nan)
    with np.errstate(invalid="ignore"):
        held = kept & (faster | (last <= until))
    return kept & ~held, held, last, until
