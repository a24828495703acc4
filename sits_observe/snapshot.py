"""What an engine's readers (a scrape, an API call, a UI tab) get when the tick holds the engine's lock.

A tick holds an engine's lock through its SQLite writes, which can wait seconds on a slow or locked file.  A reader
that waited as long would hold one of the HTTP server's few threads, and a handful of them starve ``/metrics`` and
``/healthz``.  A :class:`Snapshot` reader waits :data:`READ_WAIT_S` at most, then answers with the value the last
reader computed (the first reader, with nothing to answer yet, waits for the lock unless an initial value was
given).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["READ_WAIT_S", "Snapshot"]

T = TypeVar("T")

READ_WAIT_S = 0.25  # seconds a reader waits for an engine's lock before it answers with the last value


class Snapshot(Generic[T]):
    """The last value computed under ``lock`` by :meth:`read`."""

    def __init__(self, lock: threading.Lock | threading.RLock, *initial: T) -> None:
        """``initial``: the value to answer before any was computed (without it the first reader waits)."""
        self._lock = lock
        self._value: tuple[T] | None = (initial[0],) if initial else None

    def read(self, compute: Callable[[], T]) -> T:
        """``compute()`` under the lock, kept; the last kept value when the lock is busy for :data:`READ_WAIT_S`."""
        if self._lock.acquire(timeout=-1 if self._value is None else READ_WAIT_S):
            try:
                self._value = (compute(),)
            finally:
                self._lock.release()
        assert self._value is not None
        return self._value[0]
