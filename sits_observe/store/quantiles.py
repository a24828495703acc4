"""Pure histogram maths on the exported bucket layout (table-driven tests in tests/store/)."""

from __future__ import annotations

import numpy as np

__all__ = ["quantile_rows", "mean_rows"]


def quantile_rows(counts: np.ndarray, uppers: np.ndarray, q: float) -> np.ndarray:
    """The ``q`` quantile of each row of per-bucket counts, interpolating linearly inside buckets.

    ``counts`` has shape ``(rows, B)`` (non-cumulative), ``uppers`` the ``B`` upper edges with +Inf last.
    The first bucket's lower edge is 0; a quantile in the +Inf bucket returns the last finite edge
    (as Prometheus' ``histogram_quantile`` does).  Rows without events give NaN.
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    cum = np.cumsum(counts, axis=1)
    total = cum[:, -1]
    rank = q * total
    # first bucket whose cumulative count reaches the rank
    idx = (cum < rank[:, None]).sum(axis=1)
    idx = np.minimum(idx, counts.shape[1] - 1)
    finite = uppers[:-1]
    lowers = np.concatenate(([0.0], finite))
    below = np.where(idx > 0, cum[np.arange(len(idx)), np.maximum(idx - 1, 0)], 0.0)
    inb = counts[np.arange(len(idx)), idx]
    frac = np.divide(rank - below, inb, out=np.zeros_like(rank), where=inb > 0)
    lo = lowers[idx]
    hi = np.where(idx < len(finite), uppers[np.minimum(idx, len(uppers) - 1)], finite[-1])
    out = np.where(idx < len(finite), lo + (hi - lo) * frac, finite[-1])
    out[total <= 0] = np.nan
    return out


def mean_rows(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Exact mean per row from ``_sum`` and per-bucket counts; NaN where there were no events."""
    n = np.asarray(counts, dtype=np.float64).sum(axis=-1)
    return np.divide(sums, n, out=np.full_like(n, np.nan), where=n > 0)
