"""A loopback HTTP receiver for alert deliveries whose answers follow a script.

Each request is recorded when it has been read (before the answer), with its delivery id, JSON body
and whether its HMAC signature verified.  ``script`` lists the answers to the first requests in
order: an int is an HTTP status, ``"hang"`` sleeps ``hang_s`` before answering 200 (past the sender's
timeout), ``"hold"`` answers :attr:`hold_status` (200) only when :attr:`release` is set (and sets
:attr:`holding` meanwhile).
Later requests get 200.  With ``idle_s`` a kept-alive connection idle that long is closed (as nginx's
``keepalive_timeout`` does).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Delivery:
    delivery_id: str
    body: Any
    signed_ok: bool | None
    answer: object
    authorization: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    def __init__(self, port: int = 0, script: list[object] | None = None, secret: str | None = None,
                 hang_s: float = 1.0, idle_s: float | None = None) -> None:
        self.script = list(script or [])
        self.secret = secret
        self.hang_s = hang_s
        self.deliveries: list[Delivery] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self.hold_status = 200
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = idle_s

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer = outer._record(self.headers, body)
                try:
                    if answer == "hang":
                        time.sleep(outer.hang_s)
                    elif answer == "hold":
                        outer.holding.set()
                        outer.release.wait(30)
                    status = answer if isinstance(answer, int) else outer.hold_status if answer == "hold" else 200
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up (timeout) or was killed

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _record(self, headers: Any, body: bytes) -> object:
        signed_ok = None
        if self.secret is not None:
            ts, sig = headers.get("X-Sits-Timestamp", ""), headers.get("X-Sits-Signature", "")
            want = "sha256=" + hmac.new(self.secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
            # the id a receiver deduplicates by is signed too: a replay with a new id does not verify
            signed = ts.encode() + b"." + headers.get("X-Sits-Delivery", "").encode() + b"." + body
            want2 = "sha256=" + hmac.new(self.secret.encode(), signed, hashlib.sha256).hexdigest()
            signed_ok = hmac.compare_digest(sig, want) and hmac.compare_digest(
                headers.get("X-Sits-Delivery-Signature", ""), want2)
        with self._lock:
            answer = self.script.pop(0) if self.script else 200
            self.deliveries.append(Delivery(headers.get("X-Sits-Delivery", ""), json.loads(body), signed_ok, answer,
                                            headers.get("Authorization")))
        return answer

    def accepted(self) -> list[Delivery]:
        """Deliveries the receiver took (answered 200, maybe after the sender gave up), first copy per delivery id."""
        out, seen = [], set()
        with self._lock:
            for d in self.deliveries:
                if d.answer in (200, "hang", "hold") and d.delivery_id not in seen:
                    seen.add(d.delivery_id)
                    out.append(d)
        return out

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
