"""The scheduler API through Flask: the webhook actuator's signed plans, orchestrator acks, bad input.

Every refused request answers 4xx with a reason and leaves the shards and placements as they were.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from pydantic import SecretStr

from sits_observe.export.http import ApiError, require_token
from sits_observe.export.scheduler_api import scheduler_blueprint
from sits_observe.scheduler.engine import Scheduler

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GiB = 2**30


class Orchestrator:
    """Receives the webhook actuator's plans; checks their signature as an alert receiver would."""

    def __init__(self, secret: str) -> None:
        self.plans: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                signed = self.headers.get("X-Sits-Timestamp", "").encode() + b"." + body
                want = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
                with outer.cond:
                    if hmac.compare_digest(self.headers.get("X-Sits-Signature", ""), want):
                        outer.plans.append(json.loads(body))
                    else:
                        outer.bad_signatures += 1
                    outer.cond.notify_all()
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/plans"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int) -> list[dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.plans) >= count, timeout=20)
            return list(self.plans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def orchestrator() -> Iterator[Orchestrator]:
    o = Orchestrator("hook-key")
    yield o
    o.close()


@pytest.fixture
def api(make_scheduler: Callable[..., Scheduler], orchestrator: Orchestrator) -> tuple[FlaskClient, Scheduler]:
    sched = make_scheduler(actuator="webhook", webhook={"url": orchestrator.url, "secret": "hook-key"})
    sched.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": 30 * GiB, "comm_intensity": 1.0,
                          "placement": [0, 1]})
    app = Flask("test")
    daemon = SimpleNamespace(config=SimpleNamespace(api_token=SecretStr(TOKEN)))
    app.register_blueprint(scheduler_blueprint(sched, require_token(daemon)))

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> tuple[dict[str, str], int]:
        return {"error": exc.reason}, exc.status

    return app.test_client(), sched


def snapshot(sched: Scheduler) -> Any:
    return sched.shards_state(), [p.to_dict() for p in sched.store.placements()]


def refused(client: FlaskClient, sched: Scheduler, url: str, body: Any, status: int, reason: str,
            **kwargs: Any) -> None:
    before = snapshot(sched)
    args = {"data": body} if isinstance(body, str) else {"json": body}
    r = client.post(url, headers=kwargs.get("headers", AUTH), content_type="application/json", **args)
    assert (r.status_code, reason in r.get_json()["error"]) == (status, True), r.get_json()
    assert snapshot(sched) == before


def test_webhook_migration_walks_on_acks_and_refuses_bad_input(api: tuple[FlaskClient, Scheduler],
                                                               orchestrator: Orchestrator) -> None:
    client, sched = api
    assert client.post("/api/v1/reshard", json={"shard": "tp2", "reason": "x"}).status_code == 401
    r = client.post("/api/v1/reshard", json={"shard": "tp2", "reason": "maintenance on GPU 0"}, headers=AUTH)
    assert r.status_code == 202
    decision = r.get_json()
    new = decision["placement_id"]
    (stage,) = orchestrator.wait_for(1)
    assert (stage["step"], stage["placement_id"], stage["gpus"], stage["source"]["gpus"]) == (
        "stage", new, decision["target_gpus"], [0, 1])
    assert stage["ack_url"] == f"/api/v1/placements/{new}/ack"

    # malformed acks and acks for the wrong step: 4xx, nothing moves
    url = f"/api/v1/placements/{new}/ack"
    refused(client, sched, url, "not json", 400, "body is not JSON")
    refused(client, sched, url, [1, 2], 400, "body must be a JSON object, got list")
    refused(client, sched, url, {"step": "stage"}, 400, "ok: Field required")
    refused(client, sched, url, {"step": "warp", "ok": True}, 400, "step: String should match pattern")
    refused(client, sched, url, {"step": "stage", "ok": True, "extra": 1}, 400, "extra: unknown field")
    refused(client, sched, url, {"step": "launch", "ok": True}, 409,
            f"placement {new}: ack for step launch refused: expected state staged, actual placed")
    refused(client, sched, "/api/v1/placements/999/ack", {"step": "stage", "ok": True}, 404,
            "placement 999: no such placement")
    refused(client, sched, f"/api/v1/placements/{10**20}/ack", {"step": "stage", "ok": True}, 404,
            f"placement {10**20}: no such placement")
    refused(client, sched, url, {"step": "stage", "ok": True}, 401, "bearer token", headers={})

    # the orchestrator acks each step; the old placement then drains
    assert client.post(url, json={"step": "stage", "ok": True}, headers=AUTH).get_json()["state"] == "staged"
    assert client.post(url, json={"step": "stage", "ok": True}, headers=AUTH).status_code == 200  # repeat: no-op
    assert client.post(url, json={"step": "launch", "ok": True}, headers=AUTH).get_json()["state"] == "launched"
    plans = orchestrator.wait_for(3)
    drain = plans[2]
    assert (drain["step"], drain["gpus"]) == ("drain", [0, 1])
    shard = client.get("/api/v1/shards").get_json()["shards"][0]
    assert (shard["state"], shard["gpus"]) == ("draining", decision["target_gpus"])

    # a re-shard of a draining shard is refused with the states named
    refused(client, sched, "/api/v1/reshard", {"shard": "tp2", "reason": "again"}, 409,
            "shard tp2: cannot re-shard: expected state launched, actual draining")
    old = drain["placement_id"]
    r = client.post(f"/api/v1/placements/{old}/ack", json={"step": "drain", "ok": True}, headers=AUTH)
    assert r.get_json()["state"] == "retired"
    assert client.get("/api/v1/shards").get_json()["shards"][0]["state"] == "launched"
    assert orchestrator.bad_signatures == 0
    kinds = [d["action"] for d in client.get("/api/v1/decisions?limit=5").get_json()["decisions"]]
    assert kinds == ["migrate", "adopt"]


def test_bad_registrations_and_reshards(api: tuple[FlaskClient, Scheduler]) -> None:
    client, sched = api
    refused(client, sched, "/api/v1/shards", {"id": "huge", "gpus": 4, "memory_per_gpu": 81 * GiB}, 409,
            "shard huge: fits nowhere: needs 4 GPUs with 81.0 GiB free each; 0 of 8 qualify")
    refused(client, sched, "/api/v1/shards", {"id": "tp2", "gpus": 1}, 409, "shard tp2: already registered")
    refused(client, sched, "/api/v1/shards", {"id": "x", "gpus": 0}, 400,
            "shard: gpus: Input should be greater than or equal to 1, got 0")
    refused(client, sched, "/api/v1/shards", {"id": "x", "gpus": 2, "placement": [7, 8]}, 400,
            "placement: GPUs [8] not on this host (0-7)")
    refused(client, sched, "/api/v1/reshard", {"shard": "nope", "reason": "x"}, 404, "shard nope: not registered")
    refused(client, sched, "/api/v1/reshard", {"shard": "tp2"}, 400, "reason: must be a non-empty string")
    refused(client, sched, "/api/v1/reshard", {"reason": "x"}, 400, 'body must be {"shard": "<id>"')
    refused(client, sched, "/api/v1/shards", {"id": "x", "gpus": 2, "placement": [1, 1, 2]}, 400,
            "placement: must list 2 distinct GPU indices")
    for bad in ("0", "\u00b2", "9" * 5000):  # a superscript two is a digit to isdigit, not to int(); int() caps digits
        r = client.get(f"/api/v1/decisions?limit={bad}")
        assert r.status_code == 400 and f"limit: must be an integer from 1 to 10000, got {bad[:40]!r}" in r.get_json()["error"]
    r = client.post("/api/v1/shards", json={"id": "fits", "gpus": 2, "memory_per_gpu": 10 * GiB}, headers=AUTH)
    assert r.status_code == 201 and r.get_json()["state"] == "placed"  # waiting for the orchestrator's stage ack
