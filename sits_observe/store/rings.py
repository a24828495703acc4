"""The series store's ring buffers and its write path: each tick's Frame into its cell of every series."""

from __future__ import annotations

import threading

import numpy as np

from ..errors import StoreError
from ..frame import GPU_FIELDS, HOST_FIELDS, BucketLayout, Frame, GpuFrame, GpuInfo, Sample
from .check import malformed
from .keys import KeyTable

__all__ = ["HOST_INDEX", "SeriesRings"]

HOST_INDEX = {f.name: i for i, f in enumerate(HOST_FIELDS)}
MAX_GPU_ROWS = 256  # GPUs kept a row of history each, the missing ones with the present ones


class SeriesRings:
    """The rings of :class:`~.series.SeriesStore` and the writes of one tick; its readers are in :mod:`.series`."""

    def __init__(self, layout: BucketLayout, history: int = 3600, max_series: int = 1024) -> None:
        self.layout = layout
        self.history = int(history)
        self._uppers = layout.uppers()
        self._lock = threading.RLock()
        self._n = 0
        self._ts = np.full(self.history, np.nan)
        self._interval = np.full(self.history, np.nan)
        # Every ring is as wide as the cap from the start, so it never grows: growing by copying held old and new
        # at once (up to twice the rings at full cardinality, past the unit's MemoryMax), and went past the cap.
        # np.zeros maps them lazily and a tick writes only the series in use, so their memory stays that of the
        # series seen: each ring is by series first, a series' whole history side by side (transparent huge
        # pages map 2 MiB at a touch: a layout by tick first touched every page of a ring in one history).
        self.hists = KeyTable(max_series)
        b, width = layout.n, int(max_series)
        self._hcounts = np.zeros((width, self.history, b), dtype=np.uint32)
        self._hsum = np.zeros((width, self.history))
        self._hcum = np.zeros((width, b), dtype=np.uint64)
        self._hcum_sum = np.zeros(width)
        self._hlast = np.full(width, -np.inf)
        self.gauges = KeyTable(max_series)
        self._gauges = np.zeros((width, self.history))  # NaN (never reported) from the first use of a column
        self._gauges_ready = 0  # columns filled with NaN so far
        self.counters = KeyTable(max_series)
        self._counters = np.zeros((width, self.history))
        self._ctotal = np.zeros(width)
        self._host = np.full((self.history, len(HOST_FIELDS)), np.nan)
        self._gpu_info: tuple[GpuInfo, ...] = ()  # every GPU seen, by index (a row each)
        self._gpu = np.full((self.history, 0, len(GPU_FIELDS)), np.nan)
        self._frame_gpus: tuple[GpuInfo, ...] = ()  # the last frame's GPUs, and their rows
        self._gpu_rows = np.zeros(0, dtype=np.intp)
        self._gpu_healthy: np.ndarray | None = None  # of the latest tick; None when it had no GPU data
        self._samples: list[Sample] = []

    # ---- writing -------------------------------------------------------------------------------

    def ingest(self, frame: Frame) -> None:
        """Append one tick.  A frame the store cannot take (the daemon checks each source's part first, see
        :meth:`check`) raises :class:`StoreError` and is kept as a tick without data, so the cells a failed
        write began are never read as data and the ticks before it stay as they were (cumulative totals keep
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
        return malformed(frame, self.layout.n, (self.hists, self.gauges, self.counters), self._frame_gpus)

    def _write(self, t: int, frame: Frame) -> None:
        self._ts[t] = frame.ts
        self._interval[t] = frame.interval
        self._clear(t)
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
        self._clear(t)
        self._host[t] = np.nan
        self._gpu[t] = np.nan
        self._gpu_healthy = None
        self._samples = []

    def _clear(self, t: int) -> None:
        """Tick ``t``'s cells of the series in use (the others are still zero, and unmapped)."""
        self._hcounts[:len(self.hists), t] = 0
        self._hsum[:len(self.hists), t] = 0.0
        self._gauges[:self._gauges_ready, t] = np.nan
        self._counters[:len(self.counters), t] = 0.0

    def _ingest_hists(self, t: int, frame: Frame) -> None:
        for key, delta in frame.hists.items():
            row = self.hists.row(key)
            if row is None:
                continue
            self._hcounts[row, t] = delta.counts
            self._hsum[row, t] = delta.sum
            self._hcum[row] += delta.counts.astype(np.uint64)
            self._hcum_sum[row] += delta.sum
            if delta.counts.any():
                self._hlast[row] = frame.ts

    def _ingest_scalars(self, t: int, frame: Frame) -> None:
        for key, value in frame.workload_gauges.items():
            row = self.gauges.row(key)
            if row is not None:
                if row >= self._gauges_ready:  # a new series: never reported before
                    self._gauges[self._gauges_ready:row + 1] = np.nan
                    self._gauges_ready = row + 1
                self._gauges[row, t] = value
        for key, delta in frame.counters.items():
            row = self.counters.row(key)
            if row is not None:
                self._counters[row, t] = delta
                self._ctotal[row] += delta

    def _ingest_gpu(self, t: int, gpu: GpuFrame | None) -> None:
        if gpu is None:  # the GPU source is down: nothing is known, healthy or not
            self._gpu[t] = np.nan
            self._gpu_healthy = None
            return
        if gpu.info != self._frame_gpus:
            self._regrid(gpu.info)
        self._gpu[t] = np.nan
        self._gpu[t, self._gpu_rows] = gpu.values
        self._gpu_healthy = np.zeros(len(self._gpu_info), dtype=bool)  # a GPU the frame lacks: not reported
        self._gpu_healthy[self._gpu_rows] = gpu.healthy

    def _regrid(self, info: tuple[GpuInfo, ...]) -> None:
        """Rows for the GPUs of ``info`` and for every GPU seen before that ``info`` lacks, by GPU index: a GPU
        missing from a frame (a dcgm-exporter page without the GPU that fell off the bus) keeps its history and
        reads as missing and unhealthy, where the rows had shifted and every GPU's history had been wiped.  A
        row's history follows its GPU's UUID (a renumbered GPU takes its own with it; a GPU seen before whose
        index or UUID the frame now gives another is dropped); past :data:`MAX_GPU_ROWS` rows only the frame's
        GPUs are kept (a source inventing indices)."""
        uuids = {g.uuid for g in info if g.uuid}
        taken = {g.index for g in info}
        kept = [g for g in self._gpu_info if g.index not in taken and g.uuid not in uuids]
        union = tuple(sorted([*info, *kept], key=lambda g: g.index))
        if len(union) > MAX_GPU_ROWS:
            union = tuple(sorted(info, key=lambda g: g.index))
        old_row = {g.uuid or f"#{g.index}": k for k, g in enumerate(self._gpu_info)}
        grid = np.full((self.history, len(union), len(GPU_FIELDS)), np.nan)
        for k, g in enumerate(union):
            if (j := old_row.get(g.uuid or f"#{g.index}")) is not None:
                grid[:, k] = self._gpu[:, j]
        self._gpu, self._gpu_info = grid, union
        row = {g.index: k for k, g in enumerate(union)}
        self._gpu_rows = np.array([row[g.index] for g in info], dtype=np.intp)
        self._frame_gpus = info

