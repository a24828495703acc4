"""Host-name lookups that give up at a timeout, for the scrapes of :mod:`.promtext`.

``socket.getaddrinfo`` takes no timeout: a slow or unreachable nameserver holds its caller for the resolver's own
(5 s a try, times the tries and nameservers, by glibc's defaults), and a scrape held so holds the tick and every
other source with it.  Here a lookup runs in a daemon thread (never one that delays the process's exit) and the
caller waits at most its timeout.  Threads stay few however long the resolver hangs: a caller asking for a host
already being looked up (any port: replicas of one host share a lookup) waits on that lookup, and at most
:data:`MAX_LOOKUPS` run at once; a caller finding them all taken waits for one to end within its own timeout (the
servers of one tick fetch their pages at once), and fails when none does.  Answers are not kept: each call asks
the resolver again, so a changed record is seen at once.  A literal address is never looked up.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future, wait
from typing import Any

__all__ = ["MAX_LOOKUPS", "AddrInfo", "LookupTimedOut", "resolve"]

MAX_LOOKUPS = 8  # lookups waiting on the resolver at once (each a thread); a host that hangs holds one
AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]  # the last: the address to connect to

_slots = threading.Condition()  # guards _pending; notified when a lookup ends
_pending: dict[str, Future[list[AddrInfo]]] = {}  # host -> its lookup in flight


class LookupTimedOut(OSError):
    """The resolver did not answer for ``host`` in time.  An OSError, so that http.client and urllib pass it on as
    they do a refused connection."""

    def __init__(self, host: str) -> None:
        super().__init__(f"no answer from the DNS resolver for {host!r} in time")
        self.host = host


def resolve(host: str, port: int, timeout: float) -> list[AddrInfo]:
    """``socket.getaddrinfo(host, port, type=SOCK_STREAM)`` within ``timeout`` seconds.

    :class:`LookupTimedOut` when it takes longer (the lookup goes on, and a later call for the same host waits on
    it); an OSError when :data:`MAX_LOOKUPS` lookups of other hosts are waiting and none ends within ``timeout``;
    the resolver's own error (``socket.gaierror``) when it answers with one.
    """
    try:  # a literal address: never sent to a resolver, so never slow
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass  # a name
    deadline = time.monotonic() + timeout
    with _slots:
        while (lookup := _pending.get(host)) is None and len(_pending) >= MAX_LOOKUPS:
            if (left := deadline - time.monotonic()) <= 0:
                raise OSError(f"cannot look up {host!r}: {len(_pending)} earlier lookups are still waiting on "
                              "the DNS resolver")
            _slots.wait(left)
        if lookup is None:
            lookup = _pending[host] = Future()
            try:
                threading.Thread(target=_look_up, args=(host, lookup), name=f"resolve {host}", daemon=True).start()
            except RuntimeError as exc:  # no thread to be had: nothing is left pending
                del _pending[host]
                raise OSError(f"cannot look up {host!r}: {exc}") from exc
    if not wait([lookup], max(0.0, deadline - time.monotonic())).done:
        raise LookupTimedOut(host)
    return [(family, kind, proto, name, (addr[0], port, *addr[2:])) for family, kind, proto, name, addr in
            lookup.result()]


def _look_up(host: str, lookup: Future[list[AddrInfo]]) -> None:
    try:
        answer = socket.getaddrinfo(host, 0, 0, socket.SOCK_STREAM)  # the port is the caller's (the same for each)
    except Exception as exc:  # noqa: BLE001 (raised again in every caller waiting on it)
        lookup.set_exception(exc)
    else:
        lookup.set_result(answer)
    finally:
        with _slots:
            del _pending[host]
            _slots.notify_all()
