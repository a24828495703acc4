"""SeriesStore: the last N ticks of every Frame in preallocated numpy ring buffers.

Each tick writes one cell of each series in use; the per-tick path allocates nothing per series (new series
only extend a registry, up to ``max_series``; the rings are that wide from the start, mapped as used).
Readers get copies of windows, oldest first, gathered for the asked series only (never a copy of every
series: a reader holds the lock that the tick and the scrape need).  Cumulative histogram totals for export
are kept beside the rings, so a scrape never walks the history.  All methods are thread-safe (one lock; writes
hold it briefly).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

from ..frame import GPU_FIELD_INDEX, HOST_FIELDS, GpuFrame, GpuInfo, Sample
from .quantiles import mean_rows, quantile_rows
from .rings import HOST_INDEX, SeriesRings

__all__ = ["SeriesStore", "HistTotal"]

HistTotal = tuple[str, str, np.ndarray, float, float]  # stage, workload, cumulative counts, sum, last ts


class SeriesStore(SeriesRings):
    """Ring buffers for histograms, GPU, host and workload series; see the module docstring."""

    # ---- time ----------------------------------------------------------------------------------

    @property
    def ticks(self) -> int:
        """Ticks ingested since start (not capped by the history)."""
        return self._n

    def reading(self) -> threading.RLock:
        """The store's lock: hold it (``with store.reading():``) to read several windows of the same ticks."""
        return self._lock

    @property
    def latest_ts(self) -> float:
        with self._lock:
            return float(self._ts[(self._n - 1) % self.history]) if self._n else float("nan")

    def _rows(self, last: int | None) -> np.ndarray:
        have = min(self._n, self.history)
        n = have if last is None else max(0, min(int(last), have))
        return np.arange(self._n - n, self._n) % self.history

    def ts(self, last: int | None = None) -> np.ndarray:
        """Timestamps (source clock) of the last ``last`` ticks, oldest first (fewer right after start)."""
        with self._lock:
            return self._ts[self._rows(last)].copy()

    def intervals(self, last: int | None = None) -> np.ndarray:
        with self._lock:
            return self._interval[self._rows(last)].copy()

    # ---- histograms ----------------------------------------------------------------------------

    def hist_window(self, stage: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        """Per-tick bucket deltas ``(n, B)``; ``workload=None`` sums every workload of the stage."""
        with self._lock:
            cols = self.hists.rows_for(stage, workload)
            rows = self._rows(last)
            if not cols:
                return np.zeros((len(rows), self.layout.n), dtype=np.uint64)
            return self._hcounts[np.ix_(cols, rows)].sum(axis=0, dtype=np.uint64)

    def hist_sum_window(self, stage: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        with self._lock:
            cols = self.hists.rows_for(stage, workload)
            rows = self._rows(last)
            return self._hsum[np.ix_(cols, rows)].sum(axis=0) if cols else np.zeros(len(rows))

    def quantile_series(self, q: float, stage: str, workload: str | None = None,
                        last: int | None = None) -> np.ndarray:
        """The ``q`` quantile of each tick (seconds, NaN for ticks without events)."""
        return quantile_rows(self.hist_window(stage, workload, last), self._uppers, q)

    def quantile(self, q: float, stage: str, workload: str | None = None, last: int | None = None) -> float:
        """The ``q`` quantile over the whole window (seconds, NaN without events)."""
        counts = self.hist_window(stage, workload, last).sum(axis=0, keepdims=True)
        return float(quantile_rows(counts, self._uppers, q)[0])

    def quantiles(self, qs: tuple[float, ...], stage: str, workload: str | None = None, last: int | None = None
                  ) -> tuple[int, list[float]]:
        """Events and the ``qs`` quantiles over the whole window, all of one read of it (NaN without events)."""
        counts = self.hist_window(stage, workload, last).sum(axis=0, keepdims=True)
        return int(counts.sum()), [float(quantile_rows(counts, self._uppers, q)[0]) for q in qs]

    def mean_series(self, stage: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        """The mean of each tick (seconds, NaN for ticks without events): sums and counts of the same ticks."""
        with self._lock:
            return mean_rows(self.hist_sum_window(stage, workload, last), self.hist_window(stage, workload, last))

    def hist_totals(self, stale_after: float = float("inf")) -> list[HistTotal]:
        """Cumulative counts and sums per (stage, workload) for export, skipping stale series."""
        with self._lock:
            now = self.latest_ts
            out = []
            for (stage, workload), row in self.hists.items():
                if now - self._hlast[row] <= stale_after:
                    out.append((stage, workload, self._hcum[row].copy(), float(self._hcum_sum[row]),
                                float(self._hlast[row])))
            return out

    def stages(self) -> list[str]:
        return sorted({stage for stage, _ in self.hists.keys()})

    def workloads(self) -> list[str]:
        return sorted({w for _, w in self.hists.keys()} | {w for _, w in self.gauges.keys()})

    # ---- gauges and counters -------------------------------------------------------------------

    def gpu_info(self) -> tuple[GpuInfo, ...]:
        return self._gpu_info

    def gpu_window(self, field: str, last: int | None = None) -> np.ndarray:
        """``(n, gpus)`` values of one GPU field (NaN where not reported)."""
        j = GPU_FIELD_INDEX[field]
        with self._lock:
            return self._gpu[self._rows(last), :, j].copy()

    def gpu_latest(self) -> GpuFrame | None:
        """The latest tick's GPU data; None when that tick had none (no source, or it failed)."""
        with self._lock:
            if not self._gpu_info or self._gpu_healthy is None:
                return None
            t = (self._n - 1) % self.history
            return GpuFrame(self._gpu_info, self._gpu[t].copy(), self._gpu_healthy.copy())

    def host_window(self, field: str, last: int | None = None) -> np.ndarray:
        with self._lock:
            return self._host[self._rows(last), HOST_INDEX[field]].copy()

    def host_latest(self) -> dict[str, float]:
        with self._lock:
            if not self._n:
                return {}
            row = self._host[(self._n - 1) % self.history]
            return {f.name: float(v) for f, v in zip(HOST_FIELDS, row) if not np.isnan(v)}

    def workload_gauge_window(self, name: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        """Per-tick gauge, summed over workloads when ``workload`` is None (NaN when never reported)."""
        with self._lock:
            cols = self.gauges.rows_for(name, workload)
            rows = self._rows(last)
            if not cols:
                return np.full(len(rows), np.nan)
            vals = self._gauges[np.ix_(cols, rows)].T
            with np.errstate(invalid="ignore"):
                out = np.nansum(vals, axis=1)
            out[np.isnan(vals).all(axis=1)] = np.nan
            return out

    def counter_window(self, name: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        """Per-tick counter deltas, summed over workloads when ``workload`` is None."""
        with self._lock:
            cols = self.counters.rows_for(name, workload)
            rows = self._rows(last)
            return self._counters[np.ix_(cols, rows)].sum(axis=0) if cols else np.zeros(len(rows))

    def gauge_latest(self) -> list[tuple[str, str, float]]:
        with self._lock:
            if not self._n:
                return []
            t = (self._n - 1) % self.history
            return [(n, w, float(self._gauges[r, t])) for (n, w), r in self.gauges.items()
                    if not np.isnan(self._gauges[r, t])]

    def counter_totals(self) -> list[tuple[str, str, float]]:
        with self._lock:
            return [(n, w, float(self._ctotal[r])) for (n, w), r in self.counters.items()]

    def latest_samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    # ---- feature windows -----------------------------------------------------------------------

    def window(self, features: Sequence[str], last: int) -> np.ndarray:
        """``(n, F)`` matrix of derived series (see :mod:`sits_observe.store.features`)."""
        from .features import feature_series

        with self._lock:
            cols = [feature_series(self, name, last) for name in features]
        return np.column_stack(cols) if cols else np.zeros((0, 0))

    @property
    def rejected_series(self) -> int:
        return self.hists.rejected + self.gauges.rejected + self.counters.rejected

    @property
    def first_refused(self) -> tuple[str, str] | None:
        """The first series the cap refused (name, workload), None while none was."""
        return next((t.first_refused for t in (self.hists, self.gauges, self.counters) if t.first_refused), None)

    def known(self) -> Iterable[tuple[str, str]]:
        return self.hists.keys()
