"""The SLO engine when things go wrong around it: a failed slo.db write, a kill between queuing an alert
and recording it, a receiver added while an alert fires, and restarts between slot edges."""

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sits_observe.config import parse
from sits_observe.errors import DamagedStateError, SloError
from sits_observe.slo.evaluate import SloEngine

from alert_receiver import Receiver
from slo_helpers import SECRET, Feeder, burning, config_for, wait

ROOT = Path(__file__).resolve().parents[2]


class _Killed(Exception):
    """The process died here (kill -9, OOM): nothing after this point ran."""


def _two_slos(tmp_path, url):
    data = config_for(tmp_path, url).model_dump(mode="python")
    data["alerting"]["receivers"][0]["secret"] = SECRET
    batch = copy.deepcopy(data["slos"][0])
    batch["name"], batch["latency"]["workload"] = "batch-latency", "batch"
    data["slos"].append(batch)
    return parse(data, env={})


def test_a_failed_state_write_at_a_resolution_is_retried_and_later_alerts_still_go_out(tmp_path, receiver):
    cfg = _two_slos(tmp_path, receiver.url)
    feed = Feeder(cfg)
    engine = SloEngine.from_config(cfg)

    def tick(bad_chat, bad_batch):
        frame = feed.frame(bad_chat)
        feed.add(frame, "batch", bad_batch)
        engine.on_tick(frame)

    for _ in range(100):
        tick(0.0, 0.0)
    for _ in range(30):
        tick(0.5, 0.0)
    assert engine.firing == ["page_fast", None]
    real, failed = engine.state.set_tiers, []

    def locked_once(slo, tiers, *args, **kwargs):  # the write that records the resolution fails once
        if not failed and slo == "chat-latency" and all(since is None for since, _ in tiers.values()):
            failed.append(slo)
            raise SloError("SLO state slo.db: database is locked")
        return real(slo, tiers, *args, **kwargs)

    engine.state.set_tiers = locked_once
    for _ in range(40):
        try:
            tick(0.0, 0.0)
        except SloError:
            pass
    assert failed and engine.firing == [None, None]
    for _ in range(30):
        tick(0.0, 0.5)
    assert engine.firing == [None, "page_fast"] and engine.slos_state()[1]["firing"]["burn_tier"] == "page_fast"
    assert wait(lambda: len(receiver.accepted()) == 3)
    engine.close()
    got = [(d.body["alerts"][0]["labels"]["slo"], d.body["status"]) for d in receiver.accepted()]
    assert got == [("chat-latency", "firing"), ("chat-latency", "resolved"), ("batch-latency", "firing")]
    engine = SloEngine.from_config(cfg)  # slo.db says what the engine said
    assert engine.firing == [None, "page_fast"]
    engine.close()


def _killed_after_queuing(engine, status, tick, delivered):
    """Tick until the engine queues an alert of ``status``, then die there (kill -9): once ``delivered()``,
    nothing else is written."""
    real = engine.dispatcher.notify

    def notify_then_die(alert):
        real(alert)
        if alert.status == status:
            raise _Killed

    engine.dispatcher.notify = notify_then_die
    with pytest.raises(_Killed):
        for _ in range(60):
            tick()
    assert wait(delivered)
    engine.dispatcher.close()
    engine.state.close()


@pytest.mark.parametrize("fails", ["outbox", "state"])
def test_a_loud_annotation_whose_write_failed_goes_out_with_the_next_verdict(tmp_path, receiver, monkeypatch, fails):
    """The notes were changed in memory before the writes: after a failed queuing (a full or locked disk; the
    RCA hook logs it and goes on) the next verdict of the same cause was no longer new, and no receiver heard
    the likely cause for the rest of the incident."""
    from sits_observe.errors import AlertingError

    feed, engine = burning(config_for(tmp_path, receiver.url))
    try:
        assert wait(lambda: len(receiver.deliveries) == 1)  # the page
        target, name = (engine.dispatcher.outbox, "enqueue") if fails == "outbox" else (engine.state, "set_notes")
        real = getattr(target, name)

        def full(*args, **kwargs):
            raise (AlertingError if fails == "outbox" else SloError)("database or disk is full")

        monkeypatch.setattr(target, name, full)
        notes = {"likely_cause": "thermal_throttling", "confidence": "0.91"}
        with pytest.raises((AlertingError, SloError)):
            engine.annotate("chat-latency", notes)
        monkeypatch.setattr(target, name, real)
        engine.annotate("chat-latency", {**notes, "confidence": "0.93"})  # the next verdict; the disk has room
        assert wait(lambda: len(receiver.deliveries) == 2)
        assert receiver.deliveries[1].body["alerts"][0]["annotations"]["likely_cause"] == "thermal_throttling"
    finally:
        engine.close()


def test_a_kill_between_queuing_a_firing_alert_and_recording_it_resolves_it_after_the_restart(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed = Feeder(cfg)
    engine = SloEngine.from_config(cfg)
    for _ in range(100):
        engine.on_tick(feed.frame(0.0))
    _killed_after_queuing(engine, "firing", lambda: engine.on_tick(feed.frame(0.5)),
                          lambda: len(receiver.accepted()) == 1)

    feed.ts += 120  # back two minutes later; the burn is over
    engine = SloEngine.from_config(cfg)
    for _ in range(30):
        engine.on_tick(feed.frame(0.0))
    assert engine.firing == [None]
    assert wait(lambda: len(receiver.accepted()) == 2, timeout=5)
    first, second = (d.body["alerts"][0] for d in receiver.accepted())
    assert (first["status"], second["status"]) == ("firing", "resolved")
    assert first["fingerprint"] == second["fingerprint"]
    engine.close()


FLUSHES = """
import os, sys
from sits_observe.alerting.formats import Alert
from sits_observe.slo.state import SloState
state = SloState(sys.argv[1], ["a"], ["k"], [10.0])
os.access("/sits-mark-tiers", 0)
state.set_tiers("a", {"page_fast": (None, 1000.0)})  # a tick's write
os.access("/sits-mark-announce", 0)
state.set_announced([Alert({"alertname": "SitsSloBurnRate", "slo": "a"}, {}, "firing", 1000.0)])
os.access("/sits-mark-end", 0)
state.close()
"""


def test_an_alert_recorded_as_announced_reaches_the_disk_before_it_is_queued(tmp_path):
    """slo.db's commits were never flushed (synchronous=NORMAL), the outbox's are (FULL): after a power loss the
    outbox could hold a firing alert slo.db had not recorded as announced, which the restarted engine then never
    resolved when it no longer fired (a webhook showed it firing for ever). The announcement is flushed now; a
    tick's writes (window edges, tiers) still are not: a slow disk must not hold the tick every slot."""
    assert shutil.which("strace"), "strace is needed (Debian package strace; make test installs it)"
    trace = subprocess.run(["strace", "-f", "-e", "trace=access,faccessat,faccessat2,fsync,fdatasync", sys.executable,
                            "-c", FLUSHES, str(tmp_path / "slo.db")], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
    assert trace.returncode == 0, trace.stderr[-2000:]
    calls = [ln for ln in trace.stderr.splitlines() if "sits-mark" in ln or "sync(" in ln]
    marks = [k for k, ln in enumerate(calls) if "sits-mark" in ln]
    assert len(marks) == 3, calls
    flushes = [sum("sync(" in ln for ln in calls[a + 1:b]) for a, b in zip(marks, marks[1:])]
    assert flushes[0] == 0 and flushes[1] >= 1, calls


def test_a_kill_between_queuing_a_resolution_and_recording_it_pages_no_one_again(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg)
    assert engine.firing == ["page_fast"]
    _killed_after_queuing(engine, "resolved", lambda: engine.on_tick(feed.frame(0.0)),
                          lambda: len(receiver.accepted()) == 2)  # slo.db still says the alert fires

    engine = SloEngine.from_config(cfg)
    assert engine.firing == ["page_fast"]  # as recorded
    for _ in range(30):
        engine.on_tick(feed.frame(0.0))
    assert engine.firing == [None] and wait(lambda: engine.dispatcher.outbox.depth() == {}, timeout=5)
    engine.close()
    got = [d.body["alerts"][0]["status"] for d in receiver.accepted()]
    assert got == ["firing", "resolved"], got  # no second firing page for the incident that had ended


def test_a_receiver_added_while_an_alert_fires_gets_it_after_the_restart(tmp_path, receiver):
    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg)
    assert engine.firing == ["page_fast"] and wait(lambda: engine.dispatcher.outbox.depth() == {})
    engine.close()
    second = Receiver()
    try:
        data = cfg.model_dump(mode="python")
        data["alerting"]["receivers"][0]["secret"] = SECRET
        data["alerting"]["receivers"].append({"type": "webhook", "name": "oncall", "url": second.url})
        engine = SloEngine.from_config(parse(data, env={}))
        engine.on_tick(feed.frame(0.5))
        assert wait(lambda: len(second.accepted()) == 1)
        assert second.accepted()[0].body["alerts"][0]["labels"]["burn_tier"] == "page_fast"
        assert wait(lambda: engine.dispatcher.outbox.depth() == {})
        engine.close()
    finally:
        second.close()
    assert len(receiver.deliveries) == 1  # the first receiver had it already: not sent again


def _one_slo_engine(state_dir):
    """A one-SLO engine on ``state_dir`` with the default tiers (10 s slots at the finest level)."""
    state_dir.mkdir(exist_ok=True)
    cfg = parse({"state_dir": str(state_dir), "slos": [
        {"name": "chat", "objective": 0.99, "latency": {"stage": "e2e", "workload": "chat", "threshold": 0.25}}]},
        env={})
    return cfg, SloEngine.from_config(cfg)


def test_a_clean_restart_keeps_the_events_since_the_last_slot_edge(tmp_path):
    cfg, through = _one_slo_engine(tmp_path / "a")
    _, restarted = _one_slo_engine(tmp_path / "b")
    feed = Feeder(cfg)
    for k in range(45):
        frame = feed.frame(0.1 * (k % 3))
        through.on_tick(frame)
        restarted.on_tick(frame)
        if k % 7 == 6:  # SIGTERM and back, mostly between slot edges
            restarted.close()
            _, restarted = _one_slo_engine(tmp_path / "b")
    want = [(w["window"], w["good"], w["total"]) for w in through.slos_state()[0]["windows"]]
    assert want[0] == ("5m", 4050.0, 4500.0)
    assert [(w["window"], w["good"], w["total"]) for w in restarted.slos_state()[0]["windows"]] == want
    through.close()
    restarted.close()


def test_edges_a_failed_state_write_did_not_store_are_stored_with_the_next(tmp_path):
    cfg, through = _one_slo_engine(tmp_path / "a")
    _, flaky = _one_slo_engine(tmp_path / "b")
    feed = Feeder(cfg)
    real, failed = flaky.state.save, []

    def full_once(written, prune=(), seen=None, wait=False):
        written = list(written)
        if written and not failed:  # the write at a slot edge fails once (disk full)
            failed.append(len(written))
            raise SloError("SLO state slo.db: database or disk is full")
        return real(written, prune, seen, wait)

    flaky.state.save = full_once
    for k in range(45):
        frame = feed.frame(0.1 * (k % 3))
        through.on_tick(frame)
        try:
            flaky.on_tick(frame)
        except SloError:
            pass
    assert failed
    through.close()
    flaky.close()
    _, through = _one_slo_engine(tmp_path / "a")  # both restarted: what slo.db holds
    _, flaky = _one_slo_engine(tmp_path / "b")
    frame = feed.frame(0.0)
    through.on_tick(frame)
    flaky.on_tick(frame)
    want = [(w["window"], w["good"], w["total"]) for w in through.slos_state()[0]["windows"]]
    assert [(w["window"], w["good"], w["total"]) for w in flaky.slos_state()[0]["windows"]] == want
    through.close()
    flaky.close()


def test_a_damaged_state_or_outbox_file_leaves_no_database_open(tmp_path, receiver, monkeypatch):
    import sqlite3

    opened = []
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: opened.append(connect(*a, **k)) or opened[-1])
    cfg = config_for(tmp_path, receiver.url)
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    (state_dir / "slo.db").write_bytes(b"not a database" * 100)
    cfg = cfg.model_copy(update={"state_dir": str(state_dir)})
    with pytest.raises(DamagedStateError, match="slo.db"):
        SloEngine.from_config(cfg)
    (state_dir / "slo.db").unlink()
    (state_dir / "outbox.db").write_bytes(b"not a database" * 100)
    with pytest.raises(DamagedStateError, match="outbox.db"):
        SloEngine.from_config(cfg)
    assert opened
    for db in opened:  # every connection the failed starts made is closed
        with pytest.raises(sqlite3.ProgrammingError):
            db.execute("SELECT 1")


def _burning_with_a_5m_guard(tmp_path, url):
    data = config_for(tmp_path, url).model_dump(mode="python")
    data["alerting"]["receivers"][0]["secret"] = SECRET
    data["slos"][0]["keep_firing_for"] = "5m"
    cfg = parse(data, env={})
    return (cfg, *burning(cfg))


def test_the_flap_guard_counts_the_downtime_after_a_restart(tmp_path, receiver):
    cfg, feed, engine = _burning_with_a_5m_guard(tmp_path, receiver.url)
    assert engine.firing == ["page_fast"]
    engine.close()  # stopped while the condition held
    feed.ts += 86400  # back a day later: the burn is long over
    engine = SloEngine.from_config(cfg)
    engine.on_tick(feed.frame(0.0))
    assert engine.firing == [None]  # resolved at once: the 5 minutes of the guard passed while it was down
    engine.close()


def test_a_short_restart_keeps_the_flap_guard(tmp_path, receiver):
    cfg, feed, engine = _burning_with_a_5m_guard(tmp_path, receiver.url)
    engine.close()
    feed.ts += 30  # back in 30 s
    engine = SloEngine.from_config(cfg)
    for _ in range(200):  # clean ticks, inside the guard's 5 minutes counted from the stop
        engine.on_tick(feed.frame(0.0))
    assert engine.firing == ["page_fast"]
    for _ in range(100):
        engine.on_tick(feed.frame(0.0))
    assert engine.firing == [None]
    engine.close()


def test_a_scrape_does_not_wait_for_a_tick_stuck_in_slo_db(tmp_path, receiver):
    import time

    from in_thread import lock_held

    cfg = config_for(tmp_path, receiver.url)
    feed, engine = burning(cfg)
    before = {(s.name, s.labels): s.value for s in engine.metrics() if s.name.startswith("sits_slo")}
    slos, alerts = engine.slos_state(), engine.alerts_state()["firing"]
    with lock_held(engine._lock):  # a tick holding the engine's lock while slo.db answers "database is locked"
        start = time.monotonic()
        during = {(s.name, s.labels): s.value for s in engine.metrics() if s.name.startswith("sits_slo")}
        # the API's and the UI's reads too: each one waiting held an HTTP worker, and a few starved /metrics
        slos_during, alerts_during = engine.slos_state(), engine.alerts_state()["firing"]
        took = time.monotonic() - start
    assert took < 2 and during == before and before  # the last values, at once (deliveries may move on)
    assert slos_during == slos and alerts_during == alerts and alerts
    engine.close()


def test_a_first_scrape_does_not_wait_for_a_tick_stuck_in_slo_db(tmp_path, receiver):
    """No scrape has read the engine yet: the first one still answers at once (the SLO series come with the next)."""
    import time

    from in_thread import lock_held

    cfg = config_for(tmp_path, receiver.url)
    _feed, engine = burning(cfg)
    with lock_held(engine._lock):
        start = time.monotonic()
        during = [s for s in engine.metrics() if s.name.startswith("sits_slo")]
        took = time.monotonic() - start
    assert took < 2 and during == []
    assert [s for s in engine.metrics() if s.name.startswith("sits_slo")]
    engine.close()


def test_the_first_api_reads_do_not_wait_for_a_tick_stuck_in_slo_db(tmp_path, receiver):
    """/api/v1/slos and /api/v1/alerts had no value before their first read: it waited for the tick, however long."""
    import time

    from in_thread import lock_held

    cfg = config_for(tmp_path, receiver.url)
    _feed, engine = burning(cfg)
    with lock_held(engine._lock):
        start = time.monotonic()
        slos, alerts = engine.slos_state(), engine.alerts_state()
        took = time.monotonic() - start
    assert took < 2 and [s["name"] for s in slos] == [cfg.slos[0].name] and "firing" in alerts
    assert engine.alerts_state()["firing"]  # the next read, once the tick is done: current
    engine.close()


def test_messages_queued_for_receivers_all_since_removed_stay_visible(tmp_path, caplog):
    """With no receiver configured no dispatcher was made: the queued pages had no start-up line, no entry in the
    API and no queue-depth series, although docs/alerting.md promises all three for a receiver removed."""
    import logging

    from sits_observe.alerting.formats import Alert
    from sits_observe.alerting.outbox import Outbox

    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["oncall"], Alert({"alertname": "SitsSloBurnRate", "slo": "chat-latency"}, {}, "firing", 1.7e9))
    box.close()
    data = config_for(tmp_path, "http://127.0.0.1:9/").model_dump(mode="python")
    data["alerting"]["receivers"] = []
    cfg = parse(data, env={})
    caplog.set_level(logging.WARNING, "sits_observe.alerting")
    engine = SloEngine.from_config(cfg)
    try:
        engine.start()
        engine.on_tick(Feeder(cfg).frame(0.0))
        assert "receivers no longer configured (oncall: 1)" in caplog.text
        assert engine.alerts_state()["unconfigured_receivers"] == [{"name": "oncall", "queue_depth": 1}]
        depth = [s for s in engine.metrics() if s.name == "sits_webhook_queue_depth"]
        assert [(s.labels, s.value) for s in depth] == [((("receiver", "oncall"),), 1.0)]
    finally:
        engine.close()


def _ratio_config(state_dir, slos=None):
    slos = slos or [{"name": "errs", "objective": 0.99, "window": "1d", "tiers": {"ticket_slow": False},
                     "ratio": {"total": "requests_total", "bad": "request_errors_total", "workload": "chat"}}]
    return parse({"state_dir": str(state_dir), "slos": slos}, env={})


def _ratio_frame(ts, total, bad, workload="chat"):
    from sits_observe.frame import Frame

    frame = Frame(ts=ts, interval=1.0)
    frame.add_counter("requests_total", workload, total)
    frame.add_counter("request_errors_total", workload, bad)
    return frame


def _bad_and_total(engine, window):
    w = next(x for x in engine.slos_state()[0]["windows"] if x["window"] == window)
    return round(w["total"] - w["good"]), round(w["total"])


def test_a_clean_stop_after_failed_writes_keeps_the_events_where_they_were(tmp_path):
    """close() stored the counts but not the edges the failed writes left: at the restart every edge from the
    last stored one got the final total, so a burn of the last minutes sat at that edge, out of the 5m window."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    through, flaky = _ratio_config(tmp_path / "a"), _ratio_config(tmp_path / "b")
    engines = [SloEngine.from_config(through), SloEngine.from_config(flaky)]
    real = engines[1].state.save
    ts = 1_700_000_000.0
    for k in range(900):  # 10 minutes stored, then 5 whose writes fail, 20 % errors in their last 100 s
        ts += 1
        full = k >= 600
        engines[1].state.save = _full if full else real
        for engine in engines:
            try:
                engine.on_tick(_ratio_frame(ts, 100, 20 if k >= 800 else 0))
            except SloError:
                assert engine is engines[1] and full
    engines[1].state.save = real  # space is back; SIGTERM before the next tick
    for engine in engines:
        engine.close()
    engines = [SloEngine.from_config(through), SloEngine.from_config(flaky)]
    for engine in engines:
        engine.on_tick(_ratio_frame(ts + 1, 100, 0))
    assert _bad_and_total(engines[1], "5m") == _bad_and_total(engines[0], "5m")
    assert _bad_and_total(engines[1], "5m")[0] == 2000
    assert engines[1].firing == engines[0].firing
    for engine in engines:
        engine.close()


def _full(*args, **kwargs):
    raise SloError("SLO state slo.db: database or disk is full")


def test_the_flap_guard_counts_the_downtime_when_a_config_change_dropped_the_history(tmp_path):
    """With no stored edge left (an SLO added with a finer short window), the restart took the current time as the
    stop: a page over a day before stayed firing its whole keep_firing_for (30 min) on clean traffic."""
    a = {"name": "a", "objective": 0.999, "window": "28d",
         "ratio": {"total": "requests_total", "bad": "request_errors_total", "workload": "chat"}}
    b = {"name": "b", "objective": 0.99, "window": "7d", "tiers": {"page_fast": {"long": "10m", "short": "1m"},
                                                                   "ticket_slow": False},
         "ratio": {"total": "requests_total", "bad": "request_errors_total", "workload": "x"}}
    engine = SloEngine.from_config(_ratio_config(tmp_path, [a]))
    ts = 1_700_000_040.0
    for m in range(600):  # minute ticks, 0.8 % errors from minute 120: a burn of 8
        ts += 60
        engine.on_tick(_ratio_frame(ts, 6000, 48 if m >= 120 else 0))
    assert engine.firing == ["page_slow"]
    engine.close()
    engine = SloEngine.from_config(_ratio_config(tmp_path, [a, b]))
    ts += 86400
    engine.on_tick(_ratio_frame(ts + 60, 6000, 0))
    assert engine.firing[0] is None
    engine.close()


def test_a_slo_db_locked_by_another_process_holds_no_tick_for_the_busy_timeout(tmp_path):
    """Each tick of a burn waited SQLite's 5 s busy timeout for the lock (the whole tick loop at 1 tick per 5 s).
    Now a tick's writes wait 0.25 s each; the alert waits for the lock (it is recorded before it is sent)."""
    import sqlite3
    import time

    engine = SloEngine.from_config(_ratio_config(tmp_path))
    ts = 1_700_000_000.0
    for _ in range(600):
        ts += 1
        engine.on_tick(_ratio_frame(ts, 100, 0))
    other = sqlite3.connect(tmp_path / "slo.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # an sqlite3 shell left in a write transaction
    t0, raised = time.monotonic(), 0
    for _ in range(5):  # half the requests failing: page_fast's condition holds
        ts += 1
        try:
            engine.on_tick(_ratio_frame(ts, 100, 50))
        except SloError as exc:
            assert "database is locked" in str(exc)
            raised += 1
    assert raised >= 4 and time.monotonic() - t0 < 12.5  # 4 of the ticks took 5 s each before
    assert engine.firing == [None]
    other.execute("ROLLBACK")
    other.close()
    engine.on_tick(_ratio_frame(ts + 1, 100, 50))
    assert engine.firing == ["page_fast"]
    engine.close()


def test_a_stop_while_another_process_holds_slo_db_a_moment_still_stores_everything(tmp_path):
    """The stop's write of the edges failed writes left waited a tick's 0.25 s, and its failure skipped the write
    of the counts since the last edge (which waits SQLite's 5 s): both were lost to a backup holding the lock 1 s."""
    import sqlite3
    import threading

    engine = SloEngine.from_config(_ratio_config(tmp_path))
    real = engine.state.save
    ts = 1_700_000_000.0
    for k in range(700):
        ts += 1
        engine.state.save = _full if k >= 600 else real
        try:
            engine.on_tick(_ratio_frame(ts, 100, 0))
        except SloError:
            assert k >= 600
    engine.state.save = real
    other = sqlite3.connect(tmp_path / "slo.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.0, lambda: other.execute("ROLLBACK"))
    release.start()
    engine.close()
    release.join()
    other.close()
    db = sqlite3.connect(tmp_path / "slo.db")
    assert db.execute("SELECT ts, total FROM now").fetchall() == [(ts, 70000.0)]
    assert db.execute("SELECT max(idx) FROM edges WHERE level = 0").fetchone()[0] is not None
    db.close()
    engine = SloEngine.from_config(_ratio_config(tmp_path))
    engine.on_tick(_ratio_frame(ts + 1, 100, 0))
    assert _bad_and_total(engine, "5m") == (0, 30000)
    engine.close()


def test_a_stored_stop_time_later_than_the_new_timeline_holds_no_page(tmp_path):
    """History dropped (the SLI changed) and a restart on a clock that starts earlier (the demo's simulated clock
    runs ahead of the wall clock): the stored stop time lay in the future and kept a page firing for hours."""
    def config(bad):
        return _ratio_config(tmp_path, [{"name": "a", "objective": 0.999, "window": "28d",
                                         "ratio": {"total": "requests_total", "bad": bad, "workload": "chat"}}])

    def frame(ts, bad, name):
        from sits_observe.frame import Frame

        f = Frame(ts=ts, interval=60.0)
        f.add_counter("requests_total", "chat", 6000)
        f.add_counter(name, "chat", bad)
        return f

    engine = SloEngine.from_config(config("request_errors_total"))
    ts = 1_700_000_040.0 + 20 * 3600
    for m in range(600):
        ts += 60
        engine.on_tick(frame(ts, 48 if m >= 120 else 0, "request_errors_total"))
    assert engine.firing == ["page_slow"]
    engine.close()
    engine = SloEngine.from_config(config("preemptions_total"))
    ts = 1_700_000_040.0 + 3600
    for _ in range(40):  # past page_slow's keep_firing_for (30 min)
        ts += 60
        engine.on_tick(frame(ts, 0, "preemptions_total"))
    assert engine.firing == [None]
    engine.close()
