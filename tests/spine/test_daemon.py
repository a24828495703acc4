"""The tick loop: a failing source is counted and logged once, never stops the others or a scrape."""

import copy
import logging
import threading
import time

import numpy as np
import pytest

from sits_observe.collectors.servers import ServerSource
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.clock import WallClock
from sits_observe.errors import CollectorError, StillDown
from sits_observe.export.http import create_app
from sits_observe.frame import GPU_FIELDS, BucketLayout, GpuFrame, GpuInfo, HistDelta


class Good:
    name = "good"

    def __init__(self, layout):
        self.layout = layout

    def collect(self, frame):
        frame.add_values("e2e", "chat", np.array([0.01, 0.2, 3.0]), self.layout)
        frame.host["cpu_utilization_ratio"] = 0.25


class Bad:
    name = "bad"

    def collect(self, frame):
        raise RuntimeError("device went away")


def test_failing_source_is_counted_and_others_keep_working(tmp_path, caplog):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [Bad(), Good(daemon.layout)]
    client = create_app(daemon, ui=False).test_client()
    with caplog.at_level(logging.WARNING, logger="sits_observe.daemon"):
        for _ in range(3):
            daemon.tick()
    assert [r.message for r in caplog.records].count(
        "bad failed: RuntimeError: device went away (counting in sits_source_errors_total; will go on)") == 1
    body = client.get("/metrics").data.decode()
    assert 'sits_source_errors_total{source="bad"} 3.0' in body
    assert 'sits_source_up{source="bad"} 0.0' in body
    assert 'sits_stage_latency_seconds_count{stage="e2e",workload="chat"} 9.0' in body
    assert "sits_host_cpu_utilization_ratio 0.25" in body
    status = client.get("/api/v1/status").get_json()
    assert {s["name"]: s["healthy"] for s in status["sources"]} == {"bad": False, "good": True}


class BacksOff:
    """Fails, is not asked for the next two ticks (back-off), then works."""

    name = "backs-off"

    def __init__(self):
        self.ticks = 0

    def collect(self, frame):
        self.ticks += 1
        if self.ticks == 1:
            raise CollectorError("http://127.0.0.1:1/metrics: connection refused")
        if self.ticks <= 3:
            raise StillDown("not asked again yet")


def test_a_source_in_back_off_stays_down_without_new_errors(tmp_path, caplog):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources.append(BacksOff())
    client = create_app(daemon, ui=False).test_client()
    with caplog.at_level(logging.INFO, logger="sits_observe.daemon"):
        for _ in range(3):
            frame = daemon.tick()
            assert "connection refused" in frame.errors["backs-off"]
        body = client.get("/metrics").data.decode()
        assert 'sits_source_up{source="backs-off"} 0.0' in body  # down all along, not up between attempts
        assert 'sits_source_errors_total{source="backs-off"} 1.0' in body  # one failed attempt
        assert "recovered" not in caplog.text
        daemon.tick()
    assert 'sits_source_up{source="backs-off"} 1.0' in client.get("/metrics").data.decode()
    assert caplog.text.count("backs-off recovered") == 1


def test_api_rejects_bad_windows_with_a_reason(tmp_path):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources.append(Good(daemon.layout))
    daemon.tick()
    client = create_app(daemon, ui=False).test_client()
    ok = client.get("/api/v1/stages?window=60").get_json()
    assert ok["stages"][0]["stage"] == "e2e" and ok["stages"][0]["count"] == 3
    for bad in ("abc", "-5", "1e12", "nan"):
        r = client.get(f"/api/v1/stages?window={bad}")
        assert r.status_code == 400 and "window" in r.get_json()["error"]
    r = client.get("/api/v1/stages?workload=nope")
    assert r.status_code == 404 and "unknown workload" in r.get_json()["error"]
    r = client.get("/api/v1/stages?workload=" + "x" * 3000)  # not echoed whole
    assert r.status_code == 404 and len(r.get_json()["error"]) < 200
    r = client.get("/api/v1/nope")
    assert r.status_code == 404 and "Traceback" not in r.data.decode()


BUCKETS = BucketLayout(parse({}, env={}).store.snapped()).n  # the default layout's
GPUS = (GpuInfo(0, "GPU-0", "NVIDIA H100", "00000000:01:00.0"), GpuInfo(1, "GPU-1", "NVIDIA H100", "00000000:02:00.0"))


def _gpu(values=None, healthy=None):
    g = GpuFrame.empty(GPUS)
    return GpuFrame(GPUS, g.values if values is None else values, g.healthy if healthy is None else healthy)


class Writes:
    """A source that writes ``write(frame)``, and a counter, which must go with it when the write is bad."""

    def __init__(self, name, write):
        self.name = name
        self.write = write

    def collect(self, frame):
        frame.add_counter("requests_total", self.name, 5)
        self.write(frame)


def _set(attr, value):  # a copy each time: nothing a test writes is shared with the next
    return lambda frame: setattr(frame, attr, copy.deepcopy(value))


def _put(attr, key, value):
    return lambda frame: getattr(frame, attr).__setitem__(key, copy.deepcopy(value))


def _hist(counts, total=0.1):
    return _put("hists", ("e2e", "chat"), HistDelta(counts, total))


MALFORMED = {  # what a source writes -> what the error names
    "gpu values of the wrong shape": (_set("gpu", _gpu(np.zeros((2, 3)))),
                                      "gpu.values is a float64 array of shape (2, 3)"),
    "gpu values for another GPU count": (_set("gpu", _gpu(np.zeros((3, len(GPU_FIELDS))))), "gpu.values"),
    "gpu values that are strings": (_set("gpu", _gpu(np.full((2, len(GPU_FIELDS)), "hot"))), "gpu.values"),
    "gpu values that are objects": (_set("gpu", _gpu(np.full((2, len(GPU_FIELDS)), None, dtype=object))), "gpu.values"),
    "an infinite gpu value": (_set("gpu", _gpu(np.full((2, len(GPU_FIELDS)), np.inf))), "infinity"),
    "gpu health of the wrong shape": (_set("gpu", _gpu(healthy=np.ones(3, dtype=bool))), "gpu.healthy"),
    "gpu data that is not a GpuFrame": (_set("gpu", np.zeros((2, len(GPU_FIELDS)))), "not a GpuFrame"),
    # the store keeps a GPU's history by index and UUID: a string index failed every source's write of the tick,
    # two GPUs of one index (or UUID) wrote one row, the other reading as missing and unhealthy
    "a GPU index that is a string": (_set("gpu", GpuFrame.empty((GpuInfo("1", "GPU-1", "H100", ""),))),
                                     "the index must be an int >= 0"),
    "two GPUs of one index": (_set("gpu", GpuFrame.empty((GPUS[0], GpuInfo(0, "GPU-9", "H100", "")))),
                              "GPU index 0 twice"),
    "two GPUs of one UUID": (_set("gpu", GpuFrame.empty((GPUS[0], GpuInfo(1, "GPU-0", "H100", "")))),
                             "UUID 'GPU-0' to two GPUs"),
    "a host value that is a string": (_put("host", "cpu_utilization_ratio", "busy"), "host['cpu_utilization_ratio']"),
    "a NaN host value": (_put("host", "memory_used_bytes", float("nan")), "host['memory_used_bytes'] is nan"),
    "an infinite host value": (_put("host", "memory_used_bytes", float("inf")), "not a finite number"),
    "a host value that is None": (_put("host", "memory_used_bytes", None), "not a finite number"),
    "a NaN counter delta": (_put("counters", ("request_errors_total", "chat"), float("nan")), "counters"),
    "a gauge keyed by a bare name": (_put("workload_gauges", "queue_depth", 1.0), "workload_gauges key 'queue_depth'"),
    "a gauge that is a string": (_put("workload_gauges", ("queue_depth", "chat"), "4"), "workload_gauges"),
    "a bucket index past the layout": (lambda f: f.add_hist("e2e", "chat", np.ones(99, np.uint64), 0.1), "99"),
    "histogram counts of another length": (_hist(np.ones(99, np.uint64)), "uint64 array of shape (99,)"),
    "a histogram of signed counts": (_hist(np.ones(BUCKETS, np.int64)), f"not {BUCKETS} uint64 bucket counts"),
    "a histogram with a NaN sum": (_hist(np.ones(BUCKETS, np.uint64), float("nan")), "hists[('e2e', 'chat')].sum"),
    # the history keeps 32-bit counts per tick: 2**32 + 5 read back as 5 in quantiles, the UI and the classifier
    "a bucket count past 32 bits in one tick": (_hist(np.full(BUCKETS, 2**32 + 5, np.uint64)),
                                                "4294967301 observations in one bucket in one tick"),
    "a histogram keyed by a stage index": (_put("hists", (99, "chat"), HistDelta(np.ones(BUCKETS, np.uint64), 0.1)),
                                           "hists key (99, 'chat')"),
    "a sample that is not a Sample": (lambda f: f.samples.append(("sits_x", 1.0)), "sample"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_source_writing_malformed_data_fails_alone_and_the_tick_is_stored(tmp_path, case):
    write, named = MALFORMED[case]
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    assert daemon.layout.n == BUCKETS
    daemon.sources += [Writes("bad", write), Good(daemon.layout)]
    client = create_app(daemon, ui=False).test_client()
    frame = daemon.tick()
    assert frame.errors["bad"].startswith("StoreError: malformed data, none of it kept: ")
    assert named in frame.errors["bad"]
    assert daemon.store.ticks == 1 and daemon.store.host_latest() == {"cpu_utilization_ratio": 0.25}
    assert daemon.store.hist_window("e2e", "chat").sum() == 3
    assert daemon.store.gpu_latest() is None and daemon.store.counter_totals() == []  # none of "bad"'s data
    body = client.get("/metrics").data.decode()
    assert 'sits_source_errors_total{source="bad"} 1.0' in body and 'sits_source_up{source="bad"} 0.0' in body
    assert 'sits_source_up{source="good"} 1.0' in body
    assert 'sits_stage_latency_seconds_count{stage="e2e",workload="chat"} 3.0' in body
    assert "sits_host_cpu_utilization_ratio 0.25" in body


class GoodGpu:
    name = "gpu"

    def collect(self, frame):
        frame.gpu = _gpu()
        frame.gpu.set(1, "power_watts", 300.0)


def test_bad_gpu_and_host_sources_beside_good_ones_in_the_same_ticks(tmp_path, caplog):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [Good(daemon.layout), Writes("bad-gpu", MALFORMED["gpu values of the wrong shape"][0]),
                       GoodGpu(), Writes("bad-host", MALFORMED["a host value that is a string"][0])]
    client = create_app(daemon, ui=False).test_client()
    with caplog.at_level(logging.WARNING, logger="sits_observe.daemon"):
        for _ in range(3):
            frame = daemon.tick()
    # the bad GPU source came before the good one and the bad host value after the good one: neither counts
    assert frame.gpu is not None and frame.gpu.values.shape == (2, len(GPU_FIELDS))
    assert frame.host == {"cpu_utilization_ratio": 0.25}
    assert daemon.store.ticks == 3
    assert daemon.store.gpu_window("power_watts")[:, 1].tolist() == [300.0, 300.0, 300.0]
    assert daemon.store.host_window("cpu_utilization_ratio").tolist() == [0.25, 0.25, 0.25]
    assert len([r for r in caplog.records if "bad-gpu failed: StoreError" in r.message]) == 1
    assert len([r for r in caplog.records if "bad-host failed: StoreError" in r.message]) == 1
    body = client.get("/metrics").data.decode()
    for name in ("bad-gpu", "bad-host"):
        assert f'sits_source_errors_total{{source="{name}"}} 3.0' in body
        assert f'sits_source_up{{source="{name}"}} 0.0' in body
    assert 'sits_source_up{source="gpu"} 1.0' in body and 'sits_source_up{source="good"} 1.0' in body
    assert 'sits_gpu_power_watts{gpu="1"' in body
    assert 'sits_stage_latency_seconds_count{stage="e2e",workload="chat"} 9.0' in body
    assert "sits_host_cpu_utilization_ratio 0.25" in body
    assert 'workload="bad-gpu"' not in body and 'workload="bad-host"' not in body
    status = client.get("/api/v1/status").get_json()
    assert {s["name"]: s["healthy"] for s in status["sources"]} == {
        "bad-gpu": False, "bad-host": False, "gpu": True, "good": True}


class WritesThenRaises:
    name = "half"

    def collect(self, frame):
        frame.host["memory_used_bytes"] = 1e9
        raise CollectorError("/proc/stat: gone")


def test_what_a_source_wrote_before_raising_is_kept_as_before(tmp_path):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [WritesThenRaises(), Good(daemon.layout)]
    frame = daemon.tick()
    assert frame.errors["half"] == "CollectorError: /proc/stat: gone"
    assert daemon.store.host_latest() == {"memory_used_bytes": 1e9, "cpu_utilization_ratio": 0.25}
    assert daemon.health["half"].errors == 1


REPLICA_PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
"""


class Replica:
    def __init__(self, server, running, kv):
        self.name = server.name
        self.server = server
        self.page = REPLICA_PAGE.format(running=running, kv=kv)

    def collect(self, frame):
        self.server.read(self.page, frame)


def test_replicas_of_one_workload_still_add_up_across_sources(tmp_path):
    cfg = parse({"state_dir": str(tmp_path), "servers": [
        {"kind": "vllm", "url": "http://127.0.0.1:1/metrics", "workload": "chat"},
        {"kind": "vllm", "url": "http://127.0.0.1:2/metrics", "workload": "chat"}]}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [Replica(ServerSource(cfg.servers[0], daemon.layout), 3, 0.3),
                       Replica(ServerSource(cfg.servers[1], daemon.layout), 2, 0.5),
                       Good(daemon.layout), Good(daemon.layout)]
    frame = daemon.tick()
    assert frame.workload_gauges == {("running_requests", "chat"): 5.0, ("kv_cache_usage_ratio", "chat"): 0.5}
    assert sorted(daemon.store.gauge_latest()) == [("kv_cache_usage_ratio", "chat", 0.5),
                                                   ("running_requests", "chat", 5.0)]
    assert daemon.store.hist_window("e2e", "chat").sum() == 6  # two sources' histograms add up


def test_a_tick_the_store_cannot_take_is_counted_and_skipped_the_stored_ticks_kept(tmp_path, caplog, monkeypatch):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [Good(daemon.layout), GoodGpu()]
    client = create_app(daemon, ui=False).test_client()
    for _ in range(2):
        daemon.tick()
    assert 'source="store"' not in client.get("/metrics").data.decode()  # listed once it has failed
    store_gpu = daemon.store._ingest_gpu

    def broken(t, gpu):  # not one source's data: the store itself fails half-way through a tick
        raise MemoryError("no room")

    monkeypatch.setattr(daemon.store, "_ingest_gpu", broken)
    with caplog.at_level(logging.INFO, logger="sits_observe.daemon"):
        frame = daemon.tick()  # does not raise
        assert frame.errors["store"].startswith("StoreError: tick not stored, kept without data: ")
        assert "MemoryError: no room" in frame.errors["store"]
        body = client.get("/metrics").data.decode()
        assert 'sits_source_errors_total{source="store"} 1.0' in body and 'sits_source_up{source="store"} 0.0' in body
        monkeypatch.setattr(daemon.store, "_ingest_gpu", store_gpu)
        daemon.tick()
    logged = [r for r in caplog.records if r.name == "sits_observe.daemon"]
    assert [r.levelname for r in logged] == ["WARNING", "INFO"]  # one line for the failed tick
    assert logged[0].message.startswith("store failed: StoreError: tick not stored")
    assert logged[1].message == "store recovered"
    assert 'sits_source_up{source="store"} 1.0' in client.get("/metrics").data.decode()
    # the two ticks before are as they were; the failed one is a tick without data, never half of one
    assert daemon.store.ticks == 4 and np.isfinite(daemon.store.ts()).all()
    assert daemon.store.hist_window("e2e", "chat").sum(axis=1).tolist() == [3, 3, 0, 3]
    assert daemon.store.host_window("cpu_utilization_ratio").tolist()[:2] == [0.25, 0.25]
    assert np.isnan(daemon.store.host_window("cpu_utilization_ratio")[2])
    power = daemon.store.gpu_window("power_watts")[:, 1]
    assert power[[0, 1, 3]].tolist() == [300.0, 300.0, 300.0] and np.isnan(power[2])


class GoesBad:
    """Writes well-formed series for a tick, so the store knows their keys, then ``write`` on the same keys."""

    name = "goes-bad"

    def __init__(self, layout, write):
        self.layout, self.write, self.ticks = layout, write, 0

    def collect(self, frame):
        self.ticks += 1
        frame.add_values("e2e", "chat", np.array([0.5]), self.layout)
        frame.workload_gauges[("queue_depth", "chat")] = 2.0
        frame.add_counter("requests_total", "chat", 1)
        if self.ticks == 2:
            self.write(frame)


@pytest.mark.parametrize("case", ["histogram counts of another length", "a histogram of signed counts",
                                  "a histogram with a NaN sum", "a NaN counter delta", "a gauge that is a string",
                                  "gpu values of the wrong shape"])
def test_malformed_data_under_keys_the_store_already_holds_is_caught_too(tmp_path, case):
    write, named = MALFORMED[case]
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [GoodGpu(), GoesBad(daemon.layout, write)]
    assert "goes-bad" not in daemon.tick().errors
    frame = daemon.tick()
    assert named in frame.errors["goes-bad"] and daemon.health["goes-bad"].errors == 1
    assert daemon.store.hist_window("e2e", "chat").sum(axis=1).tolist() == [1, 0]
    assert daemon.store.counter_window("requests_total", "chat").tolist() == [1.0, 0.0]
    assert daemon.store.gpu_window("power_watts")[:, 1].tolist() == [300.0, 300.0]
    frame = daemon.tick()  # and it recovers
    assert "goes-bad" not in frame.errors and daemon.store.hist_window("e2e", "chat").sum() == 2


def test_health_and_readiness_say_when_the_tick_loop_has_stalled(tmp_path):
    from sits_observe.daemon import STALLED_AFTER_S

    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    client = create_app(daemon, ui=False).test_client()
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 503  # starting
    daemon.tick()
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200
    daemon.last_tick_at -= STALLED_AFTER_S + 5  # a source hung in the tick for a minute (monotonic clock)
    r = client.get("/healthz")
    assert r.status_code == 503 and r.get_json()["status"] == "stalled"
    assert r.get_json()["seconds_since_last_tick"] >= STALLED_AFTER_S
    assert client.get("/readyz").status_code == 503
    daemon.tick()  # it came back
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_step_of_the_wall_clock_neither_makes_nor_hides_a_stall(tmp_path, monkeypatch, step):
    from sits_observe.daemon import STALLED_AFTER_S

    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    client = create_app(daemon, ui=False).test_client()
    daemon.tick()
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + step)  # NTP stepped the clock (or an operator set it)
    assert client.get("/healthz").status_code == 200 and daemon.status()["uptime_seconds"] < 3600
    daemon.last_tick_at -= STALLED_AFTER_S + 5  # a source hung in the tick for a minute
    assert client.get("/healthz").status_code == 503


class HangsOnce:
    name = "hangs"

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def collect(self, frame):
        self.entered.set()
        self.release.wait(30)


def test_a_first_tick_that_hangs_is_a_stall_too(tmp_path, monkeypatch):
    """/healthz said ok for ever when the very first tick hung (no tick had ended to measure from)."""
    import sits_observe.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "STALLED_AFTER_S", 0.0)  # and 3 tick intervals: 30 ms
    cfg = parse({"state_dir": str(tmp_path), "tick_interval": 0.01}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(0.01))
    hangs = HangsOnce()
    daemon.sources.append(hangs)
    client = create_app(daemon, ui=False).test_client()
    loop = threading.Thread(target=daemon.run, daemon=True)
    loop.start()
    try:
        assert hangs.entered.wait(10)
        deadline = time.monotonic() + 10
        while client.get("/healthz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = client.get("/healthz")
        assert r.status_code == 503 and r.get_json()["status"] == "stalled"
    finally:
        daemon.stop_event.set()
        hangs.release.set()
        loop.join(10)


def test_sighup_says_which_changes_need_a_restart_and_keeps_them_as_running(tmp_path, caplog):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    new = parse({"state_dir": str(tmp_path), "scheduler": {"enabled": False, "cooldown": 60},
                 "otlp": {"endpoint": "http://127.0.0.1:4318"}, "ui": {"enabled": False, "update_interval": 5}},
                env={})
    with caplog.at_level(logging.WARNING, logger="sits_observe.daemon"):
        daemon.reload(new)
    warned = [r.getMessage() for r in caplog.records if "take effect after a restart" in r.getMessage()]
    assert len(warned) == 1 and "otlp" in warned[0] and "scheduler.enabled" in warned[0], warned
    assert "ui.enabled" in warned[0]  # the UI stayed served and the config said it was off
    assert daemon.config.scheduler.enabled and daemon.config.otlp.endpoint is None  # as running
    assert daemon.config.ui.enabled
    assert daemon.config.scheduler.cooldown == 60 and daemon.config.ui.update_interval == 5  # the rest is taken


def test_a_stop_asked_during_a_tick_asks_no_more_sources(tmp_path):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    asked = []

    class Source:
        def __init__(self, name, stops=False):
            self.name, self.stops = name, stops

        def collect(self, frame):
            asked.append(self.name)
            if self.stops:
                daemon.stop_event.set()  # SIGTERM while this source was being read

    daemon.sources += [Source("first", stops=True), Source("hung-server"), Source("another")]
    daemon.tick()
    assert asked == ["first"]  # each left would have had its timeout (up to 30 s) before the stop could start


class Many:
    """A source writing ``n`` workloads' end-to-end latencies (``n`` may grow between ticks)."""

    name = "many"

    def __init__(self, layout, n):
        self.layout, self.n = layout, n

    def collect(self, frame):
        for i in range(self.n):
            frame.add_hist("e2e", f"w{i}", np.ones(self.layout.n, np.uint64), 0.1)


def test_a_series_over_max_series_is_counted_once_and_the_first_logged(tmp_path, caplog):
    """Each tick's refusal was counted: one series over the cap added 3600 an hour, and none was named."""
    daemon = Daemon(config=parse({"state_dir": str(tmp_path), "store": {"max_series": 16}}, env={}),
                    clock=WallClock(1.0))
    many = Many(daemon.layout, 17)
    daemon.sources.append(many)
    client = create_app(daemon, ui=False).test_client()
    with caplog.at_level(logging.WARNING, logger="sits_observe.daemon"):
        for _ in range(5):
            daemon.tick()
        assert "sits_store_series_rejected_total 1.0" in client.get("/metrics").data.decode()
        many.n = 19
        for _ in range(5):
            daemon.tick()
    assert "sits_store_series_rejected_total 3.0" in client.get("/metrics").data.decode()
    told = [r.getMessage() for r in caplog.records if "max_series" in r.getMessage()]
    assert told == ["store: max_series (16) reached: series past it are refused, counted in "
                    "sits_store_series_rejected_total (the first: e2e of workload 'w16'); raise store.max_series"]


@pytest.mark.parametrize(("scheduler", "why"), [
    (True, "no GPU topology is known (gpu.backend none: only nvml, with the driver answering, and sim give one)"),
    (False, "scheduler.enabled is false in this daemon's config"),
])
def test_the_scheduler_api_says_why_no_scheduler_runs(tmp_path, caplog, scheduler, why):
    """With no GPU topology (dcgm, none, NVML not answering) the scheduler was off without a word, and its API
    answered 'no such API path'."""
    from sits_observe.wiring import build_daemon

    with caplog.at_level(logging.WARNING, logger="sits_observe.wiring"):
        daemon = build_daemon(parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"},
                                     "scheduler": {"enabled": scheduler}}, env={}))
    try:
        client = create_app(daemon, ui=False).test_client()
        for r in (client.get("/api/v1/shards"), client.get("/api/v1/decisions"),
                  client.post("/api/v1/placements/3/ack", json={}), client.delete("/api/v1/shards/chat-0")):
            assert r.status_code == 404 and r.get_json()["error"].startswith(f"the scheduler is not running: {why}")
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scheduler: off")]
        assert said == ([f"scheduler: off: {why}; set scheduler.enabled: false where no scheduler is wanted"]
                        if scheduler else [])
    finally:
        daemon.close()
