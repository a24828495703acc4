"""The wall clock's tick intervals: what per-second rates are divided by."""

from __future__ import annotations

import pytest

from sits_observe import clock as clockmod
from sits_observe.clock import WallClock


def test_a_tick_covers_the_real_time_since_the_last_one_whatever_the_wall_clock_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mono, wall = [1000.0], [1_700_000_000.0]
    monkeypatch.setattr(clockmod.time, "monotonic", lambda: mono[0])
    monkeypatch.setattr(clockmod.time, "time", lambda: wall[0])
    c = WallClock(1.0)

    def tick(real: float, step: float = 0.0) -> float:
        mono[0] += real
        wall[0] += real + step
        return c.elapsed(c.next_ts())

    assert tick(0.0) == 1.0  # the first tick: the configured interval
    assert tick(1.0) == 1.0
    assert tick(0.4) == 1.0  # never less than the interval
    assert tick(300.0) == pytest.approx(300.0)  # a 5-minute hang: its deltas are over 5 minutes (it said 60 s: rates x5)
    assert tick(1.0, step=3600.0) == 1.0  # the wall clock stepped an hour ahead: rates not divided by an hour
    assert tick(1.0, step=-3600.0) == 1.0  # and back
