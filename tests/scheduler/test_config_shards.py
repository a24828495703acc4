"""The config as the truth about its shards: one it no longer lists is removed at the start or SIGHUP that finds it
gone, as ``DELETE /api/v1/shards/<id>`` removes one (a traced ``shard.remove`` decision, its rows gone); and its
shards' free text is held to the API's limit.  Real schedulers over real SQLite.

A shard dropped from the config stayed registered and placed (its GPUs reserved for good) until someone called
DELETE, which refused it while the config still listed it; a config shard's ``model`` could be 900 kB, while the
API refused more than 256 characters.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from otlp_receiver import Receiver, attributes
from sched_helpers import PendingActuator, frame
from test_states import UNVERSIONED

from sits_observe.cli import main
from sits_observe.clock import SimClock
from sits_observe.config import SimConfig, load, parse
from sits_observe.daemon import Daemon
from sits_observe.errors import ConfigError, SchedulerError
from sits_observe.frame import BucketLayout
from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig, ShardSpec
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.states import State
from sits_observe.scheduler.triggers import Trigger
from sits_observe.scheduler.store import DB_NAME, SCHEMA_VERSION, PlacementStore
from sits_observe.sim.host import SimulatedHost

GiB = 2**30
A = {"id": "a", "gpus": 1, "memory_per_gpu": GiB, "placement": [0]}
B = {"id": "b", "gpus": 2, "memory_per_gpu": GiB}  # placed by the scheduler


def config(*shards: dict[str, Any], **scheduler: Any) -> Any:
    return parse({"gpu": {"backend": "none"}, "scheduler": {"shards": list(shards), **scheduler}}, env={})


def tracked(sched: Scheduler) -> list[str]:
    """The shards stored (the API's list is published from the same rows)."""
    return sorted(s.id for s in sched.store.shards())


def removals(sched: Scheduler) -> list[tuple[str, str, list[int]]]:
    return [(d["shard_id"], d["reason"], list(d["source_gpus"])) for d in sched.decisions_state()["decisions"]
            if d["name"] == "shard.remove"]


def test_a_shard_dropped_from_the_config_is_removed_at_sighup_and_the_apis_are_kept(
        make_scheduler: Callable[..., Scheduler], receiver: Receiver) -> None:
    sched = make_scheduler(shards=[A, B], otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=0.1))
    sched.on_tick(frame(1000.0))  # B is placed on the first GPU values
    sched.register_shard({"id": "api", "gpus": 1, "placement": [7]})
    b_gpus = list(sched.store.placements("b", live=True)[0].gpus)

    sched.reload(config(A))
    assert tracked(sched) == ["a", "api"] and sched.store.placements("b") == []  # its history too
    assert removals(sched) == [("b", f"removed from the config (scheduler.shards); GPUs {b_gpus} freed", b_gpus)]
    assert [v["shard"]["id"] for v in sched.shards_state()["shards"]] == ["a", "api"]
    sched.reload(config())
    assert tracked(sched) == ["api"]  # a registration through the API is never the config's to remove
    assert sched.tracer.flush()
    spans = {attributes(sp)["shard.id"]: sp for _, sp in receiver.spans() if sp.name == "shard.remove"}
    assert sorted(spans) == ["a", "b"] and list(attributes(spans["a"])["source.gpus"]) == [0]
    sched.reload(config())
    assert len(removals(sched)) == 2  # nothing more to remove: nothing more recorded


def test_a_shard_dropped_from_the_config_while_the_daemon_was_down_is_removed_at_the_start(
        make_scheduler: Callable[..., Scheduler]) -> None:
    make_scheduler(shards=[A, {**B, "placement": [2, 3]}]).close()
    again = make_scheduler(shards=[A])  # a restart on the same state_dir
    assert tracked(again) == ["a"]
    assert removals(again) == [("b", "removed from the config (scheduler.shards); GPUs [2, 3] freed", [2, 3])]


def test_a_dropped_shard_with_a_placement_in_flight_gets_no_further_step_and_is_removed(
        make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture) -> None:
    """Forgetting it at once would leave the step on its way answering for a shard no longer tracked, refusing the
    removal would leave it to a second SIGHUP someone has to remember; waiting for the placement to finish sent the
    launch of a shard the config no longer lists (and then forgot it, launched). The step on its way ends it."""
    act = PendingActuator()
    sched = make_scheduler(actuator=act, shards=[B])
    sched.on_tick(frame(1000.0))
    (p,) = sched.store.placements("b", live=True)
    with caplog.at_level(logging.WARNING, logger="sits_observe.scheduler"):
        sched.reload(config())
    assert (f"shard b is no longer in the config (scheduler.shards); its first placement is in flight (placement "
            f"{p.id} placed waiting for step stage): no stage or launch is sent for it any more") in caplog.text
    sched.on_tick(frame(1001.0))
    assert tracked(sched) == ["b"] and removals(sched) == []
    sched.ack(p.id, {"step": "stage", "ok": True})
    assert [plan["step"] for plan in act.plans] == ["stage"]  # no launch
    failed = sched.store.placement(p.id)
    assert failed.state is State.FAILED and failed.reason.startswith("launch not sent: the shard is no longer")
    assert tracked(sched) == ["b"]  # removed at the next tick, not inside the orchestrator's ack
    sched.on_tick(frame(1002.0))
    assert tracked(sched) == [] and removals(sched) == [("b", "removed from the config (scheduler.shards)", [])]


def test_a_step_in_flight_at_a_restart_is_not_sent_again_for_a_dropped_shard(
        make_scheduler: Callable[..., Scheduler]) -> None:
    first = make_scheduler(actuator=PendingActuator(), shards=[B])
    first.on_tick(frame(1000.0))
    (p,) = first.store.placements("b", live=True)
    first.close()  # stopped with the stage on its way, and restarted without the shard
    act = PendingActuator()
    again = make_scheduler(actuator=act, shards=[])
    assert act.plans == [] and again.store.placement(p.id).state is State.FAILED
    again.on_tick(frame(1001.0))
    assert tracked(again) == [] and len(removals(again)) == 1


def test_a_dropped_shard_whose_placing_fails_is_removed(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler(actuator=PendingActuator(), shards=[B])
    sched.on_tick(frame(1000.0))
    (p,) = sched.store.placements("b", live=True)
    sched.reload(config())
    sched.ack(p.id, {"step": "stage", "ok": False, "reason": "image pull"})
    sched.on_tick(frame(1001.0))
    assert tracked(sched) == [] and removals(sched) == [("b", "removed from the config (scheduler.shards)", [])]


def test_a_dropped_shard_listed_again_before_its_placement_finished_stays(
        make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler(actuator=PendingActuator(), shards=[B])
    sched.on_tick(frame(1000.0))
    (p,) = sched.store.placements("b", live=True)
    sched.reload(config())
    sched.reload(config(B))  # a mistake undone
    sched.ack(p.id, {"step": "stage", "ok": True})
    sched.ack(p.id, {"step": "launch", "ok": True})
    sched.on_tick(frame(1001.0))
    assert tracked(sched) == ["b"] and removals(sched) == []


def test_a_removal_the_database_refuses_is_tried_again(make_scheduler: Callable[..., Scheduler],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A full disk at a SIGHUP leaves the shard tracked (logged) and the rest of the new config applied; a removal
    waiting for a placement in flight is tried at each tick until the database takes it."""
    sched = make_scheduler(actuator=PendingActuator(), shards=[A, B])
    sched.on_tick(frame(1000.0))
    (p,) = sched.store.placements("b", live=True)
    sched.register_shard({"id": "api", "gpus": 1, "placement": [7]})
    db = sched.store._db
    db.execute("PRAGMA query_only = ON")  # every write fails in SQLite, as on a full disk
    try:
        with caplog.at_level(logging.ERROR, logger="sits_observe.scheduler"):
            sched.reload(config(B, cooldown=7))  # A dropped
    finally:
        db.execute("PRAGMA query_only = OFF")
    assert "scheduler: shards no longer in the config not looked for (at the next SIGHUP or start)" in caplog.text
    assert sched.cfg.cooldown == 7 and tracked(sched) == ["a", "api", "b"]
    sched.reload(config(cooldown=7))  # A and B dropped: B's placement is in flight
    assert tracked(sched) == ["api", "b"]
    sched.ack(p.id, {"step": "stage", "ok": True})  # its launch is not sent: the placement fails
    db.execute("PRAGMA query_only = ON")
    try:
        with caplog.at_level(logging.ERROR, logger="sits_observe.scheduler"):
            sched.on_tick(frame(1001.0))
    finally:
        db.execute("PRAGMA query_only = OFF")
    assert "scheduler: shard b, no longer in the config, not removed (retried at the next tick)" in caplog.text
    assert tracked(sched) == ["api", "b"] and [r[0] for r in removals(sched)] == ["a"]
    sched.on_tick(frame(1002.0))
    assert tracked(sched) == ["api"] and sorted(r[0] for r in removals(sched)) == ["a", "b"]


def test_an_api_shard_the_config_comes_to_list_is_the_configs(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler()
    sched.register_shard({"id": "x", "gpus": 1, "placement": [4]})
    sched.reload(config({"id": "x", "gpus": 1, "placement": [4]}))
    sched.reload(config())
    assert tracked(sched) == []


def test_a_config_refused_at_sighup_removes_nothing(tmp_path: Path, make_scheduler: Callable[..., Scheduler],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The daemon keeps its running config when the file does not load, and the scheduler keeps its shards when it
    refuses one of the new config's (a NUMA node without a GPU)."""
    sched = make_scheduler(shards=[A, B])
    sched.on_tick(frame(1000.0))
    daemon = Daemon(config=config(A, B), clock=SimClock(1.0, 100.0, start=1000.0), consumers=[sched])
    bad = tmp_path / "c.yaml"
    bad.write_text(f"gpu:\n  backend: none\nscheduler:\n  shards:\n    - {{id: a, model: {'m' * 300}}}\n")
    with caplog.at_level(logging.ERROR, logger="sits_observe"):
        daemon.request_reload(lambda: load(bad, env={}))
        daemon.run(duration=0.05)
    assert (f"SIGHUP: new config rejected, keeping the old one: {bad}: scheduler.shards[0].model: at most 256 "
            f"characters (shorten it: it is repeated in every shard list, plan and span), got 'mmm") in caplog.text
    with pytest.raises(ConfigError, match="shard a: numa_node: no GPU of this host is on NUMA node 7"):
        sched.reload(config({**A, "numa_node": 7}))
    assert tracked(sched) == ["a", "b"] and removals(sched) == []


def test_the_simulators_shards_are_not_removed_with_the_config(tmp_path: Path) -> None:
    sim = SimulatedHost(SimConfig(topology="nvswitch-8", scenario="quiet"), BucketLayout(parse({}).store.snapped()))
    (first, *_) = sim.shards()
    listed = {"id": first.id, "gpus": len(first.gpus), "placement": list(first.gpus)}  # the config lists one too
    sched = Scheduler(SchedulerConfig(shards=[listed]), OtlpConfig(), sim.topology, tmp_path, sim=sim,
                      clock=lambda: 1000.0)
    try:
        ran = tracked(sched)
        sched.reload(config())
        assert tracked(sched) == ran and first.id in ran and removals(sched) == []
    finally:
        sched.close()


# scheduler.sqlite at schema version 3, before shards recorded who declared them: the unversioned tables and spans
VERSION_3 = UNVERSIONED + """
CREATE TABLE spans (seq INTEGER PRIMARY KEY AUTOINCREMENT, decision_id TEXT NOT NULL, body TEXT NOT NULL,
                    created_ts REAL NOT NULL);
PRAGMA user_version=3;
"""


def test_shards_stored_before_origins_are_kept_until_the_config_claims_them(
        tmp_path: Path, make_scheduler: Callable[..., Scheduler]) -> None:
    """Which of them the config had listed is unknown: each is kept (as a shard the config dropped was kept then);
    the ones the config lists at the first start are its own from then on."""
    state = tmp_path / "state"
    state.mkdir()
    with closing(sqlite3.connect(state / DB_NAME)) as db, db:
        db.executescript(VERSION_3)
        for i, gpu in (("listed", 0), ("other", 1)):
            db.execute("INSERT INTO shards VALUES (?, ?, 1.0)", (i, ShardSpec(id=i).model_dump_json()))
            db.execute("INSERT INTO placements(shard_id, kind, gpus, node, state, version, created_ts, updated_ts) "
                       "VALUES (?, 'adopt', ?, 'localhost', 'launched', 4, 1.0, 2.0)", (i, f"[{gpu}]"))
    sched = make_scheduler(shards=[{"id": "listed", "placement": [0]}])
    assert tracked(sched) == ["listed", "other"] and removals(sched) == []
    sched.reload(config())
    assert tracked(sched) == ["other"]
    with closing(sqlite3.connect(state / DB_NAME)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_the_store_records_who_declared_a_shard(tmp_path: Path) -> None:
    store = PlacementStore(tmp_path)
    try:
        store.add_shard(ShardSpec(id="c"), 1.0, "config")
        store.add_shard(ShardSpec(id="s"), 1.0, "simulator")
        store.add_shard(ShardSpec(id="x"), 1.0, "api")
        assert store.claim("config", ["x", "nope"]) == {"c", "x"} and store.claim("simulator", []) == {"s"}
    finally:
        store.close()


def test_a_config_shards_free_text_is_held_to_the_apis_limit(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"gpu:\n  backend: none\nscheduler:\n  shards:\n    - {{id: a, tenant: t}}\n"
                   f"    - {{id: b, workload: {'w' * 257}}}\n")
    assert main(["check-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert (f"sits-observe: error: {cfg}: scheduler.shards[1].workload: at most 256 characters (shorten it: it is "
            f"repeated in every shard list, plan and span), got '{'w' * 79}... (257 characters)") in err
    assert len(err) < 400, err
    parse({"scheduler": {"shards": [{"id": "a", "model": "m" * 256}]}}, env={})  # at the limit: taken


def test_a_refused_texts_length_is_its_own(make_scheduler: Callable[..., Scheduler]) -> None:
    """The API said "at most 256 characters, got '...' (259 characters)" of a 257-character model: its repr's."""
    said = r"^shard a: model: at most 256 characters .*, got 'm{79}\.\.\. \(257 characters\)$"
    with pytest.raises(ConfigError, match=said):
        make_scheduler().register_shard({"id": "a", "model": "m" * 257})


def test_a_config_without_a_shards_list_removes_none(make_scheduler: Callable[..., Scheduler],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A start without --config, or a file that lost its scheduler.shards, removed every config shard with its
    history (and a restored config then placed them again, sending stage and launch for deployments running
    already); an explicit empty list still removes them."""
    sched = make_scheduler(shards=[A, {**B, "placement": [2, 3]}])
    with caplog.at_level(logging.WARNING, logger="sits_observe.scheduler"):
        sched.reload(parse({"gpu": {"backend": "none"}}, env={}))
        sched.reload(parse({"gpu": {"backend": "none"}, "scheduler": {"strategy": "pack"}}, env={}))
    assert tracked(sched) == ["a", "b"] and removals(sched) == []
    said = [r.getMessage() for r in caplog.records if "no scheduler.shards" in r.getMessage()]
    assert len(said) == 2 and "the 2 shard(s) an earlier one declared are kept (a, b)" in said[0], said
    sched.close()
    again = make_scheduler()  # a restart with all defaults on the same state_dir
    assert tracked(again) == ["a", "b"]
    again.reload(config())  # `shards: []`
    assert tracked(again) == [] and len(removals(again)) == 2


def test_a_dropped_shard_is_not_re_sharded_before_its_removal(make_scheduler: Callable[..., Scheduler]) -> None:
    """Its re-shard failed (its orchestrator's failed ack) and it waits for the next tick's removal: a re-shard through
    the API then started a placement that failed at once (a failed migration decision, an alert annotation)."""
    sched = make_scheduler(actuator=PendingActuator(), shards=[{**B, "placement": [0, 1]}])
    sched.on_tick(frame(1000.0))
    sched.manual_reshard("b", "rebalance")
    (_, new) = sched.store.placements("b", live=True)
    sched.reload(config())
    sched.ack(new.id, {"step": "stage", "ok": False, "reason": "image pull"})
    with pytest.raises(SchedulerError, match="shard b: cannot re-shard: it is no longer in the config"):
        sched.manual_reshard("b", "again")
    assert len(sched.store.placements("b")) == 2  # no third
    sched.on_tick(frame(1001.0))
    assert tracked(sched) == []


def test_a_dropped_shard_removed_through_the_api_and_registered_again_is_the_apis(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """Removed by DELETE while it waited for the tick's removal, the id stayed halted: the API's new shard of that id
    got its placement failed at once, and the next tick removed it as the config's."""
    act = PendingActuator()
    sched = make_scheduler(actuator=act, shards=[B])
    sched.on_tick(frame(1000.0))
    (p,) = sched.store.placements("b", live=True)
    sched.reload(config())
    sched.ack(p.id, {"step": "stage", "ok": False, "reason": "image pull"})
    sched.remove_shard("b")
    assert sched.register_shard({"id": "b", "gpus": 2, "memory_per_gpu": GiB})["failure"] == ""
    (again,) = sched.store.placements("b", live=True)
    sched.ack(again.id, {"step": "stage", "ok": True})
    sched.ack(again.id, {"step": "launch", "ok": True})
    sched.on_tick(frame(1001.0))
    assert tracked(sched) == ["b"] and sched.store.placement(again.id).state is State.LAUNCHED


def test_a_sighup_the_database_refuses_leaves_a_dropped_shard_halted(make_scheduler: Callable[..., Scheduler]) -> None:
    """The claim refused, the shards dropped earlier were no longer halted: the launch of one went out, and nothing
    removed it after."""
    act = PendingActuator()
    sched = make_scheduler(actuator=act, shards=[B])
    sched.on_tick(frame(1000.0))
    (p,) = sched.store.placements("b", live=True)
    sched.reload(config())
    db = sched.store._db
    db.execute("PRAGMA query_only = ON")  # every write fails in SQLite, as on a full disk
    try:
        sched.reload(config(cooldown=7))
    finally:
        db.execute("PRAGMA query_only = OFF")
    sched.ack(p.id, {"step": "stage", "ok": True})
    assert [plan["step"] for plan in act.plans] == ["stage"]  # no launch
    sched.on_tick(frame(1001.0))
    assert tracked(sched) == []


def test_a_trigger_does_not_move_a_shard_dropped_from_the_config(make_scheduler: Callable[..., Scheduler]) -> None:
    """A dropped shard still tracked (its removal waits for a tick the database takes) was a trigger's candidate:
    its new placement failed at once, a failed "migrate" decision and alert annotation for nothing."""
    sched = make_scheduler(shards=[{**B, "placement": [2, 3]}])
    sched.on_tick(frame(1000.0))
    sched.walker.halted.add("b")  # as a removal the database refused leaves it
    sched.decider.decide(Trigger("verdict", "gpu_compute_saturation", True, 1001.0, "p99 burn", gpus=(2, 3)))
    (d,) = [d for d in sched.decisions_state()["decisions"] if d["trigger"] == "verdict"]
    assert d["action"] == "no_action" and "b is no longer in the config" in d["reason"], d
    assert [p.state for p in sched.store.placements("b")] == [State.LAUNCHED]
