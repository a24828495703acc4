"""dcgm-exporter, vLLM and Triton pages served over loopback HTTP, scraped into Frames."""

from __future__ import annotations

import base64
import bisect
import socket

import numpy as np
import pytest
from conftest import DATA, PageServer
from prometheus_client.parser import text_string_to_metric_families

from sits_observe.collectors.config import ServerConfig
from sits_observe.collectors.dcgm import DcgmSource
from sits_observe.collectors.promtext import PageParser, redact
from sits_observe.collectors.cumulative import Cumulative, rebucket
from sits_observe.collectors.servers import ServerSource
from sits_observe.config import parse
from sits_observe.errors import CollectorError, ConfigError, StillDown
from sits_observe.frame import GPU_FIELD_INDEX, BucketLayout, Frame

MIB = 1024.0**2
LAYOUT = BucketLayout(parse({}, env={}).store.snapped())
PAGES = ("dcgm_exporter_page.txt", "vllm_page1.txt", "vllm_page2.txt", "triton_page1.txt", "triton_page2.txt")


def _page(name: str) -> str:
    return (DATA / name).read_text()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# ---- dcgm-exporter ------------------------------------------------------------------------------

DCGM_EXPECTED = {  # field -> (GPU 0, GPU 1) from the recorded page
    "utilization_ratio": (0.73, 0.18),
    "memory_utilization_ratio": (0.41, 0.06),
    "memory_used_bytes": (20480 * MIB, 1992 * MIB),  # GPU 1's MIG-instance series is not the device's
    "memory_total_bytes": (81559 * MIB, 81559 * MIB),
    "sm_clock_hertz": (1980e6, 1755e6),
    "memory_clock_hertz": (2619e6, 2619e6),
    "power_watts": (512.345, 398.1),
    "temperature_celsius": (61, 57),
    "throttle_reasons": (0x24, 0x1),
    "pcie_rx_bytes_per_second": (2097152, 524288),
    "pcie_tx_bytes_per_second": (3145728, 1048576),
    "nvlink_rx_bytes_per_second": (6291456000, 0),
    "nvlink_tx_bytes_per_second": (7340032000, 0),
    "ecc_corrected_errors_total": (5, 0),
    "ecc_uncorrected_errors_total": (1, 0),
    "retired_pages": (3, 0),
}


def test_dcgm_page_fills_the_gpu_fields(pages: PageServer) -> None:
    pages.pages["/metrics"] = _page("dcgm_exporter_page.txt")
    clock = Clock()
    src = DcgmSource(pages.url("/metrics"), sample_interval=5.0, clock=clock)
    frame = Frame(0.0, 1.0)
    src.collect(frame)
    gpu = frame.gpu
    assert [(g.index, g.uuid[-4:], g.pci_bus_id) for g in gpu.info] == [
        (0, "89ab", "00000000:18:00.0"), (1, "89ab", "00000000:2A:00.0")]
    assert {g.model for g in gpu.info} == {"NVIDIA H100 80GB HBM3"}
    for name, want in DCGM_EXPECTED.items():
        assert list(gpu.values[:, GPU_FIELD_INDEX[name]]) == pytest.approx(list(want)), name
    for name in ("nvlink_rx_bytes_total", "nvlink_tx_bytes_total", "xid_errors_total"):
        assert np.isnan(gpu.values[:, GPU_FIELD_INDEX[name]]).all()  # not on a dcgm-exporter page
    detail = {(s.name, s.labels[0][1], s.labels[4:]): s.value for s in frame.samples}
    assert detail[("sits_gpu_last_xid", "1", ())] == 79
    assert detail[("sits_gpu_remapped_rows", "0", (("kind", "uncorrectable"),))] == 1
    # the next ticks within sample_interval reuse the page
    clock.t = 4.0
    again = Frame(4.0, 1.0)
    src.collect(again)
    assert pages.hits["/metrics"] == 1 and np.array_equal(again.gpu.values, gpu.values, equal_nan=True)
    clock.t = 5.0
    src.collect(Frame(5.0, 1.0))
    assert pages.hits["/metrics"] == 2


def test_dcgm_failures_name_the_url(pages: PageServer) -> None:
    pages.pages["/metrics"] = "internal error\n"
    pages.status["/metrics"] = 500
    src = DcgmSource(pages.url("/metrics"), clock=Clock())
    frame = Frame(0.0, 1.0)
    with pytest.raises(CollectorError, match=r"127\.0\.0\.1:\d+/metrics: HTTP 500"):
        src.collect(frame)
    assert frame.gpu is None
    pages.pages["/node"] = _page("vllm_page1.txt")
    with pytest.raises(CollectorError, match="no DCGM_FI_"):
        DcgmSource(pages.url("/node"), clock=Clock()).collect(Frame(0.0, 1.0))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CollectorError, match="cannot fetch the metrics page"):
        DcgmSource(f"http://127.0.0.1:{port}/metrics", timeout=1.0, clock=Clock()).collect(Frame(0.0, 1.0))


def test_dcgm_good_page_after_a_bad_one(pages: PageServer) -> None:
    clock = Clock()
    pages.pages["/metrics"] = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} not-a-number\n"
    src = DcgmSource(pages.url("/metrics"), sample_interval=5.0, clock=clock)
    with pytest.raises(CollectorError, match="line 1: not Prometheus text format"):
        src.collect(Frame(0.0, 1.0))
    clock.t = 1.0
    idle = Frame(1.0, 1.0)
    with pytest.raises(StillDown):  # waits for the next sample: no stale data, no new request, still down
        src.collect(idle)
    assert idle.gpu is None and pages.hits["/metrics"] == 1
    pages.pages["/metrics"] = _page("dcgm_exporter_page.txt")
    clock.t = 5.0
    frame = Frame(5.0, 1.0)
    src.collect(frame)
    assert frame.gpu.values[0, GPU_FIELD_INDEX["utilization_ratio"]] == pytest.approx(0.73)


def test_dcgm_series_repeated_per_pod_count_once() -> None:
    """Kubernetes GPU sharing: dcgm-exporter repeats each GPU's series once per pod using it."""
    plain = _page("dcgm_exporter_page.txt")
    shared = "".join(line.replace("} ", f',container="srv",namespace="ml",pod="{pod}"}} ', 1) + "\n"
                     for line in plain.splitlines() for pod in (("a", "b") if "{" in line else ("",)))
    assert shared.count('pod="b"') > 40
    want, got = DcgmSource("http://h:9400/metrics").read(plain), DcgmSource("http://h:9400/metrics").read(shared)
    assert got.gpu.info == want.gpu.info
    assert np.array_equal(got.gpu.values, want.gpu.values, equal_nan=True)  # memory_total_bytes not doubled
    assert got.samples == want.samples  # one sits_gpu_last_xid / remapped_rows series per GPU, not per pod


@pytest.mark.parametrize("dropped", ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"])
def test_dcgm_memory_total_needs_used_and_free(dropped: str) -> None:
    """A counters file without FB_FREE made the total the used memory alone: every GPU read 100 % full (a
    memory-pressure cause for the classifier, a saturation trigger for the scheduler)."""
    page = "".join(line + "\n" for line in _page("dcgm_exporter_page.txt").splitlines()
                   if not line.startswith(dropped + "{"))
    gpu = DcgmSource("http://h:9400/metrics").read(page).gpu
    assert np.isnan(gpu.values[:, GPU_FIELD_INDEX["memory_total_bytes"]]).all()
    assert gpu.values[0, GPU_FIELD_INDEX["power_watts"]] == 512.345
    without_reserved = "".join(line + "\n" for line in _page("dcgm_exporter_page.txt").splitlines()
                               if not line.startswith("DCGM_FI_DEV_FB_RESERVED{"))  # older DCGM: used + free
    gpu = DcgmSource("http://h:9400/metrics").read(without_reserved).gpu
    assert np.isfinite(gpu.values[:, GPU_FIELD_INDEX["memory_total_bytes"]]).all()


def test_dcgm_gpu_in_mig_mode_keeps_its_device_wide_fields() -> None:
    """dcgm-exporter lists a GPU in MIG mode only through its instances' series (GPU_I_ID set), each repeating the
    GPU's clocks, power, temperature and error counts: the GPU vanished, and a host all in MIG mode read as
    'no DCGM_FI_* GPU series on the page' every sample."""
    plain = _page("dcgm_exporter_page.txt")
    mig = "".join(line.replace("} ", f',GPU_I_PROFILE="3g.40gb",GPU_I_ID="{gi}"}} ', 1) + "\n" if gi else line + "\n"
                  for line in plain.splitlines()
                  for gi in (("1", "2") if 'gpu="1"' in line and "GPU_I_ID" not in line else ("",)))
    want, got = DcgmSource("http://h:9400/metrics").read(plain), DcgmSource("http://h:9400/metrics").read(mig)
    assert got.gpu.info == want.gpu.info
    assert np.array_equal(got.gpu.values[0], want.gpu.values[0], equal_nan=True)
    col = GPU_FIELD_INDEX
    for name in ("sm_clock_hertz", "memory_clock_hertz", "power_watts", "temperature_celsius", "throttle_reasons",
                 "ecc_corrected_errors_total", "ecc_uncorrected_errors_total", "retired_pages"):
        assert got.gpu.values[1, col[name]] == want.gpu.values[1, col[name]], name
    for name in ("utilization_ratio", "memory_used_bytes", "memory_total_bytes", "pcie_rx_bytes_per_second"):
        assert np.isnan(got.gpu.values[1, col[name]]), name  # per instance (or not offered) in MIG mode
    assert got.samples == want.samples  # the last XID and remapped rows once, not per instance
    only_mig = "".join(line + "\n" for line in mig.splitlines() if 'gpu="0"' not in line)
    alone = DcgmSource("http://h:9400/metrics").read(only_mig)
    assert [g.index for g in alone.gpu.info] == [1] and alone.gpu.values[0, col["power_watts"]] == 398.1


# ---- vLLM ---------------------------------------------------------------------------------------

VLLM_EDGES = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
              480.0, 960.0, 1920.0, 7680.0]
TTFT_EDGES = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
              80.0, 160.0, 640.0, 2560.0]
# observations between vllm_page1 and vllm_page2 (how the recorded pages were made)
VLLM_NEW = {"e2e": [0.25, 0.7, 1.2, 3.0, 3.0], "queue": [0.004, 0.3, 0.02, 0.02, 0.6],
            "prefill": [0.03, 0.09, 0.11, 0.5, 0.07], "decode": [0.2, 0.3, 1.05, 2.4, 2.3]}
TTFT_NEW = [0.034, 0.39, 0.13, 0.52, 0.67]


def _conservative(values: list[float], src_edges: list[float]) -> dict[float, int]:
    """Exported bucket upper edge -> count, placing each value at its source bucket's upper edge."""
    out: dict[float, int] = {}
    for v in values:
        upper = src_edges[bisect.bisect_left(src_edges, v)]
        ours = LAYOUT.uppers()[bisect.bisect_left(list(LAYOUT.edges), upper)]
        out[float(ours)] = out.get(float(ours), 0) + 1
    return out


def _buckets(frame: Frame, stage: str, workload: str = "chat") -> dict[float, int]:
    counts = frame.hists[(stage, workload)].counts
    return {float(LAYOUT.uppers()[i]): int(c) for i, c in enumerate(counts) if c}


def _server(pages: PageServer, kind: str, **extra: object) -> ServerSource:
    cfg = ServerConfig(kind=kind, url=pages.url(f"/{kind}"), workload="chat", **extra)
    return ServerSource(cfg, LAYOUT, clock=Clock())


def _two_pages(pages: PageServer, src: ServerSource, first: str, second: str) -> tuple[Frame, Frame]:
    frames = []
    for text in (first, second):
        pages.pages[f"/{src.config.kind}"] = text
        frame = Frame(float(len(frames)), 1.0)
        src.collect(frame)
        frames.append(frame)
    return frames[0], frames[1]


def test_vllm_stage_deltas_gauges_and_counters(pages: PageServer) -> None:
    src = _server(pages, "vllm")
    first, second = _two_pages(pages, src, _page("vllm_page1.txt"), _page("vllm_page2.txt"))
    assert first.hists == {} and first.counters == {}  # the first page is the baseline
    assert first.workload_gauges == {("running_requests", "chat"): 12, ("queue_depth", "chat"): 3,
                                     ("kv_cache_usage_ratio", "chat"): 0.42}
    for stage, values in VLLM_NEW.items():
        assert _buckets(second, stage) == _conservative(values, VLLM_EDGES), stage
        assert second.hists[(stage, "chat")].sum == pytest.approx(sum(values))
    assert set(second.hists) == {(s, "chat") for s in VLLM_NEW}
    assert second.counters == {("requests_total", "chat"): 5, ("preemptions_total", "chat"): 2,
                               ("tokens_generated_total", "chat"): 1500}
    assert second.workload_gauges[("queue_depth", "chat")] == 0
    assert second.workload_gauges[("kv_cache_usage_ratio", "chat")] == pytest.approx(0.37)


def test_vllm_without_prefill_histogram_uses_time_to_first_token(pages: PageServer) -> None:
    def old(text: str) -> str:
        return "".join(line + "\n" for line in text.splitlines() if "request_prefill_time" not in line)

    src = _server(pages, "vllm")
    _, second = _two_pages(pages, src, old(_page("vllm_page1.txt")), old(_page("vllm_page2.txt")))
    assert _buckets(second, "prefill") == _conservative(TTFT_NEW, TTFT_EDGES)


def test_vllm_restart_is_not_a_negative_rate(pages: PageServer) -> None:
    src = _server(pages, "vllm")
    _, after = _two_pages(pages, src, _page("vllm_page2.txt"), _page("vllm_page1.txt"))
    # page1 after page2: counters went down -> the server restarted; the delta is page1's own values
    assert after.counters[("requests_total", "chat")] == 8
    assert after.counters[("preemptions_total", "chat")] == 7
    assert after.hists[("e2e", "chat")].count == 8
    assert all(v >= 0 for v in after.counters.values()) and src.counters.resets > 0


@pytest.mark.parametrize("bad", ["+Inf", "NaN", "-3.0", "1e30"])
def test_a_counter_value_that_is_no_count_skips_the_page_and_loses_nothing(pages: PageServer, bad: str) -> None:
    src = _server(pages, "vllm")
    first = _page("vllm_page1.txt")
    series = 'vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
    broken = first.replace(f"{series} 7.0", f"{series} {bad}")
    assert broken != first
    pages.pages["/vllm"] = first
    src.collect(Frame(0.0, 1.0))
    pages.pages["/vllm"] = broken
    with pytest.raises(CollectorError, match="vllm:num_preemptions_total: a value that is no count"):
        src.collect(Frame(1.0, 1.0))
    pages.pages["/vllm"] = _page("vllm_page2.txt")
    src.clock.t = 1.0  # past the back-off after the bad page
    after = Frame(2.0, 1.0)
    src.collect(after)  # counted against the last good page: no restart, no lifetime added
    assert after.counters[("preemptions_total", "chat")] == 2 and src.counters.resets == 0


@pytest.mark.parametrize("series,bad", [
    # Triton's counters have no counter suffix: they were never checked, so +Inf made the next good page count
    # the server's whole lifetime, and -5 a "restart" that sent the exported counter backwards
    ('nv_inference_request_success{model="llama",version="1"} 1000', "+Inf"),
    ('nv_inference_request_success{model="llama",version="1"} 1000', "-5"),
    ('nv_inference_request_duration_us{model="llama",version="1"} 151000000', "NaN"),
])
def test_a_triton_counter_that_is_no_count_skips_the_page_and_loses_nothing(pages: PageServer, series: str,
                                                                            bad: str) -> None:
    src = _server(pages, "triton", model="llama")
    first = _page("triton_page1.txt")
    broken = first.replace(series, series.rsplit(" ", 1)[0] + f" {bad}")
    assert broken != first
    pages.pages["/triton"] = first
    src.collect(Frame(0.0, 1.0))
    pages.pages["/triton"] = broken
    with pytest.raises(CollectorError, match=f"{series.partition('{')[0]}: a value that is no count"):
        src.collect(Frame(1.0, 1.0))
    pages.pages["/triton"] = _page("triton_page2.txt")
    src.clock.t = 1.0  # past the back-off after the bad page
    after = Frame(2.0, 1.0)
    src.collect(after)  # against the last good page, as in the test above
    assert after.counters[("requests_total", "chat")] == 11 and after.hists[("e2e", "chat")].count == 10
    assert src.counters.resets == 0


def test_a_gauge_that_is_not_finite_skips_the_page_before_any_counter_moves(pages: PageServer) -> None:
    """The store refused such a part (a NaN gauge) after the counters had moved to its page: that page's
    requests were lost, and _count and _sum were no longer exact."""
    src = _server(pages, "vllm")
    gauge = 'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
    pages.pages["/vllm"] = _page("vllm_page1.txt")
    src.collect(Frame(0.0, 1.0))
    pages.pages["/vllm"] = _page("vllm_page2.txt").replace(f"{gauge} 0.37", f"{gauge} NaN")
    with pytest.raises(CollectorError, match="vllm:kv_cache_usage_perc: a value that is not finite"):
        src.collect(Frame(1.0, 1.0))
    pages.pages["/vllm"] = _page("vllm_page2.txt")
    src.clock.t = 1.0  # past the back-off after the bad page
    after = Frame(2.0, 1.0)
    src.collect(after)
    assert after.counters[("requests_total", "chat")] == 5 and after.hists[("e2e", "chat")].count == 5


def test_model_filter_that_matches_nothing_adds_nothing(pages: PageServer) -> None:
    pages.pages["/vllm"] = _page("vllm_page1.txt")
    other = _server(pages, "vllm", model="some/other-model")
    frame = Frame(0.0, 1.0)
    other.collect(frame)
    assert frame.workload_gauges == {}


# ---- Triton -------------------------------------------------------------------------------------

def _mean_bucket(mean: float) -> float:
    return float(LAYOUT.uppers()[bisect.bisect_left(list(LAYOUT.edges), mean)])


def test_triton_counters_become_mean_latency_per_interval(pages: PageServer) -> None:
    src = _server(pages, "triton", model="llama")
    first, second = _two_pages(pages, src, _page("triton_page1.txt"), _page("triton_page2.txt"))
    assert first.hists == {} and first.workload_gauges == {("queue_depth", "chat"): 4}
    # llama: 10 successful requests; durations grew by 1.5 s, 0.05 s, 0.01 s, 1.2 s, 0.02 s
    for stage, total in (("e2e", 1.5), ("queue", 0.05), ("ingress", 0.01), ("decode", 1.2), ("egress", 0.02)):
        hist = second.hists[(stage, "chat")]
        assert hist.count == 10 and hist.sum == pytest.approx(total), stage
        assert _buckets(second, stage) == {_mean_bucket(total / 10): 10}, stage
    assert second.counters == {("requests_total", "chat"): 11, ("request_errors_total", "chat"): 1,
                               ("inferences_total", "chat"): 10, ("executions_total", "chat"): 3}
    assert second.workload_gauges == {("queue_depth", "chat"): 6}


def test_triton_all_models_are_summed(pages: PageServer) -> None:
    src = _server(pages, "triton")
    _, second = _two_pages(pages, src, _page("triton_page1.txt"), _page("triton_page2.txt"))
    assert second.counters[("requests_total", "chat")] == 411
    assert second.hists[("e2e", "chat")].count == 410
    assert second.hists[("e2e", "chat")].sum == pytest.approx(1.5 + 2.4)


def test_triton_restart(pages: PageServer) -> None:
    src = _server(pages, "triton", model="llama")
    _, after = _two_pages(pages, src, _page("triton_page2.txt"), _page("triton_page1.txt"))
    # each series on its own, as rate() takes it: the 1000 successes and the BACKEND failure went down and
    # count whole; the REJECTED failure, 1 on both pages, counts no increase
    assert after.counters[("requests_total", "chat")] == 1001
    assert after.hists[("e2e", "chat")].count == 1000
    assert after.hists[("e2e", "chat")].sum == pytest.approx(151.0)


def test_a_model_unloaded_adds_nothing_and_the_others_count_on(pages: PageServer) -> None:
    def page(models: dict[str, tuple[int, int]]) -> str:
        return "".join(f'nv_inference_request_success{{model="{m}",version="1"}} {n}\n'
                       f'nv_inference_request_duration_us{{model="{m}",version="1"}} {us}\n'
                       for m, (n, us) in models.items())

    src = _server(pages, "triton")  # every model of the server is the workload's
    _, after = _two_pages(pages, src, page({"a": (1_000_000, 50_000_000_000), "b": (500_000, 9_000_000_000)}),
                          page({"a": (1_000_100, 50_005_000_000)}))  # b unloaded, a served 100 more
    assert after.counters[("requests_total", "chat")] == 100  # not a "restart" re-adding a's million
    assert after.hists[("e2e", "chat")].count == 100 and after.hists[("e2e", "chat")].sum == pytest.approx(5.0)
    assert src.counters.resets == 0


def test_one_model_reloaded_restarts_only_its_own_series(pages: PageServer) -> None:
    def page(big: int, small: int) -> str:
        return (f'nv_inference_request_success{{model="big",version="1"}} {big}\n'
                f'nv_inference_request_success{{model="small",version="1"}} {small}\n')

    src = _server(pages, "triton")
    _, after = _two_pages(pages, src, page(1_000_010, 60), page(1_000_020, 3))  # small reloaded, then served 3
    assert after.counters[("requests_total", "chat")] == 10 + 3  # not big's million again
    assert src.counters.resets == 1


def test_credentials_in_a_server_url_go_as_basic_auth_and_never_into_errors(pages: PageServer) -> None:
    pages.pages["/vllm"] = _page("vllm_page1.txt")
    url = pages.url("/vllm").replace("http://", "http://scraper:s3cret%40pw@")
    src = ServerSource(ServerConfig(kind="vllm", url=url, workload="chat"), LAYOUT, clock=Clock())
    frame = Frame(0.0, 1.0)
    src.collect(frame)
    assert frame.workload_gauges[("running_requests", "chat")] == 12
    assert pages.auth["/vllm"] == "Basic " + base64.b64encode(b"scraper:s3cret@pw").decode()
    bad = ServerSource(ServerConfig(kind="vllm", url="http://u:s3cretpw@127.0.0.1:1/metrics", workload="chat"),
                       LAYOUT, clock=Clock())
    with pytest.raises(CollectorError) as err:
        bad.collect(Frame(0.0, 1.0))
    assert "s3cretpw" not in str(err.value) and "127.0.0.1:1/metrics" in str(err.value)


def test_unreachable_server_backs_off(pages: PageServer) -> None:
    pages.pages["/vllm"] = "overloaded\n"
    pages.status["/vllm"] = 503
    src = _server(pages, "vllm")
    clock = src.clock
    with pytest.raises(CollectorError, match="HTTP 503"):
        src.collect(Frame(0.0, 1.0))
    clock.t = 0.5
    with pytest.raises(StillDown):  # within the back-off: not asked, and still down (not up, not a new error)
        src.collect(Frame(0.5, 1.0))
    assert pages.hits["/vllm"] == 1
    clock.t = 1.0
    with pytest.raises(CollectorError):
        src.collect(Frame(1.0, 1.0))
    clock.t = 2.5  # back-off doubled to 2 s
    with pytest.raises(StillDown):
        src.collect(Frame(2.5, 1.0))
    assert pages.hits["/vllm"] == 2
    pages.status["/vllm"] = 200
    pages.pages["/vllm"] = _page("vllm_page1.txt")
    clock.t = 3.0
    frame = Frame(3.0, 1.0)
    src.collect(frame)
    assert frame.workload_gauges[("running_requests", "chat")] == 12


# ---- reading pages ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PAGES)
def test_page_parser_agrees_with_prometheus_client(name: str) -> None:
    text = _page(name)
    ours = PageParser().parse(text, lambda n: True)
    theirs: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name if s.name in ours else s.name.removesuffix("_total")  # counters without _total
            theirs.setdefault(key, []).append((s.labels, s.value))
    assert ours == theirs


def test_redact_hides_credentials() -> None:
    assert redact("http://admin:s3cret@gpu-host:9400/metrics") == "http://gpu-host:9400/metrics"
    assert redact("https://127.0.0.1/metrics") == "https://127.0.0.1/metrics"
    with pytest.raises(CollectorError) as err:
        DcgmSource("http://admin:s3cret@127.0.0.1:1/metrics", timeout=0.5, clock=Clock()).collect(Frame(0.0, 1.0))
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("src_edges,counts,want", [
    ([0.1], [3, 2], {0.100663296: 3, np.inf: 2}),  # 0.1 <= our 0.10066: same bucket
    ([0.3], [4, 0], {0.50331648: 4}),  # between our edges: the next one up, never the one below
    ([0.25165824], [1, 0], {0.25165824: 1}),  # an edge equal to ours stays
    ([0.000001, 120.0], [1, 1, 1], {3.968e-06: 1, np.inf: 2}),  # beyond our last edge: +Inf
])
def test_rebucket_never_lands_low(src_edges: list[float], counts: list[int], want: dict[float, int]) -> None:
    out = rebucket(np.array(src_edges), np.array(counts), LAYOUT)
    assert {float(LAYOUT.uppers()[i]): int(c) for i, c in enumerate(out) if c} == pytest.approx(want)
    assert out.sum() == sum(counts)


def test_cumulative_deltas_and_resets() -> None:
    c = Cumulative()
    assert c.delta("x", 10) is None
    assert list(c.delta("x", 15)) == [5]
    assert list(c.delta("x", 3)) == [3] and c.resets == 1  # restart
    assert c.delta("v", np.array([1, 2])) is None
    assert list(c.delta("v", np.array([2, 5]))) == [1, 3]
    assert c.delta("v", np.array([2, 5, 9])) is None  # bucket layout changed: new baseline


@pytest.mark.parametrize("section,message", [
    ({"servers": [{"kind": "tgi", "url": "http://a/metrics", "workload": "w"}]}, "servers[0].kind: Input should be"),
    ({"servers": [{"kind": "vllm", "url": "localhost:8000", "workload": "w"}]}, "servers[0].url: must be an http"),
    ({"servers": [{"kind": "vllm", "url": "http://a/metrics", "workload": "w", "timeout": 0}]}, "servers[0].timeout"),
    ({"servers": [{"kind": "vllm", "url": "http://a/metrics"}]}, "servers[0].workload: Field required"),
    ({"gpu": {"backend": "dcgm"}}, "gpu: backend dcgm needs gpu.dcgm_url"),
    ({"gpu": {"dcgm_url": "ftp://h/metrics"}}, "gpu.dcgm_url: must be an http"),
])
def test_config_errors_name_the_field(section: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(section, "sits.yaml", env={})
    assert str(err.value).startswith(f"sits.yaml: {message}")


@pytest.mark.parametrize("url", ["http://scraper:Pa/ss9@h:8000/metrics", "http://scraper:Pa#ss9@h:8000/metrics",
                                 "http://scraper:Pa?ss9@h:8000/metrics"])
def test_a_password_that_ends_the_host_part_early_is_refused_and_never_shown(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse({"servers": [{"kind": "vllm", "url": url, "workload": "w"}]}, "sits.yaml", env={})
    msg = str(err.value)
    assert msg.startswith("sits.yaml: servers[0].url: has '@' after the host part: percent-encode"), msg
    assert "ss9" not in msg



@pytest.mark.parametrize("url", ["https://outlook.office.com/webhookb2/g@t/IncomingWebhook/a/b",
                                 "http://host:8000/hook?to=oncall@example.com", "http://u:p%2Fq@host:9/metrics"])
def test_an_at_sign_past_the_host_or_an_encoded_password_is_fine(url: str) -> None:
    parse({"servers": [{"kind": "vllm", "url": url, "workload": "w"}]}, "sits.yaml", env={})


def test_a_histogram_without_its_inf_bucket_fails_the_page_and_keeps_nothing_of_it(pages: PageServer) -> None:
    """It was dropped without a word: the source read as up while its stage got no data at all."""
    src = _server(pages, "vllm")
    pages.pages["/vllm"] = _page("vllm_page1.txt")
    src.collect(Frame(0.0, 1.0))
    pages.pages["/vllm"] = "".join(line + "\n" for line in _page("vllm_page2.txt").splitlines()
                                   if not ("request_decode_time_seconds_bucket" in line and 'le="+Inf"' in line))
    broken = Frame(1.0, 1.0)  # decode is read last: the stages before it were added to the tick's part
    with pytest.raises(CollectorError, match="request_decode_time_seconds: a histogram without a \\+Inf bucket"):
        src.collect(broken)
    assert broken.hists == {} and broken.counters == {}  # no stage read before the bad one is kept either
    pages.pages["/vllm"] = _page("vllm_page2.txt")
    src.clock.t = 1.0  # past the back-off after the bad page
    after = Frame(2.0, 1.0)
    src.collect(after)
    assert after.counters[("requests_total", "chat")] == 5 and after.hists[("e2e", "chat")].count == 5


def test_series_the_source_does_not_read_neither_fail_nor_fill_a_page(pages: PageServer) -> None:
    """Every series with the server's prefix was checked and counted: an idle Triton model's latency summary
    (NaN while it has no observations) took the whole source down, and vLLM's per-LoRA info series, whose label
    values change with load, could pass the page's sample cap."""
    from sits_observe.collectors.promtext import MAX_SAMPLES

    triton = _server(pages, "triton", model="llama")
    summary = '\n'.join(f'nv_inference_request_summary_us{{model="idle",version="1",quantile="{q}"}} NaN'
                         for q in (0.5, 0.9, 0.99)) + "\n"
    first, second = _two_pages(pages, triton, _page("triton_page1.txt") + summary, _page("triton_page2.txt") + summary)
    assert second.counters[("requests_total", "chat")] == 11
    vllm = _server(pages, "vllm")
    info = "".join(f'vllm:lora_requests_info{{running_lora_adapters="a{i}"}} 1.7e9\n' for i in range(MAX_SAMPLES + 1))
    _, second = _two_pages(pages, vllm, _page("vllm_page1.txt") + info, _page("vllm_page2.txt") + info)
    assert second.counters[("requests_total", "chat")] == 5
