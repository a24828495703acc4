"""The checks a classifier model must pass against the daemon's settings before its verdicts mean anything: the
tick step it was trained at, a store ring that holds its window, the bucket edges its latency quantiles came
from.  The engine runs them at load and on each tick; ``check-config`` runs the first two as errors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ..store.config import DEFAULT_BUCKETS
from ..histogram import snap_edges
from .model import RcaModel

__all__ = ["other_buckets", "other_step", "short_history"]


def other_step(model: RcaModel, path: Path, tick: float | None) -> str | None:
    """Why ``model`` cannot read the windows of a daemon ticking every ``tick`` seconds: trained at another tick
    step, its window, baseline hour and occlusion minutes (all counts of ticks) would span other times.  Files
    from before the step was recorded say nothing and are taken as they are."""
    trained = model.training.get("tick_seconds")
    if not isinstance(trained, float) or tick is None or math.isclose(trained, tick, rel_tol=0.01):
        return None
    window = model.window
    return (f"{path}: trained on ticks of {trained:g} s, but this daemon ticks every {tick:g} s, so its "
            f"window of {window} ticks would span {window * tick:g} s instead of {window * trained:g} s; "
            f"set tick_interval: {trained:g}, or train a model on a dataset recorded every {tick:g} s")


def other_buckets(model: RcaModel, edges: Sequence[float]) -> str | None:
    """Why ``model`` reads other latency quantiles from a store of bucket ``edges`` than it was trained on: the
    store interpolates quantiles within its buckets, and ``rca dataset`` bins with the default ``store.buckets``."""
    trained = snap_edges(DEFAULT_BUCKETS)
    quantiles = [f for f in model.features if f.startswith("stage.") and f.endswith((".p50", ".p90", ".p95", ".p99",
                                                                                     ".tail"))]
    if tuple(edges) == trained or not quantiles:
        return None
    lacks, adds = sorted(set(trained) - set(edges)), sorted(set(edges) - set(trained))
    parts = [f"lacks {len(lacks)} of the default edges ({_edges(lacks)})"] if lacks else []
    parts += [f"adds {_edges(adds)}"] if adds else []
    diff = "; ".join(parts)
    return (f"store.buckets differ from the default ones that `rca dataset` bins training data with ({diff}), so "
            f"the model's {len(quantiles)} latency quantile features are interpolated within other buckets than in "
            "training and its verdicts shift (docs/rca.md: removing default edges moves them most); keep every "
            "default edge, or train a model on data binned with these buckets")


def _edges(edges: Sequence[float]) -> str:
    return ", ".join(f"{e:.2g}" for e in edges[:6]) + (", ..." if len(edges) > 6 else "")  # as configured, about


def short_history(model: RcaModel, history: int) -> str | None:
    """Why a store ring of ``history`` ticks cannot feed ``model``: its window would silently be cut to the ring."""
    if history >= model.window:
        return None
    return (f"store.history is {history} ticks, shorter than the model's window of {model.window} ticks; set "
            f"store.history to at least {model.window} (a restart applies it)")
