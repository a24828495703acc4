"""Actuators carry out the steps of a plan: ``stage`` and ``launch`` a placement, ``drain`` the old one.

``submit(plan)`` either answers at once (a :class:`StepOutcome`) or returns None and the outcome comes
later: from :meth:`poll` (command, simulator) or from the orchestrator's ``POST
/api/v1/placements/{id}/ack`` (webhook).  Slow work (HTTP, subprocesses) runs on one worker thread per
actuator, never on the tick.  Steps may be sent twice after a restart; receivers must treat
(``placement_id``, ``step``) as idempotent.
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..alerting.formats import sign
from ..errors import ConfigError, SimError
from .config import SchedulerConfig

__all__ = ["StepOutcome", "Actuator", "LogActuator", "WebhookActuator", "CommandActuator", "SimActuator",
           "build_actuator"]

log = logging.getLogger("sits_observe.scheduler.actuator")


@dataclass(frozen=True, slots=True)
class StepOutcome:
    placement_id: int
    step: str
    ok: bool
    reason: str = ""


class Actuator(Protocol):
    name: str

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None: ...

    def poll(self) -> list[StepOutcome]: ...

    def close(self) -> None: ...


def _ok(plan: dict[str, Any], reason: str = "") -> StepOutcome:
    return StepOutcome(int(plan["placement_id"]), str(plan["step"]), True, reason)


class LogActuator:
    """Dry run: logs each step and acks it at once."""

    name = "log"

    def submit(self, plan: dict[str, Any]) -> StepOutcome:
        log.info("plan (dry run): %s placement %s of shard %s on GPUs %s", plan["step"], plan["placement_id"],
                 plan["shard"]["id"], plan["gpus"])
        return _ok(plan, "dry run")

    def poll(self) -> list[StepOutcome]:
        return []

    def close(self) -> None:
        pass


class _Worker:
    """One background thread running ``work(plan) -> StepOutcome | None``; outcomes collected for poll()."""

    def __init__(self, name: str, work: Callable[[dict[str, Any]], StepOutcome | None]) -> None:
        self._work = work
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1024)
        self._done: list[StepOutcome] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"actuator-{name}", daemon=True)
        self._thread.start()

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None:
        try:
            self._jobs.put_nowait(plan)
        except queue.Full:
            return StepOutcome(int(plan["placement_id"]), str(plan["step"]), False, "actuator queue full")
        return None

    def poll(self) -> list[StepOutcome]:
        with self._lock:
            out, self._done = self._done, []
        return out

    def _run(self) -> None:
        while (plan := self._jobs.get()) is not None:
            try:
                outcome = self._work(plan)
            except Exception as exc:  # a broken receiver must not kill the worker
                outcome = StepOutcome(int(plan["placement_id"]), str(plan["step"]), False, f"actuator error: {exc}")
            if outcome is not None:
                with self._lock:
                    self._done.append(outcome)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)


class WebhookActuator(_Worker):
    """POSTs the plan JSON to the orchestrator, signed as alert webhooks are (``X-Sits-Timestamp``,
    ``X-Sits-Signature: sha256=HMAC(secret, timestamp + "." + body)``); the step completes when the
    orchestrator acks it through the API."""

    name = "webhook"

    def __init__(self, url: str, secret: str | None, timeout: float = 5.0, retries: int = 3) -> None:
        self.url, self.secret, self.timeout, self.retries = url, secret, timeout, retries
        super().__init__("webhook", self._post)

    def _post(self, plan: dict[str, Any]) -> StepOutcome | None:
        body = json.dumps(plan, sort_keys=True).encode()
        why = ""
        for attempt in range(self.retries + 1):
            headers = {"Content-Type": "application/json", "User-Agent": "sits-observe-scheduler"}
            if self.secret:
                ts = str(int(time.time()))
                headers |= {"X-Sits-Timestamp": ts, "X-Sits-Signature": sign(self.secret.encode(), ts, body)}
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    if 200 <= resp.status < 300:
                        return None
                    why = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the orchestrator refused the plan; retrying will not help
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
            time.sleep(min(0.5 * 2**attempt, 10.0))
        return StepOutcome(int(plan["placement_id"]), str(plan["step"]), False,
                           f"webhook {self.url} not delivered: {why}")


class CommandActuator(_Worker):
    """Runs ``argv`` with the plan JSON on stdin; exit code 0 acks the step, anything else fails it."""

    name = "command"

    def __init__(self, argv: list[str], timeout: float = 60.0) -> None:
        self.argv, self.timeout = list(argv), timeout
        super().__init__("command", self._run_command)

    def _run_command(self, plan: dict[str, Any]) -> StepOutcome:
        try:
            proc = subprocess.run(self.argv, input=json.dumps(plan, sort_keys=True).encode(), capture_output=True,
                                  timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return StepOutcome(int(plan["placement_id"]), str(plan["step"]), False, f"{self.argv[0]}: {exc}")
        if proc.returncode == 0:
            return _ok(plan)
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return StepOutcome(int(plan["placement_id"]), str(plan["step"]), False,
                           f"{self.argv[0]} exited {proc.returncode}: {tail[0][:200]}")


class SimActuator:
    """Closes the loop in the demo: ``launch`` calls ``sim.migrate(shard, gpus)`` and completes once the
    simulator has applied it; ``stage`` and ``drain`` complete at once (the simulator moves in one go)."""

    name = "sim"

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self._waiting: dict[str, dict[str, Any]] = {}

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None:
        if plan["step"] != "launch":
            return _ok(plan)
        shard = plan["shard"]["id"]
        try:
            self.sim.migrate(shard, list(plan["gpus"]))
        except SimError as exc:
            return StepOutcome(int(plan["placement_id"]), "launch", False, str(exc))
        self._waiting[shard] = plan
        return None

    def poll(self) -> list[StepOutcome]:
        pending = set(self.sim.pending_migrations())
        done = [s for s in self._waiting if s not in pending]
        return [_ok(self._waiting.pop(s)) for s in done]

    def close(self) -> None:
        pass


def build_actuator(cfg: SchedulerConfig, sim: Any = None) -> Actuator:
    """The actuator the config names (``sim`` needs the simulated host)."""
    if cfg.actuator == "webhook":
        secret = cfg.webhook.secret.get_secret_value() if cfg.webhook.secret else None
        return WebhookActuator(str(cfg.webhook.url), secret, cfg.webhook.timeout, cfg.webhook.retries)
    if cfg.actuator == "command":
        return CommandActuator(cfg.command.argv, cfg.command.timeout)
    if cfg.actuator == "sim":
        if sim is None:
            raise ConfigError("scheduler.actuator: 'sim' needs gpu.backend: sim (no simulated host to move shards on)")
        return SimActuator(sim)
    return LogActuator()
