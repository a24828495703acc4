"""Read each SLO's good and total events of one tick from a Frame.

Latency SLIs count the stage histogram's bucket deltas: good = events in buckets with ``le`` at or
under the threshold (an exact bucket edge, so no event is counted on the wrong side).  Ratio SLIs take
the Frame's counter deltas.  Without a ``workload`` every workload of the stage or counter is summed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import SloError
from ..frame import Frame
from .spec import SloSpec

__all__ = ["SliReader", "threshold_index"]


def threshold_index(threshold: float, buckets: Sequence[float]) -> int:
    """Index of ``threshold`` among the configured (unsnapped) ``store.buckets`` edges."""
    for i, edge in enumerate(buckets):
        if math.isclose(threshold, edge, rel_tol=1e-9):
            return i
    raise SloError(f"latency threshold {threshold:g} s is not one of store.buckets; add it there")


class SliReader:
    """Per-tick ``(good, total)`` arrays, one entry per spec, in spec order."""

    def __init__(self, specs: Sequence[SloSpec], buckets: Sequence[float]) -> None:
        self.n = len(specs)
        self.n_buckets = len(buckets) + 1
        self._latency = [(i, s.latency.stage, s.latency.workload, threshold_index(s.latency.threshold, buckets))
                         for i, s in enumerate(specs) if s.latency is not None]
        self._ratio = [(i, s.ratio.total, s.ratio.bad, s.ratio.good, s.ratio.workload)
                       for i, s in enumerate(specs) if s.ratio is not None]

    def read(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        good = np.zeros(self.n)
        total = np.zeros(self.n)
        cumulative: dict[tuple[str, str | None], np.ndarray | None] = {}
        for row, stage, workload, idx in self._latency:
            key = (stage, workload)
            if key not in cumulative:
                cumulative[key] = self._cumulative(frame, stage, workload)
            cum = cumulative[key]
            if cum is not None:
                good[row], total[row] = cum[idx], cum[-1]
        if self._ratio:
            counters = frame.counters
            summed: dict[str, float] = {}
            for (name, _), v in counters.items():
                summed[name] = summed.get(name, 0.0) + v

            def get(name: str | None, workload: str | None) -> float:
                if name is None:
                    return math.nan
                return summed.get(name, 0.0) if workload is None else counters.get((name, workload), 0.0)

            for row, t_name, bad, good_name, workload in self._ratio:
                t = get(t_name, workload)
                g = t - get(bad, workload) if bad is not None else get(good_name, workload)
                total[row], good[row] = t, min(max(g, 0.0), t)
        return good, total

    def _cumulative(self, frame: Frame, stage: str, workload: str | None) -> np.ndarray | None:
        if workload is not None:
            h = frame.hists.get((stage, workload))
            counts = None if h is None else h.counts
        else:
            parts = [h.counts for (s, _), h in frame.hists.items() if s == stage]
            counts = np.sum(parts, axis=0) if parts else None
        if counts is None or len(counts) != self.n_buckets:
            return None
        return np.cumsum(counts, dtype=np.float64)
