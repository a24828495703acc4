"""Actuators carry out the steps of a plan: ``stage`` and ``launch`` a placement, ``drain`` the old one.

``submit(plan)`` either answers at once (a :class:`StepOutcome`) or returns None and the outcome comes
later: from :meth:`poll` (command, simulator) or from the orchestrator's ``POST
/api/v1/placements/{id}/ack`` (webhook).  Slow work (HTTP, subprocesses) runs on one worker thread per
actuator, never on the tick.  Steps may be sent twice after a restart; receivers must treat
(``placement_id``, ``step``) as idempotent.  A worker asks ``pending(placement_id, step)`` before it sends a
step and before every webhook retry: a step already acked, timed out or failed is not sent (again).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..alerting.answers import retry_after
from ..alerting.formats import sign
from ..collectors.config import basic_auth, redact, redirect_target
from ..errors import ConfigError, SimError
from .config import SchedulerConfig

__all__ = ["StepOutcome", "Actuator", "LogActuator", "WebhookActuator", "CommandActuator", "SimActuator",
           "build_actuator"]

log = logging.getLogger("sits_observe.scheduler.actuator")
STDERR_KEPT = 4096  # bytes of a failed command's stderr read back (its last line is the reason)
# the daemon's own secrets, kept out of the actuator program's environment (it acks by its exit code, not the
# API), so out of what it logs or hands on; a program running as the daemon's user can still read the daemon's
# /proc/<pid>/environ: see docs/scheduler.md for running it as another user
SECRET_ENV = ("SITS_API_TOKEN", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
RETRY_AFTER_MAX_S = 60.0  # a webhook's Retry-After is honoured up to this (the worker sends one step at a time)
# seconds a running command has after SIGTERM at close before its group is killed: with the worker's join, inside
# the daemon's close budget (closing.CLOSE_TIMEOUT)
STOP_GRACE_S = 3.0

# (placement_id, step) -> whether that step still waits for its outcome
Pending = Callable[[int, str], bool]


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
    """One background thread running ``work(plan) -> StepOutcome | None``; outcomes collected for poll().

    A plan whose step no longer waits (``pending`` says so: acked, timed out or failed while it queued) is
    dropped unsent: sending it would apply a move the scheduler has already settled."""

    def __init__(self, name: str, work: Callable[[dict[str, Any]], StepOutcome | None],
                 pending: Pending | None = None) -> None:
        self._work = work
        self.pending = pending
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1024)
        self._done: list[StepOutcome] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
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

    def _waiting(self, plan: dict[str, Any]) -> bool:
        return self.pending is None or self.pending(int(plan["placement_id"]), str(plan["step"]))

    def _run(self) -> None:
        while (plan := self._jobs.get()) is not None and not self._closing.is_set():
            try:
                outcome = self._work(plan) if self._waiting(plan) else None
            except Exception as exc:  # a broken receiver must not kill the worker
                outcome = StepOutcome(int(plan["placement_id"]), str(plan["step"]), False, f"actuator error: {exc}")
            if outcome is not None:
                with self._lock:
                    self._done.append(outcome)

    def close(self) -> None:
        """End the thread after the step it runs (the steps still queued stay pending: resent after a restart);
        never blocks on a full queue, which would wait out the step in flight first."""
        self._closing.set()
        with contextlib.suppress(queue.Full):
            self._jobs.put_nowait(None)
        self._thread.join(timeout=5)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib turns a redirected POST into a bodiless GET (and its 200 into "delivered"): refuse instead."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class WebhookActuator(_Worker):
    """POSTs the plan JSON to the orchestrator, signed as alert webhooks are (``X-Sits-Timestamp``,
    ``X-Sits-Signature: sha256=HMAC(secret, timestamp + "." + body)``); the step completes when the
    orchestrator acks it through the API.  A 5xx, a 429 or a connection error is retried ``retries`` times,
    0.5, 1, 2 ... s apart, or after the answer's ``Retry-After`` (seconds or an HTTP date, up to
    ``RETRY_AFTER_MAX_S``); a close ends that wait (the step stays pending).  A redirect is not followed (it would
    lose the body): it fails the step, naming where it points."""

    name = "webhook"

    def __init__(self, url: str, secret: str | None, timeout: float = 5.0, retries: int = 3,
                 pending: Pending | None = None) -> None:
        self.url, self.secret, self.timeout, self.retries = url, secret, timeout, retries
        # a user:password@ in the URL is sent as basic auth (as alert webhooks do), never in a message
        self._auth, self._target = basic_auth(url), redact(url)
        parts = urlsplit(self._target)
        self.shown = urlunsplit(parts._replace(query="", fragment=""))  # a query may carry a token too
        super().__init__("webhook", self._post, pending)

    def _post(self, plan: dict[str, Any]) -> StepOutcome | None:
        body = json.dumps(plan, sort_keys=True).encode()
        why, asked = "", 0.0
        for attempt in range(self.retries + 1):
            if attempt:  # no sooner than a Retry-After asked (a rate-limited orchestrator refuses retries before)
                if self._closing.wait(max(min(0.5 * 2 ** (attempt - 1), 10.0), asked)):
                    return None  # closing: not sent again now (the step stays pending: resent after a restart)
                asked = 0.0
                if not self._waiting(plan):  # acked (or failed) meanwhile: a retry would apply the step again
                    return None
            headers = {"Content-Type": "application/json", "User-Agent": "sits-observe-scheduler"}
            if self.secret:
                ts = str(int(time.time()))
                headers |= {"X-Sits-Timestamp": ts, "X-Sits-Signature": sign(self.secret.encode(), ts, body)}
            try:
                req = urllib.request.Request(self._target, data=body, headers=headers, method="POST")
                if self._auth is not None:
                    req.add_unredirected_header("Authorization", self._auth)
                with _OPENER.open(req, timeout=self.timeout) as resp:
                    if 200 <= resp.status < 300:
                        return None
                    why = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
                if 300 <= exc.code < 400:
                    why += (f" redirect to {redirect_target(exc.headers.get('Location'))} not followed (a redirected "
                            "POST loses its body); set scheduler.webhook.url to the URL it points to")
                    break
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the orchestrator refused the plan; retrying will not help
                wait = retry_after(exc.headers.get("Retry-After"))  # seconds or an HTTP date; NaN ignored
                asked = min(wait, RETRY_AFTER_MAX_S) if wait is not None and wait > 0 else 0.0
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
        return StepOutcome(int(plan["placement_id"]), str(plan["step"]), False,
                           f"webhook {self.shown} not delivered: {why}")


class CommandActuator(_Worker):
    """Runs ``argv`` with the plan JSON on stdin; exit code 0 acks the step, anything else fails it.

    The program runs in its own process group; past ``timeout`` the whole group is killed (a helper it
    started must not go on applying a step that has been failed).  At close a running program's group gets
    SIGTERM, then SIGKILL once it exits or after :data:`STOP_GRACE_S`: no copy outlives the daemon to run beside
    the one sent after the restart; its step gets no outcome (it stays pending, so it is sent again).  Messages
    name ``argv[0]`` only: the other arguments may hold credentials (still readable by every local user in
    ``/proc/<pid>/cmdline`` while it runs: pass them in a file).  Its stdout is discarded; the last stderr line
    is the reason.  It gets the daemon's environment without the daemon's secrets (:data:`SECRET_ENV`)."""

    name = "command"

    def __init__(self, argv: list[str], timeout: float = 60.0, pending: Pending | None = None) -> None:
        self.argv, self.timeout = list(argv), timeout
        self._running: subprocess.Popen[bytes] | None = None  # the program now running, for close() to end
        self._starting = threading.Lock()  # a program is started, or close() looks for one, not both at once
        super().__init__("command", self._run_command, pending)

    def close(self) -> None:
        """End the running program's group (SIGTERM, SIGKILL for what is left after :data:`STOP_GRACE_S`), then
        the worker; a program left running would go on with its step while the restart sends it again."""
        with self._starting:  # no program starts after this: the worker sees the closing mark first
            self._closing.set()
            proc = self._running
        if proc is not None and proc.poll() is None:
            self._end_group(proc, STOP_GRACE_S)  # the worker's wait for it returns: its join below is short
        super().close()

    @staticmethod
    def _end_group(proc: subprocess.Popen[bytes], grace: float) -> None:
        """End the program and what it started (its own process group) and reap it: SIGTERM first when
        ``grace`` gives it time to stop cleanly, then SIGKILL for whatever is left."""
        # PermissionError: only members running as another user are left (a program run through sudo -u, which
        # passes the SIGTERM it got on to them); they are not the daemon's to kill
        if grace > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _run_command(self, plan: dict[str, Any]) -> StepOutcome | None:
        pid, step, prog = int(plan["placement_id"]), str(plan["step"]), self.argv[0]
        # stderr to a file, not a pipe: read whole, a chatty program's output would sit in memory; and a
        # program that exits 0, leaving a helper it started (a server launched in the background) holding a
        # pipe, would be waited for until the timeout, then killed with its helper (on a failure it is killed)
        with tempfile.TemporaryFile() as err:
            try:
                env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
                with self._starting:
                    if self._closing.is_set():  # close() has looked for a program to end: none may start now
                        return None
                    proc = self._running = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                                            stdout=subprocess.DEVNULL, stderr=err,
                                                            start_new_session=True, env=env)
            except OSError as exc:
                return StepOutcome(pid, step, False, f"{prog}: cannot run: {exc.strerror or exc}")
            with proc:
                try:
                    proc.communicate(json.dumps(plan, sort_keys=True).encode(), timeout=self.timeout)
                except subprocess.TimeoutExpired:
                    self._end_group(proc, 0)  # at once: the step has had its time
                    return StepOutcome(pid, step, False, f"{prog}: no exit within {self.timeout:g} s; killed")
                finally:
                    self._running = None
            if proc.returncode != 0:  # failed (or ended by close()): a helper it left must not go on with the step
                self._end_group(proc, 0)
            # ended by close() (or exiting just as it began): no outcome, whatever the exit code; the step stays
            # pending and is sent again after the restart (steps are idempotent)
            if self._closing.is_set():
                return None
            if proc.returncode == 0:
                return _ok(plan)
            err.seek(max(0, err.seek(0, os.SEEK_END) - STDERR_KEPT))
            text = err.read()
        tail = text.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return StepOutcome(pid, step, False, f"{prog} exited {proc.returncode}: {tail[0][:200]}")


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


def build_actuator(cfg: SchedulerConfig, sim: Any = None, pending: Pending | None = None) -> Actuator:
    """The actuator the config names (``sim`` needs the simulated host); ``pending`` tells the webhook and
    command workers whether a step still waits, so they skip (or stop retrying) one that does not."""
    if cfg.actuator == "webhook":
        secret = cfg.webhook.secret.get_secret_value() if cfg.webhook.secret else None
        return WebhookActuator(str(cfg.webhook.url), secret, cfg.webhook.timeout, cfg.webhook.retries, pending)
    if cfg.actuator == "command":
        return CommandActuator(cfg.command.argv, cfg.command.timeout, pending)
    if cfg.actuator == "sim":
        if sim is None:
            raise ConfigError("scheduler.actuator: 'sim' needs gpu.backend: sim (no simulated host to move shards on)")
        return SimActuator(sim)
    return LogActuator()
