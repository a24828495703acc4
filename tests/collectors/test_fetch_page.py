"""fetch_page against misbehaving servers: trickled headers or body, an oversized page, a redirect to another host."""

from __future__ import annotations

import base64
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import PageServer

from sits_observe.collectors import promtext
from sits_observe.collectors.promtext import fetch_page
from sits_observe.errors import CollectorError


def _trickling_server(sent: bytes, trickled: bytes) -> Iterator[int]:
    """A port whose server sends ``sent`` at once, then ``trickled`` one byte every 0.2 s."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(sent)
            for i in range(len(trickled)):
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(trickled[i:i + 1])
                except OSError:  # the client gave up
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1]
    stop.set()
    thread.join()
    srv.close()


@pytest.fixture
def trickle() -> Iterator[int]:
    """A port whose server sends the headers of a 100 kB page, then one byte every 0.2 s for 6 s."""
    yield from _trickling_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n",
                                 b"#" * 30)


@pytest.fixture
def trickled_headers() -> Iterator[int]:
    """A port whose server sends its status and header lines one byte every 0.2 s (about 15 s in all)."""
    yield from _trickling_server(b"", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nup 1\n")


def test_a_trickled_page_fails_at_the_timeout_in_all(trickle: int) -> None:
    # each byte comes well within the timeout, so a per-read timeout alone would wait the whole 6 s
    t0 = time.monotonic()
    with pytest.raises(CollectorError, match=r"127\.0\.0\.1:\d+/metrics: the metrics page did not arrive within "
                                             r"the 1 s timeout"):
        fetch_page(f"http://scraper:s3cret@127.0.0.1:{trickle}/metrics", timeout=1.0)
    assert time.monotonic() - t0 < 2.0


def test_trickled_header_lines_fail_at_the_timeout_in_all(trickled_headers: int) -> None:
    # the status line and headers come a byte at a time: a per-read timeout alone would wait about 15 s
    outcome: list[object] = []

    def fetch() -> None:
        try:
            outcome.append(fetch_page(f"http://scraper:s3cret@127.0.0.1:{trickled_headers}/metrics", timeout=1.0))
        except Exception as exc:  # noqa: BLE001 (checked below, in the test's thread)
            outcome.append(exc)

    t0 = time.monotonic()
    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "fetch_page still waiting for the header lines after 5 s"
    assert time.monotonic() - t0 < 1.5
    [exc] = outcome
    assert isinstance(exc, CollectorError)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics: the metrics page did not arrive within the 1 s timeout",
                        str(exc))


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
