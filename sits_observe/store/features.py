"""Derived series by name, for the classifier and the UI: ``store.window(names, last)``.

Grammar (``@workload`` narrows a stage or workload series to one workload):

* ``stage.<stage>[@<workload>].<p50|p90|p95|p99|mean|rate|count|tail>`` (``tail`` = p99 - p50, seconds;
  ``rate`` = events per second);
* ``gpu.<field>.<mean|max|min|spread|std|<index>>`` over GPUs (``spread`` = max - min);
* ``host.<field>``;
* ``workload.<gauge>[@<workload>].sum`` and ``workload.<counter>[@<workload>].rate``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from ..errors import StoreError

if TYPE_CHECKING:
    from .series import SeriesStore

__all__ = ["feature_series", "unseen"]

_QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


def _split(name: str) -> tuple[str, str | None]:
    base, _, workload = name.partition("@")
    return base, workload or None


def _stage(store: SeriesStore, stage: str, stat: str, last: int) -> np.ndarray:
    base, wl = _split(stage)
    if stat in _QUANTILES:
        return store.quantile_series(_QUANTILES[stat], base, wl, last)
    if stat == "tail":
        return store.quantile_series(0.99, base, wl, last) - store.quantile_series(0.5, base, wl, last)
    if stat == "mean":
        return store.mean_series(base, wl, last)
    count = store.hist_window(base, wl, last).sum(axis=1).astype(np.float64)
    if stat == "count":
        return count
    if stat == "rate":
        return count / store.intervals(last)
    raise StoreError(f"feature stage.{stage}.{stat}: unknown statistic; use p50|p90|p95|p99|mean|rate|count|tail")


_GPU_AGGREGATES = ("mean", "max", "min", "spread", "std")


def _gpu(store: SeriesStore, field: str, agg: str, last: int) -> np.ndarray:
    try:
        with store.reading():  # the rows and the GPUs they are of, of the same ticks
            vals, gpus = store.gpu_window(field, last), store.gpu_info()
    except KeyError:
        raise StoreError(f"feature gpu.{field}.{agg}: unknown GPU field") from None
    if not (agg.isdigit() or agg in _GPU_AGGREGATES):  # checked first: also on a host without GPUs (yet)
        raise StoreError(f"feature gpu.{field}.{agg}: unknown aggregate; use mean|max|min|spread|std|<gpu index>")
    n = len(vals)
    if vals.shape[1] == 0:
        return np.full(n, np.nan)
    if agg.isdigit():  # the GPU of that index, wherever its row is (GPU 4 is row 0 when it is the first listed)
        row = {g.index: k for k, g in enumerate(gpus)}.get(int(agg))
        return vals[:, row] if row is not None else np.full(n, np.nan)
    with warnings.catch_warnings():  # all-NaN ticks warn in nanmean/nanmax; NaN is the answer
        warnings.simplefilter("ignore", RuntimeWarning)
        if agg == "mean":
            return np.nanmean(vals, axis=1)
        if agg == "max":
            return np.nanmax(vals, axis=1)
        if agg == "min":
            return np.nanmin(vals, axis=1)
        if agg == "spread":
            return np.nanmax(vals, axis=1) - np.nanmin(vals, axis=1)
        return np.nanstd(vals, axis=1)  # "std"


def feature_series(store: SeriesStore, name: str, last: int) -> np.ndarray:
    """One derived series of length ``min(last, ticks held)``; raises StoreError for a bad name."""
    kind, _, rest = name.partition(".")
    if kind == "host":
        try:
            return store.host_window(rest, last)
        except KeyError:
            raise StoreError(f"feature {name}: unknown host field") from None
    head, _, stat = rest.rpartition(".")
    if not head:
        raise StoreError(f"feature {name!r}: expected <kind>.<name>.<statistic>")
    if kind == "stage":
        return _stage(store, head, stat, last)
    if kind == "gpu":
        return _gpu(store, head, stat, last)
    if kind == "workload":
        base, wl = _split(head)
        if stat == "sum":
            return store.workload_gauge_window(base, wl, last)
        if stat == "rate":
            return store.counter_window(base, wl, last) / store.intervals(last)
    raise StoreError(f"feature {name!r}: unknown kind or statistic")


def unseen(store: SeriesStore, names: list[str] | tuple[str, ...]) -> list[str]:
    """The names whose series the store has never had: no histogram of that stage, no gauge or counter of
    that name, no GPU.  Such a rate reads as 0 and anything else as missing, which a model trained where
    they existed does not expect (a host without that probe, a workload named otherwise)."""
    out = []
    for name in names:
        kind, _, rest = name.partition(".")
        head = rest.rpartition(".")[0]
        base, wl = _split(head)
        if kind == "stage":
            known = bool(store.hists.rows_for(base, wl))
        elif kind == "workload":
            known = bool(store.gauges.rows_for(base, wl) or store.counters.rows_for(base, wl))
        elif kind == "gpu":
            known = bool(store.gpu_info())
        else:
            known = True
        if not known:
            out.append(name)
    return out
