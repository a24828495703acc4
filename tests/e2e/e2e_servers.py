"""What the end-to-end test runs around the daemon: capturing HTTP receivers and real subprocesses."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

T = TypeVar("T")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "e2e"  # screenshots and process logs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.25) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Capture:
    """An HTTP server on loopback that answers 200 to every POST and keeps the bodies by path."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._lock:
                    outer.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[bytes]:
        with self._lock:
            return [b for p, b in self.posts if p == path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def otlp_spans(bodies: Sequence[bytes]) -> list[dict[str, Any]]:
    """Decode OTLP/HTTP protobuf export requests: one dict per span (name, ids, attributes, events)."""
    out = []
    for body in bodies:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append({"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                "resource": resource, "attributes": {a.key: _value(a.value) for a in s.attributes},
                                "events": [e.name for e in s.events]})
    return out


class Proc:
    """A subprocess with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, **kw: Any) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._fh = self.log.open("wb")
        self.p = subprocess.Popen(list(argv), stdout=self._fh, stderr=subprocess.STDOUT, **kw)

    def alive(self) -> bool:
        return self.p.poll() is None

    def wait_http(self, url: str, timeout: float) -> None:
        def up() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited with {self.p.returncode}:\n{self.tail()}")
            return http_ok(url)

        try:
            wait_for(f"{self.name} at {url}", up, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None

    def tail(self, n: int = 40) -> str:
        self._fh.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> int | None:
        if self.alive():
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
        self._fh.close()
        return self.p.returncode


@dataclass
class Stack:
    """The running stack: URLs of the daemon, Alertmanager and Prometheus, the capture server."""

    daemon: str
    alertmanager: str
    prometheus: str
    capture: Capture
    instance: str
    procs: dict[str, Proc] = field(default_factory=dict)

    def check_alive(self) -> None:
        for p in self.procs.values():
            assert p.alive(), f"{p.name} exited with {p.p.returncode}:\n{p.tail()}"
