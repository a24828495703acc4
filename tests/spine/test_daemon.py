"""The tick loop: a failing source is counted and logged once, never stops the others or a scrape."""

import logging

import numpy as np

from sits_observe.config import parse
from sits_observe.daemon import Daemon, WallClock
from sits_observe.errors import CollectorError, StillDown
from sits_observe.export.http import create_app


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
    r = client.get("/api/v1/nope")
    assert r.status_code == 404 and "Traceback" not in r.data.decode()


def test_a_late_tick_covers_the_time_since_the_last_one():
    clock = WallClock(1.0)
    assert clock.elapsed(100.0) == 1.0 and clock.elapsed(101.0) == 1.0
    assert clock.elapsed(104.0) == 3.0  # a source held the tick up for 2 s: its deltas cover 3 s
    assert clock.elapsed(104.2) == 1.0  # an early tick still counts one interval
