"""SeriesStore: the last N ticks of every Frame in preallocated numpy ring buffers.

Each tick writes one row of each ring; the per-tick path allocates nothing per series (new series only
extend a registry, up to ``max_series``; rings grow by doubling, never per tick).  Readers get copies
of windows, oldest first, gathered for the asked series only (never a copy of every series: a reader
holds the lock that the tick and the scrape need).  Cumulative histogram totals for export are kept beside the rings, so a
scrape never walks the history.  All methods are thread-safe (one lock; writes hold it briefly).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import StoreError
from ..frame import GPU_FIELD_INDEX, GPU_FIELDS, HOST_FIELDS, BucketLayout, Frame, GpuFrame, GpuInfo, Sample
from .check import malformed
from .keys import KeyTable
from .quantiles import mean_rows, quantile_rows

__all__ = ["SeriesStore", "HistTotal"]

HOST_INDEX = {f.name: i for i, f in enumerate(HOST_FIELDS)}
HistTotal = tuple[str, str, np.ndarray, float, float]  # stage, workload, cumulative counts, sum, last ts


class SeriesStore:
    """Ring buffers for histograms, GPU, host and workload series; see the module docstring."""

    def __init__(self, layout: BucketLayout, history: int = 3600, max_series: int = 1024) -> None:
        self.layout = layout
        self.history = int(history)
        self._uppers = layout.uppers()
        self._lock = threading.RLock()
        self._n = 0
        self._ts = np.full(self.history, np.nan)
        self._interval = np.full(self.history, np.nan)
        self.hists = KeyTable(max_series)
        b = layout.n
        self._hcounts = np.zeros((self.history, 16, b), dtype=np.uint32)
        self._hsum = np.zeros((self.history, 16))
        self._hcum = np.zeros((16, b), dtype=np.uint64)
        self._hcum_sum = np.zeros(16)
        self._hlast = np.full(16, -np.inf)
        self.gauges = KeyTable(max_series)
        self._gauges = np.full((self.history, 16), np.nan)
        self.counters = KeyTable(max_series)
        self._counters = np.zeros((self.history, 16))
        self._ctotal = np.zeros(16)
        self._host = np.full((self.history, len(HOST_FIELDS)), np.nan)
        self._gpu_info: tuple[GpuInfo, ...] = ()
        self._gpu = np.full((self.history, 0, len(GPU_FIELDS)), np.nan)
        self._gpu_healthy: np.ndarray | None = None  # of the latest tick; None when it had no GPU data
        self._samples: list[Sample] = []

    # ---- writing -------------------------------------------------------------------------------

    def ingest(self, frame: Frame) -> None:
        """Append one tick.  A frame the store cannot take (the daemon checks each source's part first, see
        :meth:`check`) raises :class:`StoreError` and is kept as a tick without data, so the row a failed
        write began is never read as data and the ticks before it stay as they were (cumulative totals keep
        what was added before the failure)."""
        with self._lock:
            t = self._n % self.history
            try:
                self._write(t, frame)
            except Exception as exc:
                self._blank(t, frame)
                raise StoreError(f"tick not stored, kept without data: {type(exc).__name__}: {exc}") from exc
            finally:
                self._n += 1

    def check(self, frame: Frame) -> str | None:
        """What in ``frame`` this store could not take, named (see :mod:`.check`); None when it can take it all.
        Call it from the thread that ingests (it reads the key tables without the lock)."""
        return malformed(frame, self.layout.n, (self.hists, self.gauges, self.counters), self._gpu_info)

    def _write(self, t: int, frame: Frame) -> None:
        self._ts[t] = frame.ts
        self._interval[t] = frame.interval
        self._ingest_hists(t, frame)
        self._ingest_scalars(t, frame)
        self._host[t] = np.nan
        for name, value in frame.host.items():
            i = HOST_INDEX.get(name)
            if i is not None:
                self._host[t, i] = value
        self._ingest_gpu(t, frame.gpu)
        self._samples = list(frame.samples)

    def _blank(self, t: int, frame: Frame) -> None:
        for ring, value in ((self._ts, frame.ts), (self._interval, frame.interval)):
            try:
                ring[t] = value
            except (TypeError, ValueError):
                ring[t] = np.nan
        self._hcounts[t] = 0
        self._hsum[t] = 0.0
        self._gauges[t] = np.nan
        self._counters[t] = 0.0
        self._host[t] = np.nan
        self._gpu[t] = np.nan
        self._gpu_healthy = None
        self._samples = []

    def _ingest_hists(self, t: int, frame: Frame) -> None:
        self._hcounts[t] = 0
        self._hsum[t] = 0.0
        for key, delta in frame.hists.items():
            row = self.hists.row(key)
            if row is None:
                continue
            if row >= self._hcounts.shape[1]:
                self._grow_hists(row + 1)
            self._hcounts[t, row] = delta.counts
            self._hsum[t, row] = delta.sum
            self._hcum[row] += delta.counts.astype(np.uint64)
            self._hcum_sum[row] += delta.sum
            if delta.counts.any():
                self._hlast[row] = frame.ts

    def _grow_hists(self, need: int) -> None:
        cap = self._hcounts.shape[1]
        new = max(need, 2 * cap)
        pad = new - cap
        self._hcounts = np.concatenate([self._hcounts, np.zeros((self.history, pad, self.layout.n), np.uint32)], 1)
        self._hsum = np.concatenate([self._hsum, np.zeros((self.history, pad))], 1)
        self._hcum = np.concatenate([self._hcum, np.zeros((pad, self.layout.n), np.uint64)])
        self._hcum_sum = np.concatenate([self._hcum_sum, np.zeros(pad)])
        self._hlast = np.concatenate([self._hlast, np.full(pad, -np.inf)])

    def _ingest_scalars(self, t: int, frame: Frame) -> None:
        self._gauges[t] = np.nan
        for key, value in frame.workload_gauges.items():
            row = self.gauges.row(key)
            if row is not None:
                if row >= self._gauges.shape[1]:
                    self._gauges = _grow_cols(self._gauges, row + 1, np.nan)
                self._gauges[t, row] = value
        self._counters[t] = 0.0
        for key, delta in frame.counters.items():
            row = self.counters.row(key)
            if row is not None:
                if row >= self._counters.shape[1]:
                    self._counters = _grow_cols(self._counters, row + 1, 0.0)
                    self._ctotal = np.concatenate([self._ctotal, np.zeros(self._counters.shape[1] - len(self._ctotal))])
                self._counters[t, row] = delta
                self._ctotal[row] += delta

    def _ingest_gpu(self, t: int, gpu: GpuFrame | None) -> None:
        if gpu is None:  # the GPU source is down: nothing is known, healthy or not
            self._gpu[t] = np.nan
            self._gpu_healthy = None
            return
        if gpu.info != self._gpu_info:
            if len(gpu.info) != len(self._gpu_info):
                self._gpu = np.full((self.history, len(gpu.info), len(GPU_FIELDS)), np.nan)
            self._gpu_info = gpu.info
        self._gpu[t] = gpu.values
        self._gpu_healthy = gpu.healthy.copy()

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
            return self._hcounts[np.ix_(rows, cols)].sum(axis=1, dtype=np.uint64)

    def hist_sum_window(self, stage: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        with self._lock:
            cols = self.hists.rows_for(stage, workload)
            rows = self._rows(last)
            return self._hsum[np.ix_(rows, cols)].sum(axis=1) if cols else np.zeros(len(rows))

    def quantile_series(self, q: float, stage: str, workload: str | None = None,
                        last: int | None = None) -> np.ndarray:
        """The ``q`` quantile of each tick (seconds, NaN for ticks without events)."""
        return quantile_rows(self.hist_window(stage, workload, last), self._uppers, q)

    def quantile(self, q: float, stage: str, workload: str | None = None, last: int | None = None) -> float:
        """The ``q`` quantile over the whole window (seconds, NaN without events)."""
        counts = self.hist_window(stage, workload, last).sum(axis=0, keepdims=True)
        return float(quantile_rows(counts, self._uppers, q)[0])

    def mean_series(self, stage: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        return mean_rows(self.hist_sum_window(stage, workload, last), self.hist_window(stage, workload, last))

    def hist_totals(self, stale_after: float = float("inf")) -> list[HistTotal]:
        """Cumulative counts and sums per (stage, workload) for export, skipping stale series."""
        with self._lock:
            now = self.latest_ts
            out = []
            for (stage, workload), row in self.hists.items():
                if row < len(self._hlast) and now - self._hlast[row] <= stale_after:
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
            vals = self._gauges[np.ix_(rows, cols)]
            with np.errstate(invalid="ignore"):
                out = np.nansum(vals, axis=1)
            out[np.isnan(vals).all(axis=1)] = np.nan
            return out

    def counter_window(self, name: str, workload: str | None = None, last: int | None = None) -> np.ndarray:
        """Per-tick counter deltas, summed over workloads when ``workload`` is None."""
        with self._lock:
            cols = self.counters.rows_for(name, workload)
            rows = self._rows(last)
            return self._counters[np.ix_(rows, cols)].sum(axis=1) if cols else np.zeros(len(rows))

    def gauge_latest(self) -> list[tuple[str, str, float]]:
        with self._lock:
            if not self._n:
                return []
            t = (self._n - 1) % self.history
            return [(n, w, float(self._gauges[t, r])) for (n, w), r in self.gauges.items()
                    if r < self._gauges.shape[1] and not np.isnan(self._gauges[t, r])]

    def counter_totals(self) -> list[tuple[str, str, float]]:
        with self._lock:
            return [(n, w, float(self._ctotal[r])) for (n, w), r in self.counters.items() if r < len(self._ctotal)]

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

    def known(self) -> Iterable[tuple[str, str]]:
        return self.hists.keys()


def _grow_cols(arr: np.ndarray, need: int, fill: float) -> np.ndarray:
    pad = max(need, 2 * arr.shape[1]) - arr.shape[1]
    return np.concatenate([arr, np.full((arr.shape[0], pad), fill)], axis=1)
