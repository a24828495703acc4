"""The daemon's clocks: where a tick's timestamp comes from (wall time, or simulated time for the simulator)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Protocol

from .files import replace_whole

__all__ = ["Clock", "SIM_CLOCK_FILE", "SimClock", "WallClock"]

log = logging.getLogger(__name__)

SIM_CLOCK_FILE = "sim-clock"  # under state_dir: where a simulated host's clock stopped
SAVE_EVERY_S = 10.0  # wall seconds between two saves of the simulated clock while it runs


class Clock(Protocol):
    interval: float  # source seconds per tick
    wall_interval: float  # wall seconds per tick

    def next_ts(self) -> float: ...

    def now(self) -> float: ...  # the source time now, between ticks (no tick consumed)

    def elapsed(self, ts: float) -> float: ...


class WallClock:
    """Real time: one tick per ``interval`` wall seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.wall_interval = interval
        self._made: float | None = None  # monotonic time at which the latest ts was made
        self._last: float | None = None  # monotonic time of the ts the previous elapsed() was of

    def next_ts(self) -> float:
        self._made = time.monotonic()
        return time.time()

    def now(self) -> float:
        return time.time()

    def elapsed(self, ts: float) -> float:
        """What the tick at ``ts`` (the latest :meth:`next_ts`) covers: the configured interval, or more after a
        late tick (a slow source, a long pause), so per-second rates of its deltas are not inflated; never less.
        Measured on the monotonic clock: a wall-clock step (NTP, an operator) neither inflates nor deflates it."""
        last, self._last = self._last, self._made
        return self.interval if last is None or self._made is None else max(self.interval, self._made - last)


class SimClock:
    """Simulated time starting at ``start``: each tick advances ``interval``; ``speed`` ticks per wall interval.

    It runs ahead of the wall clock (``speed`` times), so a restart from wall time went back from what the last run
    stored in ``state_dir`` (the SLO windows and budgets started afresh, verdicts and decisions lay in the future):
    with ``keep`` (a file) it starts where the last run stopped when that is later than ``start``, and
    :meth:`save` keeps its time there at close and every :data:`SAVE_EVERY_S` wall seconds (a killed run's
    next start goes on from at most that far back)."""

    def __init__(self, interval: float, speed: float, start: float, keep: Path | None = None) -> None:
        self.interval = interval
        self.wall_interval = interval / speed
        self._keep = keep
        self._ts = start if keep is None else max(start, _kept(keep))
        self._saved_at = time.monotonic()
        self._failing = False  # the last save failed (said once per run of failures)

    def next_ts(self) -> float:
        self._ts += self.interval
        if self._keep is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()
        return self._ts

    def now(self) -> float:
        """The simulated time of the last tick (its start before the first): ahead of the wall clock."""
        return self._ts

    def save(self) -> None:
        """Keep the time reached in the ``keep`` file (replaced whole); a failure is logged (once in a row), not
        raised: the next start then begins from the time last kept, or wall time."""
        if self._keep is None:
            return
        self._saved_at = time.monotonic()
        try:
            replace_whole(self._keep, lambda tmp: tmp.write_text(f"{self._ts!r}\n"))
        except OSError as exc:
            if not self._failing:
                log.warning("cannot keep the simulated clock in %s (%s); the next start begins from the time last "
                            "kept, or wall time", self._keep, exc.strerror)
            self._failing = True
        else:
            self._failing = False

    def elapsed(self, ts: float) -> float:
        """Simulated ticks are never late."""
        return self.interval


def _kept(path: Path) -> float:
    """The time a last run's :meth:`SimClock.save` kept in ``path``; -inf when there is none to use (said once)."""
    try:
        text = path.read_text()[:64]
    except FileNotFoundError:
        return -math.inf
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read %s (%s); the simulated clock starts from wall time", path, exc)
        return -math.inf
    try:
        ts = float(text)
    except ValueError:
        ts = math.nan
    if not math.isfinite(ts):
        log.warning("%s holds no time (%r); the simulated clock starts from wall time", path, text.strip()[:20])
        return -math.inf
    return ts
