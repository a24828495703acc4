"""Actuators carry out the steps of a plan: ``stage`` and ``launch`` a placement, ``drain`` the old one.

``submit(plan)`` either answers at once (a :class:`StepOutcome`) or returns None and the outcome comes
later: from :meth:`poll` (command, simulator) or from the orchestrator's ``POST
/api/v1/placements/{id}/ack`` (webhook).  Slow work (HTTP, subprocesses) runs on one worker thread per
actuator, never on the tick.  Steps may be sent twice after a restart; receivers must treat
(``placement_id``, ``step``) as idempotent.  A worker asks ``pending(placement_id, step)`` before it sends a
step and before every webhook retry: a step already acked, timed out or failed is not sent (again).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..alerting.answers import retry_after
from ..alerting.formats import sign
from ..collectors.config import basic_auth, redact, redirect_target
from ..errors import ConfigError, SimError
from .command import CommandActuator
from .config import SchedulerConfig
from .worker import Actuator, Pending, StepOutcome, Worker, acked

__all__ = ["StepOutcome", "Actuator", "LogActuator", "WebhookActuator", "CommandActuator", "SimActuator",
           "build_actuator"]

log = logging.getLogger("sits_observe.scheduler.actuator")
RETRY_AFTER_MAX_S = 60.0  # a webhook's Retry-After is honoured up to this (the worker sends one step at a time)


class LogActuator:
    """Dry run: logs each step and acks it at once."""

    name = "log"

    def submit(self, plan: dict[str, Any]) -> StepOutcome:
        log.info("plan (dry run): %s placement %s of shard %s on GPUs %s", plan["step"], plan["placement_id"],
                 plan["shard"]["id"], plan["gpus"])
        return acked(plan, "dry run")

    def poll(self) -> list[StepOutcome]:
        return []

    def close(self) -> None:
        pass


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib turns a redirected POST into a bodiless GET (and its 200 into "delivered"): refuse instead."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class WebhookActuator(Worker):
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


class SimActuator:
    """Closes the loop in the demo: ``launch`` calls ``sim.migrate(shard, gpus)`` and completes once the
    simulator has applied it; ``stage`` and ``drain`` complete at once (the simulator moves in one go)."""

    name = "sim"

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self._waiting: dict[str, dict[str, Any]] = {}

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None:
        if plan["step"] != "launch":
            return acked(plan)
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
        return [acked(self._waiting.pop(s)) for s in done]

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
