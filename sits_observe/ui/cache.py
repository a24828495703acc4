"""Incremental column caches: each series a page draws is derived from the store once, never again.

A :class:`ColumnCache` keeps the last columns of a derived ``(columns, rows)`` series, e.g. p99 per
stage or utilization per GPU, one column per *bin* of ``bin`` ticks (so an hour fits the screen: about
720 columns, never more columns than pixels).  On each request it computes only the bins completed since
the last one (under the store's read lock, so every row of a column covers the same ticks) and answers
with the columns a browser lacks.  All browsers share one cache per (series, bin).
"""

from __future__ import annotations

import secrets
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..store import quantile_rows

__all__ = ["Columns", "ColumnCache", "CacheSet", "Read", "binned_quantile", "binned_counts", "binned_mean",
           "cells", "times_ms", "MAX_COLUMNS"]

MAX_COLUMNS = 720  # columns a time heatmap draws at most; the bin grows with the time range
Read = Callable[[int, int, int], np.ndarray]  # (ticks, skip newest, bin) -> (ticks // bin, rows)


@dataclass(frozen=True)
class Columns:
    """Columns for one browser: ``full`` means replace what it holds, else append.  ``tick`` is the
    store tick count at the end of the newest column."""

    tick: int
    ts: np.ndarray
    values: np.ndarray
    full: bool


class ColumnCache:
    """The last ``history`` ticks (at most :data:`MAX_COLUMNS` bins) of one derived series in bins of ``bin``
    ticks; see the module docstring.

    ``read(ticks, skip, bin)`` derives the columns of the ``ticks`` ticks that end ``skip`` ticks before
    the newest.  ``incremental=False`` recomputes the whole window on every request (the baseline that
    ``bench ui`` compares against).
    """

    def __init__(self, store: Any, rows: tuple[str, ...], read: Read, history: int, bin: int = 1,
                 incremental: bool = True) -> None:
        self.store = store
        self.rows = rows
        self.bin = max(1, int(bin))
        self._read = read
        # no page draws more than MAX_COLUMNS columns: a cache of 1-tick bins kept every tick of the history
        self.history = min(int(history), MAX_COLUMNS * self.bin) // self.bin * self.bin
        self.incremental = incremental
        # which cache, of which daemon process, a browser's columns came from: a restarted daemon counts ticks
        # from 0 again, and a browser holding tick 10 of the last run was sent ticks 10-30 of this one to append
        self.run = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._tick = 0
        self._ts = np.zeros(0)
        self._vals = np.zeros((0, len(rows)))

    def _refresh(self) -> None:
        b = self.bin
        with self.store.reading():
            now = self.store.ticks
            end = now - now % b  # only whole bins are drawn
            skip = now - end
            held = min(now, self.store.history) - skip
            span = min(end - self._tick if self.incremental else end, held, self.history) // b * b
            if span <= 0:
                return
            vals = np.asarray(self._read(span, skip, b), dtype=np.float64).reshape(span // b, len(self.rows))
            ts = self.store.ts(span + skip)[:span][b - 1::b]
        if span >= self.history or not self.incremental or end - span != self._tick:
            self._ts, self._vals = ts, vals
        else:
            self._ts = np.concatenate([self._ts, ts])[-(self.history // b):]
            self._vals = np.concatenate([self._vals, vals])[-(self.history // b):]
        self._tick = end

    def columns(self, after: int | None, limit: int) -> Columns:
        """Columns newer than tick ``after`` (what a browser holds), or the last ``limit`` in full.

        Full when the browser holds nothing, is from another run, or lacks more than half a window
        (a new figure is then smaller than the patch would be).
        """
        with self._lock:
            self._refresh()
            new = None if after is None or (self._tick - after) % self.bin else (self._tick - after) // self.bin
            full = not self.incremental or new is None or not 0 <= new <= limit // 2
            take = min(limit, len(self._ts)) if full else new
            if take == 0:
                return Columns(self._tick, self._ts[:0], self._vals[:0], full)
            return Columns(self._tick, self._ts[-take:].copy(), self._vals[-take:].copy(), full)


class CacheSet:
    """Caches by key, least recently used dropped past ``cap`` (a key includes the rows and the bin)."""

    def __init__(self, cap: int = 64) -> None:
        self._caches: OrderedDict[Hashable, ColumnCache] = OrderedDict()
        self._lock = threading.Lock()
        self.cap = cap

    def get(self, key: Hashable, make: Callable[[], ColumnCache]) -> ColumnCache:
        with self._lock:
            cache = self._caches.get(key)
            if cache is None:
                cache = self._caches[key] = make()
                while len(self._caches) > self.cap:
                    self._caches.popitem(last=False)
            self._caches.move_to_end(key)
            return cache


def _bins(a: np.ndarray, ticks: int, skip: int, b: int) -> np.ndarray:
    """The ``ticks`` rows before the ``skip`` newest, grouped ``(ticks // b, b, ...)``."""
    a = a[:ticks] if skip else a
    return a.reshape(ticks // b, b, *a.shape[1:])


def binned_counts(windows: Sequence[Callable[[int], np.ndarray]], ticks: int, skip: int, b: int) -> np.ndarray:
    """Per-bin sums of per-tick ``(n, B)`` bucket counts, one window reader per row group, stacked."""
    return np.concatenate([_bins(w(ticks + skip), ticks, skip, b).sum(axis=1) for w in windows], axis=1)


def binned_quantile(windows: Sequence[Callable[[int], np.ndarray]], uppers: np.ndarray, q: float,
                    ticks: int, skip: int, b: int) -> np.ndarray:
    """The ``q`` quantile of each bin's merged histogram, one column per window reader (e.g. per stage); no
    column without readers (a host no stage has reported on yet)."""
    if not windows:
        return np.zeros((ticks // b, 0))
    return np.column_stack([quantile_rows(_bins(w(ticks + skip), ticks, skip, b).sum(axis=1), uppers, q)
                            for w in windows])


def binned_mean(window: Callable[[int], np.ndarray], ticks: int, skip: int, b: int) -> np.ndarray:
    """Per-bin mean (NaN ignored) of a per-tick ``(n, rows)`` gauge."""
    with warnings.catch_warnings():  # an all-NaN bin warns; NaN is the answer
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(_bins(window(ticks + skip), ticks, skip, b), axis=1)


def cells(a: np.ndarray, digits: int) -> list[Any]:
    """Nested lists for JSON: rounded, NaN/inf as None (null)."""
    a = np.asarray(a, dtype=np.float64)
    bad = ~np.isfinite(a)
    out = np.round(a, digits).astype(object)
    out[bad] = None
    return out.tolist()


def times_ms(ts: np.ndarray) -> list[float]:
    """Source-clock seconds -> epoch milliseconds for a plotly date axis."""
    return np.round(np.asarray(ts, dtype=np.float64) * 1000.0).tolist()
