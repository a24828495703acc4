"""Triggers: verdict streaks, imbalance and saturation windows, hysteresis, cooldown, non-fixable causes; a
migration stands when the database refuses to prune old placements."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from contextlib import closing

import numpy as np
import pytest
from sched_helpers import PendingActuator, frame, live_gpus

from sits_observe.frame import GPU_FIELD_INDEX, GPU_FIELDS, Frame, numa_cpu_sample
from sits_observe.errors import SchedulerError
from sits_observe.rca.verdict import Verdict
from sits_observe.scheduler import decide
from sits_observe.scheduler.config import SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.states import TERMINAL, State
from sits_observe.scheduler.triggers import Sustained, Triggers, culprits
from sits_observe.topology import preset


def verdict(cause: str, conf: float, ts: float, gpus: tuple[int, ...] = (0,)) -> Verdict:
    return Verdict(cause, conf, ts, gpus=gpus, trigger="slo_burn")


def fired_at(trig: Triggers, seq: list[tuple[str, float]]) -> list[int]:
    return [i for i, (c, p) in enumerate(seq) if trig.on_verdict(verdict(c, p, 100.0 + i), 100.0 + i) is not None]


@pytest.mark.parametrize(("seq", "fires"), [
    ([("thermal_throttling", 0.9)] * 2, []),
    ([("thermal_throttling", 0.9)] * 5, [2]),                                     # once per episode
    ([("thermal_throttling", 0.9), ("thermal_throttling", 0.5)] + [("thermal_throttling", 0.9)] * 3,
     [4]),                                                                        # a weak verdict breaks the streak
    ([("thermal_throttling", 0.9), ("thermal_throttling", 0.67), ("thermal_throttling", 0.9),
      ("thermal_throttling", 0.9)], [3]),                                         # hysteresis band: held, not counted
    ([("thermal_throttling", 0.9)] * 3 + [("healthy", 0.95)] + [("thermal_throttling", 0.9)] * 3, [2, 6]),
    ([("gpu_memory_pressure", 0.9), ("thermal_throttling", 0.9), ("gpu_memory_pressure", 0.9),
      ("gpu_memory_pressure", 0.9)], []),                                         # a different cause restarts
])
def test_verdict_streaks(seq: list[tuple[str, float]], fires: list[int]) -> None:
    trig = Triggers(SchedulerConfig(verdict_threshold=0.7, verdict_consecutive=3, hysteresis=0.05), 8)
    assert fired_at(trig, seq) == fires


def test_persisting_cause_fires_again_after_cooldown() -> None:
    trig = Triggers(SchedulerConfig(verdict_consecutive=2, cooldown=60), 8)
    fired = [t.ts for i in range(0, 200, 10)
             if (t := trig.on_verdict(verdict("cpu_contention", 0.9, float(i)), float(i)))]
    assert fired == [10.0, 70.0, 130.0, 190.0]


@pytest.mark.parametrize("cause", ["network_ingress", "scheduler_stall", "unknown"])
def test_non_fixable_causes_are_marked(cause: str) -> None:
    trig = Triggers(SchedulerConfig(verdict_consecutive=2), 8)
    out = [trig.on_verdict(verdict(cause, 0.4 if cause == "unknown" else 0.9, float(i)), float(i)) for i in range(2)]
    assert out[0] is None and out[1] is not None
    assert out[1].fixable is False and cause in out[1].reason


def test_sustained_window_with_hysteresis() -> None:
    s = Sustained(level=0.30, hysteresis=0.05, sustain=60, refire=600)
    values = [0.4] * 59 + [0.4] * 2 + [0.27] * 10 + [0.4] * 30 + [0.2] + [0.4] * 61
    fired = [t for t, v in enumerate(values) if s.update(float(t), v)]
    # onset 0, fires at 60; 0.27 is inside the band (no re-arm); 0.2 re-arms; new onset 102 fires at 162
    assert fired == [60, 162]


def test_a_value_left_inside_the_band_does_not_fire_again() -> None:
    """Past the cooldown a window fired again while its value sat between the re-arm level and the level: an
    imbalance at stddev 0.28 (below the configured 0.30) could start a migration every ``cooldown`` seconds."""
    s = Sustained(level=0.30, hysteresis=0.05, sustain=60, refire=300)
    values = [0.4] * 61 + [0.28] * 600 + [0.4] * 10
    fired = [t for t, v in enumerate(values) if s.update(float(t), v)]
    assert fired == [60, 661]  # again once above the level, the cooldown long over
    assert s.repeat is True


def test_imbalance_and_saturation_windows() -> None:
    trig = Triggers(SchedulerConfig(imbalance_sustain=30, saturation_sustain=300), 8)
    skewed = np.array([0.95, 0.9, 0.1, 0.1, 0.05, 0.1, 0.1, 0.1])
    mem = np.array([0.5, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    out = {t: trig.on_frame(float(t), skewed, mem, 0.9) for t in range(0, 301)}
    kinds = {t: [(x.kind, x.cause, x.gpus) for x in v] for t, v in out.items() if v}
    assert kinds == {30: [("imbalance", "load_imbalance", (0,))],
                     300: [("saturation", "gpu_memory_saturation", (1,)), ("saturation", "host_cpu_saturation", ())]}
    assert out[300][1].other_node is True


# ---- engine level ------------------------------------------------------------------------------

def _place_two(s: Scheduler) -> None:
    s.register_shard({"id": "a", "gpus": 2, "memory_per_gpu": 20 * 2**30, "comm_intensity": 1.0, "placement": [0, 1]})
    s.register_shard({"id": "b", "gpus": 2, "memory_per_gpu": 20 * 2**30, "comm_intensity": 1.0, "placement": [2, 3]})


def test_non_fixable_cause_records_no_action_and_annotates(make_scheduler: Callable[..., Scheduler]) -> None:
    notes: list[dict[str, str]] = []
    s = make_scheduler(verdict_consecutive=2)
    s.decider.annotate = notes.append
    _place_two(s)
    before = live_gpus(s)
    for i in range(2):
        s.on_verdict(verdict("network_ingress", 0.9, 1000.0 + i))
        s.on_tick(frame(1000.0 + i))
    d = s.decisions_state()["decisions"][0]
    assert (d["action"], d["trigger"], d["cause"], d["target_gpus"]) == ("no_action", "verdict", "network_ingress", ())
    assert "cannot help" in d["reason"]
    assert notes == [{"scheduler_action": "none", "scheduler_reason": d["reason"], "scheduler_decision_id": d["id"]}]
    assert live_gpus(s) == before
    assert all(p.kind == "adopt" for p in s.store.placements())


BUSY = [0.6, 0.6, 0.6, 0.6, 0.0, 0.0, 0.0, 0.0]  # shards a and b on GPUs 0-3, the rest idle


def test_a_move_is_said_on_the_alerts_after_an_earlier_none(make_scheduler: Callable[..., Scheduler]) -> None:
    """The alert said "scheduler_action: none" (a cause a move cannot fix) and kept saying it after the scheduler
    then moved a shard for the same incident."""
    notes: list[dict[str, str]] = []
    s = make_scheduler(actuator=PendingActuator(), verdict_consecutive=1)
    s.decider.annotate = notes.append
    _place_two(s)
    s.on_verdict(verdict("network_ingress", 0.9, 1000.0))
    s.on_tick(frame(1000.0, BUSY))
    s.on_verdict(verdict("thermal_throttling", 0.9, 1001.0, gpus=(0,)))
    s.on_tick(frame(1001.0, BUSY))
    moved = s.decisions_state()["decisions"][0]
    assert moved["action"] == "migrate"
    assert [n["scheduler_action"] for n in notes] == ["none", "migrate"]
    assert notes[-1]["scheduler_decision_id"] == moved["id"]
    assert f"moving a [0, 1] -> {list(moved['target_gpus'])}" in notes[-1]["scheduler_reason"]


def test_cooldown_and_one_migration_per_gpu(make_scheduler: Callable[..., Scheduler]) -> None:
    act = PendingActuator()
    s = make_scheduler(actuator=act, verdict_consecutive=1, cooldown=300)
    _place_two(s)
    s.on_verdict(verdict("thermal_throttling", 0.9, 1000.0, gpus=(0,)))
    s.on_tick(frame(1000.0, BUSY))
    first = s.decisions_state()["decisions"][0]
    assert first["action"] == "migrate" and first["shard_id"] == "a" and set(first["target_gpus"]) in ({4, 5}, {6, 7})
    # at most one migration in flight per GPU: a shard sharing a GPU with it stays, a's own GPUs are taken
    target = first["target_gpus"][0]
    s.register_shard({"id": "c", "gpus": 1, "memory_per_gpu": 2**30, "placement": [target]})
    with pytest.raises(SchedulerError, match=rf"GPUs \[{target}\] are in a migration in flight"):
        s.manual_reshard("c", "maintenance")  # an operator's re-shard keeps the rule too
    for t, gpu in ((1001.0, target), (1002.0, 1)):
        s.on_verdict(verdict("healthy", 0.9, t))
        s.on_verdict(verdict("gpu_compute_saturation", 0.9, t, gpus=(gpu,)))
        s.on_tick(frame(t, BUSY))
    second, third = s.decisions_state()["decisions"][1::-1]
    assert second["action"] == "no_action" and "c shares a GPU with a migration in flight" in second["reason"]
    assert third["action"] == "no_action" and "a is migrating" in third["reason"]
    # another shard may move meanwhile, but never onto a GPU of the migration in flight
    s.on_verdict(verdict("healthy", 0.9, 1003.0))
    s.on_verdict(verdict("gpu_compute_saturation", 0.9, 1003.0, gpus=(2,)))
    s.on_tick(frame(1003.0, BUSY))
    fourth = s.decisions_state()["decisions"][0]
    assert fourth["action"] == "migrate" and fourth["shard_id"] == "b"
    assert not set(fourth["target_gpus"]) & {0, 1, 2, *first["target_gpus"]}
    # finish the migration through acks, then a new fault on a's new GPUs within the cooldown is refused
    new = first["placement_id"]
    for step in ("stage", "launch"):
        s.ack(new, {"step": step, "ok": True})
    old = s.store.placement(new).source_id
    s.ack(old, {"step": "drain", "ok": True})
    assert live_gpus(s)["a"] == ("launched", list(first["target_gpus"]))
    s.on_verdict(verdict("healthy", 0.9, 1100.0))
    s.on_verdict(verdict("thermal_throttling", 0.9, 1100.0, gpus=(first["target_gpus"][1],)))
    s.on_tick(frame(1100.0, BUSY))
    last = s.decisions_state()["decisions"][0]
    assert last["action"] == "no_action" and "a in cooldown for 200 s more" in last["reason"]


@pytest.mark.parametrize(("topology", "numa_busy", "moved", "away_from"), [
    ("pcie-8", {0: 0.2, 1: 0.95}, "b", {4, 5, 6, 7}),   # node 1's cores are contended: b (GPUs 4, 5) leaves it
    ("pcie-8", {0: 0.95, 1: 0.2}, "a", {0, 1, 2, 3}),
    ("pcie-8", {0: float("nan"), 1: 0.9}, "b", {4, 5, 6, 7}),   # a node without a reading is not the busiest
    ("pcie-8", None, "a", {0, 1, 2, 3}),       # no per-node CPU reported: the busiest GPU (0) stands in
    # two hosts: node 1 on both is contended (per-node samples carry the node number only)
    ("fabric-2x8", {0: 0.2, 1: 0.95}, "b", {4, 5, 6, 7, 12, 13, 14, 15}),
])
def test_cpu_contention_without_gpus_moves_a_shard_off_the_busiest_numa_node(
        make_scheduler: Callable[..., Scheduler], topology: str, numa_busy: dict[int, float] | None, moved: str,
        away_from: set[int]) -> None:
    s = make_scheduler(topology, verdict_consecutive=1)   # GPUs 0-3 (and 8-11) on NUMA node 0, 4-7 (12-15) on 1
    n = 16 if topology == "fabric-2x8" else 8
    s.register_shard({"id": "a", "gpus": 2, "memory_per_gpu": 20 * 2**30, "comm_intensity": 1.0, "placement": [0, 1]})
    s.register_shard({"id": "b", "gpus": 2, "memory_per_gpu": 20 * 2**30, "comm_intensity": 1.0, "placement": [4, 5]})
    f = frame(1000.0, [0.9, 0.9, 0.0, 0.0, 0.6, 0.6] + [0.0] * (n - 6), n=n)
    f.samples += [numa_cpu_sample(n, busy) for n, busy in (numa_busy or {}).items()]
    s.on_verdict(verdict("cpu_contention", 0.9, 1000.0, gpus=()))
    s.on_tick(f)
    d = s.decisions_state()["decisions"][0]
    assert (d["action"], d["shard_id"]) == ("migrate", moved)
    assert not set(d["target_gpus"]) & away_from


def test_a_co_tenant_verdict_without_gpus_points_at_the_foreign_busy_gpu() -> None:
    topo = preset("nvswitch-8")
    values = np.full((8, len(GPU_FIELDS)), np.nan)
    values[:, GPU_FIELD_INDEX["utilization_ratio"]] = [0.9, 1.0, 1.0, 0.2, 0.0, 0.0, 0.0, 0.0]
    values[:, GPU_FIELD_INDEX["foreign_utilization_ratio"]] = [0.0, 0.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert culprits("gpu_compute_saturation", values, topo, {}) == {2}  # not the first of the busiest
    values[:, GPU_FIELD_INDEX["foreign_utilization_ratio"]] = np.nan  # DCGM: no per-process field
    assert culprits("gpu_compute_saturation", values, topo, {}) == {1}
    values[:, GPU_FIELD_INDEX["foreign_utilization_ratio"]] = 0.0  # no foreign use seen: not GPU 0 by default
    assert culprits("gpu_compute_saturation", values, topo, {}) == {1}


def test_imbalance_moves_only_for_a_real_gain(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(imbalance_sustain=5, min_gain=0.05)
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 20 * 2**30, "placement": [0]})
    s.register_shard({"id": "b", "gpus": 1, "memory_per_gpu": 20 * 2**30, "placement": [0]})
    util = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    for t in range(7):
        s.on_tick(frame(1000.0 + t, util, mem_gib=[40] + [0] * 7))
    d = s.decisions_state()["decisions"][0]
    assert (d["trigger"], d["action"], d["source_gpus"]) == ("imbalance", "migrate", (0,))
    assert d["target_gpus"] != (0,) and d["score"] > 0


def hung_frame(ts: float, stuck: int, n: int = 8) -> Frame:
    """What the NVML source gives while a sample is hung: every GPU missing but for its XID count, the GPU of
    the hung call unhealthy."""
    f = frame(ts, n=n)
    f.gpu.values[:] = np.nan
    f.gpu.values[:, GPU_FIELD_INDEX["xid_errors_total"]] = 0.0
    f.gpu.healthy[stuck] = False
    return f


def test_a_hung_gpu_source_is_not_reporting_rather_than_every_gpu_unqualified(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """Frames of missing GPUs were taken as fresh values: a re-shard then said '0 of 8 qualify'."""
    s = make_scheduler(verdict_consecutive=1)
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 20 * 2**30, "placement": [0]})
    s.on_tick(frame(1000.0))
    for t in range(1, 17):
        s.on_tick(hung_frame(1000.0 + t, stuck=3))
    assert not s.seen.healthy[3] and s.seen.healthy[[0, 1, 2, 4, 5, 6, 7]].all()  # the hung GPU is avoided
    s.on_verdict(verdict("thermal_throttling", 0.9, 1017.0, gpus=(0,)))
    s.on_tick(hung_frame(1017.0, stuck=3))
    d = s.decisions_state()["decisions"][0]
    assert d["action"] == "no_action"
    assert "the GPU source is not reporting, or reads every GPU as missing" in d["reason"]


def test_nothing_is_decided_on_gpu_values_the_gpu_source_stopped_sending(
        make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(imbalance_sustain=5, min_gain=0.0, verdict_consecutive=1)
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 20 * 2**30, "placement": [0]})
    s.register_shard({"id": "b", "gpus": 1, "memory_per_gpu": 20 * 2**30, "placement": [0]})
    s.on_tick(frame(1000.0, [1.0] + [0.0] * 7))  # one sample of an imbalance, then the GPU source is down
    for t in range(1, 120):
        s.on_tick(Frame(1000.0 + t, 1.0))
    # not an imbalance "sustained" by one old sample
    assert [d for d in s.decisions_state()["decisions"] if d["name"] == "shard.reshard"] == []
    s.on_verdict(verdict("thermal_throttling", 0.9, 1120.0, gpus=(0,)))
    s.on_tick(Frame(1120.0, 1.0))
    d = s.decisions_state()["decisions"][0]
    assert d["action"] == "no_action" and "the GPU source is not reporting" in d["reason"]
    for t in range(121, 128):  # back: the window starts again from fresh values and fires
        s.on_tick(frame(1000.0 + t, [1.0] + [0.0] * 7, mem_gib=[40] + [0] * 7))
    assert s.decisions_state()["decisions"][0]["action"] == "migrate"
    assert culprits("thermal_throttling", None, preset("nvswitch-8"), {}) == set()  # no values: not GPU 0


def test_reload_applies_thresholds_and_new_shards(make_scheduler: Callable[..., Scheduler]) -> None:
    from sits_observe.config import parse

    s = make_scheduler(verdict_consecutive=5)
    _place_two(s)
    s.reload(parse({"scheduler": {"verdict_consecutive": 1, "actuator": "command", "command": {"argv": ["true"]},
                                  "shards": [{"id": "c", "gpus": 1, "memory_per_gpu": 2**30}]}}))
    assert s.actuator.name == "log"  # the actuator changes only on restart
    s.on_verdict(verdict("thermal_throttling", 0.9, 1000.0, gpus=(0,)))
    s.on_tick(frame(1000.0, BUSY))
    assert s.decisions_state()["decisions"][0]["action"] == "migrate"
    assert live_gpus(s)["c"][0] == "launched"


def test_a_persisting_condition_is_explained_once(make_scheduler: Callable[..., Scheduler]) -> None:
    """A spare GPU pair keeps utilization uneven and serving engines keep memory near full: each fires,
    nothing better exists, and re-fires after the cooldown add no new "no action" decisions."""
    s = make_scheduler(topology="nvswitch-8", imbalance_sustain=60, saturation_sustain=300, cooldown=300)
    for i, gpus in enumerate(([0, 1], [2, 3], [4, 5])):
        s.register_shard({"id": f"chat-{i}", "gpus": 2, "memory_per_gpu": 71 * 2**30, "comm_intensity": 0.1,
                          "placement": gpus})
    for t in range(1200):
        s.on_tick(frame(1000.0 + t, util=[1.0] * 6 + [0.0] * 2, mem_gib=[76.0] * 6 + [0.0] * 2))
    made = [(d["trigger"], d["cause"], d["action"]) for d in s.decisions_state()["decisions"]
            if d["trigger"] != "adopt"]
    assert sorted(made) == [("imbalance", "load_imbalance", "no_action"),
                            ("saturation", "gpu_memory_saturation", "no_action")]


def test_a_prune_the_database_refuses_does_not_fail_a_started_migration(make_scheduler: Callable[..., Scheduler],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(decide, "HISTORY_PER_SHARD", 0)  # every retired placement is history to prune
    s = make_scheduler(verdict_consecutive=1)
    _place_two(s)
    with closing(sqlite3.connect(s.store.path, isolation_level=None)) as db:  # the disk is full: no row is deleted
        db.execute("CREATE TRIGGER refuse_delete BEFORE DELETE ON placements BEGIN "
                   "SELECT RAISE(ABORT, 'database or disk is full'); END")
    s.on_verdict(verdict("thermal_throttling", 0.9, 1000.0, gpus=(0,)))
    s.on_tick(frame(1000.0, BUSY))
    d = s.decisions_state()["decisions"][0]
    assert (d["trigger"], d["action"], d["shard_id"]) == ("verdict", "migrate", "a")
    assert live_gpus(s)["a"] == ("launched", list(d["target_gpus"]))  # it moved (log actuator: acked at once)
    assert [p.state for p in s.store.placements("a")] == [State.RETIRED, State.LAUNCHED]  # not pruned, yet
    (line,) = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert line.levelno == logging.ERROR and "not pruned" in line.getMessage() and line.exc_info is None
    with closing(sqlite3.connect(s.store.path, isolation_level=None)) as db:
        db.execute("DROP TRIGGER refuse_delete")
    assert s.manual_reshard("b", "maintenance")["action"] == "migrate"
    assert not [p for p in s.store.placements() if p.state in TERMINAL]  # the next decision pruned both shards


def test_memory_of_a_shard_counts_on_top_of_the_reading_until_the_reading_can_show_it(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """Memory in use was max(observed, held): a shard placed but not loaded yet hid another tenant's memory, and a
    second shard landed where both cannot fit. Once a reading shows a staged shard (weights loaded), its memory is
    not counted twice either."""
    from sched_helpers import PendingActuator

    s = make_scheduler(actuator=PendingActuator())
    s.on_tick(frame(1000.0, mem_gib=[10.0] + [75.0] * 7))  # GPU 0: 10 GiB of another tenant's
    a = s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 30 * 2**30})["placements"][0]["id"]
    assert live_gpus(s)["a"] == ("placed", [])
    with pytest.raises(SchedulerError, match="shard b: fits nowhere"):  # 10 + 30 (loading) + 45 > 80
        s.register_shard({"id": "b", "gpus": 1, "memory_per_gpu": 45 * 2**30})
    for step in ("stage", "launch"):  # (a GPU in a placing in flight takes no other shard)
        s.ack(a, {"step": step, "ok": True})
    # the frames just after it may carry a reading taken before it loaded (NVML every 5 s, dcgm every 30 s)
    s.on_tick(frame(1001.0, mem_gib=[10.0] + [75.0] * 7))
    with pytest.raises(SchedulerError, match="shard b: fits nowhere"):
        s.register_shard({"id": "b", "gpus": 1, "memory_per_gpu": 45 * 2**30})
    s.on_tick(frame(1060.0, mem_gib=[40.0] + [75.0] * 7))  # a minute on: the reading shows its 30 GiB
    s.register_shard({"id": "b", "gpus": 1, "memory_per_gpu": 40 * 2**30})  # 40 + 40 = 80: fits, not 110
    assert s.store.placements("b")[0].gpus == (0,)


def test_a_dry_run_places_as_if_its_shards_had_loaded(make_scheduler: Callable[..., Scheduler]) -> None:
    """With the log actuator nothing loads, so a reading never shows a shard it placed: two 20 GiB shards went
    onto a GPU with 50 GiB of another tenant's of 80."""
    s = make_scheduler()
    mem = [50.0] + [75.0] * 7
    s.on_tick(frame(1000.0, mem_gib=mem))
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 20 * 2**30})
    for t in (1001.0, 1200.0):  # launched at once, and long ago: still not in the reading
        s.on_tick(frame(t, mem_gib=mem))
        with pytest.raises(SchedulerError, match="shard b: fits nowhere"):
            s.register_shard({"id": "b", "gpus": 1, "memory_per_gpu": 20 * 2**30})
    assert live_gpus(s)["a"] == ("launched", [0])


def test_no_movable_shard_names_a_bounded_number_of_shards(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(actuator=PendingActuator(), verdict_consecutive=1)
    s.on_tick(frame(999.0))
    s.register_shard({"id": "first", "gpus": 1, "memory_per_gpu": 2**30, "placement": [0]})
    s.manual_reshard("first", "maintenance")  # no step acked: a re-shard in flight from GPU 0
    gpu = [0]
    for i in range(30):  # each on the GPU of that re-shard in flight: none can move
        s.register_shard({"id": f"s{i:02d}", "gpus": 1, "memory_per_gpu": 2**30, "placement": gpu})
    s.on_verdict(verdict("thermal_throttling", 0.9, 1000.0, gpus=tuple(gpu)))
    s.on_tick(frame(1000.0))
    d = s.decisions_state()["decisions"][0]
    assert d["action"] == "no_action" and "no movable shard" in d["reason"]
    assert "first is migrating" in d["reason"]  # then 7 of the others: decide.WHY_NOT_SHOWN is 8
    assert d["reason"].count("shares a GPU with a migration in flight") == 7
    assert d["reason"].endswith("; and 23 more")
