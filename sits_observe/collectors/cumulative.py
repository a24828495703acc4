"""Cumulative series read from servers' pages: a counter's increase since the last page (its decrease is a
restart), and a histogram's buckets moved onto the exported bucket layout, never lower."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..frame import BucketLayout

__all__ = ["Cumulative", "rebucket", "CUMULATIVE_SUFFIXES", "COUNT_MAX"]


def rebucket(src_edges: np.ndarray, src_counts: np.ndarray, layout: BucketLayout) -> np.ndarray:
    """Per-bucket counts on ``src_edges`` (finite uppers, then +Inf) moved to ``layout``, never lower."""
    edges = np.asarray(layout.edges)
    # first exported edge >= the source upper edge; a relative 1e-9 absorbs decimal noise (0.1 vs 0.1000000001)
    target = np.searchsorted(edges, np.asarray(src_edges) * (1 - 1e-9), side="left")
    out = np.zeros(layout.n, dtype=np.uint64)
    np.add.at(out, np.append(target, layout.n - 1), np.asarray(src_counts, dtype=np.uint64))
    return out


CUMULATIVE_SUFFIXES = ("_total", "_count", "_sum", "_bucket")  # series that only count up
COUNT_MAX = float(2**53)  # past this a float no longer counts by ones


class Cumulative:
    """Turns cumulative values (scalars or vectors) into deltas; a series' decrease is its restart;
    ``resets`` counts them."""

    def __init__(self) -> None:
        self._prev: dict[str, np.ndarray] = {}
        self._parts: dict[str, set[str]] = {}
        self.resets = 0

    def summed(self, name: str, parts: dict[str, float]) -> float | None:
        """The summed increase of one counter exported as several series (``parts``: label set -> value),
        each series on its own, as Prometheus' ``rate`` takes them: a series that appears counts from its
        next value, one that vanishes (a model unloaded) adds nothing, and one that went down (its model
        reloaded, or the server restarted) counts its new value.  None when no series had a previous value."""
        total, known = 0.0, False
        for labels, value in parts.items():
            key = f"{name}{{{labels}}}"
            prev = self._prev.get(key)
            self._prev[key] = np.atleast_1d(np.float64(value))
            if prev is not None and prev.shape == (1,):
                known = True
                if value < prev[0]:
                    self.resets += 1
                    total += value
                else:
                    total += value - float(prev[0])
        self.keep_only(name, parts.keys())
        return total if known else None

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, set[str]], int]:
        """What :meth:`restore` puts back (values are replaced, never changed in place: a shallow copy is one)."""
        return dict(self._prev), dict(self._parts), self.resets

    def restore(self, state: tuple[dict[str, np.ndarray], dict[str, set[str]], int]) -> None:
        self._prev, self._parts, self.resets = dict(state[0]), dict(state[1]), state[2]

    def keep_only(self, name: str, labels: Iterable[str]) -> None:
        """Forget the series of ``name`` whose label sets are not in ``labels`` (bounded memory)."""
        now = set(labels)
        for gone in self._parts.get(name, set()) - now:
            self._prev.pop(f"{name}{{{gone}}}", None)
        self._parts[name] = now

    def delta(self, key: str, value: float | np.ndarray) -> np.ndarray | None:
        """None on the first value (or after the vector changed shape); the increase otherwise."""
        cur = np.atleast_1d(np.asarray(value, dtype=np.float64))
        prev = self._prev.get(key)
        self._prev[key] = cur
        if prev is None or prev.shape != cur.shape:
            return None
        if (cur < prev).any():
            self.resets += 1
            return cur
        return cur - prev
