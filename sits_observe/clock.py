"""The daemon's clocks: where a tick's timestamp comes from (wall time, or simulated time for the simulator)."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SimClock", "WallClock"]


class Clock(Protocol):
    interval: float  # source seconds per tick
    wall_interval: float  # wall seconds per tick

    def next_ts(self) -> float: ...

    def elapsed(self, ts: float) -> float: ...


class WallClock:
    """Real time: one tick per ``interval`` wall seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.wall_interval = interval
        self._last: float | None = None

    def next_ts(self) -> float:
        return time.time()

    def elapsed(self, ts: float) -> float:
        """What the tick at ``ts`` covers: the configured interval, or more after a late tick (a slow
        source), so per-second rates of its deltas are not inflated; never less."""
        last, self._last = self._last, ts
        return self.interval if last is None else max(self.interval, min(ts - last, 60 * self.interval))


class SimClock:
    """Simulated time starting at ``start``: each tick advances ``interval``; ``speed`` ticks per wall interval."""

    def __init__(self, interval: float, speed: float, start: float) -> None:
        self.interval = interval
        self.wall_interval = interval / speed
        self._ts = start

    def next_ts(self) -> float:
        self._ts += self.interval
        return self._ts

    def elapsed(self, ts: float) -> float:
        """Simulated ticks are never late."""
        return self.interval
