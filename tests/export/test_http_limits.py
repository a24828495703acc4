"""The HTTP server itself: a request body too large is refused from its headers, before it is read."""

import socket

from sits_observe.export.http import MAX_REQUEST_BODY, Server


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
