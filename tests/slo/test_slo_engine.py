"""The SLO engine in daemon conditions: real outbox and sender to a loopback receiver, restarts on the same
state directory, RCA annotations, API and metrics output."""

import copy
import json
import logging
import sqlite3
import time

import numpy as np
import pytest

from sits_observe.config import parse
from sits_observe.slo.evaluate import SloEngine

from slo_helpers import SECRET, Feeder, burning, config_for, wait


def _tier(engine, name):
    return next(t for t in engine.slos_state()[0]["tiers"] if t["burn_tier"] == name)


def test_restart_remembers_budget_and_firing_alert(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg, clean=120)
    assert engine.firing == ["page_fast"]
    before = engine.slos_state()[0]["error_budget"]["remaining_ratio"]
    assert before < 0  # 15 % of a 1h window's events were bad against a 1 % budget
    assert wait(lambda: len(receiver.accepted()) == 1)
    assert wait(lambda: engine.dispatcher.outbox.depth() == {})  # recorded as delivered: a close now cuts nothing off
    engine.close()

    engine = SloEngine.from_config(cfg)  # same state_dir: a restart
    assert engine.slos_state()[0]["firing"]["burn_tier"] == "page_fast"
    engine.on_tick(feed.frame(0.5))
    after = engine.slos_state()[0]["error_budget"]["remaining_ratio"]
    assert after < before  # the burned budget was not forgotten, and this tick burned more
    held_at = None
    for _ in range(20):  # the 10 s short window clears within 11 ticks
        engine.on_tick(feed.frame(0.0))
        if not _tier(engine, "page_fast")["active"]:
            held_at = _tier(engine, "page_fast")["condition_held_at"]
            break
    assert held_at == feed.ts - 1 and engine.firing == ["page_fast"]  # kept firing: keep_firing_for = short window
    engine.close()

    engine = SloEngine.from_config(cfg)  # a restart while the alert is kept firing: the flap guard is not reset
    for _ in range(9):
        engine.on_tick(feed.frame(0.0))
        assert engine.firing == ["page_fast"] and _tier(engine, "page_fast")["condition_held_at"] == held_at
    engine.on_tick(feed.frame(0.0))
    assert engine.firing == [None] and feed.ts == held_at + 11
    assert wait(lambda: len(receiver.accepted()) == 2)
    assert wait(lambda: engine.dispatcher.outbox.depth() == {})
    engine.close()

    got = receiver.accepted()
    assert [d.body["status"] for d in got] == ["firing", "resolved"]
    assert all(d.signed_ok for d in got)
    alerts = [d.body["alerts"][0] for d in got]
    assert alerts[0]["fingerprint"] == alerts[1]["fingerprint"]
    assert alerts[0]["labels"] == {"alertname": "SitsSloBurnRate", "slo": "chat-latency", "severity": "page",
                                   "burn_tier": "page_fast", "host": "gpu-7"}
    assert len(receiver.deliveries) == 2  # nothing re-sent by the restart


def test_annotations_ride_on_the_alert(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed = Feeder(cfg)
    engine = SloEngine.from_config(cfg)
    for _ in range(100):
        engine.on_tick(feed.frame(0.0))
    engine.annotate("chat-latency", {"likely_cause": "gpu_memory_pressure", "confidence": 0.81,
                                     "scheduler_action": "none", "scheduler_reason": "a move cannot help",
                                     "scheduler_decision_id": "d1"})
    for _ in range(30):
        engine.on_tick(feed.frame(0.5))
    assert wait(lambda: len(receiver.accepted()) == 1)
    for confidence in (0.93, 0.94, 0.95):  # a verdict every few ticks, same cause: no message of its own
        engine.annotate("chat-latency", {"likely_cause": "gpu_memory_pressure", "confidence": confidence,
                                         "rca_verdict": f"v{confidence}"})
    engine.annotate("chat-latency", {"scheduler_action": "none", "scheduler_reason": "a move cannot help",
                                     "scheduler_decision_id": "d2"})  # another episode saying the same: quiet
    engine.annotate("chat-latency", {"likely_cause": "thermal_throttling", "confidence": 0.7})  # already
    assert wait(lambda: len(receiver.accepted()) == 2)  # delivered: sent again, updated
    with pytest.raises(Exception, match="unknown SLO 'nope'"):
        engine.annotate("nope", {"likely_cause": "x"})
    for _ in range(25):  # 10 s until the short window clears, 10 s of keep_firing_for
        engine.on_tick(feed.frame(0.0))
    assert wait(lambda: len(receiver.accepted()) == 3)
    engine.close()
    notes = [d.body["alerts"][0]["annotations"] for d in receiver.accepted()]
    assert notes[0]["likely_cause"] == "gpu_memory_pressure" and notes[0]["confidence"] == "0.81"
    assert notes[1]["likely_cause"] == "thermal_throttling" and notes[1]["confidence"] == "0.7"
    assert notes[1]["rca_verdict"] == "v0.95" and notes[2] == notes[1]
    assert notes[1]["scheduler_action"] == "none" and notes[1]["scheduler_decision_id"] == "d2"
    assert [d.body["status"] for d in receiver.accepted()] == ["firing", "firing", "resolved"]
    assert notes[0]["summary"] == "chat-latency: error budget burning over 1.2x in the last 1m and 10s"


def test_api_state_and_metrics(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg, clean=90, bad=0.3)
    slos, alerts = engine.slos_state(), engine.alerts_state()
    text = json.dumps([slos, alerts])  # JSON-ready
    assert SECRET not in text and receiver.url not in text
    slo = slos[0]
    assert slo["window"] == "1h" and slo["firing"]["burn_tier"] == "page_fast"
    win = {w["window"]: w for w in slo["windows"]}
    assert set(win) == {"10s", "1m", "10m", "1h"}
    assert win["10s"]["total"] == 1000 and win["10s"]["good"] == 700 and win["10s"]["burn_rate"] == pytest.approx(30)
    assert win["1m"]["sli"] == pytest.approx(1 - 30 * 30 / 6000)
    tiers = {t["burn_tier"]: t for t in slo["tiers"]}
    # with only 90 s of history the 10m tier burned first: ticket_slow fired, then page_fast took over and
    # ticket_slow resolved at that tick (held while its condition is kept)
    assert tiers["page_fast"]["firing"] and tiers["page_fast"]["condition_held_at"] == feed.ts
    assert tiers["ticket_slow"]["held"] and not tiers["ticket_slow"]["firing"]
    assert tiers["ticket_slow"]["keep_firing_for"] == "1m" and tiers["ticket_slow"]["condition_held_at"] == feed.ts
    # held while its 1m short window and 1m keep_firing_for may still lag page_fast's incident
    assert tiers["ticket_slow"]["held_until"] == feed.ts + 60 + 60
    assert [a["labels"]["burn_tier"] for a in alerts["firing"]] == ["page_fast"]
    assert [a["labels"]["burn_tier"] for a in alerts["recent"]] == ["ticket_slow"]
    assert alerts["receivers"][0]["name"] == "hook" and set(alerts["receivers"][0]) >= {"queue_depth", "delivered"}
    samples = {(s.name, s.labels): s.value for s in engine.metrics()}
    slo_l = (("slo", "chat-latency"),)
    assert samples[("sits_slo_alert_firing", (*slo_l, ("severity", "page"), ("burn_tier", "page_fast")))] == 1.0
    assert samples[("sits_slo_alert_firing", (*slo_l, ("severity", "ticket"), ("burn_tier", "ticket_slow")))] == 0.0
    assert samples[("sits_slo_burn_rate", (*slo_l, ("window", "10s")))] == pytest.approx(30)
    assert samples[("sits_slo_sli_ratio", (*slo_l, ("window", "1h")))] == pytest.approx(1 - 900 / 12000)
    assert samples[("sits_slo_error_budget_remaining_ratio", slo_l)] == pytest.approx(1 - (900 / 12000) / 0.01)
    assert wait(lambda: engine.dispatcher.outbox.depth() == {})
    samples = {(s.name, s.labels): s.value for s in engine.metrics()}
    # ticket_slow firing, page_fast firing, ticket_slow resolved
    assert samples[("sits_webhook_deliveries_total", (("receiver", "hook"), ("outcome", "delivered")))] == 3.0
    assert samples[("sits_webhook_queue_depth", (("receiver", "hook"),))] == 0.0
    engine.close()


def test_a_restart_keeps_how_long_a_tier_is_held_and_reads_the_old_held_list(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg, clean=90, bad=0.3)
    until = engine.held_until.copy()
    assert until[0, 3] == feed.ts + 120 and np.isnan(until[0, 0])
    engine.close()
    engine = SloEngine.from_config(cfg)
    assert np.array_equal(engine.held_until, until, equal_nan=True)
    engine.close()
    db = sqlite3.connect(tmp_path / "slo.db")  # an earlier version: the held tiers' names only
    db.execute("UPDATE held SET tiers = ?", ('["ticket_slow"]',))
    db.commit()
    db.close()
    engine = SloEngine.from_config(cfg)
    assert engine.held_until[0, 3] == np.inf  # held until its own condition lapses, as it was then
    engine.close()


def test_an_alert_the_new_configuration_no_longer_has_is_resolved_after_a_restart(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg)
    assert engine.firing == ["page_fast"] and wait(lambda: len(receiver.accepted()) == 1)
    old = receiver.accepted()[0].body["alerts"][0]
    engine.close()
    data = cfg.model_dump(mode="python")
    data["alerting"]["receivers"][0]["secret"] = SECRET
    data["slos"][0]["labels"] = {"team": "serving"}  # the same burn, another alert (fingerprint)
    cfg = parse(data, env={})
    engine = SloEngine.from_config(cfg)
    engine.on_tick(feed.frame(0.5))
    assert engine.firing == ["page_fast"]
    assert wait(lambda: len(receiver.accepted()) == 3)
    got = [d.body["alerts"][0] for d in receiver.accepted()[1:]]
    # the old alert resolved, then the new one announced (it fired before the restart, under other labels)
    assert [(a["status"], a["fingerprint"] == old["fingerprint"]) for a in got] == [("resolved", True),
                                                                                    ("firing", False)]
    assert got[1]["labels"]["team"] == "serving"
    engine.close()
    engine = SloEngine.from_config(cfg)  # and nothing more at the next restart
    engine.on_tick(feed.frame(0.5))
    engine.close()
    time.sleep(0.5)
    assert len(receiver.accepted()) == 3


def test_clock_going_back_starts_afresh(tmp_path, receiver, caplog):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg)
    assert engine.firing == ["page_fast"]
    feed.ts -= 3600
    with caplog.at_level(logging.WARNING, logger="sits_observe.slo"):
        engine.on_tick(feed.frame(0.0))
    assert "start afresh" in caplog.text
    assert engine.slos_state()[0]["windows"][-1]["total"] == 100
    # the alert does not outlive its windows: resolved at once, not kept until the clock catches up
    assert engine.firing == [None]
    assert wait(lambda: [d.body["status"] for d in receiver.accepted()] == ["firing", "resolved"])
    engine.close()


def test_a_changed_sli_starts_afresh_and_others_keep_their_history(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed = Feeder(cfg)
    engine = SloEngine.from_config(cfg)
    for _ in range(100):
        engine.on_tick(feed.frame(0.1))
    engine.close()
    data = cfg.model_dump(mode="python")
    data["alerting"]["receivers"][0]["secret"] = SECRET
    data["slos"].append({**copy.deepcopy(data["slos"][0]), "name": "chat-p99"})  # a new SLO, same SLI
    data["slos"][0]["latency"]["threshold"] = 0.5                 # the first one's SLI changed
    engine = SloEngine.from_config(parse(data, env={}))
    engine.on_tick(feed.frame(0.0))
    first, new = engine.slos_state()
    assert first["windows"][-1]["total"] == 100 and new["windows"][-1]["total"] == 100  # both start afresh
    engine.close()
    data["slos"][0]["latency"]["threshold"] = 0.25  # changed again: afresh again; the new one keeps its history
    engine = SloEngine.from_config(parse(data, env={}))
    engine.on_tick(feed.frame(0.0))
    assert [s["windows"][-1]["total"] for s in engine.slos_state()] == [100, 200]
    engine.close()


@pytest.mark.parametrize("script", [
    # one alert per SLO
    "CREATE TABLE alerts (slo TEXT PRIMARY KEY, tier TEXT NOT NULL, since REAL NOT NULL);"
    "INSERT INTO alerts VALUES ('chat-latency', 'page_fast', 1700000000.0);",
    # firing alerts with when their condition cleared
    "CREATE TABLE firing (slo TEXT NOT NULL, tier TEXT NOT NULL, since REAL NOT NULL, cleared REAL,"
    " PRIMARY KEY (slo, tier));"
    "INSERT INTO firing VALUES ('chat-latency', 'page_fast', 1700000000.0, NULL);",
])
def test_firing_alert_of_an_earlier_state_file_is_kept(tmp_path, receiver, script):
    """slo.db of earlier versions kept firing alerts in an `alerts` or `firing` table; migrated on open."""
    cfg = config_for(tmp_path, receiver.url)
    SloEngine.from_config(cfg).close()
    db = sqlite3.connect(tmp_path / "slo.db")
    db.executescript("DROP TABLE tiers;" + script)
    db.close()
    engine = SloEngine.from_config(cfg)
    assert engine.firing == ["page_fast"] and engine.slos_state()[0]["firing"]["since"] == 1700000000.0
    engine.close()
