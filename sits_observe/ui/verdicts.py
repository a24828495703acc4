"""The classifier's verdicts as the UI keeps them: polled, numbered, bounded.

The classifier keeps only its newest verdicts in memory (about 200, one per tick while an SLO burns).
The UI polls them on every live update of any page (the status line does) and appends the ones it
has not seen, each with a sequence number, so a browser asks for "verdicts after number N" and gets a
small patch, and an hour of verdicts stays on the timeline while any page is open.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from . import parts

if TYPE_CHECKING:
    from .context import UiContext

__all__ = ["VerdictLog"]

FIRST = 16  # newest verdicts read per poll ...
POLL = 200  # ... and when all of those are new: what the classifier keeps in memory


class VerdictLog:
    def __init__(self, keep: int = 10000) -> None:
        self._log: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._ids: set[str] = set()
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def refresh(self, ctx: UiContext) -> None:
        fresh = parts.verdicts(ctx, FIRST)  # newest first
        with self._lock:
            gap = len(fresh) == FIRST and str(fresh[-1].get("id")) not in self._ids
        if gap:  # all of them new: there may be more
            fresh = parts.verdicts(ctx, POLL)
        with self._lock:
            for v in reversed(fresh):
                vid = str(v.get("id"))
                if vid in self._ids:
                    continue
                if len(self._log) == self._log.maxlen:
                    self._ids.discard(str(self._log[0][1].get("id")))
                self._log.append((next(self._seq), v))
                self._ids.add(vid)

    def after(self, seq: int, since_ts: float) -> list[tuple[int, dict[str, Any]]]:
        """(number, verdict) of the verdicts numbered after ``seq`` with ``ts >= since_ts``, oldest first."""
        with self._lock:
            return [(n, v) for n, v in self._log if n > seq and float(v.get("ts", 0)) >= since_ts]

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._log[-1][1] if self._log else None
