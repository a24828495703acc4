"""Crash recovery: ``kill -9`` after every committed write of a migration (and of adopting a running
shard at start-up), then restart and resume.

A child process arms a counter on the store's writes; the counter SIGKILLs the child right after the
n-th committed write.  The parent then opens the same state_dir with a fresh scheduler, which must
finish what was started: one live placement, launched, where it should be, the old one retired, no
step left waiting.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from sched_helpers import frame

from sits_observe.scheduler.actuators import LogActuator
from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.states import State
from sits_observe.topology import preset

SHARD = {"id": "tp2", "gpus": 2, "memory_per_gpu": 20 * 2**30, "comm_intensity": 1.0, "placement": [0, 1]}
# re-shard: create, placed, stage sent, staged, launch sent, launched, old draining, drain sent, old retired
WRITES = 9
ADOPT_WRITES = 4  # create, placed, staged, launched

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, HELPERS)
    from sched_helpers import frame
    from sits_observe.scheduler import store as st
    from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
    from sits_observe.scheduler.engine import Scheduler
    from sits_observe.topology import preset

    state_dir, kill_after, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    writes = 0

    def counted(fn):
        def inner(*args, **kwargs):
            global writes
            out = fn(*args, **kwargs)
            writes += 1
            if writes == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        return inner

    def arm():
        st.PlacementStore.create = counted(st.PlacementStore.create)
        st.PlacementStore.update = counted(st.PlacementStore.update)

    if what == "adopt":  # the config's shard is adopted at start-up
        arm()
    s = Scheduler(SchedulerConfig(shards=[SHARD]), OtlpConfig(), preset("pcie-8"), state_dir, clock=lambda: 1000.0)
    if what == "reshard":
        s.on_tick(frame(1000.0))  # GPU values: a re-shard needs to know where memory is free
        arm()
        d = s.manual_reshard("tp2", "recovery test")
    print(json.dumps({"writes": writes, "gpus": s.shards_state()["shards"][0]["gpus"]}))
""").replace("SHARD", repr(SHARD)).replace("HELPERS", repr(str(Path(__file__).parent)))


def run_child(state_dir: Path, kill_after: int, what: str = "reshard") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(state_dir), str(kill_after), what], capture_output=True,
                          text=True, timeout=60, check=False)


def restart(state_dir: Path, gpu_frame: bool = True) -> Scheduler:
    """A fresh scheduler on ``state_dir``, then (``gpu_frame``) its first GPU values: all GPUs empty."""
    s = Scheduler(SchedulerConfig(shards=[SHARD]), OtlpConfig(), preset("pcie-8"), state_dir,
                  actuator=LogActuator(), clock=lambda: 2000.0)
    if gpu_frame:
        s.on_tick(frame(2000.0))
    return s


@pytest.mark.parametrize(("what", "writes", "gpus"), [("reshard", WRITES, [2, 3]), ("adopt", ADOPT_WRITES, [0, 1])])
def test_uninterrupted_runs_make_the_expected_writes(tmp_path: Path, what: str, writes: int, gpus: list[int]) -> None:
    done = run_child(tmp_path, 0, what)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"writes": writes, "gpus": gpus}


@pytest.mark.parametrize("kill_after", range(1, ADOPT_WRITES))
def test_kill_9_while_adopting_a_running_shard(tmp_path: Path, kill_after: int) -> None:
    done = run_child(tmp_path, kill_after, "adopt")
    assert done.returncode == -signal.SIGKILL, done.stderr
    s = restart(tmp_path)
    try:
        live = s.store.placements("tp2", live=True)
        assert [(p.kind, p.state, p.gpus, p.step) for p in live] == [("adopt", State.LAUNCHED, (0, 1), None)]
    finally:
        s.close()


@pytest.mark.parametrize("kill_after", range(1, WRITES))
def test_kill_9_between_steps_then_resume(tmp_path: Path, kill_after: int) -> None:
    done = run_child(tmp_path, kill_after)
    assert done.returncode == -signal.SIGKILL, done.stderr
    s = restart(tmp_path)
    try:
        placements = s.store.placements("tp2")
        live = [p for p in placements if p.state not in (State.RETIRED, State.FAILED)]
        assert [(p.state, p.step) for p in live] == [(State.LAUNCHED, None)]
        assert live[0].kind == "reshard" and set(live[0].gpus) == {2, 3}
        assert [(p.kind, p.state) for p in placements] == [("adopt", State.RETIRED), ("reshard", State.LAUNCHED)]
        assert s.shards_state()["shards"][0]["state"] == "launched"
        assert s.shards_state()["migrations_in_flight"] == 0
    finally:
        s.close()


def test_a_pending_placement_waits_for_gpu_values_after_restart(tmp_path: Path) -> None:
    """A placement left pending by a crash had its GPUs chosen at start-up, before any GPU sample, when every
    GPU looked empty: here onto GPUs 2-3, which another tenant has filled."""
    done = run_child(tmp_path, 1)  # killed right after the new placement was created (pending)
    assert done.returncode == -signal.SIGKILL, done.stderr
    s = restart(tmp_path, gpu_frame=False)
    try:
        pending = [p for p in s.store.placements("tp2", live=True) if p.kind == "reshard"]
        assert [(p.state, p.gpus) for p in pending] == [(State.PENDING, ())]  # nothing chosen on unknown memory
        assert s.shards_state()["shards"][0]["gpus"] == [0, 1]  # the old placement keeps serving
        s.on_tick(frame(2000.0, mem_gib=[20, 20, 75, 75, 0, 0, 0, 0]))
        live = s.store.placements("tp2", live=True)
        assert [(p.kind, p.state) for p in live] == [("reshard", State.LAUNCHED)]
        assert not set(live[0].gpus) & {0, 1, 2, 3}  # away from its source, and not onto the full GPUs
    finally:
        s.close()


def test_a_placement_left_between_steps_by_a_failed_write_walks_on_at_the_next_tick(tmp_path: Path) -> None:
    from sits_observe.errors import SchedulerError
    from sits_observe.scheduler.actuators import StepOutcome
    from sits_observe.scheduler.config import ShardSpec
    from sits_observe.scheduler.migrate import Walker
    from sits_observe.scheduler.store import PlacementStore

    class Orchestrator:  # acks later, like the webhook actuator's orchestrator
        name = "test"

        def __init__(self) -> None:
            self.sent: list[str] = []

        def submit(self, plan: dict) -> None:
            self.sent.append(plan["step"])

        def poll(self) -> list:
            return []

    store = PlacementStore(tmp_path)
    store.add_shard(ShardSpec(id="s", gpus=1, memory_per_gpu=1 << 30), 0.0)
    orch = Orchestrator()
    walker = Walker(store, orch, lambda p: None, step_timeout=600.0)
    p = walker.start("s", "assign", (0,), "0", 0.0)
    assert (p.state, p.step, orch.sent) == (State.PLACED, "stage", ["stage"])
    real, failed = store.update, []

    def full_disk_once(q, ts, state=None, **fields):  # the write that marks the launch step fails once
        if fields.get("step") == "launch" and not failed:
            failed.append(q.id)
            raise SchedulerError(f"{store.path}: database or disk is full")
        return real(q, ts, state, **fields)

    store.update = full_disk_once
    with pytest.raises(SchedulerError):
        walker.complete(StepOutcome(p.id, "stage", True, ""), 1.0)  # the ack: staged, then the failed write
    assert (store.placement(p.id).state, store.placement(p.id).step) == (State.STAGED, None)
    walker.expire(2.0)  # the next tick: it walks on instead of sitting staged, never timed out
    q = store.placement(p.id)
    assert (q.state, q.step, orch.sent) == (State.STAGED, "launch", ["stage", "launch"])
    store.close()


def test_an_actuator_outcome_whose_write_fails_is_applied_at_the_next_tick(tmp_path: Path) -> None:
    from sits_observe.errors import SchedulerError
    from sits_observe.scheduler.actuators import StepOutcome
    from sits_observe.scheduler.config import ShardSpec
    from sits_observe.scheduler.migrate import Walker
    from sits_observe.scheduler.store import PlacementStore

    class Worker:  # a command or webhook actuator: outcomes come back through poll()
        name = "test"

        def __init__(self) -> None:
            self.done: list[StepOutcome] = []

        def submit(self, plan: dict) -> None:
            self.done.append(StepOutcome(int(plan["placement_id"]), str(plan["step"]), True, ""))

        def poll(self) -> list:
            out, self.done = self.done, []
            return out

    store = PlacementStore(tmp_path)
    store.add_shard(ShardSpec(id="s", gpus=1, memory_per_gpu=1 << 30), 0.0)
    walker = Walker(store, Worker(), lambda p: None, step_timeout=600.0)
    p = walker.start("s", "assign", (0,), "0", 0.0)
    real, failed = store.update, []

    def full_disk_once(q, ts, state=None, **fields):  # the write of the stage's outcome fails once
        if state is State.STAGED and not failed:
            failed.append(q.id)
            raise SchedulerError(f"{store.path}: database or disk is full")
        return real(q, ts, state, **fields)

    store.update = full_disk_once
    walker.poll(1.0)
    assert failed and store.placement(p.id).state is State.PLACED
    walker.poll(2.0)  # the next tick: the stage was done, and it is not lost
    assert (store.placement(p.id).state, store.placement(p.id).step) == (State.STAGED, "launch")
    walker.poll(3.0)
    assert store.placement(p.id).state is State.LAUNCHED
    store.close()


def test_the_placement_a_live_one_replaces_outlives_the_history_limit(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """Pruning the history deleted the placement a live one replaced: that one's drain plan raised NotFound, so
    the orchestrator's launch ack got a 404, its drain was never sent, and the daemon could not start again."""
    from sched_helpers import GiB, PendingActuator

    from sits_observe.scheduler.decide import HISTORY_PER_SHARD

    act = PendingActuator()
    s = make_scheduler(actuator=act, step_timeout=600)
    s.on_tick(frame(1000.0))
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 10 * GiB, "placement": [0]})
    old = s.manual_reshard("a", "first move")["placement_id"]
    for step in ("stage", "launch"):
        s.ack(old, {"step": step, "ok": True})
    s.ack(s.store.placement(old).source_id, {"step": "drain", "ok": True})  # the adopted one retires
    for i in range(HISTORY_PER_SHARD):  # moves the orchestrator refuses fill the history
        new = s.manual_reshard("a", f"try {i}")["placement_id"]
        s.ack(new, {"step": "stage", "ok": False, "reason": "no capacity"})
    new = s.manual_reshard("a", "this one works")["placement_id"]
    for step in ("stage", "launch"):
        s.ack(new, {"step": step, "ok": True})
    drain = [p for p in act.plans if p["placement_id"] == old and p["step"] == "drain"]
    assert len(drain) == 1 and drain[0]["source"] is None  # the one it replaced: pruned history
    s.close()
    again = make_scheduler(actuator=PendingActuator(), step_timeout=600)  # a restart resumes the drain
    assert again.store.placement(old).state is State.DRAINING


def test_a_config_shard_whose_placing_failed_is_placed_again_at_a_restart(
        make_scheduler: Callable[..., Scheduler]) -> None:
    """It stayed unplaced across restarts: only a config shard with a placement given was adopted again."""
    from sched_helpers import GiB, PendingActuator, live_gpus

    shard = {"id": "c", "gpus": 1, "memory_per_gpu": 10 * GiB}
    s = make_scheduler(actuator=PendingActuator(), shards=[shard])
    s.on_tick(frame(1000.0))  # placed on the first GPU values
    (pid,) = [p["id"] for p in s.shards_state()["shards"][0]["placements"]]
    s.ack(pid, {"step": "stage", "ok": False, "reason": "image pull failed"})
    assert live_gpus(s)["c"] == ("unplaced", [])
    s.close()
    again = make_scheduler(actuator=PendingActuator(), shards=[shard])
    again.on_tick(frame(1001.0))
    assert live_gpus(again)["c"][0] == "placed"  # placing again, waiting for its stage step


def test_a_reloaded_shard_that_fits_nowhere_does_not_keep_the_others_out(
        make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture) -> None:
    """SIGHUP registered the config's shards until the first refused: those after it were left out."""
    from types import SimpleNamespace

    from sched_helpers import GiB, live_gpus

    s = make_scheduler()
    s.on_tick(frame(1000.0))
    new = SchedulerConfig(shards=[{"id": "huge", "gpus": 1, "memory_per_gpu": 500 * GiB},
                                  {"id": "fine", "gpus": 1, "memory_per_gpu": 10 * GiB}])
    s.reload(SimpleNamespace(scheduler=new))
    assert "huge" not in live_gpus(s) and live_gpus(s)["fine"][0] == "launched"  # log actuator: at once
    assert "config shard huge not placed: shard huge: fits nowhere" in caplog.text


def test_a_changed_config_shard_is_stored_and_re_sharded_to_its_new_size(
        make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture) -> None:
    """A SIGHUP (or a restart) with a config shard's gpus or memory changed kept the spec first registered, silently:
    its placements, the memory counted for it and every later re-shard went by the old one."""
    from types import SimpleNamespace

    from sched_helpers import GiB, live_gpus

    s = make_scheduler(shards=[{"id": "a", "gpus": 2, "memory_per_gpu": 10 * GiB}])
    s.on_tick(frame(1000.0))
    assert live_gpus(s)["a"][0] == "launched" and len(live_gpus(s)["a"][1]) == 2
    bigger = {"id": "a", "gpus": 4, "memory_per_gpu": 30 * GiB, "model": "llama"}
    s.reload(SimpleNamespace(scheduler=SchedulerConfig(shards=[bigger])))
    assert s.store.shard("a").gpus == 4 and s.store.shard("a").memory_per_gpu == 30 * GiB
    assert "config shard a changed: model '' -> 'llama', gpus 2 -> 4, memory_per_gpu 10737418240 -> 32212254720; " \
           "re-shard it" in caplog.text
    assert len(live_gpus(s)["a"][1]) == 2  # placements stay until it is re-sharded
    s.manual_reshard("a", "new size")
    assert live_gpus(s)["a"][0] == "launched" and len(live_gpus(s)["a"][1]) == 4
    s.close()
    again = make_scheduler(shards=[bigger | {"priority": 5}])  # at a restart too
    assert again.store.shard("a").priority == 5


def test_a_config_shard_changed_while_it_migrates_keeps_its_spec(
        make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from sched_helpers import GiB, PendingActuator

    act = PendingActuator()
    s = make_scheduler(actuator=act, shards=[{"id": "a", "gpus": 2, "memory_per_gpu": 10 * GiB}])
    s.on_tick(frame(1000.0))  # being placed: its stage step waits for an ack
    s.reload(SimpleNamespace(scheduler=SchedulerConfig(shards=[{"id": "a", "gpus": 4, "memory_per_gpu": 10 * GiB}])))
    assert s.store.shard("a").gpus == 2 and "not applied while it migrates" in caplog.text
    pid = act.plans[-1]["placement_id"]
    s.ack(pid, {"step": "stage", "ok": True})
    assert act.plans[-1]["shard"]["gpus"] == len(act.plans[-1]["gpus"]) == 2  # the launch plan: one shard
