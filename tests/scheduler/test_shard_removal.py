"""Removing shards (``DELETE /api/v1/shards/<id>``) and ``scheduler.max_shards``, through Flask with the bearer-token
decorator the daemon uses, on real schedulers over real SQLite.

Registered shards were unbounded and nothing removed one: an orchestrator retiring a deployment could not tell the
scheduler, which kept its GPUs reserved for good, and ever-new ids grew the registry (and every registration's cost)
without end.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from pydantic import SecretStr

from otlp_receiver import Receiver, attributes
from sched_helpers import PendingActuator, frame

from sits_observe.cli import main
from sits_observe.config import SimConfig, parse
from sits_observe.errors import SchedulerError
from sits_observe.export.http import ApiError, require_token
from sits_observe.export.scheduler_api import scheduler_blueprint
from sits_observe.frame import BucketLayout
from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.states import State
from sits_observe.scheduler.store import PlacementStore
from sits_observe.sim.host import SimulatedHost

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GiB = 2**30


def client_of(sched: Scheduler, token: str | None = TOKEN) -> FlaskClient:
    app = Flask("test")
    daemon = SimpleNamespace(config=SimpleNamespace(api_token=SecretStr(token) if token else None))
    app.register_blueprint(scheduler_blueprint(sched, require_token(daemon)))

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> tuple[dict[str, str], int]:
        return {"error": exc.reason}, exc.status

    return app.test_client()


def ids(client: FlaskClient) -> list[str]:
    return [s["shard"]["id"] for s in client.get("/api/v1/shards").get_json()["shards"]]


def rows(sched: Scheduler) -> Any:
    """Every shard and placement row as stored (history included)."""
    return [s.id for s in sched.store.shards()], [p.to_dict() for p in sched.store.placements()]


def refused(client: FlaskClient, sched: Scheduler, shard_id: str, status: int, reason: str,
            headers: dict[str, str] | None = None) -> None:
    before = rows(sched)
    r = client.delete(f"/api/v1/shards/{shard_id}", headers=AUTH if headers is None else headers)
    assert (r.status_code, reason in r.get_json()["error"]) == (status, True), r.get_json()
    assert rows(sched) == before


def test_removing_a_launched_shard_frees_its_gpus_for_another(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler()
    client = client_of(sched)
    sched.on_tick(frame(1000.0, mem_gib=[0] * 8))
    r = client.post("/api/v1/shards", json={"id": "old", "gpus": 2, "memory_per_gpu": 70 * GiB, "placement": [0, 1]},
                    headers=AUTH)
    assert r.status_code == 201
    r = client.post("/api/v1/reshard", json={"shard": "old", "reason": "history"}, headers=AUTH)
    assert r.status_code == 202  # a retired placement too: history
    (old,) = sched.store.placements("old", live=True)
    sched.on_tick(frame(1001.0, mem_gib=[75] * 8))  # another tenant fills every other GPU
    new = {"id": "new", "gpus": 2, "memory_per_gpu": 60 * GiB}
    r = client.post("/api/v1/shards", json=new, headers=AUTH)
    assert r.status_code == 409 and "fits nowhere" in r.get_json()["error"]

    r = client.delete("/api/v1/shards/old", headers=AUTH)
    assert r.status_code == 200, r.get_json()
    gone = r.get_json()
    assert (gone["shard"]["id"], gone["state"], gone["gpus"]) == ("old", "launched", list(old.gpus))
    assert [p["id"] for p in gone["placements"]] == [old.id]
    assert ids(client) == [] and rows(sched) == ([], [])  # its history went too: not live, not kept for good
    (d, *_) = client.get("/api/v1/decisions?limit=1").get_json()["decisions"]
    assert (d["id"], d["name"], d["action"], d["trigger"], d["shard_id"], d["source_gpus"], d["target_gpus"]) == (
        gone["decision_id"], "shard.remove", "remove", "unregister", "old", list(old.gpus), [])
    assert d["reason"] == f"removed by api; GPUs {list(old.gpus)} freed"
    refused(client, sched, "old", 404, "shard old: not registered")

    mem = [75.0] * 8
    for g in old.gpus:  # its orchestrator stopped it: the readings show its memory gone
        mem[g] = 0.0
    sched.on_tick(frame(1002.0, mem_gib=mem))
    r = client.post("/api/v1/shards", json=new, headers=AUTH)
    assert (r.status_code, r.get_json()["gpus"]) == (201, list(old.gpus))


def test_a_removal_needs_the_bearer_token_and_a_known_id(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler()
    sched.register_shard({"id": "tp2", "gpus": 2, "placement": [0, 1]})
    client = client_of(sched)
    refused(client, sched, "tp2", 401, "missing or wrong bearer token", headers={})
    refused(client, sched, "tp2", 401, "missing or wrong bearer token", headers={"Authorization": "Bearer nope"})
    refused(client_of(sched, token=None), sched, "tp2", 403, "mutating API calls are disabled")
    refused(client, sched, "nope", 404, "shard nope: not registered")
    refused(client, sched, "x" * 5000, 400, "remove: a shard id has at most 63 characters, got 'xxx")
    assert ids(client) == ["tp2"]


def test_a_shard_with_a_placement_in_flight_is_not_removed(make_scheduler: Callable[..., Scheduler]) -> None:
    """Its orchestrator is carrying out a step: the scheduler would forget a placement whose ack is on its way."""
    sched = make_scheduler(actuator=PendingActuator())
    client = client_of(sched)
    sched.on_tick(frame(1000.0))
    new = client.post("/api/v1/shards", json={"id": "new", "gpus": 1}, headers=AUTH).get_json()["placements"][0]["id"]
    refused(client, sched, "new", 409, f"shard new: cannot remove while its first placement is in flight (placement "
                                       f"{new} placed waiting for step stage); try again when it has finished")
    sched.ack(new, {"step": "stage", "ok": False, "reason": "image pull"})  # its placing failed: unplaced
    assert client.delete("/api/v1/shards/new", headers=AUTH).get_json()["state"] == "unplaced"

    sched.register_shard({"id": "tp2", "gpus": 2, "placement": [0, 1]})
    old = sched.store.placements("tp2")[0].id
    moved = sched.manual_reshard("tp2", "maintenance")["placement_id"]
    refused(client, sched, "tp2", 409, f"shard tp2: cannot remove while a re-shard is in flight (placement {moved} "
                                       "placed waiting for step stage)")
    sched.ack(moved, {"step": "stage", "ok": True})
    sched.ack(moved, {"step": "launch", "ok": True})
    refused(client, sched, "tp2", 409, f"a re-shard is in flight (placement {old} draining waiting for step drain)")
    sched.ack(old, {"step": "drain", "ok": True})
    serving = list(sched.store.placement(moved).gpus)
    r = client.delete("/api/v1/shards/tp2", headers=AUTH)
    assert (r.status_code, r.get_json()["state"], r.get_json()["gpus"]) == (200, "launched", serving)
    assert ids(client) == [] and rows(sched) == ([], [])


def test_a_config_shard_is_removed_from_the_config_and_a_removal_survives_restarts(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """A shard removed through the API must not come back from scheduler.sqlite at a restart; one of the config
    would come back at the next SIGHUP or start, so DELETE refuses it: dropping it from the config removes it
    (tests/scheduler/test_config_shards.py)."""
    cfg = {"id": "cfg", "gpus": 1, "placement": [0]}
    sched = make_scheduler(shards=[cfg])
    client = client_of(sched)
    sched.register_shard({"id": "api", "gpus": 1, "placement": [1]})
    refused(client, sched, "cfg", 409, "shard cfg: cannot remove a shard of the config (scheduler.shards): the next "
                                       "SIGHUP or start would register it again; remove it from the config and reload "
                                       "(SIGHUP): that removes it")
    assert client.delete("/api/v1/shards/api", headers=AUTH).status_code == 200
    sched.close()

    again = make_scheduler(shards=[cfg])  # a restart on the same state_dir
    client = client_of(again)
    assert ids(client) == ["cfg"] and rows(again)[0] == ["cfg"]
    again.reload(parse({"gpu": {"backend": "none"}, "scheduler": {"shards": []}}, env={}))  # the config drops it
    assert ids(client) == [] and rows(again) == ([], [])
    refused(client, again, "cfg", 404, "shard cfg: not registered")
    again.close()

    third = make_scheduler()
    assert ids(client_of(third)) == [] and rows(third) == ([], [])


def test_a_shard_the_simulator_runs_is_not_removed(tmp_path: Path) -> None:
    sim = SimulatedHost(SimConfig(topology="nvswitch-8", scenario="quiet"), BucketLayout(parse({}).store.snapped()))
    sched = Scheduler(SchedulerConfig(), OtlpConfig(), sim.topology, tmp_path, sim=sim, clock=lambda: 1000.0)
    try:
        (first, *_) = [s.id for s in sim.shards()]
        with pytest.raises(SchedulerError, match=f"shard {first}: cannot remove a shard the simulator runs: the next "
                                                 "start would register it again"):
            sched.remove_shard(first)
        assert first in [s.id for s in sched.store.shards()]
    finally:
        sched.close()


def test_registrations_past_max_shards_are_refused(make_scheduler: Callable[..., Scheduler]) -> None:
    """A config shard counts, also while it waits for GPU values to be placed."""
    sched = make_scheduler(max_shards=3, shards=[{"id": "cfg", "gpus": 1}])
    client = client_of(sched)
    for i in (1, 2):
        assert client.post("/api/v1/shards", json={"id": f"a{i}", "placement": [i]}, headers=AUTH).status_code == 201
    before = rows(sched)
    r = client.post("/api/v1/shards", json={"id": "a3", "placement": [3]}, headers=AUTH)
    assert (r.status_code, r.get_json()["error"]) == (409, (
        "shard a3: cannot register: 3 shards are tracked, scheduler.max_shards is 3; remove one no longer served "
        "(DELETE /api/v1/shards/<id>) or raise scheduler.max_shards"))
    assert rows(sched) == before
    assert client.delete("/api/v1/shards/a1", headers=AUTH).status_code == 200
    assert client.post("/api/v1/shards", json={"id": "a3", "placement": [3]}, headers=AUTH).status_code == 201
    sched.on_tick(frame(1000.0))
    assert sorted(ids(client)) == ["a2", "a3", "cfg"]  # the config shard, waiting until now, was counted
    shards = [{"id": "cfg", "gpus": 1}, {"id": "cfg2", "gpus": 1, "placement": [5]}]
    sched.reload(parse({"gpu": {"backend": "none"}, "scheduler": {"max_shards": 3, "shards": shards}}, env={}))
    assert sorted(ids(client)) == ["a2", "a3", "cfg", "cfg2"]  # the config's shards are checked at load, not here
    r = client.post("/api/v1/shards", json={"id": "a4", "placement": [4]}, headers=AUTH)
    assert r.status_code == 409 and "4 shards are tracked, scheduler.max_shards is 3" in r.get_json()["error"]


def test_a_config_with_more_shards_than_max_shards_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gpu:\n  backend: none\nscheduler:\n  max_shards: 2\n  shards:\n"
                   + "".join(f"    - id: s{i}\n" for i in range(3)))
    assert main(["check-config", str(cfg)]) == 2
    assert (f"sits-observe: error: {cfg}: scheduler.shards: 3 shards, more than scheduler.max_shards (2); raise "
            "max_shards or list fewer shards") in capsys.readouterr().err


def test_a_removal_is_traced_and_stored_with_its_span(make_scheduler: Callable[..., Scheduler],
                                                      receiver: Receiver) -> None:
    sched = make_scheduler(otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=0.1))
    sched.register_shard({"id": "tp2", "gpus": 2, "placement": [2, 3]})
    d = sched.remove_shard("tp2")["decision_id"]
    assert sched.tracer.flush()
    (span,) = [sp for _, sp in receiver.spans() if attributes(sp)["decision.id"] == d]
    attrs = attributes(span)
    assert (span.name, attrs["shard.id"], list(attrs["source.gpus"]), list(attrs["target.gpus"]),
            attrs["decision.action"], attrs["decision.trigger"]) == ("shard.remove", "tp2", [2, 3], [], "remove",
                                                                      "unregister")


def test_a_removal_the_database_cannot_store_is_a_503_and_changes_nothing(
        make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler()
    sched.register_shard({"id": "tp2", "gpus": 2, "placement": [0, 1]})
    client = client_of(sched)
    before = rows(sched)
    sched.store._db.execute("PRAGMA query_only = ON")  # every write fails in SQLite, as on a full disk
    try:
        r = client.delete("/api/v1/shards/tp2", headers=AUTH)
        assert (r.status_code, r.headers.get("Retry-After")) == (503, "5"), r.get_json()
    finally:
        sched.store._db.execute("PRAGMA query_only = OFF")
    assert rows(sched) == before and ids(client) == ["tp2"]
    assert [d["action"] for d in sched.decisions_state()["decisions"]] == ["adopt"]  # not recorded as removed


def test_a_removal_loses_a_race_with_a_placement_moved_meanwhile(tmp_path: Path) -> None:
    """Removal is a compare-and-swap as every transition: live placements that moved since they were read
    (another process on the same file) are not deleted unseen."""
    from sits_observe.scheduler.config import ShardSpec

    store = PlacementStore(tmp_path)
    try:
        store.add_shard(ShardSpec(id="a"), 1.0)
        p = store.create("a", "assign", 1.0)
        store.update(p, 2.0, State.PLACED, gpus=[0])
        with pytest.raises(SchedulerError, match=r"shard a: lost a race removing it: its live placements \(id, "
                                                 rf"version\) were \[\({p.id}, 1\)\], now \[\({p.id}, 2\)\]"):
            store.remove_shard("a", [p])
        assert [s.id for s in store.shards()] == ["a"] and store.placement(p.id).state is State.PLACED
    finally:
        store.close()
