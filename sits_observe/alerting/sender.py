"""Delivery: one worker thread per receiver drains its part of the outbox, oldest first.

A receiver's queue is strictly ordered: the head is retried (exponential back-off with jitter) on a
5xx, 408, 429, timeout or connection error, and later alerts wait behind it.  Any other non-2xx answer
is final, and so is a URL that http.client refuses (the config check already does): the message
moves to the outbox's ``failed`` table with the reason (a batch so refused is sent again one message per
request, so that only the one refused alone is given up).  A kept-alive connection the receiver closed
while idle is replaced at once, not counted as a failed attempt.  Webhook and Slack
receivers get one alert per request; Alertmanager up to ``max_batch`` (its API takes a list; the
dispatcher (:mod:`.dispatch`) re-queues firing alerts for it every ``resend_interval``, as Prometheus does).
Logs and errors name receivers, never their URL or secret.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from ..backoff import backoff_delay
from ..collectors.config import basic_auth
from ..errors import AlertingError
from .answers import describe, echoes, retry_after
from .config import BackoffConfig, ReceiverConfig
from .formats import render, sign
from .outbox import Message, Outbox

__all__ = ["Sender", "OUTCOMES"]

log = logging.getLogger("sits_observe.alerting")

OUTCOMES = ("delivered", "retried", "failed")
ANSWER_KEPT = 4096  # bytes of a receiver's answer read (a refusal's reason quotes 200 of them)
_RETRY_STATUS = {408, 429}
_AM_PATH = "/api/v2/alerts"


class _Retry(Exception):
    """A delivery attempt failed in a way worth retrying; ``after`` is the receiver's Retry-After, if any."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


class Sender(threading.Thread):
    """Delivers one receiver's messages; :meth:`wake` after queuing, :meth:`stop` to end."""

    def __init__(self, cfg: ReceiverConfig, outbox: Outbox, backoff: BackoffConfig, max_batch: int,
                 counts: Counter[tuple[str, str]], rng: random.Random | None = None, hold: float = 0.0) -> None:
        """``hold``: how long a firing alert sent to Alertmanager stays valid unless re-sent (:func:`render`)."""
        super().__init__(name=f"sits-alert-{cfg.label}", daemon=True)
        self.cfg = cfg
        self.outbox = outbox
        self.backoff = backoff
        self.hold = hold
        self.batch = max_batch if cfg.type == "alertmanager" else 1
        self.counts = counts
        self.rng = rng or random.Random()
        parts = urlsplit(cfg.url)
        self._https = parts.scheme == "https"
        # user:password@ in the URL (a proxy in front of Alertmanager): sent as HTTP basic auth, never logged
        self._auth = basic_auth(cfg.url)
        self._host, self._port = parts.hostname or "", parts.port
        path = parts.path or "/"
        if cfg.type == "alertmanager" and not path.endswith(_AM_PATH):
            path = path.rstrip("/") + _AM_PATH
        self._path = path + (f"?{parts.query}" if parts.query else "")
        # what a receiver's answer may echo of the request (a proxy's "Cannot POST /hooks/<token>"): the
        # path and query are the secret of many webhooks (Slack's among them), so never kept in a reason
        self._secrets = echoes(cfg.url, self._path, cfg.secret.get_secret_value() if cfg.secret else "", self._auth)
        self._conn: http.client.HTTPConnection | None = None
        self._wake = threading.Event()
        self._halt = threading.Event()
        self.failing: str | None = None  # reason while the head of the queue is failing
        self._solo = 0  # messages still to send one at a time: those of a batch refused for good

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ask the thread to end; a request in flight is cut off (its message stays queued)."""
        self._halt.set()
        self._wake.set()
        _shut(self._conn)

    def join_stopped(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end after :meth:`stop` (if it was started)."""
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        attempts = 0
        while not self._halt.is_set():
            try:
                attempts = self._step(attempts)
            except AlertingError as exc:  # the outbox itself failed (disk): say so, wait, try again
                log.error("receiver %s: %s", self.cfg.label, exc)
                self._halt.wait(self.backoff.max)
            except Exception as exc:  # noqa: BLE001 - a bug must not end deliveries until a restart
                # the type only: a message could quote the URL, whose path may be the receiver's secret
                log.error("receiver %s: unexpected %s while delivering; trying again in %g s",
                          self.cfg.label, type(exc).__name__, self.backoff.max)
                self._close_conn()
                self._halt.wait(self.backoff.max)
        self._close_conn()

    def _step(self, attempts: int) -> int:
        """Send the head of the queue once; returns the consecutive failed attempts so far."""
        batch = self.outbox.head(self.cfg.label, 1 if self._solo else self.batch)
        if not batch:
            self._solo = 0
            self._wake.wait(1.0)
            self._wake.clear()
            return 0
        try:
            self._post(batch)
        except _Retry as exc:
            if self._halt.is_set():
                return attempts
            self._note(batch, "retried", str(exc))
            self.outbox.attempted([m.id for m in batch], str(exc))
            self._halt.wait(self._delay(attempts + 1, exc.after))
            return attempts + 1
        except _Final as exc:
            if len(batch) > 1:  # which of them? Alertmanager takes the valid ones of a list it answers 400 to,
                # a proxy's 413 refuses all: each is sent alone next, and only one refused alone is given up
                log.warning("receiver %s: a batch of %d alerts refused (%s); sending them one at a time",
                            self.cfg.label, len(batch), exc)
                self._solo = len(batch)
                return 0
            self._note(batch, "failed", str(exc))
            self.outbox.failed([m.id for m in batch], str(exc), [m.version for m in batch])
        else:
            self._note(batch, "delivered", None)
            self.outbox.delivered(batch)
        self._solo = max(0, self._solo - len(batch))
        return 0

    def _delay(self, attempts: int, after: float | None) -> float:
        b = self.backoff
        delay = backoff_delay(attempts, b.initial, b.max, b.multiplier, b.jitter, self.rng)
        return min(b.max, max(delay, after or 0.0))

    def _note(self, batch: Sequence[Message], outcome: str, reason: str | None) -> None:
        self.counts[(self.cfg.label, outcome)] += len(batch)
        if outcome == "retried" and self.failing is None:
            log.warning("receiver %s: delivery failed (%s); retrying with back-off", self.cfg.label, reason)
        elif outcome == "failed":
            log.error("receiver %s: %d alert(s) refused for good: %s", self.cfg.label, len(batch), reason)
        elif outcome == "delivered" and self.failing is not None:
            log.info("receiver %s: delivering again", self.cfg.label)
        self.failing = reason if outcome == "retried" else None

    def _headers(self, body: bytes, batch: Sequence[Message]) -> dict[str, str]:
        ids = ",".join(f"{m.id}.{m.version}" for m in batch)
        headers = {"Content-Type": "application/json", "User-Agent": "sits-observe",
                   "X-Sits-Delivery": f"{self.outbox.instance}:{ids}"}
        if self._auth is not None:
            headers["Authorization"] = self._auth
        if self.cfg.secret is not None:
            ts = str(int(time.time()))
            headers["X-Sits-Timestamp"] = ts
            secret = self.cfg.secret.get_secret_value().encode()
            headers["X-Sits-Signature"] = sign(secret, ts, body)
            headers["X-Sits-Delivery-Signature"] = sign(secret, ts, body, headers["X-Sits-Delivery"])
        return headers

    def _post(self, batch: Sequence[Message]) -> None:
        body = render(self.cfg.type, [m.alert for m in batch], self.cfg.label, time.time(), self.hold)
        headers = self._headers(body, batch)
        try:
            resp, text = self._exchange(body, headers)
        except TimeoutError:
            self._close_conn()
            raise _Retry(f"no answer within {self.cfg.timeout:g} s") from None
        except http.client.InvalidURL:  # refused before sending: it would be at every attempt
            self._close_conn()
            raise _Final("InvalidURL: http.client refuses this receiver's url; fix it in the config") from None
        except (OSError, http.client.HTTPException) as exc:
            self._close_conn()
            raise _Retry(describe(exc)) from None
        status = resp.status
        if 200 <= status < 300:
            return
        reason = f"HTTP {status} {self._excerpt(resp.reason.encode())}: {self._excerpt(text)}".rstrip(": ")
        if status >= 500 or status in _RETRY_STATUS:
            raise _Retry(reason, retry_after(resp.getheader("Retry-After")))
        raise _Final(reason)

    def _exchange(self, body: bytes, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
        """POST ``body`` and read the answer.  A kept-alive connection that the receiver closed while it
        was idle fails at its next use: that is no failed attempt, so it is replaced and tried again once."""
        reused = self._conn is not None and self._conn.sock is not None
        try:
            return self._request(body, headers)
        except (BrokenPipeError, ConnectionResetError):  # also http.client.RemoteDisconnected
            if not reused or self._halt.is_set():
                raise
            self._close_conn()
            return self._request(body, headers)

    def _excerpt(self, text: bytes) -> str:
        """The first 200 characters of an answer, with anything of the URL or the secret it echoes hidden."""
        out = text.decode(errors="replace")
        for secret in self._secrets:
            out = out.replace(secret, "<hidden>")
        return out[:200].strip()

    def _request(self, body: bytes, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
        """One POST; TimeoutError when, once connected, its status line and headers have not all come within the
        receiver's timeout (the socket's timeout bounds each read, so an answer dribbled a byte at a time had none).
        Connecting (the TLS handshake too) has the socket's timeout of its own."""
        conn = self._connection()
        late = threading.Event()
        cut = threading.Timer(self.cfg.timeout, _cut_off, (conn, late))
        cut.daemon = True
        if conn.sock is None:  # the request connects first (after checking the URL): the watchdog starts then
            def connect(real: Callable[[], None] = conn.connect) -> None:
                real()
                cut.start()
            conn.connect = connect  # type: ignore[method-assign]
        else:
            cut.start()
        try:
            conn.request("POST", self._path, body=body, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException):
            if late.is_set():
                raise TimeoutError from None
            raise
        finally:
            cut.cancel()
            vars(conn).pop("connect", None)
        if late.is_set():  # the cut ended the headers early (an end of input, not an error): no answer to trust
            raise TimeoutError
        text = self._answer(resp, conn)
        if resp.will_close or not resp.isclosed():  # an answer not read to its end cannot be followed by another
            self._close_conn()
        return resp, text

    def _answer(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> bytes:
        """At most :data:`ANSWER_KEPT` bytes of the answer, within the receiver's timeout in all: one that
        streams or dribbles its answer cannot hold the sender (the status is known by then)."""
        deadline = time.monotonic() + self.cfg.timeout
        text = b""
        try:
            while len(text) < ANSWER_KEPT and not resp.isclosed() and (left := deadline - time.monotonic()) > 0:
                if conn.sock is not None:
                    conn.sock.settimeout(left)
                if not (chunk := resp.read1(ANSWER_KEPT - len(text))):
                    break
                text += chunk
        except (TimeoutError, OSError, http.client.HTTPException):
            pass  # the rest of the answer is lost with the connection, closed by the caller
        finally:
            if conn.sock is not None:
                conn.sock.settimeout(self.cfg.timeout)
        return text

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.cfg.timeout)
        return self._conn

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Final(Exception):
    """The receiver refused the message for good (a non-2xx answer other than 5xx, 408, 429)."""


def _cut_off(conn: http.client.HTTPConnection, late: threading.Event) -> None:
    """The request's time is up: end its socket, so the read waiting on it returns (one still connecting has its
    own timeout, the same)."""
    late.set()
    _shut(conn)


def _shut(conn: http.client.HTTPConnection | None) -> None:
    """End ``conn``'s socket, if it has one, so that a read waiting on it returns (the socket is read once: the
    sender thread may close the connection meanwhile)."""
    sock = None if conn is None else conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
