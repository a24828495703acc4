"""The command actuator runs a real program with the plan on stdin; its exit code is the ack."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sched_helpers import frame, live_gpus

from sits_observe.scheduler.engine import Scheduler

PROGRAM = """
import json, sys
plan = json.load(sys.stdin)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"step": plan["step"], "placement": plan["placement_id"], "gpus": plan["gpus"]}) + "\\n")
if plan["step"] == sys.argv[2]:
    print("orchestrator: no capacity on the target", file=sys.stderr)
    sys.exit(3)
"""


def run_until_idle(s: Scheduler, ts: float) -> float:
    """Tick until the command worker has answered every step it was given."""
    for _ in range(200):
        ts += 1.0
        s.on_tick(frame(ts))
        if not s.shards_state()["migrations_in_flight"]:
            return ts
        time.sleep(0.05)
    raise AssertionError("the command actuator never answered")


def test_command_actuator_acks_by_exit_code(make_scheduler: Callable[..., Scheduler], tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    s = make_scheduler(actuator="command", command={"argv": [sys.executable, "-c", PROGRAM, str(log), "launch"]})
    s.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": 2**30, "comm_intensity": 1.0, "placement": [0, 1]})
    d = s.manual_reshard("tp2", "try a move the orchestrator refuses")
    run_until_idle(s, 1000.0)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["step"], x["placement"]) for x in steps] == [("stage", d["placement_id"]), ("launch", d["placement_id"])]
    failed = s.store.placement(d["placement_id"])
    assert failed.state.value == "failed"
    assert "launch failed:" in failed.reason and "exited 3: orchestrator: no capacity on the target" in failed.reason
    assert live_gpus(s) == {"tp2": ("launched", [0, 1])}  # the old placement kept serving
