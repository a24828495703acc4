"""The command actuator runs a real program with the plan on stdin; its exit code is the ack.  The webhook
actuator's retries, against a real HTTP server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sched_helpers import frame, live_gpus

from sits_observe.scheduler.actuators import CommandActuator, WebhookActuator
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
    s.on_tick(frame(1000.0))  # GPU values: a re-shard needs to know where memory is free
    d = s.manual_reshard("tp2", "try a move the orchestrator refuses")
    run_until_idle(s, 1000.0)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["step"], x["placement"]) for x in steps] == [("stage", d["placement_id"]), ("launch", d["placement_id"])]
    failed = s.store.placement(d["placement_id"])
    assert failed.state.value == "failed"
    assert "launch failed:" in failed.reason and "exited 3: orchestrator: no capacity on the target" in failed.reason
    assert live_gpus(s) == {"tp2": ("launched", [0, 1])}  # the old placement kept serving


HANGS = """
import subprocess, sys, time
helper = subprocess.Popen(["sleep", "60"])  # e.g. a tool the script starts to carry out the step
open(sys.argv[1], "w").write(str(helper.pid))
time.sleep(60)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_command_timeout_kills_the_group_and_keeps_arguments_out_of_the_reason(tmp_path: Path) -> None:
    """Past its timeout the program and what it started are killed (a helper left running would apply the
    step the scheduler has just failed); the reason names the program, not its arguments (credentials)."""
    pidfile = tmp_path / "helper.pid"
    act = CommandActuator([sys.executable, "-c", HANGS, str(pidfile), "--token=s3cret"], timeout=2.0)
    helper = 0
    try:
        assert act.submit({"placement_id": 4, "step": "launch"}) is None
        deadline = time.monotonic() + 20
        while not (out := act.poll()) and time.monotonic() < deadline:
            time.sleep(0.05)
        helper = int(pidfile.read_text())
        (o,) = out
        assert (o.placement_id, o.step, o.ok) == (4, "launch", False)
        assert not _running(helper)
        assert o.reason == f"{sys.executable}: no exit within 2 s; killed"
    finally:
        if helper and _running(helper):
            os.kill(helper, signal.SIGKILL)
        act.close()



LAUNCHES = """
import subprocess, sys
server = subprocess.Popen(["sleep", "60"])  # e.g. the inference server, left running (it inherits stderr)
open(sys.argv[1], "w").write(str(server.pid))
sys.stderr.write("x" * (8 << 20) + "\\nstarting\\n")  # chatty: 8 MiB of it
"""


def test_a_command_that_leaves_a_helper_running_is_acked_at_its_exit_and_the_helper_lives(tmp_path: Path) -> None:
    """The step is the program's exit; what it started and left running (a server launched in the background)
    is its business: neither waited for until the timeout nor killed then."""
    pidfile = tmp_path / "server.pid"
    act = CommandActuator([sys.executable, "-c", LAUNCHES, str(pidfile)], timeout=20.0)
    server = 0
    try:
        started = time.monotonic()
        assert act.submit({"placement_id": 5, "step": "launch"}) is None
        while not (out := act.poll()) and time.monotonic() - started < 30:
            time.sleep(0.05)
        took = time.monotonic() - started
        server = int(pidfile.read_text())
        (o,) = out
        assert (o.placement_id, o.step, o.ok) == (5, "launch", True) and took < 10, (o, took)
        assert _running(server)
    finally:
        if server and _running(server):
            os.kill(server, signal.SIGKILL)
        act.close()


FAILS = """
import subprocess, sys
helper = subprocess.Popen(["sleep", "60"])  # a tool it started to carry out the step
open(sys.argv[1], "w").write(str(helper.pid))
sys.exit(4)
"""


def test_a_command_that_fails_takes_its_helpers_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    act = CommandActuator([sys.executable, "-c", FAILS, str(pidfile)], timeout=20.0)
    helper = 0
    try:
        assert act.submit({"placement_id": 6, "step": "stage"}) is None
        deadline = time.monotonic() + 20
        while not (out := act.poll()) and time.monotonic() < deadline:
            time.sleep(0.05)
        helper = int(pidfile.read_text())
        (o,) = out
        assert (o.placement_id, o.ok) == (6, False) and "exited 4" in o.reason
        deadline = time.monotonic() + 5
        while _running(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(helper)  # the step failed: nothing it started goes on applying it
    finally:
        if helper and _running(helper):
            os.kill(helper, signal.SIGKILL)
        act.close()


SHOWS_ENV = """
import os, sys
sys.stderr.write(",".join(k for k in ("SITS_API_TOKEN", "OTEL_EXPORTER_OTLP_HEADERS", "KUBECONFIG") if k in os.environ))
sys.exit(3)
"""


def test_a_command_gets_the_environment_without_the_daemons_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SITS_API_TOKEN", "s3cret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
    monkeypatch.setenv("KUBECONFIG", "/etc/kube/config")  # what the program may well need
    act = CommandActuator([sys.executable, "-c", SHOWS_ENV], timeout=20.0)
    try:
        assert act.submit({"placement_id": 7, "step": "launch"}) is None
        deadline = time.monotonic() + 20
        while not (out := act.poll()) and time.monotonic() < deadline:
            time.sleep(0.05)
        (o,) = out
        assert o.reason.endswith("exited 3: KUBECONFIG"), o.reason
    finally:
        act.close()


def test_a_command_that_may_outlive_its_step_is_refused_at_load() -> None:
    from sits_observe.config import parse
    from sits_observe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^c.yaml: scheduler: step_timeout \(600 s\) must be above "
                                          r"command.timeout \(900 s\)"):
        parse({"scheduler": {"actuator": "command", "command": {"argv": ["true"], "timeout": 900}}}, "c.yaml", env={})
    parse({"scheduler": {"actuator": "command", "command": {"argv": ["true"], "timeout": 900}, "step_timeout": 1200}},
          "c.yaml", env={})


def test_weights_that_are_all_zero_are_refused_at_load() -> None:
    from sits_observe.config import parse
    from sits_observe.errors import ConfigError

    zero = {"comm": 0, "memory": 0, "load": 0, "balance": 0, "numa": 0}
    with pytest.raises(ConfigError, match="scheduler.weights: all weights are 0"):
        parse({"scheduler": {"weights": zero}}, "c.yaml", env={})
    parse({"scheduler": {"weights": zero | {"load": 1}}}, "c.yaml", env={})


def test_a_config_placement_off_this_host_is_refused_when_a_known_shard_is_adopted_again(
        make_scheduler: Callable[..., Scheduler]) -> None:
    from sits_observe.errors import ConfigError
    from sits_observe.scheduler.config import ShardSpec
    from sits_observe.scheduler.states import State

    s = make_scheduler()
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 1 << 30, "placement": [0]})
    for p in s.store.placements("a"):  # it stopped serving: known, with no live placement
        s.store.update(p, 1000.0, State.FAILED, reason="test")
    with pytest.raises(ConfigError, match=r"placement: GPUs \[-1\] not on this host"):
        s._ensure(ShardSpec(id="a", gpus=1, memory_per_gpu=1 << 30, placement=[-1]), "config")
    assert all(p.state is State.FAILED for p in s.store.placements("a"))  # nothing adopted on "the last GPU"


def test_sighup_cannot_lower_step_timeout_below_the_running_command_timeout(
        make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from sits_observe.config import parse

    s = make_scheduler(actuator="command", command={"argv": ["true"], "timeout": 300}, step_timeout=600)
    new = parse({"scheduler": {"actuator": "command", "command": {"argv": ["true"], "timeout": 30},
                               "step_timeout": 60}}, env={})  # valid alone; not with the command still running
    with caplog.at_level(logging.WARNING, logger="sits_observe.scheduler"):
        s.reload(new)
    assert s.walker.step_timeout == 600 and s.cfg.command.timeout == 300
    assert any("step_timeout 60 s kept at 600 s" in r.getMessage() for r in caplog.records)


def test_a_sighup_with_a_shard_off_this_host_changes_nothing(make_scheduler: Callable[..., Scheduler]) -> None:
    from sits_observe.config import parse
    from sits_observe.errors import ConfigError

    s = make_scheduler(cooldown=300)
    new = parse({"gpu": {"backend": "none"}, "scheduler": {"cooldown": 60, "shards": [  # (sim: refused at load)
        {"id": "far", "gpus": 1, "memory_per_gpu": 1 << 30, "placement": [12]}]}}, env={})  # an 8-GPU host
    with pytest.raises(ConfigError, match=r"placement: GPUs \[12\] not on this host"):
        s.reload(new)
    assert s.cfg.cooldown == 300 and "far" not in s.decider.views()  # nothing half-applied


def test_closing_with_a_full_queue_behind_a_hung_step_does_not_wait_for_the_step() -> None:
    """close() put its stop mark with a blocking put: with 1024 steps queued behind one that hangs, it waited
    for that step to end (up to its timeout) before its own 5 s join even began."""
    import threading

    from sits_observe.scheduler.worker import Worker

    release = threading.Event()
    worker = Worker("test", lambda plan: release.wait(60) and None)
    try:
        worker.submit({"placement_id": 0, "step": "stage"})  # taken, and hangs
        while worker._jobs.qsize():
            time.sleep(0.01)
        for i in range(1, 1025):
            assert worker.submit({"placement_id": i, "step": "stage"}) is None  # the queue fills
        assert worker.submit({"placement_id": 2000, "step": "stage"}).reason == "actuator queue full"
        closing = threading.Thread(target=worker.close, daemon=True)
        closing.start()
        closing.join(8)  # the 5 s join (the old code: still waiting for the hung step)
        assert not closing.is_alive()
    finally:
        release.set()


def test_an_exhaustive_search_limit_that_would_hang_the_tick_is_a_config_error() -> None:
    """exact_limit had no upper bound: 10**9 let a placement build every combination in the tick, holding the
    engine's lock (on a 1024-GPU fabric, gigabytes and minutes) instead of saying no at the start."""
    from sits_observe.config import parse
    from sits_observe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"scheduler.exact_limit: Input should be less than or equal to 1000000"):
        parse({"scheduler": {"exact_limit": 10**9}}, env={})


def test_a_shard_adopted_again_at_start_up_is_a_recorded_decision(make_scheduler: Callable[..., Scheduler]) -> None:
    """Re-adopting a config or simulator shard where it runs wrote a placement with no decision, count or span."""
    from sits_observe.scheduler.config import ShardSpec
    from sits_observe.scheduler.states import State

    s = make_scheduler()
    s.register_shard({"id": "a", "gpus": 1, "memory_per_gpu": 1 << 30, "placement": [0]})
    for p in s.store.placements("a"):  # it stopped serving: known, with no live placement
        s.store.update(p, 1000.0, State.FAILED, reason="test")
    s._ensure(ShardSpec(id="a", gpus=1, memory_per_gpu=1 << 30, placement=[3]), "config")
    d = s.decisions_state()["decisions"][0]
    assert (d["name"], d["action"], d["target_gpus"], d["reason"]) == ("shard.assign", "adopt", (3,),
                                                                        "running on start-up (config)")
    assert [p.gpus for p in s.store.placements("a") if p.state is State.LAUNCHED] == [(3,)]
    assert s.store.placement(d["placement_id"]).gpus == (3,)


@contextlib.contextmanager
def _orchestrator(answer: Callable[[], tuple[int, str | None]]) -> Iterator[str]:
    """A real HTTP orchestrator whose every POST gets ``answer()``: (status, Retry-After or None); yields the URL."""

    class Orchestrator(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            status, after = answer()
            self.send_response(status)
            if after is not None:
                self.send_header("Retry-After", after)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Orchestrator)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/plans"
    finally:
        server.shutdown()
        server.server_close()


def test_a_webhook_retry_waits_as_long_as_retry_after_asks() -> None:
    """A rate-limited orchestrator (429/503 with Retry-After) refuses a retry sent sooner: the retries came at 0.5,
    1, 2 s whatever it asked, so the step failed and the migration with it."""
    answers: list[int] = []
    first: list[float] = []
    second = threading.Event()

    def answer() -> tuple[int, str | None]:
        early = bool(first) and time.monotonic() - first[0] < 1.5
        status = 503 if not first or early else 202
        first[:] = first or [time.monotonic()]
        answers.append(status)
        if len(answers) == 2:
            second.set()
        return status, "1.5" if status == 503 else None

    with _orchestrator(answer) as url:
        hook = WebhookActuator(url, None, 2.0, 1)
        try:
            assert hook.submit({"placement_id": 3, "step": "launch"}) is None
            assert second.wait(10)
        finally:
            hook.close()  # after the step it sends
    assert answers == [503, 202] and hook.poll() == []  # delivered: the step waits for its ack


def test_closing_ends_a_webhook_retry_wait_at_once() -> None:
    """A Retry-After of up to 60 s was slept through: closing waited its 5 s for the worker, which then lived on and
    could send the step again after the daemon had closed."""
    asked = threading.Event()
    posts: list[int] = []

    def answer() -> tuple[int, str | None]:
        posts.append(429)
        asked.set()
        return 429, "60"

    with _orchestrator(answer) as url:
        hook = WebhookActuator(url, None, 2.0, 3)
        assert hook.submit({"placement_id": 3, "step": "launch"}) is None
        assert asked.wait(10)
        hook.close()
        assert not hook._thread.is_alive()  # ended, not left sleeping past close's 5 s join
    assert posts == [429] and hook.poll() == []  # not sent again, not failed: the step stays pending
