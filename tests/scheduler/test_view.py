"""What the planner sees of shards being placed: their load on top of the readings, and no migration lock."""

from __future__ import annotations

from collections.abc import Callable

from sched_helpers import GiB, PendingActuator, frame, live_gpus

from sits_observe.scheduler.engine import Scheduler


def test_shards_registered_one_after_another_spread_over_the_gpus(make_scheduler: Callable[..., Scheduler]) -> None:
    """The load of a shard just placed is not in the utilization readings yet: each next shard went to the same
    GPU (10 of 10 GiB on 80 GiB GPUs: 6 on GPU 0, 4 on GPU 1; without memory: all 10 on GPU 0)."""
    for topology, mem in (("pcie-8", 10), ("nvswitch-8", 0)):
        s = make_scheduler(topology, state=topology, shards=[{"id": f"s{i}", "gpus": 1, "memory_per_gpu": mem * GiB}
                                                             for i in range(10)])
        s.on_tick(frame(1000.0))  # placed on the first GPU values, launched at once (log actuator)
        gpus = [g for _, (_, (g,)) in sorted(live_gpus(s).items())]
        assert sorted(gpus) == [0, 0, 1, 1, 2, 3, 4, 5, 6, 7], (topology, gpus)


def test_placing_a_shard_keeps_its_gpus_open_to_other_shards(make_scheduler: Callable[..., Scheduler]) -> None:
    """Placing a shard is no migration, but it locked its GPUs until launched: with an orchestrator acking, config
    shards past the eighth "fit nowhere: 0 of 8 qualify" (never tried again) and a registration was refused."""
    act = PendingActuator()
    s = make_scheduler(actuator=act, shards=[{"id": f"s{i}", "gpus": 1, "memory_per_gpu": 10 * GiB}
                                             for i in range(10)])
    s.on_tick(frame(1000.0))  # none acked: all ten being placed
    placing = s.shards_state()["shards"]
    assert [v["state"] for v in placing] == ["placed"] * 10
    assert sorted(p["gpus"][0] for v in placing for p in v["placements"]) == [0, 0, 1, 1, 2, 3, 4, 5, 6, 7]
    tp8 = s.register_shard({"id": "tp8", "gpus": 8, "memory_per_gpu": 20 * GiB})
    assert tp8["placements"][0]["gpus"] == list(range(8))
    assert s.shards_state()["migrations_in_flight"] == 0
