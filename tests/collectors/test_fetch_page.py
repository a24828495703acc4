"""fetch_page against misbehaving servers: a trickled body, an oversized page, a redirect to another host."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import PageServer

from sits_observe.collectors import promtext
from sits_observe.collectors.promtext import fetch_page
from sits_observe.errors import CollectorError


@pytest.fixture
def trickle() -> Iterator[int]:
    """A port whose server sends the headers of a 100 kB page, then one byte every 0.2 s for 6 s."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(30):
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(b"#")
                except OSError:  # the client gave up
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1]
    stop.set()
    thread.join()
    srv.close()


def test_a_trickled_page_fails_at_the_timeout_in_all(trickle: int) -> None:
    # each byte comes well within the timeout, so a per-read timeout alone would wait the whole 6 s
    t0 = time.monotonic()
    with pytest.raises(CollectorError, match=r"127\.0\.0\.1:\d+/metrics: the metrics page did not arrive within "
                                             r"the 1 s timeout"):
        fetch_page(f"http://scraper:s3cret@127.0.0.1:{trickle}/metrics", timeout=1.0)
    assert time.monotonic() - t0 < 2.0


def test_a_page_over_the_cap_is_refused(pages: PageServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promtext, "MAX_PAGE_BYTES", 1 << 20)
    pages.pages["/metrics"] = "#" * (1 << 20) + "\n"  # one byte over
    with pytest.raises(CollectorError, match=r"/metrics: the metrics page is larger than 1 MiB"):
        fetch_page(pages.url("/metrics"), timeout=5.0)
    pages.pages["/metrics"] = "#" * ((1 << 20) - 1) + "\n"  # the cap itself: read whole
    assert fetch_page(pages.url("/metrics"), timeout=5.0) == pages.pages["/metrics"]


def test_credentials_do_not_follow_a_redirect_to_another_server(pages: PageServer) -> None:
    other = PageServer()
    try:
        other.pages["/collect"] = "up 1\n"
        pages.redirect["/metrics"] = other.url("/collect")
        url = pages.url("/metrics").replace("http://", "http://scraper:s3cret@")
        assert fetch_page(url, timeout=5.0) == "up 1\n"
        assert pages.auth["/metrics"] == "Basic " + base64.b64encode(b"scraper:s3cret").decode()
        assert other.hits["/collect"] == 1 and other.auth["/collect"] is None
    finally:
        other.close()
