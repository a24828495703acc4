"""Closing the daemon's parts at shutdown: all at once, each in a daemon thread, waited for a bounded time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CLOSE_TIMEOUT", "close_all", "side_by_side"]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 10.0  # seconds :meth:`Daemon.close` waits for the parts (inside the shipped unit's TimeoutStopSec=15)


def _close_one(close: Callable[[], object], failed: list[Exception]) -> None:
    try:
        close()
    except Exception as exc:  # closing one part must not keep the others open; reported by close_all
        failed.append(exc)


def side_by_side(*closes: Callable[[], object]) -> None:
    """Call each of ``closes`` in its own thread and wait for all of them (none waits on another's budget); then
    raise the first error one of them raised."""
    failed: list[Exception] = []
    threads = [threading.Thread(target=_close_one, args=(close, failed), daemon=True) for close in closes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]


def close_all(parts: Iterable[Any], timeout: float) -> bool:
    """Call every part's ``close()`` (those that have one), all at once (none calls another once the ticks have
    stopped), waiting at most ``timeout`` seconds; True when each closed.  One that raises or hangs is logged and
    keeps no other open; one still closing when the time is up is left to its (daemon) thread, so shutdown never
    waits on it."""
    closing: list[tuple[str, threading.Thread, list[Exception]]] = []
    for part in parts:
        close = getattr(part, "close", None)
        if close is not None:
            name = str(getattr(part, "name", part))
            failed: list[Exception] = []
            thread = threading.Thread(target=_close_one, args=(close, failed), name=f"close-{name}", daemon=True)
            thread.start()
            closing.append((name, thread, failed))
    deadline = time.monotonic() + timeout
    closed = True
    for name, thread, failed in closing:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.error("closing %s did not finish within %g s; going on without it", name, timeout)
            closed = False
        elif failed:
            log.warning("closing %s failed: %s: %s", name, type(failed[0]).__name__, failed[0])
            closed = False
    return closed
