"""Which inference-server replica a GPU process serves, and whether that replica has work.

A server's /metrics page says how many requests it is running and how many wait; NVML says which
processes hold a context on each GPU.  The join: a GPU process belongs to a configured server when the
process itself, or one of its ancestors, listens on the TCP port of the server's URL (vLLM's GPU workers
are children of the process that serves the API).  Sockets are looked up in the listening process's own
network namespace (``/proc/PID/net/tcp``), so a server in a container is found too when its URL reaches
the port it listens on (no port mapping in between).  Only servers whose URL names this host (loopback
or its hostname) are joined: a port number means nothing on another host.

The GPU field this feeds, ``backlog_utilization_ratio``, is the utilization of GPUs whose replica has
requests waiting or running: an idle GPU there is a serving loop that is not issuing work, which the
host-wide figures cannot tell from a replica that simply has nothing to do.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["ReplicaBoard", "listening_ports", "namespace_listeners", "parent_pid"]

log = logging.getLogger("sits_observe.collectors.replicas")

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
_MAX_DEPTH = 8  # ancestors searched above a GPU process
_RETRY = 10.0  # seconds before a process found under no server is looked up again
_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


def namespace_listeners(pid: int, wanted: Collection[int], proc: Path = Path("/proc")) -> dict[str, int]:
    """Socket inode -> port of the listeners on the TCP ports ``wanted`` in the network namespace of
    ``pid`` (reading these tables costs milliseconds whatever their length, so callers cache per namespace)."""
    listeners: dict[str, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pid) / "net" / table).read_text().splitlines()[1:]
        except FileNotFoundError:
            if table == "tcp6":  # no IPv6 in this namespace
                continue
            raise
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _LISTEN and (port := int(f[1].rsplit(":", 1)[1], 16)) in wanted:
                listeners[f[9]] = port
    return listeners


def listening_ports(pid: int, listeners: dict[str, int], proc: Path = Path("/proc")) -> set[int]:
    """The ports of ``listeners`` (from :func:`namespace_listeners`) whose socket process ``pid`` holds."""
    ports: set[int] = set()
    if not listeners:
        return ports
    for fd in (proc / str(pid) / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed between listing and reading
            continue
        if target.startswith("socket:[") and target[8:-1] in listeners:
            ports.add(listeners[target[8:-1]])
    return ports


def parent_pid(pid: int, proc: Path = Path("/proc")) -> int:
    """The parent of ``pid`` (0 for the kernel's own); OSError when it is gone."""
    stat = (proc / str(pid) / "stat").read_bytes()  # bytes: the command in it need not be UTF-8
    return int(stat.rpartition(b")")[2].split()[1])  # the command may contain spaces and parentheses


class ReplicaBoard:
    """Shared by the server sources (each publishes its backlog every tick) and the NVML source (asks,
    per GPU, whether a replica using it has work).  Process lookups are cached per pid for ``refresh``
    seconds (one that found no server for 10 s); a pid that is gone, or not readable, joins nothing."""

    def __init__(self, *, proc: Path = Path("/proc"), refresh: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.refresh = refresh
        self.clock = clock
        self._ports: dict[int, set[str]] = {}  # local listening port -> servers (one per model on a Triton)
        self._backlog: dict[str, float | None] = {}
        self._owners: dict[int, tuple[float, frozenset[str]]] = {}  # pid -> (looked up at, servers)
        self._namespaces: dict[str, tuple[float, dict[str, int]]] = {}  # netns -> (read at, listeners)
        self._hosts = _LOCAL | {socket.gethostname().lower()}

    def register(self, server: str, url: str) -> bool:
        """Join ``server`` to GPU processes through its URL's port; False (not joined) for another host."""
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # out of range: the page read reports the URL itself
            return False
        if parts.hostname not in self._hosts:
            log.info("replicas: %s is not on this host (%s); its GPUs are not joined to its backlog",
                     server, parts.hostname)
            return False
        self._ports.setdefault(port, set()).add(server)
        self._backlog[server] = None
        self._owners.clear()  # looked up without this server
        self._namespaces.clear()
        return True

    def __bool__(self) -> bool:
        return bool(self._ports)

    def publish(self, server: str, backlog: float | None) -> None:
        """Requests waiting plus running on ``server``'s latest page; None when it was not read."""
        if server in self._backlog:
            self._backlog[server] = backlog

    def servers_of(self, pid: int, depth: int = _MAX_DEPTH) -> frozenset[str]:
        """The configured servers whose listening process is ``pid`` or its nearest ancestor that listens on
        a configured port.  Every process on the way is cached, so the workers of one server read its file
        descriptors once per refresh."""
        now = self.clock()
        cached = self._owners.get(pid)
        # a process not (yet) under a listening server is looked up again sooner: vLLM's workers hold
        # their GPUs before the API server listens
        if cached is not None and now - cached[0] < (self.refresh if cached[1] else min(self.refresh, _RETRY)):
            return cached[1]
        # a retry after finding nothing reads the sockets again unless read since: the server may listen now
        stale = cached[0] if cached is not None and not cached[1] else -math.inf
        found: frozenset[str] = frozenset()
        if pid > 1 and depth > 0:
            try:
                ports = listening_ports(pid, self._listeners(pid, now, stale), self.proc)
                found = (frozenset(s for port in ports for s in self._ports[port])
                         or self.servers_of(parent_pid(pid, self.proc), depth - 1))
            except (OSError, ValueError, IndexError):  # gone, or not ours to read
                pass
        if len(self._owners) > 4096:  # pids come and go; never grow without bound
            self._owners.clear()
            self._namespaces.clear()
        self._owners[pid] = (now, found)
        return found

    def _listeners(self, pid: int, now: float, stale: float) -> dict[str, int]:
        """The listeners of ``pid``'s network namespace, read again when ``refresh`` old or read at ``stale``
        or before."""
        ns = os.readlink(self.proc / str(pid) / "ns" / "net")
        cached = self._namespaces.get(ns)
        if cached is None or now - cached[0] >= self.refresh or cached[0] <= stale:
            cached = self._namespaces[ns] = (now, namespace_listeners(pid, self._ports, self.proc))
        return cached[1]

    def has_work(self, pids: Iterable[int]) -> bool | None:
        """True when a replica of these GPU processes has requests waiting or running, False when the
        replicas found have none, None when no replica with a known backlog uses them."""
        known = [b for s in {s for pid in pids for s in self.servers_of(pid)}
                 if (b := self._backlog.get(s)) is not None]
        return any(b > 0 for b in known) if known else None
