"""A real Alertmanager (Debian's prometheus-alertmanager on a loopback port) receives an SLO alert from
the engine, shows it firing with our fingerprint, then resolved."""

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from datetime import datetime

import numpy as np
import pytest

from sits_observe.config import parse
from sits_observe.frame import BucketLayout, Frame
from sits_observe.slo.evaluate import SloEngine

from alert_receiver import free_port

AM = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
AM_CONFIG = """
route:
  receiver: blackhole
  group_wait: 1s
receivers:
  - name: blackhole
"""


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read() or b"null")


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


@pytest.fixture
def alertmanager(tmp_path):
    with _alertmanager(tmp_path, AM_CONFIG) as base:
        yield base


@contextlib.contextmanager
def _alertmanager(tmp_path, config):
    port = free_port()
    (tmp_path / "am.yml").write_text(config)
    proc = subprocess.Popen([AM, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_alert_arrives_then_resolves_in_alertmanager(tmp_path, alertmanager):
    cfg = parse({
        "state_dir": str(tmp_path),
        "slos": [{"name": "chat-latency", "objective": 0.99, "window": "1h",
                  "latency": {"stage": "e2e", "workload": "chat", "threshold": 0.25},
                  "tiers": {"page_fast": {"long": "60s", "short": "10s"}, "page_slow": False,
                            "ticket_fast": False, "ticket_slow": False}}],
        "alerting": {"receivers": [{"type": "alertmanager", "url": alertmanager, "timeout": 5}],
                     "backoff": {"initial": 0.1, "max": 0.5},
                     "external_labels": {"host": "gpu-7", "rack": ""}},  # empty: no label, as Alertmanager takes it
    }, env={})
    layout = BucketLayout(cfg.store.snapped())
    engine = SloEngine.from_config(cfg)
    ts = time.time() - 300  # source clock a little behind the wall clock, as a real host's ticks are

    def tick(bad: int) -> None:
        nonlocal ts
        ts += 1.0
        frame = Frame(ts=ts, interval=1.0)
        frame.add_values("e2e", "chat", np.r_[np.full(100 - bad, 0.01), np.full(bad, 0.9)], layout)
        engine.on_tick(frame)

    try:
        for _ in range(60):
            tick(0)
        for _ in range(20):
            tick(50)
        assert engine.firing == ["page_fast"]
        ours = engine.alerts_state()["firing"][0]
        url = f"{alertmanager}/api/v2/alerts?filter=slo%3D%22chat-latency%22"
        got = _wait(lambda: _get(url))
        assert len(got) == 1
        alert = got[0]
        assert alert["labels"] == {"alertname": "SitsSloBurnRate", "slo": "chat-latency", "severity": "page",
                                   "burn_tier": "page_fast", "host": "gpu-7"}
        assert alert["fingerprint"] == ours["fingerprint"]  # Alertmanager's own label fingerprint
        assert alert["status"]["state"] == "active"
        assert alert["annotations"]["summary"].startswith("chat-latency: error budget burning")
        for _ in range(25):  # 10 s until the short window clears, then keep_firing_for (= short window)
            tick(0)
        assert engine.firing == [None]
        _wait(lambda: _get(url) == [])  # resolved alerts leave the active list
        assert engine.alerts_state()["receivers"][0]["delivered"] == 2
    finally:
        engine.close()


def test_a_live_alert_outlives_alertmanagers_resolve_timeout_between_resends(tmp_path):
    """Firing alerts went out without endsAt, so Alertmanager ended them resolve_timeout (default 5 min) after
    each re-send: with a longer resend_interval a live alert flapped resolved and firing. Scaled down here."""
    from sits_observe.alerting.config import AlertingConfig
    from sits_observe.alerting.dispatch import Dispatcher
    from sits_observe.alerting.formats import Alert

    config = AM_CONFIG.replace("route:", "global:\n  resolve_timeout: 2s\nroute:")
    with _alertmanager(tmp_path, config) as base:
        cfg = AlertingConfig.model_validate({"receivers": [{"type": "alertmanager", "url": base}],
                                             "resend_interval": 6})
        d = Dispatcher(cfg, tmp_path)
        d.notify(Alert({"alertname": "SitsSloBurnRate", "slo": "chat"}, {}, "firing", time.time()))
        d.start()
        try:
            (first,) = _wait(lambda: _get(f"{base}/api/v2/alerts"))
            time.sleep(3.0)  # past resolve_timeout, before the re-send is due
            (later,) = _get(f"{base}/api/v2/alerts")
        finally:
            d.close()
    assert first["status"]["state"] == later["status"]["state"] == "active"
    # valid for four re-send intervals, as Prometheus sends them
    ends = datetime.fromisoformat(first["endsAt"]).timestamp() - datetime.fromisoformat(first["updatedAt"]).timestamp()
    assert 23 <= ends <= 25


def test_one_alert_alertmanager_refuses_fails_alone_not_its_whole_batch(tmp_path, alertmanager):
    """A batch answered 400 moved every alert of it to ``failed``: Alertmanager had taken the valid ones (and a
    proxy's 413 takes none), yet all were counted as refused for good. Now each is sent alone after a refusal."""
    from sits_observe.alerting.config import AlertingConfig
    from sits_observe.alerting.dispatch import Dispatcher
    from sits_observe.alerting.formats import Alert

    cfg = AlertingConfig.model_validate({"receivers": [{"type": "alertmanager", "name": "am", "url": alertmanager}],
                                         "backoff": {"initial": 0.1, "max": 0.5}})
    d = Dispatcher(cfg, tmp_path)
    for slo in "abc":  # Alertmanager 0.25 refuses an annotation name that is no Prometheus label name
        d.notify(Alert({"alertname": "SitsSloBurnRate", "slo": slo}, {"bad-name" if slo == "b" else "ok": "x"},
                       "firing", time.time()))
    d.start()
    try:
        _wait(lambda: not d.outbox.depth())
        state = d.state()
    finally:
        d.close()
    assert [(f["status"], f["reason"][:8]) for f in state["failed"]] == [("firing", "HTTP 400")]
    assert (state["receivers"][0]["delivered"], state["receivers"][0]["failed"]) == (2, 1)
    assert sorted(a["labels"]["slo"] for a in _get(f"{alertmanager}/api/v2/alerts")) == ["a", "c"]
