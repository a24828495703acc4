"""/api/v1/stages: every figure of an answer from the same ticks, and the span those ticks cover."""

import numpy as np
import pytest

from sits_observe.clock import WallClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.frame import Frame


def _frame(daemon: Daemon, t: int, seconds: float) -> Frame:
    frame = Frame(ts=float(t), interval=1.0)
    frame.add_values("e2e", "chat", np.full(100, seconds), daemon.layout)
    return frame


def test_a_tick_landing_during_an_answer_does_not_mix_windows(tmp_path):
    """Each quantile and the count were read under a lock of their own: a tick in between gave p99 below p50."""
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    daemon.store.ingest(_frame(daemon, 0, 0.5))  # a slow tick; the one landing mid-answer is fast
    read = daemon.store.hist_window
    landed = []

    def then_a_tick(*args, **kwargs):
        out = read(*args, **kwargs)
        if not landed:
            landed.append(True)
            daemon.store.ingest(_frame(daemon, 1, 0.001))
        return out

    daemon.store.hist_window = then_a_tick
    stage = create_app(daemon, ui=False).test_client().get("/api/v1/stages?window=1").get_json()["stages"][0]
    assert landed and stage["count"] == 100
    assert stage["p50"] <= stage["p95"] <= stage["p99"] and stage["tail_delta"] >= 0, stage


def test_window_seconds_is_the_span_of_the_ticks_held(tmp_path):
    """It said 3600 s for an answer over the 5 ticks held after a start."""
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    for t in range(5):
        daemon.store.ingest(_frame(daemon, t, 0.1))
    client = create_app(daemon, ui=False).test_client()
    assert client.get("/api/v1/stages?window=3600").get_json()["window_seconds"] == 5.0
    assert client.get("/api/v1/stages?window=3").get_json()["window_seconds"] == 3.0


@pytest.mark.parametrize("param", ["window", "workload"])
def test_a_parameter_given_twice_is_refused(tmp_path, param):
    """The first was taken and the rest ignored: ?workload=a&workload=b answered for a alone, saying nothing."""
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    daemon.store.ingest(_frame(daemon, 0, 0.1))
    r = create_app(daemon, ui=False).test_client().get(f"/api/v1/stages?{param}=60&{param}=abc")
    assert r.status_code == 400 and r.get_json()["error"] == f"{param}: given more than once; give it once"


def test_metrics_content_type_names_its_charset_once(tmp_path):
    """Werkzeug's mimetype= appended a charset to one that already had it: '...; charset=utf-8; charset=utf-8'."""
    from prometheus_client import CONTENT_TYPE_LATEST

    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    r = create_app(daemon, ui=False).test_client().get("/metrics")
    assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST and r.headers["Content-Type"].count("charset") == 1


def test_an_answer_is_computed_once_per_tick_window_and_workload(tmp_path):
    """Every request re-read the whole window under the store's lock (0.1 s for an hour at the series cap): a few
    clients polling it kept the tick's ingest waiting for seconds."""
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    daemon.store.ingest(_frame(daemon, 0, 0.1))
    read, reads = daemon.store.quantiles, []

    def counted(*args, **kwargs):
        reads.append(args)
        return read(*args, **kwargs)

    daemon.store.quantiles = counted
    client = create_app(daemon, ui=False).test_client()
    first = client.get("/api/v1/stages?window=60").get_json()
    assert client.get("/api/v1/stages?window=60").get_json() == first and len(reads) == 1
    client.get("/api/v1/stages?window=30")
    assert len(reads) == 2  # another window: its own answer
    daemon.store.ingest(_frame(daemon, 1, 0.2))
    assert client.get("/api/v1/stages?window=60").get_json()["stages"][0]["count"] == 200 and len(reads) == 3
