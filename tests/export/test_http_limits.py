"""The HTTP server itself: a request body too large is refused from its headers, before it is read; descriptors
past 1023 (a daemon whose probes hold many perf events) are served; a client holding every connection open keeps
no other out."""

import os
import resource
import socket

import pytest

from sits_observe.export.http import CONNECTION_LIMIT, MAX_REQUEST_BODY, Server


def test_a_body_over_the_limit_is_refused_before_it_is_sent_or_read() -> None:
    called = []

    def app(environ, start_response):  # any route: the app must never see the request
        called.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    server = Server(app, "127.0.0.1", 0, threads=1)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            # the headers only: a client announcing 64 MiB gets its answer without sending a byte of it
            sock.sendall(f"POST /api/v1/shards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {64 << 20}\r\n\r\n".encode())
            answer = sock.recv(4096).decode(errors="replace")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            size = MAX_REQUEST_BODY // 2  # well over the API's own 1 MiB: that check is the app's
            sock.sendall(f"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode() + b"a" * size)
            within = sock.recv(4096).decode(errors="replace")
    finally:
        server.close()
    assert answer.startswith("HTTP/1.1 413"), answer
    assert within.startswith("HTTP/1.1 200"), within
    assert called == ["/x"]


def test_connections_on_descriptors_past_1023_are_served() -> None:
    """select() cannot watch a descriptor past 1023: the server's thread died on the first such connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: cannot open descriptors past 1023")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # what many probes' perf events hold

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    server = Server(app, "127.0.0.1", 0, threads=1)
    server.start()
    try:
        answers = []
        for _ in range(2):  # the first is served on a descriptor past 1023, and so is the next: the server lives on
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                assert sock.fileno() > 1023
                sock.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
                answers.append(sock.recv(4096).decode(errors="replace"))
    finally:
        server.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert all(a.startswith("HTTP/1.0 200") for a in answers), answers


def _ok(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def test_a_client_holding_every_connection_open_keeps_no_other_out() -> None:
    """At the connection limit waitress stopped accepting: /healthz and /metrics waited as long as the holder liked."""
    server = Server(_ok, "127.0.0.1", 0, threads=1)
    server.start()
    held = []
    try:
        for i in range(CONNECTION_LIMIT + 5):  # idle keep-alives, and requests sent a byte at a time
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHo")
            held.append(sock)
        answers = []
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
                answers.append(sock.recv(4096).decode(errors="replace"))
    finally:
        for sock in held:
            sock.close()
        server.close()
    assert all(a.startswith("HTTP/1.0 200") for a in answers), answers
