"""Stopping the daemon while the command actuator's program runs: the program's whole group is ended (a copy left
running would carry out the step beside the one sent again after the restart), close() does not wait out its
join for it, and the step stays pending, so the restart sends it again."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from sched_helpers import PendingActuator, frame

from sits_observe.closing import CLOSE_TIMEOUT
from sits_observe.scheduler.command import STOP_GRACE_S, CommandActuator
from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.topology import preset

STEP = """#!/bin/sh
{trap}
echo $$ > "$1"
sleep 30  # a tool it runs to carry out the step, in its process group
echo finished >> "$1"
"""


def _program(tmp_path: Path, ignores_sigterm: bool = False) -> Path:
    script = tmp_path / "step.sh"
    script.write_text(STEP.format(trap="trap '' TERM" if ignores_sigterm else ""))
    script.chmod(0o755)
    return script


def _started(pidfile: Path) -> int:
    """The program's pid (its process group's id: it runs in its own session), once it has written it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):  # not written yet
            return int(pidfile.read_text().split()[0])
        time.sleep(0.05)
    raise AssertionError("the command never started")


def _alive_in_group(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (one whose parent has gone waits for PID 1 to reap it,
    which a container's init may never do; os.killpg(pgid, 0) would count it)."""
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    state, _ppid, pgrp = f.read().rpartition(")")[2].split()[:3]
                if int(pgrp) == pgid and state != "Z":
                    alive.append(int(entry))
    return alive


def _closed(close: Callable[[], None], pgid: int) -> tuple[float, list[int]]:
    """Seconds ``close`` took and the group's processes left alive then (killed afterwards: none outlives the
    test, whatever it found)."""
    started = time.monotonic()
    try:
        close()
        return time.monotonic() - started, _alive_in_group(pgid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def test_closing_ends_the_running_command_and_its_step_is_sent_again_after_the_restart(
        make_scheduler: Callable[..., Scheduler], tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    cfg = SchedulerConfig(actuator="command", command={"argv": [str(_program(tmp_path)), str(pidfile)], "timeout": 60})
    s = Scheduler(cfg, OtlpConfig(), preset("pcie-8"), tmp_path / "state", clock=lambda: 1000.0)
    try:
        s.on_tick(frame(1000.0))  # GPU values: a new shard needs to know where memory is free
        s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 2**30})
        pgid = _started(pidfile)
        (p,) = [p for p in s.store.placements(live=True) if p.step is not None]
    except BaseException:
        s.close()
        raise
    took, alive = _closed(s.close, pgid)
    assert alive == [] and took < STOP_GRACE_S, (alive, took)  # the old code: its 5 s join, the program running
    assert pidfile.read_text().split()[1:] == []  # ended, not finished
    again = PendingActuator()
    make_scheduler(actuator=again, state="state")  # the restart, on the same state_dir
    assert (p.id, p.step) in [(plan["placement_id"], plan["step"]) for plan in again.plans]


def test_a_command_that_ignores_sigterm_is_killed_with_its_group_after_the_grace(tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    act = CommandActuator([str(_program(tmp_path, ignores_sigterm=True)), str(pidfile)], timeout=60.0)
    try:
        assert act.submit({"placement_id": 3, "step": "launch"}) is None
        pgid = _started(pidfile)
    except BaseException:
        act.close()
        raise
    took, alive = _closed(act.close, pgid)
    # SIGTERM first (the grace waited out), then the group killed, within the daemon's close budget
    assert alive == [] and STOP_GRACE_S <= took < CLOSE_TIMEOUT, (alive, took)
    assert act.poll() == []  # no outcome: neither done nor failed by the kill
