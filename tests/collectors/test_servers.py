"""ServerSource on pages that arrive but do not read: back-off, Triton's fractional counts, a bad bucket edge."""

from __future__ import annotations

import logging

import pytest
from conftest import PageServer

from sits_observe.collectors.config import ServerConfig
from sits_observe.collectors.servers import ServerSource
from sits_observe.config import parse
from sits_observe.errors import CollectorError
from sits_observe.frame import BucketLayout, Frame
from sits_observe.health import Health

LAYOUT = BucketLayout(parse({}, env={}).store.snapped())
E2E = "vllm:e2e_request_latency_seconds"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_malformed_page_backs_off_like_an_unreachable_server(pages: PageServer,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A page that arrived but did not read was fetched and parsed again every tick, and one whose quoted line
    changed each time logged a warning each tick."""
    served = [0]

    def page() -> str:
        served[0] += 1
        return f'vllm:num_requests_waiting{{model_name="m"}} {served[0]} 17 oops\n'

    clock = Clock()
    url = pages.url("/vllm").replace("http://", "http://scraper:s3cretpw@")
    src = ServerSource(ServerConfig(kind="vllm", url=url, workload="chat"), LAYOUT, clock=clock)
    health = Health()
    with caplog.at_level(logging.WARNING, logger="sits_observe.daemon"):
        for tick in range(8):
            clock.t = float(tick)
            pages.pages["/vllm"] = page()
            src.prefetch(None)
            health.guard(src.name, lambda: src.collect(Frame(clock.t, 1.0)), Frame(clock.t, 1.0))
    assert pages.hits["/vllm"] == 4  # asked at 0, 1, 3 and 7 s: back-off of 1, 2, 4 s
    assert health[src.name].errors == 4 and len(caplog.records) == 4
    message = health[src.name].last_error
    assert "line 1: not Prometheus text format" in message and "127.0.0.1" in message and "s3cretpw" not in message
    pages.pages["/vllm"] = 'vllm:num_requests_waiting{model_name="m"} 3\n'
    clock.t = 15.0  # 8 s after the last try
    frame = Frame(clock.t, 1.0)
    src.collect(frame)
    assert frame.workload_gauges == {("queue_depth", "chat"): 3.0}


TRITON = ('nv_inference_request_success{{model="m",version="1"}} {ok}\n'
          'nv_inference_request_duration_us{{model="m",version="1"}} {us}\n')


def test_a_triton_success_increase_below_one_request_adds_no_stage() -> None:
    """n = round(0.4) = 0 divided the duration by zero (ZeroDivisionError, not even a CollectorError)."""
    src = ServerSource(ServerConfig(kind="triton", url="http://127.0.0.1:1/metrics", workload="w"), LAYOUT)
    src.read(TRITON.format(ok=10, us=1000), Frame(0.0, 1.0))
    frame = Frame(1.0, 1.0)
    src.read(TRITON.format(ok=10.4, us=2000), frame)
    assert frame.hists == {} and frame.counters[("requests_total", "w")] == pytest.approx(0.4)
    frame = Frame(2.0, 1.0)
    src.read(TRITON.format(ok=12, us=5000), frame)
    assert frame.hists[("e2e", "w")].count == 2 and frame.hists[("e2e", "w")].sum == pytest.approx(0.003)


@pytest.mark.parametrize("le", ["fast", "NaN"])
def test_a_bucket_edge_that_is_no_number_fails_the_page_naming_the_server(le: str) -> None:
    """``float("fast")`` raised a ValueError that named neither the server nor the series."""
    src = ServerSource(ServerConfig(kind="vllm", url="http://u:s3cretpw@127.0.0.1:1/metrics", workload="w"), LAYOUT)
    page = f'{E2E}_bucket{{le="{le}"}} 1\n{E2E}_bucket{{le="+Inf"}} 1\n{E2E}_sum 1\n{E2E}_count 1\n'
    with pytest.raises(CollectorError, match=f"^http://127.0.0.1:1/metrics: {E2E}_bucket: le='{le}' is not a bucket"):
        src.read(page, Frame(0.0, 1.0))
