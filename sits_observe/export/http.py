"""The one HTTP port: /metrics, /healthz, /readyz, /api/v1/..., and the UI at /.

Flask app served by waitress (a production WSGI server) from a background thread.  User mistakes get a
4xx JSON ``{"error": ...}``; unexpected errors a 500 without a stack trace (logged server-side).
"""

from __future__ import annotations

import errno
import hmac
import logging
import socket
import threading
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import HTTPException

from ..errors import ConfigError, ListenError, SchedulerError, SitsError
from .api import register_api
from .fasttext import TAKEN, GpuText, HistogramText
from .prometheus import StoreCollector

if TYPE_CHECKING:
    from ..daemon import Daemon

__all__ = ["create_app", "Server", "require_token", "ApiError"]

log = logging.getLogger("sits_observe.http")


class ApiError(Exception):
    """A 4xx answer with a reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def require_token(daemon: Daemon) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for mutating endpoints: ``Authorization: Bearer <api_token>`` must match."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            token = daemon.config.api_token
            if token is None:
                raise ApiError(403, "mutating API calls are disabled: set api_token (or SITS_API_TOKEN)")
            sent = request.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token.get_secret_value()}".encode()):
                raise ApiError(401, "missing or wrong bearer token")
            return fn(*args, **kwargs)

        return inner

    return deco


def create_app(daemon: Daemon, *, ui: bool = True) -> Flask:
    app = Flask("sits_observe")
    collector = StoreCollector(daemon.store, daemon.providers, daemon.note_error, TAKEN)
    daemon.registry.register(collector)
    histograms = HistogramText(daemon.store, daemon.config.store.stale_after)
    gpus = GpuText(daemon.store)

    @app.get("/metrics")
    def metrics() -> Response:
        body = (histograms.render() + gpus.render()).encode() + generate_latest(daemon.registry)
        return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST})  # mimetype= added a second charset

    @app.get("/healthz")
    def healthz() -> tuple[Response, int]:
        if (since := daemon.stalled_seconds()) is not None:
            return jsonify({"status": "stalled", "seconds_since_last_tick": round(since, 1)}), 503
        return jsonify({"status": "ok"}), 200

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        ready = daemon.store.ticks > 0 and daemon.stalled_seconds() is None
        return jsonify({"ready": ready}), 200 if ready else 503

    register_api(app, daemon)
    if daemon.scheduler is not None:
        from .scheduler_api import scheduler_blueprint

        app.register_blueprint(scheduler_blueprint(daemon.scheduler, require_token(daemon)))
    else:  # its paths say why, not "no such API path"
        from ..wiring import scheduler_off

        off = {"error": f"the scheduler is not running: {scheduler_off(daemon.config, daemon.topology)}"}
        for rule in ("/api/v1/shards", "/api/v1/shards/<shard_id>", "/api/v1/decisions", "/api/v1/reshard",
                     "/api/v1/placements/<pid>/ack"):
            app.add_url_rule(rule, f"no-scheduler:{rule}", lambda **_: (jsonify(off), 404),
                             methods=["GET", "POST", "DELETE"])

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> tuple[Response, int]:
        resp = jsonify({"error": exc.reason})
        if exc.status == 401:  # RFC 6750: the scheme the client should send
            resp.headers["WWW-Authenticate"] = 'Bearer realm="sits-observe"'
        return resp, exc.status

    @app.errorhandler(ConfigError)
    def config_error(exc: ConfigError) -> tuple[Response, int]:
        return jsonify({"error": str(exc)}), 400

    @app.errorhandler(SchedulerError)
    def scheduler_error(exc: SchedulerError) -> tuple[Response, int]:
        return jsonify({"error": str(exc)}), 409

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        resp = jsonify({"error": exc.description})
        for name, value in exc.get_headers():  # Allow of a 405, Retry-After: what the status says comes with it
            if name.lower() != "content-type":
                resp.headers[name] = value
        return resp, exc.code or 500

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> tuple[Response, int]:
        # quoted: a path or message with a newline (%0A) must not start a line of its own in the log
        log.error("request %s %r failed: %r", request.method, request.path, str(exc),
                  exc_info=not isinstance(exc, SitsError))
        return jsonify({"error": "internal error; see the daemon log"}), 500

    if ui and daemon.config.ui.enabled:
        from dash.exceptions import DependencyException

        from ..ui.app import create_dash

        @app.errorhandler(DependencyException)
        def no_such_asset(exc: DependencyException) -> tuple[Response, int]:
            # a UI asset path nobody serves (a guess, an old page's fingerprint): a 404, not a logged 500
            return jsonify({"error": "no such UI asset"}), 404

        create_dash(app, daemon)
    return app


# any request body over this is refused (413) by waitress from its headers, before it is read (its own default
# is 1 GiB, buffered to temporary files); the API's bodies are under 1 KiB, the UI's callbacks a few KiB
MAX_REQUEST_BODY = 8 << 20
CONNECTION_LIMIT = 100  # open connections (waitress's default); at it, the one idle longest is closed for a newcomer


class Server:
    """waitress on the configured address, in a daemon thread; port in use -> ConfigError."""

    def __init__(self, app: Callable[..., Any], host: str, port: int, threads: int = 8) -> None:
        """Binds now (``app``: any WSGI application); serves from :meth:`start`."""
        from waitress.server import BaseWSGIServer, create_server

        try:
            # poll(), not select(): select() raises on a descriptor past 1023, which killed the server's thread for
            # good (every request refused from then on) once the probes' perf events had opened that many
            self._server = create_server(app, host=host, port=port, threads=threads, ident="sits-observe",
                                         clear_untrusted_proxy_headers=True, max_request_body_size=MAX_REQUEST_BODY,
                                         asyncore_use_poll=True, connection_limit=CONNECTION_LIMIT)
        except (OSError, ValueError) as exc:  # waitress raises ValueError for a host that does not resolve
            cause = exc.__context__  # the resolver's own error, which waitress replaced
            if isinstance(cause, socket.gaierror) and cause.errno == socket.EAI_AGAIN:
                raise ListenError(f"listen: {host}:{port}: no answer from the DNS resolver for {host!r} yet "
                                  f"({cause.strerror}); exiting with 1 so that systemd tries again (an IP address in "
                                  "listen: does not depend on DNS)") from None
            if getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:  # an address the host does not have yet (boot)
                raise ListenError(f"listen: {host}:{port}: no such address on this host (yet) ({exc.strerror}); "
                                  "exiting with 1 so that systemd tries again once the network is up (or set "
                                  "listen: to an address of this host, e.g. 0.0.0.0)") from None
            why = ("is in use" if getattr(exc, "errno", None) == errno.EADDRINUSE
                   else f"cannot be bound ({getattr(exc, 'strerror', None) or exc})")
            raise ConfigError(f"listen: {host}:{port} {why}; set listen: or SITS_LISTEN to a free host:port") from None
        srv = self._server  # a host name of several addresses (localhost: 127.0.0.1 and ::1) gives one per address
        self.port = int(srv.effective_listen[0][1] if hasattr(srv, "effective_listen") else srv.effective_port)
        self.host = host
        sockets = getattr(srv, "_map", None) or srv.map  # type: ignore[union-attr]
        for listener in [d for d in sockets.values() if isinstance(d, BaseWSGIServer)]:
            _evict_when_full(listener, sockets)
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._raised: Exception | None = None

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._server.run()
        except Exception as exc:  # noqa: BLE001 - kept for dead(), which the daemon asks every tick
            log.debug("HTTP server loop raised", exc_info=True)
            self._raised = exc

    def dead(self) -> str | None:
        """Why the server's thread has ended (every connection is refused from then on), else None (serving, or
        not started)."""
        if not self._thread.ident or self._thread.is_alive():
            return None
        exc = self._raised
        return "its loop ended" if exc is None else f"its loop raised {type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Stop accepting, close every socket inside the server's own loop thread, then stop the workers.

        Closing sockets from another thread while the loop polls them makes waitress log EBADF tracebacks.
        """
        from waitress import wasyncore
        from waitress.trigger import trigger

        srv = self._server
        sockets = getattr(srv, "_map", None) or srv.map  # one server's, or those of one per address
        if self._thread.is_alive():
            wake = next(d for d in sockets.values() if isinstance(d, trigger))
            wake.pull_trigger(lambda: wasyncore.close_all(sockets))
            self._thread.join(timeout=3)
        else:  # never started (state_dir's lock refused): no loop polls the sockets
            wasyncore.close_all(sockets)
        srv.task_dispatcher.shutdown()  # type: ignore[union-attr]


def _evict_when_full(listener: Any, sockets: dict[int, Any]) -> None:
    """At its connection limit waitress stops accepting, so one client holding that many connections open (idle
    keep-alives, requests sent a byte at a time) kept every other out, /metrics and /healthz included, for as long
    as it went on.  Here the connection idle the longest with no request being served on it is closed instead (one
    at a time; those still sending an answer to a slow reader go last), so that a newcomer gets in; a request being
    served is never cut off."""
    from waitress.channel import HTTPChannel

    accepts = listener.readable  # asked on every turn of the server's loop, in its thread

    def readable() -> bool:
        try:
            if listener.accepting and len(sockets) >= listener.adj.connection_limit:
                idle = [c for c in sockets.values() if isinstance(c, HTTPChannel) and not c.requests]
                if idle:  # it closes on the loop's next turn, and the newcomer is accepted on the one after
                    if not any(c.will_close for c in idle):
                        min(idle, key=lambda c: (bool(c.total_outbufs_len), c.last_activity)).will_close = True
                    return False  # not accepting until then (waitress would log each such turn)
        except Exception:  # noqa: BLE001 - waitress internals (3.0) changed: its own behaviour, not a dead server
            log.debug("connection eviction skipped", exc_info=True)
        return bool(accepts())

    listener.readable = readable
