"""The in-daemon consumer on a real Daemon, SeriesStore and HTTP app."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sits_observe.clock import SimClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.frame import Frame, GpuFrame, GpuInfo
from sits_observe.rca.config import RcaConfig
from sits_observe.rca.engine import RcaEngine
from sits_observe.rca.log import VerdictLog
from sits_observe.rca.model import RcaModel
from sits_observe.rca.verdict import Verdict

GPUS = tuple(GpuInfo(i, f"GPU-{i}", "sim", f"0:{i}") for i in range(4))


class HostSource:
    """Steady host at the synthetic baseline; from tick 30 the GPUs ``hot`` run 80 % hotter than the rest."""

    name = "host"

    def __init__(self, layout: Any, hot: tuple[int, ...] = ()) -> None:
        self.layout = layout
        self.hot = hot
        self.rng = np.random.default_rng(0)
        self.ticks = 0
        self.gpus_out = False  # the GPU source gives nothing

    def collect(self, frame: Frame) -> None:
        self.ticks += 1
        frame.gpu = GpuFrame.empty(() if self.gpus_out else GPUS)
        for g in range(len(frame.gpu.info)):
            hot = g in self.hot and self.ticks > 30
            frame.gpu.set(g, "temperature_celsius", 60.0 * (1.8 if hot else 1.0))
        frame.host["cpu_utilization_ratio"] = 0.3
        frame.add_values("ingress", "chat", self.rng.uniform(0.0015, 0.0021, 50), self.layout)
        frame.add_values("e2e", "chat", self.rng.uniform(0.3, 0.5, 50), self.layout)


def _config(tmp_path: Path, model: Path, every: int, history: int = 3600) -> Any:
    return parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}, "store": {"history": history},
                  "rca": {"model": str(model), "every_ticks": every, "burn_every_ticks": 1}}, env={})


def _daemon(tmp_path: Path, model: Path, every: int, history: int = 3600, **hooks: Any) -> tuple[Daemon, RcaEngine]:
    cfg = _config(tmp_path, model, every, history)
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 1.0, start=1000.0))
    engine = RcaEngine(cfg.rca, cfg.state_dir, **hooks)
    daemon.consumers.append(engine)
    daemon.rca = engine
    return daemon, engine


def test_verdicts_are_classified_stored_exported_and_handed_on(tmp_path: Path, tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    burning: list[str] = []
    annotations: list[tuple[str, dict[str, str]]] = []
    handed: list[Verdict] = []
    daemon, engine = _daemon(tmp_path, path, every=10, firing=lambda: burning,
                             annotate=lambda slo, a: annotations.append((slo, dict(a))), on_verdict=handed.append)
    daemon.sources.append(HostSource(daemon.layout, hot=(2,)))
    for _ in range(40):  # window 16: periodic verdicts at ticks 20, 30, 40
        daemon.tick()
    assert [v.trigger for v in handed] == ["periodic"] * 3 and not annotations
    burning += ["chat-latency", "chat-availability"]
    for _ in range(2):  # a burn classifies every tick and annotates the firing alerts
        daemon.tick()
    assert [v.trigger for v in handed[-2:]] == ["slo_burn"] * 2
    v = handed[-1]
    assert v.cause == "thermal_throttling" and v.confidence >= 0.6
    assert v.gpus[:1] == (2,)  # occluding the hot GPU is what lowers the verdict most
    assert v.top_features[0][0] == "gpu.temperature_celsius.max"
    notes = {"likely_cause": "thermal_throttling", "confidence": f"{v.confidence:.2f}", "rca_verdict": v.id}
    assert annotations[-2:] == [("chat-latency", notes), ("chat-availability", notes)]
    assert daemon.health["rca"].errors == 0

    client = create_app(daemon, ui=False).test_client()
    body = client.get("/metrics").data.decode()
    assert 'sits_rca_verdicts_total{cause="thermal_throttling"} ' in body
    assert 'sits_rca_verdict_confidence{cause="thermal_throttling"} ' in body
    assert f"sits_rca_last_classification_timestamp_seconds {v.ts}" in body
    assert "sits_rca_model_loaded 1.0" in body
    state = client.get("/api/v1/verdicts").get_json()
    assert state["enabled"] and state["verdicts"][0]["id"] == v.id and state["verdicts"][0]["gpus"][0] == 2
    assert state["latest_ts"] == v.ts
    engine.close()
    rows = sqlite3.connect(tmp_path / "rca.sqlite").execute("SELECT cause, ts FROM verdicts ORDER BY seq").fetchall()
    assert len(rows) == 5 and rows[-1] == ("thermal_throttling", v.ts)
    # a restarted engine serves the stored verdicts again
    again = RcaEngine(RcaConfig(model=str(path)), tmp_path)
    assert again.verdicts_state()["verdicts"][0]["id"] == v.id


def test_a_fault_on_a_pair_of_gpus_implicates_both(tmp_path: Path, tiny_model: RcaModel) -> None:
    """Putting one of two hot GPUs back to normal leaves the other driving the hottest-GPU feature, so one GPU at
    a time implicated neither: no GPU fault of the demo (each on a tensor-parallel pair) named a GPU."""
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    handed: list[Verdict] = []
    daemon, engine = _daemon(tmp_path, path, every=10, on_verdict=handed.append)
    daemon.sources.append(HostSource(daemon.layout, hot=(1, 2)))
    for _ in range(40):
        daemon.tick()
    v = handed[-1]
    assert v.cause == "thermal_throttling" and sorted(v.gpus) == [1, 2]
    engine.close()


@pytest.mark.parametrize("content", [b"", b"\x00garbage", None])
def test_daemon_runs_on_without_rca_when_the_model_is_broken(tmp_path: Path, tiny_model: RcaModel,
                                                            caplog: pytest.LogCaptureFixture,
                                                            content: bytes | None) -> None:
    path = tmp_path / "m.pt"
    if content is not None:
        tiny_model.save(path)
        path.write_bytes(path.read_bytes()[:200] if content == b"" else content)
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        daemon, _ = _daemon(tmp_path, path, every=1)
        daemon.sources.append(HostSource(daemon.layout))
        for _ in range(30):
            daemon.tick()
    warned = [r.message for r in caplog.records if "root-cause classification is off" in r.message]
    assert len(warned) == 1 and str(path) in warned[0]
    assert daemon.health["rca"].errors == 0 and daemon.store.ticks == 30
    client = create_app(daemon, ui=False).test_client()
    state = client.get("/api/v1/verdicts").get_json()
    assert state["enabled"] is False and state["verdicts"] == [] and str(path) in state["error"]
    assert "sits_rca_model_loaded 0.0" in client.get("/metrics").data.decode()


def test_a_failing_hook_does_not_lose_the_verdict(tmp_path: Path, tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)

    def broken(v: Verdict) -> None:
        raise RuntimeError("scheduler is down")

    daemon, engine = _daemon(tmp_path, path, every=1, on_verdict=broken)
    daemon.sources.append(HostSource(daemon.layout))
    for _ in range(17):
        daemon.tick()
    assert daemon.health["rca"].errors == 0 and len(engine.verdicts_state()["verdicts"]) == 2


def test_a_burn_classifies_every_burn_every_ticks(tmp_path: Path, tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    handed: list[Verdict] = []
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"},
                 "rca": {"model": str(path), "every_ticks": 1000, "burn_every_ticks": 4}}, env={})
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 1.0, start=1000.0))
    daemon.consumers.append(RcaEngine(cfg.rca, cfg.state_dir, firing=lambda: ["chat-latency"],
                                      on_verdict=handed.append))
    daemon.sources.append(HostSource(daemon.layout, hot=(2,)))
    for _ in range(40):  # window 16: burn verdicts at ticks 16, 20, ..., 40
        daemon.tick()
    assert [v.trigger for v in handed] == ["slo_burn"] * 7


def test_a_burn_is_classified_on_the_tick_it_starts(tmp_path: Path, tiny_model: RcaModel) -> None:
    """Burn verdicts came every burn_every_ticks ticks counted from the engine's start: a burn starting just after
    one waited up to N - 1 ticks for its first verdict (and its alert for its likely cause), a shorter one got
    none."""
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    burning: list[str] = []
    handed: list[tuple[int, str]] = []
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"},
                 "rca": {"model": str(path), "every_ticks": 1000, "burn_every_ticks": 5}}, env={})
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 1.0, start=1000.0))
    daemon.consumers.append(RcaEngine(cfg.rca, cfg.state_dir, firing=lambda: burning,
                                      on_verdict=lambda v: handed.append((daemon.store.ticks, v.trigger))))
    daemon.sources.append(HostSource(daemon.layout))
    for t in range(1, 51):
        if t in (31, 45):  # a burn from tick 31 to 41, another from 45
            burning[:] = ["chat-latency"]
        elif t == 42:
            burning.clear()
        daemon.tick()
    assert handed == [(31, "slo_burn"), (36, "slo_burn"), (41, "slo_burn"), (45, "slo_burn"), (50, "slo_burn")]


def test_a_window_without_gpu_readings_gets_no_verdict(tmp_path: Path, tiny_model: RcaModel,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The GPU source out (stages and host still reporting), the window went to the fallback network, which never
    saw every GPU feature missing in training: it named a cause with confidence (scheduler_stall at 0.95 for the
    shipped model), enough for the scheduler to act on. Now such a window is passed over, as one without data."""
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    handed: list[int] = []
    daemon, engine = _daemon(tmp_path, path, every=1, on_verdict=lambda v: handed.append(daemon.store.ticks))
    source = HostSource(daemon.layout)
    daemon.sources.append(source)
    with caplog.at_level(logging.INFO, logger="sits_observe.rca"):
        for t in range(1, 61):
            source.gpus_out = 21 <= t <= 40
            daemon.tick()
    # window 16: verdicts from tick 16; none from the outage's first tick until its last tick and most of its
    # window have readings again (tick 41 + 7)
    assert handed == [*range(16, 21), *range(48, 61)]
    said = [r.message for r in caplog.records if "GPU readings" in r.message]
    assert len(said) == 2 and "no verdict until they are back" in said[0] and "verdicts resume" in said[1]


def test_sighup_brings_rca_back_once_the_model_file_is_fixed_or_retrained(tmp_path: Path, tiny_model: RcaModel,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(b"\x00garbage")
    cfg = _config(tmp_path, path, every=5, history=600)
    daemon, engine = _daemon(tmp_path, path, every=5, history=600)
    daemon.sources.append(HostSource(daemon.layout))
    daemon.tick()
    assert engine.model is None
    tiny_model.save(path)  # fixed (or retrained) in place, same path
    engine.reload(cfg)
    assert engine.model is not None and engine.error is None
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        for _ in range(20):
            daemon.tick()
    assert engine.verdicts_state()["verdicts"] and engine._base is not None
    # the default store keeps 3600 ticks; this one 600, shorter than the model's baseline: said once
    assert sum("store.history is 600 ticks" in r.message for r in caplog.records) == 1
    engine.reload(cfg)  # the same file: kept as loaded, baseline and all
    assert engine._base is not None
    path.write_bytes(path.read_bytes() + b"")  # rewritten: a retrained model takes over with its own baseline
    engine.reload(cfg)
    assert engine.model is not None and engine._base is None


@pytest.mark.parametrize("bad", ["missing", "garbage"])
def test_a_sighup_naming_a_model_that_cannot_be_loaded_keeps_the_loaded_one(tmp_path: Path, tiny_model: RcaModel,
                                                                            bad: str,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A bad new config is logged and the old one kept; a mistyped rca.model (or a file broken in place) turned
    the working classifier off instead."""
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    daemon, engine = _daemon(tmp_path, path, every=1)
    daemon.sources.append(HostSource(daemon.layout, hot=(2,)))
    for _ in range(20):
        daemon.tick()
    loaded = engine.model
    if bad == "missing":
        cfg = _config(tmp_path, tmp_path / "typo.pt", every=1)
    else:
        cfg = _config(tmp_path, path, every=1)
        path.write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        engine.reload(cfg)
    assert engine.model is loaded and engine.error is None and engine.cfg.model_path() == path
    assert f"the model loaded before ({path}) stays" in caplog.text
    before = len(engine.verdicts_state()["verdicts"])
    daemon.tick()
    assert len(engine.verdicts_state()["verdicts"]) == before + 1  # it goes on classifying
    if bad == "garbage":
        tiny_model.save(path)  # fixed in place: the next SIGHUP takes it
        engine.reload(cfg)
        assert engine.model is not loaded and engine.model is not None


def test_the_verdict_log_holds_keep_verdicts_across_restarts_and_sighup(tmp_path: Path) -> None:
    path = tmp_path / "rca.sqlite"
    for restart in range(6):  # a daemon restarted more often than every 100 verdicts
        log = VerdictLog(path, keep=10)
        for i in range(8):
            log.append(Verdict("healthy", 1.0, 1000.0 + 8 * restart + i))
        assert log.count() <= 10
        log.close()
    log = VerdictLog(path, keep=10)
    for i in range(150):  # one long run: never more than keep rows either
        log.append(Verdict("healthy", 1.0, 2000.0 + i))
        assert log.count() <= 10
    assert [v["ts"] for v in log.recent(10)] == [2000.0 + i for i in range(149, 139, -1)]
    log.close()
    assert VerdictLog(path, keep=4).count() == 4  # a smaller keep holds from the next start


def test_sighup_applies_a_smaller_keep_verdicts_at_once(tmp_path: Path, tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    engine = RcaEngine(RcaConfig(model=str(path), keep_verdicts=100), tmp_path)
    for i in range(50):
        engine.record(Verdict("healthy", 1.0, 1000.0 + i))
    engine.reload(_config(tmp_path, path, every=5).model_copy(
        update={"rca": RcaConfig(model=str(path), keep_verdicts=10)}))
    assert engine.log.count() == 10


def test_the_api_shows_both_floors_and_sighup_applies_a_new_healthy_floor(tmp_path: Path, tiny_model: RcaModel,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    daemon, engine = _daemon(tmp_path, path, every=5)
    client = create_app(daemon, ui=False).test_client()
    state = client.get("/api/v1/verdicts").get_json()
    assert (state["min_confidence"], state["healthy_min_confidence"]) == (0.91, 0.6)
    assert (state["model"]["fallback"], state["model"]["relative_only"]) == (False, [])  # a one-network file
    classes = list(tiny_model.classes)
    proba = np.full(len(classes), 0.3 / (len(classes) - 1), dtype=np.float32)
    proba[classes.index("healthy")] = 0.7  # healthy, but not sure of it
    monkeypatch.setattr(RcaModel, "proba", lambda self, raw, base, lacking=None: proba[None])
    raw = np.zeros((tiny_model.window, len(tiny_model.features)), dtype=np.float32)
    base = np.zeros(len(tiny_model.features), dtype=np.float32)
    assert engine.classify(raw, base, 1000.0, "periodic").cause == "healthy"
    cfg = _config(tmp_path, path, every=5)
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={"healthy_min_confidence": 0.8})}))
    assert client.get("/api/v1/verdicts").get_json()["healthy_min_confidence"] == 0.8
    assert engine.classify(raw, base, 1001.0, "periodic").cause == "unknown"
    # a fault floor below the healthy one lowers it too: the API says the floor in force (it said 0.8)
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={"healthy_min_confidence": 0.8,
                                                                            "min_confidence": 0.65})}))
    assert client.get("/api/v1/verdicts").get_json()["healthy_min_confidence"] == 0.65
    assert engine.classify(raw, base, 1002.0, "periodic").cause == "healthy"
    # floors per cause: the healthy one is capped at their default
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={
        "healthy_min_confidence": 0.8, "min_confidence": {"default": 0.75, "thermal_throttling": 0.5}})}))
    state = client.get("/api/v1/verdicts").get_json()
    assert (state["min_confidence"], state["healthy_min_confidence"]) == (
        {"default": 0.75, "thermal_throttling": 0.5}, 0.75)
    assert engine.classify(raw, base, 1003.0, "periodic").cause == "unknown"
    engine.close()


def test_a_store_shorter_than_the_models_window_turns_rca_off(tmp_path: Path, tiny_model: RcaModel,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.pt"
    dataclasses.replace(tiny_model, window=80).save(path)  # a model that needs 80 ticks per window
    handed: list[Verdict] = []
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        daemon, engine = _daemon(tmp_path, path, every=1, history=60, on_verdict=handed.append)
        daemon.sources.append(HostSource(daemon.layout, hot=(2,)))
        for _ in range(100):  # the ring holds 60 ticks: a window of 80 cannot be read
            daemon.tick()
    assert handed == [] and engine.model is None and daemon.health["rca"].errors == 0
    warned = [r.message for r in caplog.records if "root-cause classification is off" in r.message]
    assert len(warned) == 1 and "store.history is 60 ticks" in warned[0] and "at least 80" in warned[0]
    client = create_app(daemon, ui=False).test_client()
    state = client.get("/api/v1/verdicts").get_json()
    assert state["enabled"] is False and "store.history" in state["error"]
    assert "sits_rca_model_loaded 0.0" in client.get("/metrics").data.decode()


def test_a_window_mostly_without_data_is_not_classified(tmp_path: Path, tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    handed: list[Verdict] = []
    daemon, engine = _daemon(tmp_path, path, every=1, on_verdict=handed.append)
    for _ in range(3 * tiny_model.window):  # no source: nothing to classify, no verdict made up from nothing
        daemon.tick()
    assert handed == [] and engine.model is not None
    daemon.sources.append(HostSource(daemon.layout))
    for _ in range(tiny_model.window // 2 - 1):  # fewer than half of the window's ticks have data
        daemon.tick()
    assert handed == []
    for _ in range(2):
        daemon.tick()
    assert len(handed) >= 1  # from the tick on which half the window has data, as training windows


def test_no_verdict_on_ticks_the_store_did_not_take(tmp_path: Path, tiny_model: RcaModel,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick the store failed to take was still classified: the last stored window again, stamped with the lost
    tick's time, every due tick of an outage (and the scheduler re-shards on a streak of verdicts)."""
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    handed: list[Verdict] = []
    daemon, engine = _daemon(tmp_path, path, every=1, on_verdict=handed.append)
    daemon.sources.append(HostSource(daemon.layout))
    for _ in range(tiny_model.window + 5):
        daemon.tick()
    assert handed and handed[-1].ts == daemon.store.latest_ts
    before = len(handed)

    def refuse(frame: Frame) -> None:
        raise OSError("no memory for the tick")

    monkeypatch.setattr(daemon.store, "ingest", refuse)
    for _ in range(10):
        daemon.tick()
    assert len(handed) == before and daemon.health["store"].errors == 10
    monkeypatch.undo()
    daemon.tick()
    assert len(handed) == before + 1 and handed[-1].ts == daemon.store.latest_ts


def test_confidence_series_go_when_rca_turns_off(tmp_path: Path, tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    cfg = _config(tmp_path, path, every=1)
    daemon, engine = _daemon(tmp_path, path, every=1)
    daemon.sources.append(HostSource(daemon.layout, hot=(2,)))
    for _ in range(20):
        daemon.tick()
    client = create_app(daemon, ui=False).test_client()
    assert "sits_rca_verdict_confidence{" in client.get("/metrics").data.decode()
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={"enabled": False})}))  # SIGHUP
    body = client.get("/metrics").data.decode()
    assert engine.model is None and "sits_rca_model_loaded 0.0" in body
    assert "sits_rca_verdict_confidence{" not in body  # no stale probabilities of a model that is gone
    assert engine.verdicts_state()["latest_probabilities"] == {}
    assert 'sits_rca_verdicts_total{cause="' in body  # counters stay: they count what was given


def test_a_verdict_the_log_cannot_store_is_still_annotated_and_handed_on(tmp_path: Path,
                                                                        tiny_model: RcaModel) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    handed: list[Verdict] = []
    annotations: list[str] = []
    daemon, engine = _daemon(tmp_path, path, every=1, firing=lambda: ["chat-latency"],
                             annotate=lambda slo, a: annotations.append(a["rca_verdict"]), on_verdict=handed.append)
    daemon.sources.append(HostSource(daemon.layout, hot=(2,)))
    for _ in range(16):
        daemon.tick()
    assert len(handed) == 1
    engine.log._db.execute("PRAGMA query_only=ON")  # rca.sqlite cannot be written (read-only, full disk)
    for _ in range(2):
        daemon.tick()
    assert len(handed) == 3 and annotations == [v.id for v in handed]
    assert [v["id"] for v in engine.verdicts_state()["verdicts"][:2]] == [handed[2].id, handed[1].id]
    assert daemon.health["rca"].errors == 2 and "cannot write a verdict" in str(daemon.health["rca"].last_error)
    engine.log._db.execute("PRAGMA query_only=OFF")
    daemon.tick()
    assert daemon.health["rca"].last_error is None and engine.log.count() == 2


def test_reads_do_not_wait_for_a_verdict_write_to_a_locked_file(tmp_path: Path) -> None:
    """GET /api/v1/verdicts took the lock a write holds through SQLite's 5 s busy timeout on a locked file (an
    operator's sqlite3 shell, a backup), holding one of the HTTP server's few workers as long."""
    import threading

    from in_thread import in_thread

    log = VerdictLog(tmp_path / "rca.sqlite")
    log.append(Verdict("healthy", 0.9, 1.0))
    other = sqlite3.connect(tmp_path / "rca.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    writing = threading.Thread(target=log.append, args=(Verdict("thermal_throttling", 0.95, 2.0),), daemon=True)
    writing.start()
    while not log._lock.locked():  # the write is waiting for the file
        writing.join(0.01)
    try:
        recent, _ = in_thread(log.recent, wait=2.0)  # the write waits 5 s for the file
        assert [v["cause"] for v in recent] == ["thermal_throttling", "healthy"]
    finally:
        other.rollback()
        writing.join(10)
        log.close()


@pytest.mark.parametrize("body", ["{not json", '{"confidence": 0.5, "ts": 1.0}', "null", '{"cause": "x", "gpus": 3}'])
def test_a_damaged_verdict_row_is_skipped_with_a_warning_not_a_failed_start(tmp_path: Path, body: str,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Such a row raised out of the log's open: the daemon's start failed with a traceback."""
    path = tmp_path / "rca.sqlite"
    log = VerdictLog(path)
    for ts in (1.0, 2.0, 3.0):
        log.append(Verdict("healthy", 0.9, ts))
    log.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE verdicts SET body = ? WHERE ts = 2.0", (body,))
    with caplog.at_level(logging.WARNING, "sits_observe.rca"):
        log = VerdictLog(path)
    try:
        assert [v["ts"] for v in log.recent()] == [3.0, 1.0] and log.count() == 3  # left in the file
        assert "1 of the last 3 stored verdicts cannot be read back" in caplog.text
    finally:
        log.close()


def test_a_verdict_says_which_network_scored_it_and_keeps_it_in_the_log(
        tmp_path: Path, untrained: Callable[..., RcaModel]) -> None:
    features = ("stage.e2e.p99", "gpu.backlog_utilization_ratio.min", "gpu.backlog_utilization_ratio.mean")
    model = untrained(features, 1)
    model.fallback = untrained(features, 2)
    path = tmp_path / "m.pt"
    model.save(path)
    cfg = _config(tmp_path, path, every=1)
    engine = RcaEngine(cfg.rca, cfg.state_dir)
    raw = np.random.default_rng(0).random((8, 3)).astype(np.float32)
    base = raw[0].copy()
    whole = engine.classify(raw, base, 1000.0, "periodic")
    raw[:, 1:] = np.nan  # no replica reported a backlog in the window: the fallback scores it
    lacking = engine.classify(raw, base, 1001.0, "periodic")
    assert (whole.network, lacking.network) == ("main", "fallback")
    engine.record(lacking)
    engine.close()
    log = VerdictLog(tmp_path / "rca.sqlite")
    assert [v["network"] for v in log.recent()] == ["fallback"]
    log.close()
    assert Verdict.from_dict({"cause": "healthy", "confidence": 0.9, "ts": 1.0}).network == "main"  # older rows


def test_sighup_turns_rca_off_and_on_and_applies_threads(tmp_path: Path, tiny_model: RcaModel,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    path = tmp_path / "m.pt"
    tiny_model.save(path)
    daemon, engine = _daemon(tmp_path, path, every=5)
    cfg = _config(tmp_path, path, every=5)
    assert engine.model is not None
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={"enabled": False})}))
    assert engine.model is None and "rca.enabled is false" in (engine.error or "")
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={"threads": 2})}))
    assert engine.model is not None and engine.error is None and threads[-1] == 2  # on again, with the new threads
    engine.reload(cfg.model_copy(update={"rca": cfg.rca.model_copy(update={"threads": 1})}))
    assert threads[-1] == 1  # the same model: only the threads change
    engine.close()


def test_no_verdict_is_made_from_ticks_without_data_even_with_rate_features(
        tmp_path: Path, untrained: Callable[..., RcaModel], caplog: pytest.LogCaptureFixture) -> None:
    model = untrained(("stage.e2e.rate", "stage.e2e.p99", "host.cpu_utilization_ratio", "stage.nosuch.p99"), 1)
    path = tmp_path / "m.pt"
    model.save(path)
    daemon, engine = _daemon(tmp_path, path, every=1)
    for _ in range(20):  # every source down: empty ticks, whose rates read 0 (not missing)
        daemon.tick()
    assert engine.log.count() == 0 and not engine.log.recent()
    daemon.sources.append(HostSource(daemon.layout))
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        for _ in range(20):
            daemon.tick()
    assert engine.log.count() > 0  # data again: verdicts again
    warned = [r.getMessage() for r in caplog.records if "no series for" in r.getMessage()]
    assert len(warned) == 1 and "stage.nosuch.p99" in warned[0] and "stage.e2e" not in warned[0], warned
    engine.close()


def test_a_model_trained_at_another_tick_step_is_refused_with_the_way_out(tmp_path: Path, tiny_model: RcaModel,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The window, the baseline's hour and the occlusion's minutes are counts of ticks: a model trained at 1 s
    ticks read 5 s ticks as windows five times as long, without a word."""
    assert tiny_model.training["tick_seconds"] == 1.0  # recorded by `rca train` from the dataset's step
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    cfg = _config(tmp_path, path, every=1)
    with caplog.at_level(logging.WARNING):
        engine = RcaEngine(cfg.rca, cfg.state_dir, tick_seconds=5.0)
    try:
        assert engine.model is None
        assert engine.error == (f"{path}: trained on ticks of 1 s, but this daemon ticks every 5 s, so its window of "
                                "16 ticks would span 80 s instead of 16 s; set tick_interval: 1, or train a model on "
                                "a dataset recorded every 5 s")
        assert [r.getMessage() for r in caplog.records] == [
            f"rca: root-cause classification is off: {engine.error}"]
    finally:
        engine.log.close()
    for tick in (1.0, 1.005):
        same = RcaEngine(cfg.rca, cfg.state_dir, tick_seconds=tick)
        assert same.model is not None and same.error is None
        same.log.close()
    older = dataclasses.replace(tiny_model)  # a file from before the step was recorded: taken as it is
    older.training = {k: v for k, v in tiny_model.training.items() if k != "tick_seconds"}
    older.save(path)
    engine = RcaEngine(cfg.rca, cfg.state_dir, tick_seconds=5.0)
    assert engine.model is not None
    engine.log.close()


def test_a_floor_for_a_cause_the_model_never_names_is_one_warning(tmp_path: Path, tiny_model: RcaModel,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        engine = RcaEngine(RcaConfig(model=str(path), min_confidence={"default": 0.6, "thermal_throtling": 0.8}),
                           tmp_path)
    lines = [r.getMessage() for r in caplog.records if "thermal_throtling" in r.getMessage()]
    assert len(lines) == 1 and "never names; they have no effect" in lines[0], lines
    assert engine.model is not None  # the classifier runs on, every cause at the default floor
    engine.close()
