"""Rolling event sums over long windows in bounded memory: cumulative counters sampled at slot edges.

Each of ``n`` series (one per SLO) has cumulative ``good`` and ``total`` counts.  Level ``l`` samples
them every ``res * factor**l`` seconds of source time into a ring of ``slots`` edges, so a 5 m window
reads the 10 s level and a 28 d window the 2.5 h level of the same structure (defaults for a 5 m
shortest window).  The sum over ``(t - w, t]`` is ``cum(t) - cum(t - w)``; ``cum`` at ``t - w`` is
interpolated linearly between the two edges around it, which is exact while the event rate is steady
within a slot.  An edge holds the total of all ticks with ``ts <= edge``, like a Prometheus counter
sampled at that instant.  Everything is vectorised over series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SloError

__all__ = ["Levels", "WindowRing"]

SLOTS = 2048
FACTOR = 30
# seconds a source clock may step back before a new timeline starts (every window afresh, the stored
# history dropped): NTP or chrony correcting a host that booted with its clock some minutes fast is held
CLOCK_SLACK = 900.0


@dataclass(frozen=True, slots=True)
class Levels:
    """Slot resolutions (seconds), finest first, enough for the longest window."""

    res: tuple[float, ...]
    slots: int = SLOTS

    @classmethod
    def for_windows(cls, shortest: float, longest: float, slots: int = SLOTS, factor: int = FACTOR) -> Levels:
        res = [shortest / factor]
        while (slots - 3) * res[-1] < longest:
            res.append(res[-1] * factor)
        return cls(tuple(res), slots)

    def level_of(self, window: float) -> int:
        """Finest level whose ring still holds ``window`` seconds of edges."""
        for i, r in enumerate(self.res):
            if window <= (self.slots - 3) * r:
                return i
        raise SloError(f"window of {window:g} s is longer than the longest level holds")


class WindowRing:
    """Cumulative good/total of ``n`` series at every level; see the module docstring."""

    def __init__(self, n: int, levels: Levels) -> None:
        self.n = n
        self.levels = levels
        self.cum = np.zeros((2, n))
        self.rings = [np.zeros((2, n, levels.slots)) for _ in levels.res]
        self.first: list[int | None] = [None] * len(levels.res)  # first edge index held, per level
        self.last: list[int | None] = [None] * len(levels.res)   # last edge index written, per level
        self.ts: float | None = None

    def add(self, ts: float, good: np.ndarray, total: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
        """Add one tick's events at source time ``ts``.

        Returns the edges written as ``(level, index, (2, n) values)``; of a run of edges written at once
        (a gap in ticks) only the first and last, which is enough for :meth:`restore` to rebuild it.
        A clock that steps back by up to :data:`CLOCK_SLACK` seconds is held at the last time seen;
        further back raises :class:`SloError` (the caller starts a new timeline).
        """
        if self.ts is not None and ts < self.ts:
            if self.ts - ts > CLOCK_SLACK:
                raise SloError(f"source clock went back from {self.ts:.3f} to {ts:.3f}")
            ts = self.ts
        written = []
        for lvl, r in enumerate(self.levels.res):  # edges strictly before ts hold the total before this tick
            hi = math.ceil(ts / r - 1e-9) - 1
            last = self.last[lvl]
            lo = hi if last is None else max(last + 1, hi - self.levels.slots + 1)
            if lo <= hi:
                written += self._write(lvl, lo, hi)
        self.cum[0] += good
        self.cum[1] += total
        for lvl, r in enumerate(self.levels.res):
            k = ts / r
            if k == round(k) and self.last[lvl] != int(k):  # ts sits on an edge: it includes this tick
                written += self._write(lvl, int(k), int(k))
        self.ts = ts
        return written

    def _write(self, lvl: int, lo: int, hi: int) -> list[tuple[int, int, np.ndarray]]:
        slots = self.levels.slots
        self.rings[lvl][:, :, np.arange(lo, hi + 1) % slots] = self.cum[:, :, None]
        first = self.first[lvl]
        self.first[lvl] = max(lo if first is None else first, hi - slots + 1)
        self.last[lvl] = hi
        value = self.cum.copy()
        return [(lvl, lo, value)] if lo == hi else [(lvl, lo, value), (lvl, hi, value)]

    def restore(self, lvl: int, idx: np.ndarray, values: np.ndarray) -> None:
        """Load persisted edges of one level: ``idx`` ascending, ``values`` ``(len(idx), 2, n)``, NaN = not stored.

        Edges between stored ones carry the earlier value forward (no events, or a run written at once);
        a series with nothing stored before some edge carries its first value back (no events before).
        """
        slots = self.levels.slots
        lo = max(int(idx[0]), int(idx[-1]) - slots + 1)
        dense = np.full((int(idx[-1]) - lo + 1, 2, self.n), np.nan)
        keep = idx >= lo
        dense[idx[keep] - lo] = values[keep]
        dense = np.fmax.accumulate(dense, axis=0)  # cumulative counts never fall: max carries forward
        dense = np.fmin.accumulate(dense[::-1], axis=0)[::-1]
        dense = np.nan_to_num(dense)
        ring = self.rings[lvl]
        ring[:, :, np.arange(lo, int(idx[-1]) + 1) % slots] = np.moveaxis(dense, 0, -1)
        self.first[lvl], self.last[lvl] = lo, int(idx[-1])
        self.cum = np.maximum(self.cum, dense[-1])
        edge_ts = float(idx[-1]) * self.levels.res[lvl]
        self.ts = edge_ts if self.ts is None else max(self.ts, edge_ts)

    def resume(self, ts: float, cum: np.ndarray) -> None:
        """Continue from cumulative counts ``cum`` ``(2, n)`` at ``ts`` stored at a clean shutdown (NaN: none
        stored), which hold the events after the last edge :meth:`restore` loaded; older ones change nothing."""
        self.cum = np.fmax(self.cum, cum)
        self.ts = ts if self.ts is None else max(self.ts, ts)

    def sums(self, ts: float, rows: np.ndarray, windows: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """Events in ``(ts - window, ts]`` for each ``(row, window)`` pair: ``(2, pairs)`` good and total."""
        out = self.cum[:, rows].copy()
        for lvl, r in enumerate(self.levels.res):
            pick = levels == lvl
            if not pick.any() or self.last[lvl] is None:
                continue
            x = (ts - windows[pick]) / r
            n0 = np.floor(x + 1e-9)
            frac = np.clip(x - n0, 0.0, 1.0)
            n0 = n0.astype(np.int64)
            before = n0 < self.first[lvl]
            n0 = np.clip(n0, self.first[lvl], self.last[lvl])
            n1 = np.minimum(n0 + 1, self.last[lvl])
            frac = np.where(before, 0.0, frac)
            ring = self.rings[lvl]
            sel = rows[pick]
            c0 = ring[:, sel, n0 % self.levels.slots]
            c1 = ring[:, sel, n1 % self.levels.slots]
            out[:, pick] -= c0 + (c1 - c0) * frac
        return out
