"""How the scheduler takes verdicts in: old ones, ones naming GPUs the host lacks, streaks that disagree on the GPU,
and a decision the database refused."""

from __future__ import annotations

from collections.abc import Callable

from sched_helpers import PendingActuator, frame

from sits_observe.errors import SchedulerError
from sits_observe.rca.verdict import Verdict
from sits_observe.scheduler.engine import Scheduler

BUSY = [0.6, 0.6, 0.6, 0.6, 0.0, 0.0, 0.0, 0.0]


def _thermal(ts: float, gpus: tuple[int, ...] = (0,)) -> Verdict:
    return Verdict("thermal_throttling", 0.93, ts, gpus=gpus, trigger="slo_burn")


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
    for i in range(3):
        s.on_verdict(_thermal(1000.0 + 10 * i))
        try:
            s.on_tick(frame(1000.0 + 10 * i, BUSY))
        except SchedulerError:
            pass
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
    real, raised = s.store.create, []

    def locked_once(*args: object, **kwargs: object) -> object:
        s.store.create = real
        raise SchedulerError("database is locked")

    s.store.create = locked_once
    for i in range(5):
        s.on_verdict(_thermal(1000.0 + 10 * i))
        try:
            s.on_tick(frame(1000.0 + 10 * i, BUSY))
        except SchedulerError as exc:
            raised.append(str(exc))
    assert raised == ["database is locked"]  # the verdict at 1020
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
