"""Inference servers (and a dcgm-exporter) that hang: their page fetches run together, so a tick waits about one
timeout however many hang; a fetch still out is not started again; a stop waits for none of them."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from conftest import DATA, PageServer
from in_thread import in_thread

from sits_observe.clock import WallClock
from sits_observe.collectors import servers
from sits_observe.collectors.promtext import fetch_page
from sits_observe.collectors.servers import ServerSource
from sits_observe.collectors.sources import build_sources
from sits_observe.config import Config, parse
from sits_observe.daemon import Daemon
from sits_observe.errors import CollectorError
from sits_observe.frame import BucketLayout, Frame


class Stalling:
    """A loopback port that accepts connections, counts them, and answers none; :meth:`hang_up` closes those open."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def accepted(self) -> int:
        return len(self._conns)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self._conns.append(self._sock.accept()[0])
            except TimeoutError:
                continue

    def hang_up(self) -> None:
        for conn in self._conns:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.hang_up()
        self._sock.close()


@pytest.fixture
def stalling() -> Iterator[Callable[[int], list[Stalling]]]:
    made: list[Stalling] = []

    def make(n: int) -> list[Stalling]:
        made.extend(Stalling() for _ in range(n))
        return made[-n:]

    yield make
    for server in made:  # ends the fetches still waiting on them
        server.close()


def _outliving_its_timeout(url: str, timeout: float) -> str:
    """fetch_page as if some wait of the request escaped its deadline: it hangs as long as the server does."""
    return fetch_page(url, 30.0)


def _config(tmp_path: Path, hung: list[Stalling], timeout: float, *, healthy: Sequence[dict[str, str]] = (),
            gpu: dict[str, object] | None = None) -> Config:
    entries = [{"kind": "vllm", "url": s.url, "workload": f"stuck{i}", "timeout": timeout} for i, s in enumerate(hung)]
    return parse({"state_dir": str(tmp_path), "gpu": gpu or {"backend": "none"}, "servers": [*entries, *healthy]},
                 env={})


def _fetches(server: Stalling) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"fetch {server.url}"]


def _too_slow(url: str, timeout: float) -> str:
    return f"CollectorError: {url}: the metrics page did not arrive within the {timeout:g} s timeout"


def test_hung_servers_hold_a_tick_for_one_timeout_not_the_sum(tmp_path: Path, pages: PageServer,
                                                                stalling: Callable[[int], list[Stalling]]) -> None:
    hung, [dcgm] = stalling(4), stalling(1)
    pages.pages["/vllm"] = (DATA / "vllm_page1.txt").read_text()
    cfg = _config(tmp_path, hung, 1.0, gpu={"backend": "dcgm", "dcgm_url": dcgm.url, "dcgm_timeout": 1.0},
                  healthy=[{"kind": "vllm", "url": pages.url("/vllm"), "workload": "chat"}])
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += build_sources(cfg, daemon.layout)  # the hung servers, the healthy one, then dcgm
    try:
        frame, took = in_thread(daemon.tick, 15)
        assert isinstance(frame, Frame)
        assert took < 2.0  # read one after another: five timeouts of 1 s
        for i, server in enumerate(hung):  # each its own source, error and count
            assert frame.errors[f"vllm:stuck{i}"] == _too_slow(server.url, 1.0)
        assert frame.errors["dcgm"] == _too_slow(dcgm.url, 1.0)
        assert frame.workload_gauges[("running_requests", "chat")] == 12  # read after four hung ones, all the same
        assert "vllm:chat" not in frame.errors
        counted = {s.labels: s.value for s in daemon.metrics() if s.name == "sits_source_errors_total"}
        assert counted == {**{(("source", f"vllm:stuck{i}"),): 1.0 for i in range(4)},
                           (("source", "dcgm"),): 1.0, (("source", "host"),): 0.0, (("source", "vllm:chat"),): 0.0}
    finally:
        daemon.close()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_fetch_still_out_at_the_next_tick_is_not_started_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 stalling: Callable[[int], list[Stalling]]) -> None:
    monkeypatch.setattr(servers, "fetch_page", _outliving_its_timeout)
    [server] = stalling(1)
    cfg = _config(tmp_path, [server], 0.5)
    clock = Clock()
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources.append(ServerSource(cfg.servers[0], daemon.layout, clock=clock))
    frame, took = in_thread(daemon.tick, 5)
    assert isinstance(frame, Frame) and took < 1.5
    assert frame.errors["vllm:stuck0"] == _too_slow(server.url, 0.5)
    for t in (5.0, 200.0):  # past the back-off each time: the fetch is due, but the last one is still out
        clock.t = t
        frame, took = in_thread(daemon.tick, 5)
        assert isinstance(frame, Frame) and took < 0.5  # known to hang: not waited for again
        assert re.fullmatch(rf"CollectorError: {re.escape(server.url)}: the fetch started \d+ s ago \(timeout 0\.5 s\) "
                            "has not ended; no other starts until it does", frame.errors["vllm:stuck0"])
    time.sleep(0.2)  # a second fetch, had one started, would have connected by now
    assert server.accepted == 1 and len(_fetches(server)) == 1
    assert daemon.health["vllm:stuck0"].errors == 3
    server.hang_up()  # the fetch ends (with an error no tick waits for any more)
    for _ in range(100):
        if not _fetches(server):
            break
        time.sleep(0.05)
    clock.t = 400.0
    frame, _ = in_thread(daemon.tick, 5)
    assert isinstance(frame, Frame) and frame.errors["vllm:stuck0"] == _too_slow(server.url, 0.5)
    assert server.accepted == 2  # the next due tick fetched again


def test_a_stop_does_not_wait_for_hung_fetches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               stalling: Callable[[int], list[Stalling]]) -> None:
    monkeypatch.setattr(servers, "fetch_page", _outliving_its_timeout)
    hung = stalling(4)
    cfg = _config(tmp_path, hung, 20.0)
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += build_sources(cfg, daemon.layout)
    stop = threading.Timer(0.3, daemon.stop_event.set)
    stop.start()
    _, took = in_thread(daemon.run, 10)
    assert took < 2.0  # the source being collected stops waiting at the stop, not at its 20 s; the others not asked
    assert daemon.store.ticks == 1
    assert all(len(_fetches(server)) == 1 for server in hung)  # still out: nothing waited for them
    closed, took = in_thread(daemon.close, 5)
    assert closed is True and took < 1.0


def test_a_fetch_thread_that_cannot_start_fails_only_its_tick(pages: PageServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pages.pages["/vllm"] = (DATA / "vllm_page1.txt").read_text()
    cfg = parse({"servers": [{"kind": "vllm", "url": pages.url("/vllm"), "workload": "chat"}]}, env={})
    clock = Clock()
    src = ServerSource(cfg.servers[0], BucketLayout(cfg.store.snapped()), clock=clock)

    def refused(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refused)
        with pytest.raises(CollectorError, match=r"/vllm: cannot start the fetch: can't start new thread$"):
            src.collect(Frame(0.0, 1.0))
    clock.t = 5.0  # past the back-off, threads to be had again
    frame = Frame(5.0, 1.0)
    src.collect(frame)
    assert frame.workload_gauges[("running_requests", "chat")] == 12
