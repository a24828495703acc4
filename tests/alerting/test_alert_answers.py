"""What a receiver answers: an answer that never ends cannot hold a sender, and one that echoes the URL
cannot carry its secret path into the reason shown in logs and the API."""

import base64
import shutil
import socketserver
import tempfile
import threading
import time
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote

from sits_observe.alerting.answers import retry_after
from sits_observe.alerting.config import AlertingConfig
from sits_observe.alerting.dispatch import Dispatcher
from sits_observe.alerting.formats import Alert

PATH = "/services/T0/B0/URLTOKEN?sig=QUERYSECRET"


class RawReceiver:
    """Reads one request per connection, then answers as ``mode`` says: ``endless`` (200, a chunked body
    that never ends), ``dribble`` (200, one byte of a 1 GB body every 0.1 s) or ``echo`` (404 quoting the
    request line, as a proxy's "Cannot POST ..." page does), ``quote-headers`` (401 quoting the credentials sent),
    ``headers`` (a header line every 0.1 s, never
    their end) or ``slow-ok`` (200 after 0.6 s)."""

    def __init__(self, mode: str) -> None:
        self.requests = 0
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += self.request.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += self.request.recv(65536)
                outer.requests += 1
                line = head.split(b"\r\n")[0].decode()
                try:
                    if mode == "quote-headers":  # 401 quoting the credentials, as a debugging proxy's page does
                        auth = [h.split(b":", 1)[1].strip() for h in head.split(b"\r\n")
                                if h.lower().startswith(b"authorization:")]
                        body = b"refused: " + b"|".join(auth + [base64.b64decode(a.split()[-1]) for a in auth])
                        self.request.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n" % len(body)
                                             + body)
                    elif mode == "echo":  # the ways servers quote a path: as sent, without its slash, JSON, encoded
                        path = line.split()[1]
                        body = (f"Cannot {line}|route {path.lstrip('/')}|{path.replace('/', chr(92) + '/')}"
                                f"|{quote(path, safe='')}|").encode() * 5
                        head = b"HTTP/1.1 404 No URLTOKEN\r\nContent-Length: %d\r\n\r\n" % len(body)
                        self.request.sendall(head + body)
                    elif mode == "slow-ok":  # 200 after 0.6 s
                        time.sleep(0.6)
                        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    elif mode == "headers":  # a status line, then a header line every 0.1 s, never the end
                        self.request.sendall(b"HTTP/1.1 200 OK\r\n")
                        for _ in range(600):
                            self.request.sendall(b"X-Slow: 1\r\n")
                            time.sleep(0.1)
                    elif mode == "endless":
                        self.request.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                        while True:
                            self.request.sendall(b"1000\r\n" + b"x" * 4096 + b"\r\n")
                    else:
                        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                        for _ in range(600):
                            self.request.sendall(b"x")
                            time.sleep(0.1)
                except OSError:
                    pass  # the sender closed the connection

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{PATH}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _dispatch(tmp_path, url: str, n: int) -> tuple[Dispatcher, float]:
    cfg = AlertingConfig.model_validate({"receivers": [{"type": "webhook", "name": "r", "url": url, "timeout": 1.0}],
                                         "backoff": {"initial": 0.02, "max": 0.1}})
    tmp_path.mkdir(exist_ok=True)
    d = Dispatcher(cfg, tmp_path)
    d.start()
    start = time.monotonic()
    for i in range(n):
        d.notify(Alert({"alertname": "SitsSloBurnRate", "slo": f"s{i}"}, {}, "firing", 1_700_000_000.0))
    return d, start


def _one_failure(tmp_path, rx: RawReceiver, url: str) -> tuple[dict, str]:
    """One alert sent to ``url`` (served by ``rx``), refused for good: its failure row and the API's state."""
    d, _ = _dispatch(tmp_path, url, 1)
    try:
        assert _wait(lambda: d.outbox.recent_failures(), 20)
        (failure,) = d.outbox.recent_failures()
        return failure, str(d.state())
    finally:
        d.close()
        rx.close()


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred():
        time.sleep(0.02)
    return pred()


def test_an_answer_that_never_ends_cannot_hold_the_sender(tmp_path) -> None:
    for mode in ("endless", "dribble"):
        rx = RawReceiver(mode)
        d, start = _dispatch(tmp_path / mode, rx.url, 3)
        try:
            assert _wait(lambda: not d.outbox.depth(), 20), (mode, d.outbox.depth())
            took = time.monotonic() - start
        finally:
            d.close()
            rx.close()
        assert rx.requests == 3 and took < 15, (mode, took)  # each within its 1 s timeout (with room for a busy CI)


def test_an_answer_echoing_the_url_shows_none_of_its_secret_path(tmp_path) -> None:
    rx = RawReceiver("echo")
    failure, state = _one_failure(tmp_path, rx, rx.url)
    reason = failure["reason"]
    assert reason.startswith("HTTP 404 No <hidden>: Cannot POST <hidden> HTTP/1.1|route <hidden>|"), reason
    assert "URLTOKEN" not in reason + state and "QUERYSECRET" not in reason + state and len(reason) < 260


def test_headers_that_never_end_are_a_failed_attempt_within_the_timeout(tmp_path) -> None:
    """Each read came within the socket's timeout, so a receiver (or a broken proxy) that dribbles its headers
    held the sender, and every later alert of that receiver, as long as it liked."""
    rx = RawReceiver("headers")
    d, _ = _dispatch(tmp_path, rx.url, 1)
    try:
        assert _wait(lambda: d.counts[("r", "retried")] >= 2, 10)  # each attempt given up after its 1 s
        assert d.counts[("r", "delivered")] == 0 and "no answer within 1 s" in str(d.state())
    finally:
        d.close()
        rx.close()


def test_close_waits_its_timeout_for_all_senders_together(tmp_path) -> None:
    """Senders still connecting (a receiver behind a firewall that drops packets: there is no socket yet to cut)
    were waited for one after another, 5 s each: three took 15 s, past the daemon's 10 s to close."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    backlog = []
    for _ in range(3):  # fill the accept queue: later connection attempts go unanswered, as if dropped
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        backlog.append(s)
    cfg = AlertingConfig.model_validate({"receivers": [
        {"type": "webhook", "name": f"r{i}", "url": f"http://127.0.0.1:{port}/h", "timeout": 30} for i in range(3)]})
    d = Dispatcher(cfg, tmp_path)
    d.notify(Alert({"alertname": "SitsSloBurnRate", "slo": "s"}, {}, "firing", 1_700_000_000.0))
    d.start()
    try:
        assert _wait(lambda: all(s._conn is not None for s in d.senders.values()), 5)  # each one connecting
        closing = threading.Thread(target=d.close, daemon=True)
        closing.start()
        closing.join(9)  # its 5 s for all three (the old code: 15 s)
        assert not closing.is_alive()
    finally:
        for s in backlog:
            s.close()
        srv.close()


def test_connecting_has_its_own_time_beside_the_answers(tmp_path, monkeypatch) -> None:
    """The watchdog started before connecting, so a slow connect (or TLS handshake) and a slow answer, each within
    the timeout, made a failed attempt, and a delivered alert was sent again."""
    import http.client

    real = http.client.HTTPConnection.connect

    def slow_connect(self) -> None:
        time.sleep(0.6)
        real(self)

    monkeypatch.setattr(http.client.HTTPConnection, "connect", slow_connect)
    rx = RawReceiver("slow-ok")
    d, _ = _dispatch(tmp_path, rx.url, 1)
    try:
        assert _wait(lambda: d.counts[("r", "delivered")] or d.counts[("r", "retried")], 5)
        assert d.counts[("r", "delivered")] == 1 and d.counts[("r", "retried")] == 0
    finally:
        d.close()
        rx.close()


def test_an_answer_quoting_the_request_headers_shows_no_credentials(tmp_path) -> None:
    """The ``Authorization: Basic <base64 of user:password>`` sent for a ``user:password@`` URL was not hidden:
    a page quoting the request's headers carried the credentials into the reason, logs and API."""
    rx = RawReceiver("quote-headers")
    failure, state = _one_failure(tmp_path, rx, rx.url.replace("http://", "http://am%40ops:pa%3As-s3cret@"))
    token = base64.b64encode(b"am@ops:pa:s-s3cret").decode()
    assert failure["reason"] == "HTTP 401 Unauthorized: refused: Basic <hidden>|am@ops:<hidden>", failure["reason"]
    assert token[:12] not in state and "s3cret" not in state


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    """An HTTP date (RFC 9110 allows it; proxies and some APIs send one) was ignored: retried at the back-off pace."""
    cfg = AlertingConfig.model_validate({"receivers": [{"type": "webhook", "name": "r", "url": "http://127.0.0.1:9/h"}],
                                         "backoff": {"initial": 1, "max": 600, "jitter": 0}})
    tmp = Path(tempfile.mkdtemp())
    d = Dispatcher(cfg, tmp)
    try:  # the receiver's wait, not the first back-off step of 1 s
        assert d.senders["r"]._delay(1, retry_after(formatdate(time.time() + 300, usegmt=True))) > 290
    finally:
        d.close()
        shutil.rmtree(tmp)
    now = 1_700_000_000.0
    assert retry_after("120", now) == 120.0
    assert retry_after(formatdate(now + 90, usegmt=True), now) == 90.0
    assert retry_after("Tue, 14 Nov 2023 22:14:50 -0000", now) == 90.0  # no zone: GMT, as the RFC has it
    assert retry_after(formatdate(now - 90, usegmt=True), now) == 0.0  # passed already: no extra wait
    assert [retry_after(v, now) for v in (None, "", "soon", "nan", "-inf")] == [None] * 5
    assert retry_after("-3", now) == 0.0
