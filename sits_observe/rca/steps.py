"""Per-step rules that the training windows (:mod:`.dataset`) and the daemon's windows read alike: which features
say a step was observed (:func:`observed_columns`), gaps carried forward (:func:`fill_forward`, for the encoder),
and the entity's own *baseline* (:class:`Baseline`, :func:`rolling_baseline`: the per-feature median of the
preceding ``horizon`` steps, refreshed every ``every`` steps), the figure the daemon keeps from its store."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_BASELINE", "Baseline", "fill_forward", "observed_columns", "rolling_baseline"]


def fill_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Carry the last observed value forward along the step axis (``-2``) of ``(..., steps, F)``.

    Returns ``(filled, missing)``; ``missing`` marks the cells that were NaN.  Cells before a column's
    first observation stay NaN (the encoder maps them to the feature's typical value).
    """
    missing = np.isnan(x)
    steps = np.arange(x.shape[-2]).reshape(-1, 1)
    idx = np.maximum.accumulate(np.where(missing, 0, steps), axis=-2)
    return np.take_along_axis(x, idx, axis=-2), missing


def observed_columns(features: Sequence[str]) -> np.ndarray:
    """``(F,)`` bool: the features whose values say whether a step had data (every one but the rates, which read
    0 on a step without any; all of them where there are only rates).  A step is observed when one of them has
    a value, in training windows and in the daemon's alike."""
    rates = np.array([f.endswith(".rate") for f in features], dtype=bool)
    return ~rates if (~rates).any() else np.ones_like(rates)


@dataclass(frozen=True, slots=True)
class Baseline:
    """Per-feature median of the last ``horizon`` steps, recomputed every ``every`` steps."""

    horizon: int = 3600
    every: int = 60


DEFAULT_BASELINE = Baseline()


def rolling_baseline(values: np.ndarray, b: Baseline) -> np.ndarray:
    """``(T, F)``: row ``t`` holds the baseline last refreshed at step ``u = t - t % every``, i.e. the
    NaN-ignoring median of rows ``u - horizon + 1 .. u`` (fewer at the start); NaN where never observed."""
    out = np.full(values.shape, np.nan, dtype=np.float32)
    with warnings.catch_warnings():  # all-NaN columns: NaN is the answer
        warnings.simplefilter("ignore", RuntimeWarning)
        for u in range(0, len(values), b.every):
            out[u:u + b.every] = np.nanmedian(values[max(0, u - b.horizon + 1):u + 1], axis=0)
    return out
