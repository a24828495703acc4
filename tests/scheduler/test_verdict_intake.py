"""How the scheduler takes verdicts in: old ones, ones naming GPUs the host lacks, streaks that disagree on the GPU,
and a decision the database refused."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sched_helpers import PendingActuator, frame

from sits_observe.errors import SchedulerError
from sits_observe.rca.verdict import Verdict
from sits_observe.scheduler.config import SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.triggers import Triggers

BUSY = [0.6, 0.6, 0.6, 0.6, 0.0, 0.0, 0.0, 0.0]


def _thermal(ts: float, gpus: tuple[int, ...] = (0,)) -> Verdict:
    return Verdict("thermal_throttling", 0.93, ts, gpus=gpus, trigger="slo_burn")


def _verdicts_every_10_s(s: Scheduler, n: int) -> list[str]:
    """A thermal verdict on GPU 0 and a tick, every 10 s from 1000 s, ``n`` times; what the ticks raised."""
    raised = []
    for i in range(n):
        s.on_verdict(_thermal(1000.0 + 10 * i))
        try:
            s.on_tick(frame(1000.0 + 10 * i, BUSY))
        except SchedulerError as exc:
            raised.append(str(exc))
    return raised


def _verdict_decisions(s: Scheduler) -> list[dict]:
    return [d for d in s.decisions_state()["decisions"] if d["trigger"] == "verdict"]


def test_verdicts_that_waited_while_ticks_failed_are_not_acted_on(make_scheduler: Callable[..., Scheduler]) -> None:
    """Queued while scheduler.sqlite refused every tick, three 15-minute-old verdicts made a streak once it worked
    again: a move for a fault long over, stamped with the old time, so its step failed as timed out at the next
    tick."""
    act = PendingActuator()
    s = make_scheduler(actuator=act, verdict_consecutive=3, step_timeout=600)
    s.on_tick(frame(999.0, BUSY))
    s.register_shard({"id": "a", "gpus": 2, "memory_per_gpu": 20 * 2**30, "comm_intensity": 1.0,
                      "placement": [0, 1]})
    real = s.store.placements

    def full(*_: object, **__: object) -> None:
        raise SchedulerError("database or disk is full")

    s.store.placements = full
    assert _verdicts_every_10_s(s, 3) == ["database or disk is full"] * 3
    s.store.placements = real
    s.on_tick(frame(1900.0, BUSY))
    assert _verdict_decisions(s) == [] and not s._verdicts and act.plans == []
    for i in range(3):  # fresh verdicts act, stamped with the tick that decided
        s.on_verdict(_thermal(1901.0 + i))
        s.on_tick(frame(1902.0 + i, BUSY))
    (d,) = _verdict_decisions(s)
    assert d["action"] == "migrate" and d["ts"] == 1904.0


def test_a_decision_the_database_refused_is_tried_again_at_the_next_verdict(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """The trigger counted as fired before its decision was recorded: a locked database cost the move and every
    verdict for a whole cooldown, with nothing recorded."""
    s = make_scheduler(actuator=PendingActuator(), verdict_consecutive=3, cooldown=300)
    s.on_tick(frame(999.0, BUSY))
    s.register_shard({"id": "a", "gpus": 2, "memory_per_gpu": 2**30, "placement": [0, 1]})
    real = s.store.create

    def locked_once(*args: object, **kwargs: object) -> object:
        s.store.create = real
        raise SchedulerError("database is locked")

    s.store.create = locked_once
    assert _verdicts_every_10_s(s, 5) == ["database is locked"]  # the verdict at 1020
    assert [(d["ts"], d["action"]) for d in _verdict_decisions(s)] == [(1030.0, "migrate")]


def test_verdicts_naming_gpus_the_host_lacks_are_acted_on_without_them(make_scheduler: Callable[..., Scheduler],
                                                                       caplog) -> None:
    """GPU 8 on an 8-GPU host made avoid() raise IndexError (every tick of the streak failed), and -1 wrapped to the
    last GPU."""
    s = make_scheduler(actuator=PendingActuator(), verdict_consecutive=2)
    s.on_tick(frame(999.0, BUSY))
    s.register_shard({"id": "a", "gpus": 2, "memory_per_gpu": 2**30, "placement": [0, 1]})
    for i in range(2):
        s.on_verdict(_thermal(1000.0 + i, gpus=(0, 8, -1)))
        s.on_tick(frame(1000.0 + i, BUSY))
    (d,) = _verdict_decisions(s)
    assert d["action"] == "migrate" and d["shard_id"] == "a"
    said = [r.message for r in caplog.records if "the topology does not have" in r.message]
    assert said == ["scheduler: verdicts name GPUs [-1, 8], which the topology does not have: left out"]


def test_a_streak_moves_the_shard_on_the_gpus_most_of_its_verdicts_name(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """The streak compared causes only and the last verdict picked the GPU: verdicts naming GPU 0, then 2, then 6
    moved the shard on GPU 6 on the word of one verdict."""
    s = make_scheduler(actuator=PendingActuator(), verdict_consecutive=3)
    s.on_tick(frame(999.0, BUSY))
    for g in (0, 2, 4, 6):
        s.register_shard({"id": f"s{g}", "gpus": 1, "memory_per_gpu": 2**30, "placement": [g]})
    for i, g in enumerate((0, 2, 6)):
        s.on_verdict(_thermal(1000.0 + i, gpus=(g,)))
        s.on_tick(frame(1000.0 + i, BUSY))
    # no GPU named by two of the three: the culprit comes from the GPU values (the busiest, GPU 0), as for a verdict
    # naming none
    assert [(d["action"], d["shard_id"]) for d in _verdict_decisions(s)] == [("migrate", "s0")]
    s.on_verdict(Verdict("healthy", 0.99, 1010.0, trigger="slo_burn"))  # the streak ends
    for i, g in enumerate((2, 4, 2)):  # a new one: GPU 2 in two of three
        s.on_verdict(_thermal(1020.0 + i, gpus=(g,)))
        s.on_tick(frame(1020.0 + i, BUSY))
    assert [d["shard_id"] for d in _verdict_decisions(s)] == ["s2", "s0"]  # newest first


def _queued(*verdicts: Verdict) -> deque[Verdict]:
    return deque(verdicts)


def test_a_streak_over_a_gap_or_stale_verdicts_starts_again() -> None:
    """Stale verdicts were dropped but the streak they broke was kept: two verdicts before an outage and one after it
    made "3 in a row" (the healthy verdict between them dropped as stale)."""
    every = frozenset(range(8))
    trig = Triggers(SchedulerConfig(verdict_consecutive=3), 8)
    assert trig.on_verdicts(_queued(_thermal(1000.0), _thermal(1010.0)), 1010.0, every) == []
    queued = _queued(_thermal(1020.0), Verdict("healthy", 0.99, 1030.0, trigger="slo_burn"), _thermal(1040.0))
    assert trig.on_verdicts(queued, 1900.0, every) == []  # all three dropped as stale
    assert trig.on_verdicts(_queued(_thermal(1901.0)), 1901.0, every) == []  # one in a row, not three
    assert trig.on_verdicts(_queued(_thermal(1902.0), _thermal(1903.0)), 1903.0, every) != []
    trig = Triggers(SchedulerConfig(verdict_consecutive=3), 8)  # fresh verdicts, 2 minutes apart: not in a row
    assert [trig.on_verdicts(_queued(_thermal(t)), t, every) for t in (1000.0, 1120.0, 1240.0)] == [[], [], []]


def test_retracting_one_trigger_leaves_another_fired_in_the_same_tick_in_its_cooldown() -> None:
    """One slot held the fire time to restore: retracting a refused trigger restored it into another cause's
    streak, which then fired again a second later, past its cooldown."""
    every = frozenset(range(8))
    trig = Triggers(SchedulerConfig(verdict_consecutive=3, cooldown=300), 8)
    compute = [Verdict("gpu_compute_saturation", 0.93, 1004.0 + i, gpus=(1,), trigger="slo_burn") for i in range(3)]
    fired = trig.on_verdicts(_queued(*(_thermal(1000.0 + i) for i in range(3)), *compute), 1010.0, every)
    assert [t.cause for t in fired] == ["thermal_throttling", "gpu_compute_saturation"]
    trig.retract(fired[0])  # the thermal decision refused: the compute one was recorded
    again = Verdict("gpu_compute_saturation", 0.93, 1011.0, gpus=(1,), trigger="slo_burn")
    assert trig.on_verdicts(_queued(again), 1011.0, every) == []  # still in its cooldown
