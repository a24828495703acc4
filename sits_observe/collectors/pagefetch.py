"""Page fetches in the background, so that the HTTP sources of one tick wait on their servers together, not in turn.

:meth:`Daemon.tick <sits_observe.daemon.Daemon.tick>` calls every source's ``prefetch()`` before it collects any.  A
vLLM, Triton or dcgm-exporter source due to be read then starts its page fetch (:func:`.promtext.fetch_page`) in a
daemon thread of its own (:class:`.background.Background`); its ``collect()`` waits for the page at most until the
fetch's timeout, counted from the fetch's start, has passed, and parses it in the tick's thread as before.  So
servers that hang hold the tick for about the largest of their timeouts, not for the sum.

fetch_page ends at its own deadline; a fetch that outlives it all the same (by more than :data:`SLACK`) fails its
tick and keeps its thread: until it ends the source starts no other and each tick it is due reports it still out,
so a source has at most one thread however long its server hangs.  The thread is a daemon thread: neither a stop nor
the process's exit waits for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from ..errors import CollectorError
from .background import Background
from .config import shown_url
from .promtext import too_slow

__all__ = ["SLACK", "PageFetch"]

SLACK = 0.25  # seconds past its timeout a fetch is given to report its own error (thread wake-up on a busy CPU)


class PageFetch:
    """One source's page: fetched in the background when the tick's :meth:`prefetch` finds it ``due``, taken by
    ``collect()`` with :meth:`page`.  ``fetch`` is :func:`.promtext.fetch_page` (a test's stand-in)."""

    def __init__(self, fetch: Callable[[str, float], str], url: str, timeout: float, *,
                 clock: Callable[[], float], due: Callable[[float], bool]) -> None:
        self._fetch, self._url, self.timeout = fetch, url, timeout
        self._shown = shown_url(url)
        self._clock, self._due = clock, due
        self._call: Background[str] = Background(f"fetch {self._shown}")
        self._started = 0.0  # time.monotonic() at the start of the fetch out
        self._late = False  # the fetch out outlived its timeout: a tick gave up on it
        self._asked: float | None = None  # the source's clock at this tick's prefetch, until collect() reads it
        self._refused: CollectorError | None = None  # this tick's fetch could not start
        self._stop: threading.Event | None = None  # the daemon's, from this tick's prefetch()

    def prefetch(self, stop: threading.Event | None = None) -> float:
        """Note this tick's time (returned) and start a fetch when one is due, unless one is still out (hung); one
        that ended untaken (its tick gave up on it, or stopped before asking for it) is dropped.  ``stop`` (the
        daemon's) ends :meth:`page`'s wait once set."""
        self._stop = stop
        self._asked = now = self._clock()
        if not self._due(now) or (self._call.busy and not self._call.wait(0.0)):
            return now
        if self._call.busy:
            with contextlib.suppress(Exception):  # a page or error no tick waits for any more
                self._call.take()
        self._started, self._late = time.monotonic(), False
        try:
            self._call.start(self._fetch, self._url, self.timeout)
        except RuntimeError as exc:  # no thread to be had (the process's limit): page() says so
            self._refused = CollectorError(f"{self._shown}: cannot start the fetch: {exc}")
        return now

    def tick_time(self) -> float:
        """The source's clock at this tick's :meth:`prefetch` (prefetching now when the tick did not: a
        ``collect()`` called on its own); every decision of one tick is taken at that time."""
        now = self.prefetch() if self._asked is None else self._asked
        self._asked = None
        return now

    def page(self) -> str:
        """The started fetch's page, waited for at most until its timeout (and :data:`SLACK`) has passed since its
        start; its CollectorError when it failed, one when it did not end in time or is still out from a tick before."""
        if self._refused is not None:
            refused, self._refused = self._refused, None
            raise refused
        if not self._call.wait(max(0.0, self._started + self.timeout + SLACK - time.monotonic()), self._stop):
            if self._late:
                raise CollectorError(f"{self._shown}: the fetch started {time.monotonic() - self._started:.0f} s ago "
                                     f"(timeout {self.timeout:g} s) has not ended; no other starts until it does")
            self._late = True
            raise too_slow(self._shown, self.timeout)
        return self._call.take()
