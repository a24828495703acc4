"""fetch_page against misbehaving servers and resolvers: trickled headers or body, an oversized page, a redirect to
another host, a DNS resolver that does not answer; and TLS checked against the host name."""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, PageServer
from in_thread import in_thread

from sits_observe.collectors import promtext
from sits_observe.collectors.promtext import fetch_page
from sits_observe.collectors.resolve import MAX_LOOKUPS
from sits_observe.collectors.sources import build_sources
from sits_observe.clock import WallClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.errors import CollectorError
from sits_observe.frame import Frame

_GETADDRINFO = socket.getaddrinfo


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
    exc, took = in_thread(lambda: fetch_page(f"http://scraper:s3cret@127.0.0.1:{trickled_headers}/metrics",
                                              timeout=1.0), 5)
    assert took < 1.5
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


def _raw_redirect(location: str, announced: int) -> tuple[socket.socket, threading.Event]:
    """A port whose server answers one request 302 to ``location`` with a body of ``announced`` bytes that it never
    sends: a client that reads the redirect's body waits until its timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: {announced}\r\n\r\n".encode())
        stop.wait(10)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, stop


def test_a_redirect_is_followed_without_reading_its_body(pages: PageServer) -> None:
    pages.pages["/collect"] = "up 1\n"
    srv, stop = _raw_redirect(pages.url("/collect"), 300 << 20)  # 300 MiB announced: urllib read it all first
    try:
        got, took = in_thread(lambda: fetch_page(f"http://127.0.0.1:{srv.getsockname()[1]}/metrics", 10.0), 15.0)
    finally:
        stop.set()
        srv.close()
    assert got == "up 1\n" and took < 5, (got, took)  # reading the body would have waited the whole 10 s


def test_a_redirect_to_ftp_is_refused_without_following_it() -> None:
    srv, stop = _raw_redirect("ftp://198.51.100.7/metrics?user=SECRET", 0)  # TEST-NET-2: nothing answers there
    try:
        got, took = in_thread(lambda: fetch_page(f"http://127.0.0.1:{srv.getsockname()[1]}/metrics", 10.0), 15.0)
    finally:
        stop.set()
        srv.close()
    assert isinstance(got, CollectorError) and "not http(s)" in str(got) and took < 5, (got, took)
    assert "SECRET" not in str(got)


def test_messages_show_the_url_without_its_query_or_credentials(pages: PageServer) -> None:
    url = pages.url("/missing?token=QUERYSECRET").replace("http://", "http://scraper:s3cret@")
    with pytest.raises(CollectorError) as err:
        fetch_page(url, timeout=5.0)
    assert "/missing?<hidden>: HTTP 404" in str(err.value)
    assert "QUERYSECRET" not in str(err.value) and "s3cret" not in str(err.value)


def test_a_label_set_too_long_is_refused_and_long_ones_are_not_kept() -> None:
    from sits_observe.collectors.promtext import MAX_LABEL_BLOCK, PageParser

    parser = PageParser()
    wanted = lambda name: True  # noqa: E731
    mid = 'a="' + "x" * 2000 + '"'
    for i in range(50):  # a new long label set on every page: parsed, not kept
        assert parser.parse(f'm{{{mid},i="{i}"}} 1\n', wanted)["m"][0][1] == 1.0
    assert all(len(block) <= 1024 for block in parser._labels)
    with pytest.raises(CollectorError, match=f"line 2: a label set of {MAX_LABEL_BLOCK + 4} bytes; at most"):
        parser.parse('m{a="1"} 1\nm{a="' + "x" * MAX_LABEL_BLOCK + '"} 2\n', wanted, source="p")


@pytest.mark.parametrize("line,labels,value", [
    # an exemplar: the label block ran to the exemplar's "}", so its value replaced the sample's
    ('m_bucket{le="1"} 3 # {trace_id="abc"} 0.5', {"le": "1"}, 3.0),
    ('m_bucket{le="1"} 3 # {trace_id="abc"} 0.5 1700000000.123', {"le": "1"}, 3.0),
    ("m_total 7 # {trace_id=\"a\"} 1", {}, 7.0),
    ("m 3 1700000000.123", {}, 3.0),  # OpenMetrics' float timestamp: the whole page failed
    ("m 3 1700000000123", {}, 3.0),
    ('m{a="x}y",b="\\"}"} 2', {"a": "x}y", "b": '"}'}, 2.0),  # quoted "}" and escaped quotes
])
def test_samples_with_exemplars_float_timestamps_or_braces_in_values_read_right(line: str, labels: dict[str, str],
                                                                                value: float) -> None:
    from sits_observe.collectors.promtext import PageParser

    (name,) = {line.partition("{")[0].partition(" ")[0]}
    assert PageParser().parse(line + "\n", lambda n: True)[name] == [(labels, value)]


class HungResolver:
    """socket.getaddrinfo whose lookups of names under ``.hung.test`` get no answer until :meth:`release`, then
    127.0.0.1; literal addresses (AI_NUMERICHOST) and other names are answered as usual."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.waiting = 0  # lookups without an answer yet
        self.most = 0  # the most that were waiting at once

    def getaddrinfo(self, host: str, port: Any, family: int = 0, kind: int = 0, proto: int = 0,
                    flags: int = 0) -> list[Any]:
        if flags & socket.AI_NUMERICHOST or not host.endswith(".hung.test"):
            return _GETADDRINFO(host, port, family, kind, proto, flags)
        with self._lock:
            self.waiting += 1
            self.most = max(self.most, self.waiting)
        try:
            self.released.wait(60)
        finally:
            with self._lock:
                self.waiting -= 1
        return _GETADDRINFO("127.0.0.1", port, family, kind, proto, flags)


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungResolver]:
    resolver = HungResolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver.getaddrinfo)
    yield resolver
    resolver.released.set()
    for _ in range(100):  # the lookups left waiting end (before the next test patches getaddrinfo)
        if resolver.waiting == 0:
            break
        time.sleep(0.05)


def test_a_hung_name_lookup_fails_its_source_at_the_timeout_and_the_others_still_read(
        tmp_path: Path, pages: PageServer, hung: HungResolver) -> None:
    pages.pages["/vllm"] = (DATA / "vllm_page1.txt").read_text()
    cfg = parse({"state_dir": str(tmp_path), "servers": [
        {"kind": "vllm", "url": "http://vllm-0.hung.test:8000/metrics", "workload": "stuck", "timeout": 1.0},
        {"kind": "vllm", "url": pages.url("/vllm"), "workload": "chat"}]}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += build_sources(cfg, daemon.layout)
    try:
        frame, took = in_thread(daemon.tick, 5)  # before the lookup had a deadline: held until the resolver answers
        assert took < 1.5 and isinstance(frame, Frame)
        assert frame.errors["vllm:stuck"] == (
            "CollectorError: http://vllm-0.hung.test:8000/metrics: the host name 'vllm-0.hung.test' did not resolve "
            "within the 1 s timeout (is the DNS resolver answering?)")
        assert frame.workload_gauges[("running_requests", "chat")] == 12
    finally:
        daemon.close()


def test_hung_lookups_hold_a_few_threads_however_often_they_are_asked(pages: PageServer, hung: HungResolver) -> None:
    pages.pages["/metrics"] = "up 1\n"
    port = pages.httpd.server_address[1]
    threads = threading.active_count()
    for _ in range(10):  # one host, asked every tick while its lookup hangs: still one lookup
        exc, took = in_thread(lambda: fetch_page(f"http://vllm-0.hung.test:{port}/metrics", timeout=0.1), 2)
        assert isinstance(exc, CollectorError) and "did not resolve" in str(exc) and took < 0.5
    assert hung.waiting == 1
    for i in range(3 * MAX_LOOKUPS):  # ever new hosts (a redirect can name any): at most MAX_LOOKUPS lookups
        exc, took = in_thread(lambda i=i: fetch_page(f"http://vllm-{i}.hung.test:{port}/metrics", timeout=0.1), 2)
        assert isinstance(exc, CollectorError) and took < 0.5
    assert str(exc) == (f"http://vllm-{3 * MAX_LOOKUPS - 1}.hung.test:{port}/metrics: cannot fetch the metrics page: "
                        f"cannot look up 'vllm-{3 * MAX_LOOKUPS - 1}.hung.test': {MAX_LOOKUPS} earlier lookups are "
                        "still waiting on the DNS resolver")
    assert hung.most == MAX_LOOKUPS
    assert threading.active_count() - threads <= MAX_LOOKUPS
    hung.released.set()
    # the resolver answers again: the next fetch looks the name up afresh (no failure was remembered)
    assert fetch_page(f"http://vllm-0.hung.test:{port}/metrics", timeout=5.0) == "up 1\n"


def test_a_literal_address_is_not_looked_up(pages: PageServer, monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[tuple[str, bool]] = []  # (host, whether asked from a thread other than the fetching one)
    fetching = threading.current_thread()

    def getaddrinfo(host: str, *args: Any) -> list[Any]:
        lookups.append((host, threading.current_thread() is not fetching))
        return _GETADDRINFO(host, *args)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    pages.pages["/metrics"] = "up 1\n"
    assert fetch_page(pages.url("/metrics"), timeout=5.0) == "up 1\n"
    assert ("127.0.0.1", True) not in lookups
    assert fetch_page(pages.url("/metrics").replace("127.0.0.1", "localhost"), timeout=5.0) == "up 1\n"
    assert ("localhost", True) in lookups


@pytest.fixture(scope="module")
def localhost_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for the name ``localhost`` (not for 127.0.0.1), and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def test_https_checks_the_certificate_against_the_host_name(localhost_cert: tuple[Path, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = localhost_cert
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    names: list[str | None] = []

    def sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        names.append(name)

    served.sni_callback = sni
    monkeypatch.setattr(ssl, "_create_default_https_context", lambda: ssl.create_default_context(cafile=str(cert)))
    server = PageServer(tls=served)
    try:
        server.pages["/metrics"] = "up 1\n"
        # connected to an address looked up for localhost; the certificate checked, and SNI sent, for the name
        assert fetch_page(server.url("/metrics").replace("127.0.0.1", "localhost"), timeout=5.0) == "up 1\n"
        assert names == ["localhost"]
        with pytest.raises(CollectorError, match=r"certificate is not valid for '127\.0\.0\.1'"):
            fetch_page(server.url("/metrics"), timeout=5.0)
    finally:
        server.close()


def test_servers_fetched_together_share_the_lookup_slots_instead_of_failing(
        tmp_path: Path, pages: PageServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick starts every page fetch at once: 12 hosts whose names take 20 ms to resolve, more than MAX_LOOKUPS,
    had the same 4 fail at every tick with a message about a hung resolver; 8 replicas of one host name on
    different ports are one lookup."""
    asked: list[str] = []
    delay = [0.02]

    def slow(host: str, port: Any, family: int = 0, kind: int = 0, proto: int = 0, flags: int = 0) -> list[Any]:
        if flags & socket.AI_NUMERICHOST or not host.endswith(".slow.test"):
            return _GETADDRINFO(host, port, family, kind, proto, flags)
        asked.append(host)
        time.sleep(delay[0])
        return _GETADDRINFO("127.0.0.1", port, family, kind, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    pages.pages["/vllm"] = (DATA / "vllm_page1.txt").read_text()
    port = pages.httpd.server_address[1]
    servers = [{"kind": "vllm", "url": f"http://vllm-{i}.slow.test:{port}/vllm", "workload": f"w{i}"}
               for i in range(12)]
    cfg = parse({"state_dir": str(tmp_path), "servers": servers}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += build_sources(cfg, daemon.layout)
    try:
        for _ in range(3):
            frame, _took = in_thread(daemon.tick, 10)
            assert frame.errors == {}
        assert len(asked) == 36 and pages.hits["/vllm"] == 36
        replicas = [{"kind": "vllm", "url": f"http://replicas.slow.test:{p}/vllm", "workload": "chat"}
                    for p in range(port, port + 8)]
        asked.clear()
        delay[0] = 0.5  # every replica's fetch starts while the first one's lookup is out
        cfg = parse({"state_dir": str(tmp_path), "servers": replicas}, env={})
        sources = build_sources(cfg, daemon.layout)
        for src in sources:
            src.prefetch()
        for src in sources:
            with contextlib.suppress(CollectorError):  # only the first port has a server
                src.collect(Frame(ts=1.0, interval=1.0))
        assert asked == ["replicas.slow.test"]
    finally:
        daemon.close()


def test_a_page_of_unbounded_series_is_refused() -> None:
    """A 30 MiB page of 519,000 label sets held the tick 6.6 s and left 254 MiB of counters per source."""
    from sits_observe.collectors.promtext import MAX_SAMPLES, PageParser

    page = "".join(f'vllm:e2e_request_latency_seconds_count{{request_id="{i}"}} 1\n' for i in range(MAX_SAMPLES + 1))
    with pytest.raises(CollectorError, match=f"p: more than {MAX_SAMPLES} samples of the metrics read; page refused"):
        PageParser().parse(page, lambda n: n.startswith("vllm:"), source="p")
    assert len(PageParser().parse(page, lambda n: n.startswith("nv_"), source="p")) == 0  # not read: not counted


def test_a_value_with_underscores_is_not_a_number() -> None:
    """float() takes "1_000"; Prometheus refuses such a page, and so does the parser now."""
    from sits_observe.collectors.promtext import PageParser

    with pytest.raises(CollectorError, match="p: line 2: not Prometheus text format: 'm 1_000'"):
        PageParser().parse("m 1\nm 1_000\n", lambda n: True, source="p")
