"""The simulated host as a Source: frame contents, determinism, migrations, fault ground truth."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sits_observe.config import SimConfig
from sits_observe.errors import SimError
from sits_observe.frame import GPU_FIELD_INDEX, GPU_FIELDS, HOST_FIELDS, REQUEST_STAGES, Frame
from sits_observe.sim.faults import Scenario
from sits_observe.sim.host import SimulatedHost
from sits_observe.store.series import SeriesStore

from sim_helpers import T0, one_fault, run_until

DEVICE_AND_HOST = ("launch", "h2d", "d2h", "sync", "collective", "runq")


@pytest.mark.parametrize("topology", ["nvswitch-8", "pcie-8"])
def test_frames_fill_every_stage_and_eight_gpus(layout, topology):
    sim = SimulatedHost(SimConfig(topology=topology, scenario="quiet"), layout)
    store = SeriesStore(layout, history=120)
    frame = run_until(sim, store, 120)
    assert {s for s, _ in store.known()} >= set(REQUEST_STAGES) | set(DEVICE_AND_HOST)
    assert {w for _, w in store.known()} == {"chat"}
    for stage in REQUEST_STAGES + DEVICE_AND_HOST:
        assert store.hist_window(stage, "chat", last=60).sum() > 0, stage
    g = frame.gpu
    serving = g.values[:, GPU_FIELD_INDEX["serving_utilization_ratio"]]
    assert g.values.shape == (8, len(GPU_FIELDS)) and len(g.info) == 8
    backlog = g.values[:, GPU_FIELD_INDEX["backlog_utilization_ratio"]]
    absent = [GPU_FIELD_INDEX["serving_utilization_ratio"], GPU_FIELD_INDEX["backlog_utilization_ratio"]]
    assert not np.isnan(np.delete(g.values, absent, axis=1)).any()
    # the spare pair runs no serving process: its serving utilization is absent, the others' is theirs
    assert np.isnan(serving[6:]).all()
    assert (serving[:6] == g.values[:6, GPU_FIELD_INDEX["utilization_ratio"]]).all()
    # backlog: only where the replica has requests at the tick's end, and then the GPU's own utilization
    at_server = np.repeat([sim._shards[f"chat-{k}"].engine.backlog > 0 for k in range(3)], 2)
    assert (~np.isnan(backlog[:6]) == at_server).all() and np.isnan(backlog[6:]).all()
    assert (backlog[:6][at_server] == serving[:6][at_server]).all()
    assert (g.values[:, GPU_FIELD_INDEX["foreign_utilization_ratio"]] == 0).all()  # no co-tenant in "quiet"
    assert [i.index for i in g.info] == list(range(8)) and len({i.uuid for i in g.info}) == 8
    util = store.gpu_window("utilization_ratio", 60).mean(axis=0)
    assert (util[:6] > 0.5).all() and (util[6:] == 0).all()  # three TP pairs busy, the spare pair idle
    mem = g.values[:, GPU_FIELD_INDEX["memory_used_bytes"]]
    assert (mem[:6] > 70e9).all() and (mem[6:] == 0).all()
    assert set(frame.host) == {f.name for f in HOST_FIELDS}
    assert {k for k, _ in frame.workload_gauges} == {"queue_depth", "running_requests", "kv_cache_usage_ratio"}
    assert store.counter_window("requests_total", "chat", last=100).sum() > 100
    assert store.counter_window("tokens_generated_total", "chat", last=100).sum() > 10_000
    assert store.counter_window("request_errors_total", "chat", last=100).sum() == 0


def _frames(seed: int, ticks: int, layout) -> list[Frame]:
    sim = SimulatedHost(SimConfig(seed=seed), layout, scenario=Scenario.load("stress").model_copy(
        update={"faults": [f.model_copy(update={"onset": f.onset / 30}) for f in Scenario.load("stress").faults]}))
    out = []
    for i in range(ticks):
        f = Frame(T0 + i, 1.0)
        sim.collect(f)
        out.append(f)
    return out


def _same(a: Frame, b: Frame) -> bool:
    return (a.hists.keys() == b.hists.keys()
            and all(np.array_equal(a.hists[k].counts, b.hists[k].counts) and a.hists[k].sum == b.hists[k].sum
                    for k in a.hists)
            and np.array_equal(a.gpu.values, b.gpu.values, equal_nan=True) and a.host == b.host
            and a.workload_gauges == b.workload_gauges and a.counters == b.counters)


def test_same_seed_same_frames(layout):
    a, b, c = (_frames(s, 150, layout) for s in (3, 3, 4))
    assert all(_same(x, y) for x, y in zip(a, b))
    assert not all(_same(x, y) for x, y in zip(a, c))


def test_ticks_must_move_forward(layout):
    sim = SimulatedHost(SimConfig(scenario="quiet"), layout)
    sim.collect(Frame(T0 + 1, 1.0))
    with pytest.raises(SimError, match="not after the simulator's clock"):
        sim.collect(Frame(T0 + 1, 1.0))


def test_migration_applies_after_the_weights_load(layout):
    sim = SimulatedHost(SimConfig(scenario="quiet"), layout)
    with pytest.raises(SimError, match="has not ticked yet"):
        sim.migrate("chat-0", [6, 7])
    store = SeriesStore(layout, history=600)
    run_until(sim, store, 60)
    sim.migrate("chat-0", [6, 7])
    m = sim.pending_migrations()["chat-0"]
    assert set(sim.pending_migrations()) == {"chat-0"}
    assert (m.source, m.target, m.new) == ((0, 1), (6, 7), [6, 7])
    run_until(sim, store, 60 + 25)  # loading takes about 20 s, the engine start 15 s more
    assert not m.loading
    assert 20 <= m.ready_at - m.started <= 60  # 69 GB per GPU over shared NVMe, then engine start
    run_until(sim, store, m.ready_at - T0 - 2)
    assert {s.id: s.gpus for s in sim.shards()}["chat-0"] == (0, 1)  # still serving where it was
    mem = store.gpu_window("memory_used_bytes", 5)[-1]
    assert mem[6] > 60e9  # weights already on the new GPUs
    run_until(sim, store, m.ready_at - T0 + 120)
    assert {s.id: s.gpus for s in sim.shards()}["chat-0"] == (6, 7) and not sim.pending_migrations()
    util = store.gpu_window("utilization_ratio", 60).mean(axis=0)
    assert util[0] == 0 and util[1] == 0 and util[6] > 0.5 and util[7] > 0.5
    info = {s.id: s for s in sim.shards()}["chat-0"]
    assert (info.tp, info.numa_node, info.workload, info.model) == (2, 1, "chat", "llama2-70b")
    assert 70e9 < info.memory_per_gpu < 80e9 and 0 < info.comm_intensity < 1


@pytest.mark.parametrize(
    ("shard", "gpus", "message"),
    [
        ("chat-7", [6, 7], "unknown shard 'chat-7'; shards are chat-0, chat-1, chat-2"),
        ("chat-0", [6], "tensor-parallel over 2 GPUs; give 2 distinct GPUs, got [6]"),
        ("chat-0", [6, 6], "give 2 distinct GPUs"),
        ("chat-0", [6, 9], "GPUs [9] do not exist; this host has GPUs 0-7"),
        ("chat-0", [2, 6], "GPU 2 is taken by shard chat-1"),
        ("chat-0", [1, 0], "already runs on GPUs [0, 1]"),
        ("chat-0", ["a", 6], "target GPUs must be integers"),
        ("chat-1", [7, 6], "GPU 7 has 7.6 GiB free, the shard needs 71.3 GiB per GPU"),
    ],
)
def test_impossible_migrations_are_refused(layout, shard, gpus, message):
    sim = SimulatedHost(SimConfig(), layout, scenario=one_fault("gpu_memory_pressure", 0, 0.9, gpus=[7]))
    run_until(sim, None, 5)
    with pytest.raises(SimError, match=re.escape(message)):
        sim.migrate(shard, gpus)
    assert not sim.pending_migrations()


def test_second_migration_of_a_moving_shard_is_refused(layout):
    sim = SimulatedHost(SimConfig(scenario="quiet"), layout)
    run_until(sim, None, 5)
    sim.migrate("chat-2", [6, 7])
    with pytest.raises(SimError, match=r"chat-2 is already migrating to GPUs \[6, 7\]"):
        sim.migrate("chat-2", [0, 1])
    with pytest.raises(SimError, match="GPU 6 is taken by shard chat-2"):
        sim.migrate("chat-0", [6, 7])


def test_gpu_faults_stay_with_the_gpus_so_migrating_away_fixes_them(layout):
    scenario = one_fault("gpu_compute_saturation", 100, 0.9, shard="chat-0")
    stores = {}
    for move in (False, True):
        sim = SimulatedHost(SimConfig(), layout, scenario=scenario)
        store = stores[move] = SeriesStore(layout, history=900)
        run_until(sim, store, 120)
        if move:
            sim.migrate("chat-0", [6, 7])
        run_until(sim, store, 900)
        (rec,) = sim.fault_log()
        assert (rec.kind, rec.gpus, rec.shards, rec.cause) == ("gpu_compute_saturation", (0, 1), ("chat-0",),
                                                                "gpu_compute_saturation")
        assert rec.start == T0 + 100 and rec.end == T0 + 3700 and sim.active_faults() == [rec]
    stay, moved = stores[False], stores[True]
    # the co-tenant still holds GPUs 0-1 after the move, but the shard no longer runs there
    assert stay.gpu_window("utilization_ratio", 300)[:, 0].mean() == 1.0
    assert moved.gpu_window("utilization_ratio", 300)[:, 0].mean() == 1.0
    assert moved.gpu_window("utilization_ratio", 300)[:, 6].mean() > 0.5
    assert moved.quantile(0.9, "sync", last=300) < 0.8 * stay.quantile(0.9, "sync", last=300)
    assert moved.quantile(0.5, "decode", last=300) < 0.9 * stay.quantile(0.5, "decode", last=300)


def test_memory_pressure_on_a_migration_target_leaves_room_for_the_weights(layout):
    """The fault's foreign allocation was sized as if the GPU were empty while the shard's weights loaded there:
    after the switch the GPU held 146 GB of its 86 GB (the gauge clipped) and most requests failed."""
    sim = SimulatedHost(SimConfig(scenario="quiet"), layout,
                        scenario=one_fault("gpu_memory_pressure", 10, 0.9, gpus=[6, 7]))
    run_until(sim, None, 5)
    sim.migrate("chat-0", [6, 7])  # the fault starts while the weights load
    run_until(sim, None, 90)
    assert [s.gpus for s in sim.shards() if s.id == "chat-0"] == [(6, 7)]
    errors = requests = 0.0
    for _ in range(30):
        frame = run_until(sim, None, sim.elapsed + 1)
        errors += frame.counters.get(("request_errors_total", "chat"), 0.0)
        requests += frame.counters.get(("requests_total", "chat"), 0.0)
        used, total = (frame.gpu.values[6, GPU_FIELD_INDEX[f]] for f in ("memory_used_bytes", "memory_total_bytes"))
        assert used < total
    assert requests > 50 and errors == 0


@pytest.mark.parametrize(
    ("kind", "target", "mover", "fixed"),
    [
        # the co-tenant's CPUs are NUMA node 0's: moving chat-0 to GPUs 6-7 (node 1) gives it idle CPUs back
        ("cpu_contention", {"numa": 0}, "chat-0", True),
        # a stalling serving loop is the shard's own: it stalls as much on GPUs 6-7
        ("scheduler_stall", {"shard": "chat-2"}, "chat-2", False),
    ],
)
def test_what_a_move_fixes(layout, kind, target, mover, fixed):
    sim = SimulatedHost(SimConfig(), layout, scenario=one_fault(kind, 60, 0.9, **target))
    store = SeriesStore(layout, history=900)
    run_until(sim, store, 90)
    sim.migrate(mover, [6, 7])
    run_until(sim, store, 600)
    util = store.gpu_window("utilization_ratio", 300).mean(axis=0)
    stuck = util[2] if fixed else util[0]  # a shard the fault still holds (chat-1 on node 0), or a healthy one
    if fixed:
        assert util[6] > stuck + 0.1 and util[6] > 0.9
    else:
        assert util[6] < stuck - 0.3
