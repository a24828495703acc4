"""One call at a time in a daemon thread, waited for a bounded time: a call that hangs holds its thread, not the tick.

A driver call (NVML's) takes no timeout, and a GPU that falls off the bus can hold one for minutes.  A source runs
such work through a :class:`Background`: the tick waits for it at most a deadline, and while a call is still out
no second one starts (so threads stay one per source however long it hangs).  The thread is a daemon thread, so a
hung call never delays the process's exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Generic, TypeVar

from ..errors import StillDown

__all__ = ["Background"]

T = TypeVar("T")


class Background(Generic[T]):
    """Runs ``fn(*args)`` in a thread of its own (:meth:`start`) and hands its result on once (:meth:`take`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._call: Future[T] | None = None

    @property
    def busy(self) -> bool:
        """A call was started and its result not yet taken (it may have ended)."""
        return self._call is not None

    def start(self, fn: Callable[..., T], *args: object) -> None:
        """Start ``fn(*args)``; a call already out must be taken first."""
        if self._call is not None:
            raise RuntimeError(f"{self.name}: a call is still out")
        call: Future[T] = Future()

        def run() -> None:
            try:
                call.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 (raised again by take(), in the caller's thread)
                call.set_exception(exc)

        threading.Thread(target=run, name=self.name, daemon=True).start()
        self._call = call

    def wait(self, timeout: float, stop: threading.Event | None = None) -> bool:
        """Wait at most ``timeout`` seconds for the call out; True when it has ended (or none is out).  Once
        ``stop`` is set (the daemon's: a SIGTERM came) the wait ends with :class:`StillDown`, within 50 ms."""
        if self._call is None or stop is None:
            return self._call is None or wait([self._call], timeout).done
        deadline = time.monotonic() + timeout
        while not wait([self._call], min(0.05, max(0.0, deadline - time.monotonic()))).done:
            if stop.is_set():
                raise StillDown(f"{self.name}: not waited for: the daemon is stopping")
            if time.monotonic() >= deadline:
                return False
        return True

    def take(self) -> T:
        """The ended call's result, or its exception raised here; after this another call may start."""
        call, self._call = self._call, None
        if call is None or not call.done():
            self._call = call
            raise RuntimeError(f"{self.name}: no ended call to take")
        return call.result()
