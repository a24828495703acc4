"""Shared fixtures: the fake NVML on each topology fixture, and a loopback HTTP server for scrapes."""

from __future__ import annotations

import ssl
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sits_observe.collectors.nvml_fake import FakeNvml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))

from topologies import fixture  # noqa: E402

DATA = Path(__file__).with_name("data")


@pytest.fixture
def fake() -> FakeNvml:
    """8 H100 on NVSwitch (the H100 SXM fixture)."""
    return FakeNvml(fixture("h100-sxm8"))


class PageServer:
    """Serves ``pages[path]`` (text) on 127.0.0.1 at a free port (over TLS with ``tls``); ``status[path]``
    overrides 200; ``redirect[path]`` answers 302 to that URL."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.pages: dict[str, str] = {}
        self.status: dict[str, int] = {}
        self.redirect: dict[str, str] = {}
        self.hits: dict[str, int] = {}
        self.auth: dict[str, str | None] = {}  # path -> the Authorization header of its last request
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                server.auth[self.path] = self.headers.get("Authorization")
                if self.path in server.redirect:
                    self.send_response(302)
                    self.send_header("Location", server.redirect[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = server.pages.get(self.path, "not found\n").encode()
                self.send_response(server.status.get(self.path, 200 if self.path in server.pages else 404))
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "http" if tls is None else "https"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer()
    yield server
    server.close()
