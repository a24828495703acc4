"""The UI's incremental caches give exactly what a full recompute from the store gives."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from sits_observe.daemon import Daemon
from sits_observe.ui.cache import MAX_COLUMNS, CacheSet, ColumnCache, binned_counts, binned_mean, binned_quantile


def _p99(d: Daemon, stages: tuple[str, ...]) -> Callable[[int, int, int], np.ndarray]:
    wins = [lambda n, s=s: d.store.hist_window(s, None, n) for s in stages]
    return lambda t, k, b: binned_quantile(wins, d.store.layout.uppers(), 0.99, t, k, b)


def test_incremental_equals_full(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(ticks=50)
    stages = ("e2e", "decode", "runq")
    caches = {b: ColumnCache(d.store, stages, _p99(d, stages), d.store.history, b) for b in (1, 3, 7)}
    held = {b: c.columns(None, 10_000) for b, c in caches.items()}
    for step in (1, 2, 5, 13, 640):  # the last step wraps the 600-tick ring
        for _ in range(step):
            d.tick()
        for b, inc in caches.items():
            new = inc.columns(held[b].tick, 10_000)
            full = ColumnCache(d.store, stages, _p99(d, stages), d.store.history, b).columns(None, 10_000)
            assert full.tick == new.tick == d.store.ticks - d.store.ticks % b
            if new.full:
                got_ts, got = new.ts, new.values
            else:
                got_ts = np.concatenate([held[b].ts, new.ts])[-len(full.ts):]
                got = np.concatenate([held[b].values, new.values])[-len(full.ts):]
            assert np.array_equal(got_ts, full.ts)
            np.testing.assert_array_equal(got, full.values)
            assert len(full.ts) == (min(d.store.ticks, d.store.history) - d.store.ticks % b) // b
            held[b] = full


def test_bins_aggregate_ticks(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(ticks=37)
    per_tick = d.store.hist_window("e2e", None, 37)[:35]  # drop the 2 ticks of the unfinished bin
    counts = binned_counts([lambda n: d.store.hist_window("e2e", None, n)], 35, 2, 5)
    np.testing.assert_array_equal(counts, per_tick.reshape(7, 5, -1).sum(axis=1))
    util = d.store.gpu_window("utilization_ratio", 37)[:35]
    mean = binned_mean(lambda n: d.store.gpu_window("utilization_ratio", n), 35, 2, 5)
    np.testing.assert_allclose(mean, util.reshape(7, 5, -1).mean(axis=1))


def test_browser_state_decides_full_or_append(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(ticks=40)
    c = ColumnCache(d.store, ("e2e",), _p99(d, ("e2e",)), d.store.history, 2)
    first = c.columns(None, 10)
    assert first.full and len(first.ts) == 10 and first.tick == 40
    for _ in range(4):
        d.tick()
    assert not (nxt := c.columns(first.tick, 10)).full and len(nxt.ts) == 2
    assert c.columns(first.tick + 1, 10).full  # not on a bin edge: not ours
    assert c.columns(10_000, 10).full  # from another run of the daemon
    for _ in range(12):
        d.tick()
    assert c.columns(first.tick, 10).full  # lacks more than half a window: a new figure is smaller
    baseline = ColumnCache(d.store, ("e2e",), _p99(d, ("e2e",)), d.store.history, 2, incremental=False)
    assert baseline.columns(baseline.columns(None, 10).tick, 10).full


def test_cache_set_is_bounded() -> None:
    made = []
    caches = CacheSet(cap=3)
    for key in "abcdb":
        caches.get(key, lambda k=key: made.append(k) or k)  # type: ignore[arg-type, func-returns-value]
    assert made == ["a", "b", "c", "d"] and list(caches._caches) == ["c", "d", "b"]


class _Store:
    """What a cache reads of the store: a long history of ticks one second apart."""

    history = 86_400

    def __init__(self, ticks: int) -> None:
        self.ticks = ticks

    def reading(self) -> Any:
        return contextlib.nullcontext()

    def ts(self, n: int) -> np.ndarray:
        return np.arange(self.ticks - n, self.ticks, dtype=np.float64)


def test_a_cache_keeps_no_more_columns_than_a_page_draws() -> None:
    """A cache of 1-tick bins kept the whole history (86,400 columns per series: 225 MB for 13 stages at 5 min),
    though no page draws more than MAX_COLUMNS."""
    store, asked = _Store(10_003), []

    def read(ticks: int, skip: int, b: int) -> np.ndarray:
        asked.append(ticks)
        return np.zeros((ticks // b, 1))

    for b in (1, 7):
        cache = ColumnCache(store, ("a",), read, store.history, b)
        assert len(cache.columns(None, 10**6).ts) == MAX_COLUMNS
        assert asked[-1] == MAX_COLUMNS * b  # only that span is derived, at first and after
        store.ticks += 5 * b
        assert len(cache.columns(None, 10**6).ts) == MAX_COLUMNS and asked[-1] == 5 * b
