"""The scheduler API through Flask: the webhook actuator's signed plans, orchestrator acks, bad input.

Every refused request answers 4xx with a reason and leaves the shards and placements as they were.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from pydantic import SecretStr

from sched_helpers import frame, live_gpus

from sits_observe.export.http import ApiError, require_token
from sits_observe.export.scheduler_api import scheduler_blueprint
from sits_observe.scheduler.actuators import WebhookActuator
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.states import State

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GiB = 2**30


class Orchestrator:
    """Receives the webhook actuator's plans; checks their signature as an alert receiver would."""

    def __init__(self, secret: str) -> None:
        self.plans: list[dict[str, Any]] = []
        self.auth: list[str | None] = []  # the Authorization header of each plan
        self.on_plan: Callable[[dict[str, Any]], int] | None = None  # what to do with a plan -> HTTP status
        self.bad_signatures = 0
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                signed = self.headers.get("X-Sits-Timestamp", "").encode() + b"." + body
                want = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
                status = 202
                if outer.on_plan is not None and hmac.compare_digest(self.headers.get("X-Sits-Signature", ""), want):
                    status = outer.on_plan(json.loads(body))
                with outer.cond:
                    if hmac.compare_digest(self.headers.get("X-Sits-Signature", ""), want):
                        outer.plans.append(json.loads(body))
                        outer.auth.append(self.headers.get("Authorization"))
                    else:
                        outer.bad_signatures += 1
                    outer.cond.notify_all()
                self.send_response(status)
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
    sched.on_tick(frame(1000.0))  # GPU values: a re-shard needs to know where memory is free
    app = Flask("test")
    daemon = SimpleNamespace(config=SimpleNamespace(api_token=SecretStr(TOKEN)))
    app.register_blueprint(scheduler_blueprint(sched, require_token(daemon)))

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> tuple[dict[str, str], int]:
        return {"error": exc.reason}, exc.status

    return app.test_client(), sched


def snapshot(sched: Scheduler) -> Any:
    """The shards and placements (not ``as_of``, which every tick moves)."""
    state = {k: v for k, v in sched.shards_state().items() if k != "as_of"}
    return state, [p.to_dict() for p in sched.store.placements()]


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
    # another script's digits are no placement id (Werkzeug's int took \u0663 for placement 3)
    arabic = "".join(chr(0x0660 + int(d)) for d in str(new))
    refused(client, sched, f"/api/v1/placements/{arabic}/ack", {"step": "stage", "ok": True}, 404, "")
    refused(client, sched, f"/api/v1/placements/{'9' * 5000}/ack", {"step": "stage", "ok": True}, 404, "")  # int() 500

    # the orchestrator acks each step; the old placement then drains
    assert client.post(url, json={"step": "stage", "ok": True}, headers=AUTH).get_json()["state"] == "staged"
    assert client.post(url, json={"step": "stage", "ok": True}, headers=AUTH).status_code == 200  # repeat: no-op
    assert orchestrator.wait_for(2)[1]["step"] == "launch"  # (a step acked before it is sent is not sent)
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
    # a superscript two is a digit to isdigit, not to int(); int() caps digits
    for bad in ("0", "", "\u00b2", "9" * 5000):
        r = client.get(f"/api/v1/decisions?limit={bad}")
        want = f"limit: must be an integer from 1 to 10000, got {bad[:40]!r}"
        assert r.status_code == 400 and want in r.get_json()["error"]
    r = client.get("/api/v1/decisions?limit=5&limit=10000")  # the first was taken, the rest ignored
    assert r.status_code == 400 and r.get_json()["error"] == "limit: given more than once; give it once"
    r = client.post("/api/v1/shards", json={"id": "fits", "gpus": 2, "memory_per_gpu": 10 * GiB}, headers=AUTH)
    assert r.status_code == 201 and r.get_json()["state"] == "placed"  # waiting for the orchestrator's stage ack


def test_registration_with_an_absurd_memory_size_is_a_400(api: tuple[FlaskClient, Scheduler]) -> None:
    """Past float64's range the placement maths overflowed: a 500 instead of naming the field."""
    client, sched = api
    for body in ({"id": "big", "gpus": 1, "memory_per_gpu": 10**400, "placement": [2]},
                 {"id": "big", "gpus": 1, "memory_per_gpu": 10**400}):
        refused(client, sched, "/api/v1/shards", json.dumps(body), 400,
                "shard: memory_per_gpu: Input should be less than or equal to 1125899906842624")


def test_webhook_stops_retrying_a_step_acked_meanwhile(make_scheduler: Callable[..., Scheduler],
                                                      orchestrator: Orchestrator) -> None:
    """The orchestrator applies each step and acks it through the API, but its answer to the POST is a 503
    (a proxy timing out): a retry would apply the step a second time.  Each step is sent once."""
    sched = make_scheduler(actuator="webhook", webhook={"url": orchestrator.url, "secret": "hook-key", "retries": 3})

    def apply_ack_then_fail(plan: dict[str, Any]) -> int:
        sched.ack(plan["placement_id"], {"step": plan["step"], "ok": True})
        return 503

    orchestrator.on_plan = apply_ack_then_fail
    old = sched.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": GiB, "placement": [0, 1]})
    sched.on_tick(frame(1000.0))
    new = sched.manual_reshard("tp2", "maintenance")["placement_id"]
    plans = orchestrator.wait_for(3)
    assert [(p["step"], p["placement_id"]) for p in plans] == [
        ("stage", new), ("launch", new), ("drain", old["placements"][0]["id"])]
    time.sleep(0.8)  # past the first retry's back-off
    assert len(orchestrator.plans) == 3
    assert [p.state.value for p in sched.store.placements()] == ["retired", "launched"]


def test_webhook_credentials_go_in_a_header_never_in_a_reason(orchestrator: Orchestrator) -> None:
    """A ``user:password@`` URL is basic auth (urllib took it for part of the host name: never delivered),
    and a failure reason (shown by the unauthenticated GET /api/v1/shards) names neither it nor the query."""
    plan = {"placement_id": 7, "step": "stage"}
    hook = WebhookActuator(orchestrator.url.replace("http://", "http://orch:pa%3Ass@"), "hook-key", 2.0, 0)
    try:
        hook.submit(plan)
        orchestrator.wait_for(1)
    finally:
        hook.close()
    assert orchestrator.auth == ["Basic b3JjaDpwYTpzcw=="]  # base64("orch:pa:ss")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hook = WebhookActuator(f"http://orch:hunter2@127.0.0.1:{port}/plans?token=abc", None, 2.0, 0)
    try:
        hook.submit(plan)
        deadline = time.monotonic() + 10
        while not (out := hook.poll()) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        hook.close()
    (o,) = out
    assert not o.ok and o.reason.startswith(f"webhook http://127.0.0.1:{port}/plans not delivered: ")
    assert "hunter2" not in o.reason and "abc" not in o.reason


def test_a_reshard_is_refused_while_free_memory_is_unknown(make_scheduler: Callable[..., Scheduler]) -> None:
    """Before the first GPU sample (or with the GPU source silent for 15 s) every GPU looked empty, so an
    operator's re-shard right after a restart moved the shard onto GPUs another tenant had filled."""
    from sits_observe.errors import SchedulerError
    from sits_observe.frame import Frame

    sched = make_scheduler()
    sched.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": 30 * GiB, "placement": [0, 1]})
    before = snapshot(sched)
    with pytest.raises(SchedulerError, match=r"shard tp2: cannot re-shard: no GPU values for 15 s \(the GPU source"):
        sched.manual_reshard("tp2", "maintenance")  # GPUs 2-7 hold 75 GiB of another tenant's; nothing said so yet
    assert snapshot(sched) == before
    sched.on_tick(frame(1000.0, mem_gib=[30, 30] + [75] * 6))
    with pytest.raises(SchedulerError, match="cannot re-shard: no other placement fits"):
        sched.manual_reshard("tp2", "maintenance")  # with the values known: nowhere else has 30 GiB free
    for t in range(1, 17):  # then the GPU source goes quiet
        sched.on_tick(Frame(1000.0 + t, 1.0))
    with pytest.raises(SchedulerError, match="cannot re-shard: no GPU values for 15 s"):
        sched.manual_reshard("tp2", "maintenance")
    assert snapshot(sched) == before


def test_a_registration_is_refused_while_free_memory_is_unknown(make_scheduler: Callable[..., Scheduler]) -> None:
    """A shard registered without its placement right after a restart (or with the GPU source silent) was
    placed as if every GPU were empty: onto GPUs another tenant had filled.  One that names its placement
    (it already runs there) is adopted as before."""
    from sits_observe.errors import SchedulerError
    from sits_observe.frame import Frame

    sched = make_scheduler()
    sched.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": 30 * GiB, "placement": [0, 1]})
    before = snapshot(sched)
    chat = {"id": "chat", "gpus": 2, "memory_per_gpu": 30 * GiB}
    with pytest.raises(SchedulerError, match=r"shard chat: cannot place: no GPU values for 15 s \(the GPU source"):
        sched.register_shard(chat)  # GPUs 2-5 hold 75 GiB of another tenant's; nothing said so yet
    assert snapshot(sched) == before
    sched.on_tick(frame(1000.0, mem_gib=[30, 30] + [75] * 4 + [0, 0]))
    assert sched.register_shard(chat)["gpus"] == [6, 7]  # with the values known: where memory is free
    for t in range(1, 17):  # then the GPU source goes quiet
        sched.on_tick(Frame(1000.0 + t, 1.0))
    before = snapshot(sched)
    with pytest.raises(SchedulerError, match="shard chat-2: cannot place: no GPU values for 15 s"):
        sched.register_shard(chat | {"id": "chat-2", "gpus": 1})
    assert snapshot(sched) == before


def test_registration_without_gpu_values_is_a_409(api: tuple[FlaskClient, Scheduler]) -> None:
    from sits_observe.frame import Frame

    client, sched = api
    for t in range(1, 17):  # the GPU source stops reporting
        sched.on_tick(Frame(1000.0 + t, 1.0))
    refused(client, sched, "/api/v1/shards", {"id": "chat", "gpus": 1, "memory_per_gpu": GiB}, 409,
            "shard chat: cannot place: no GPU values for 15 s (the GPU source is not reporting, or reads every GPU as "
            "missing), so the targets' free memory is unknown; try again when it reports")
    r = client.post("/api/v1/shards", json={"id": "chat", "gpus": 1, "memory_per_gpu": GiB, "placement": [5]},
                    headers=AUTH)
    assert (r.status_code, r.get_json()["gpus"]) == (201, [5])  # a running shard is adopted where it runs


def test_a_config_shard_is_placed_when_gpu_values_come(make_scheduler: Callable[..., Scheduler]) -> None:
    """A shard in ``scheduler.shards`` without a placement was placed at start-up, before any GPU sample."""
    sched = make_scheduler(shards=[{"id": "chat", "gpus": 2, "memory_per_gpu": 30 * GiB}])
    assert sched.shards_state()["shards"] == []  # waits: every GPU's free memory is unknown
    sched.on_tick(frame(1000.0, mem_gib=[75] * 6 + [0, 0]))
    (chat,) = sched.shards_state()["shards"]
    assert (chat["shard"]["id"], chat["state"], chat["gpus"]) == ("chat", "launched", [6, 7])


def test_bodies_json_allows_but_the_scheduler_cannot_store_are_a_400(api: tuple[FlaskClient, Scheduler]) -> None:
    """JSON nested past the recursion limit, and strings with a lone surrogate (valid JSON, not UTF-8 text:
    SQLite and the plan JSON cannot encode them), were a 500 with a traceback in the log."""
    client, sched = api
    for url in ("/api/v1/shards", "/api/v1/reshard", "/api/v1/placements/1/ack"):
        refused(client, sched, url, "[" * 100_000, 400, f"POST {url}: body nests too deeply")
    for url, body in (("/api/v1/shards", '{"id": "y", "gpus": 1, "model": "\\ud800"}'),
                      ("/api/v1/shards", '{"id": "z", "gpus": 1, "tenant": "a\\udfff", "placement": [3]}'),
                      ("/api/v1/reshard", '{"shard": "tp2", "reason": "\\ud800"}'),
                      ("/api/v1/placements/1/ack", '{"step": "stage", "ok": false, "reason": "\\ud800"}')):
        refused(client, sched, url, body, 400, "a lone UTF-16 surrogate that is not Unicode text")


def test_webhook_redirect_fails_the_step_instead_of_losing_the_plan() -> None:
    """urllib followed a 302 to a POST with a GET without the plan, and took the GET's 200 for delivered: the
    orchestrator never saw the plan and the step waited ``step_timeout`` for an ack that could not come."""
    seen: list[tuple[str, str]] = []

    class Moved(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(("POST", self.path))
            self.send_response(302)
            self.send_header("Location", "/v2/plans?token=abc")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            seen.append(("GET", self.path))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = WebhookActuator(f"http://127.0.0.1:{server.server_address[1]}/plans", None, 2.0, 2)
    try:
        hook.submit({"placement_id": 3, "step": "launch"})
        deadline = time.monotonic() + 5
        while not (out := hook.poll()) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        hook.close()
        server.shutdown()
        server.server_close()
    assert seen == [("POST", "/plans")]  # once: a redirect is a wrong URL, not worth a retry
    (o,) = out
    assert (o.placement_id, o.step, o.ok) == (3, "launch", False)
    assert "HTTP 302 redirect to /v2/plans not followed" in o.reason and "abc" not in o.reason


def test_an_oversized_body_is_refused_before_it_is_read(api: tuple[FlaskClient, Scheduler]) -> None:
    """A body of any size was read into memory and parsed whole (waitress accepts up to 1 GiB)."""
    client, sched = api
    body = json.dumps({"id": "big", "gpus": 1, "model": "m" * (2 << 20)})
    refused(client, sched, "/api/v1/shards", body, 413,
            f"POST /api/v1/shards: body of {len(body)} bytes; at most 1048576")


def test_an_ack_after_the_step_timed_out_is_a_409_saying_the_placement_failed(
        api: tuple[FlaskClient, Scheduler], orchestrator: Orchestrator) -> None:
    """docs/scheduler.md tells an orchestrator to undo what it set up when its late ack gets this answer."""
    client, sched = api
    new = client.post("/api/v1/reshard", json={"shard": "tp2", "reason": "x"}, headers=AUTH).get_json()["placement_id"]
    orchestrator.wait_for(1)
    sched.on_tick(frame(1000.0 + sched.cfg.step_timeout + 1))  # no ack in time: the placement fails
    refused(client, sched, f"/api/v1/placements/{new}/ack", {"step": "stage", "ok": True}, 409,
            f"placement {new}: ack for step stage refused: expected state placed, actual failed "
            "(not waiting for any step)")
    assert live_gpus(sched)["tp2"] == ("launched", [0, 1])  # the old placement keeps serving


def test_reads_do_not_wait_for_a_tick_stuck_in_the_database(api: tuple[FlaskClient, Scheduler]) -> None:
    """A tick holds the scheduler's lock through its scheduler.sqlite writes; /api/v1/shards, the UI's topology
    page and /metrics waited as long, each holding one of the HTTP server's few workers."""
    import time

    from in_thread import lock_held

    client, sched = api
    shards = client.get("/api/v1/shards").get_json()
    metrics = [(s.name, s.labels, s.value) for s in sched.metrics()]
    with lock_held(sched._lock), lock_held(sched.store.lock):  # the store's, too: a write waits for the file
        start = time.monotonic()
        during = client.get("/api/v1/shards").get_json()
        metrics_during = [(s.name, s.labels, s.value) for s in sched.metrics()]
        took = time.monotonic() - start
    assert took < 2 and during == shards and shards["shards"] and metrics_during == metrics


def test_a_read_says_when_the_state_it_shows_was_published(api: tuple[FlaskClient, Scheduler]) -> None:
    """A read during a stuck tick answers with the last published state; nothing in it said how old that was."""
    from in_thread import lock_held

    client, sched = api
    sched.on_tick(frame(1010.0))
    assert client.get("/api/v1/shards").get_json()["as_of"] == 1010.0
    with lock_held(sched._lock):  # the next tick is stuck in the database
        assert client.get("/api/v1/shards").get_json()["as_of"] == 1010.0
    sched.on_tick(frame(1071.0))
    assert client.get("/api/v1/shards").get_json()["as_of"] == 1071.0


def test_a_read_while_a_tick_is_stuck_shows_the_last_change(api: tuple[FlaskClient, Scheduler]) -> None:
    """No reader had looked since the shard was registered and re-sharded: a read during a stuck tick showed
    the state of the last read (no shards at all on a fresh daemon), not that of the last change."""
    from in_thread import lock_held

    client, sched = api
    r = client.post("/api/v1/reshard", json={"shard": "tp2", "reason": "x"}, headers=AUTH)
    assert r.status_code == 202
    with lock_held(sched._lock):
        during = client.get("/api/v1/shards").get_json()
    assert [s["shard"]["id"] for s in during["shards"]] == ["tp2"] and during["migrations_in_flight"] == 1


def test_placing_a_new_shard_is_not_a_migration_in_flight(make_scheduler: Callable[..., Scheduler]) -> None:
    """docs: max_migrations counts re-shards only; a shard being placed for the first time counted, and with
    max_migrations 1 it refused every re-shard (manual or triggered) until its orchestrator had acked it."""
    from sched_helpers import PendingActuator

    s = make_scheduler(actuator=PendingActuator(), max_migrations=1)
    s.on_tick(frame(1000.0))
    s.register_shard({"id": "old", "gpus": 1, "memory_per_gpu": 70 * GiB, "placement": [0]})
    s.register_shard({"id": "new", "gpus": 1, "memory_per_gpu": 20 * GiB})  # elsewhere; waits for its stage ack
    assert s.shards_state()["migrations_in_flight"] == 0
    assert s.manual_reshard("old", "maintenance")["action"] == "migrate"
    assert s.shards_state()["migrations_in_flight"] == 1


def test_a_shard_whose_placing_failed_is_placed_again_by_a_reshard(api: tuple[FlaskClient, Scheduler],
                                                                  orchestrator: Orchestrator) -> None:
    """Its first placing refused (or timed out), a shard served nowhere for good: registering it again said
    'already registered; re-shard it instead', and a re-shard 'expected state launched, actual unplaced'."""
    client, sched = api
    r = client.post("/api/v1/shards", json={"id": "new", "gpus": 1, "memory_per_gpu": GiB}, headers=AUTH)
    pid = r.get_json()["placements"][0]["id"]
    orchestrator.wait_for(1)
    assert client.post(f"/api/v1/placements/{pid}/ack", json={"step": "stage", "ok": False, "reason": "image pull"},
                       headers=AUTH).status_code == 200
    assert live_gpus(sched)["new"] == ("unplaced", [])
    r = client.post("/api/v1/reshard", json={"shard": "new", "reason": "image fixed"}, headers=AUTH)
    assert r.status_code == 202 and (r.get_json()["name"], r.get_json()["action"]) == ("shard.assign", "assign")
    assert sched.store.placement(r.get_json()["placement_id"]).state is State.PLACED  # walking again


def test_an_ack_the_database_cannot_store_is_a_503_not_a_refusal(api: tuple[FlaskClient, Scheduler],
                                                                  orchestrator: Orchestrator) -> None:
    """A full disk answered an ack with 409, the answer an orchestrator is told to take as the scheduler giving up
    on the placement (it releases the target it set up) while the placement still waited for that ack."""
    client, sched = api
    new = client.post("/api/v1/reshard", json={"shard": "tp2", "reason": "x"}, headers=AUTH).get_json()["placement_id"]
    orchestrator.wait_for(1)
    url = f"/api/v1/placements/{new}/ack"
    sched.store._db.execute("PRAGMA query_only = ON")  # every write fails in SQLite, as on a full disk
    try:
        r = client.post(url, json={"step": "stage", "ok": True}, headers=AUTH)
        assert (r.status_code, r.headers.get("Retry-After")) == (503, "5"), r.get_json()
        assert "readonly database; try again" in r.get_json()["error"]
        r = client.post("/api/v1/shards", json={"id": "c", "gpus": 1}, headers=AUTH)
        assert r.status_code == 503, r.get_json()
    finally:
        sched.store._db.execute("PRAGMA query_only = OFF")
    assert sched.store.placement(new).step == "stage"  # still waiting: the orchestrator's retry is taken
    assert client.post(url, json={"step": "stage", "ok": True}, headers=AUTH).get_json()["state"] == "staged"


def test_a_huge_bad_value_is_named_and_cut_short_in_the_400(api: tuple[FlaskClient, Scheduler]) -> None:
    """A 400 repeated a bad value whole: a 900 kB id came back in a 900 kB error (and into the client's log)."""
    client, sched = api
    huge = "x" * 900_000
    for url, body, field in (
            ("/api/v1/shards", {"id": huge}, "shard: id: String should match pattern"),
            ("/api/v1/shards", {"id": "a", "gpus": 2, "placement": [0] * 100_000}, "shard: placement: must list 2"),
            ("/api/v1/shards", {"id": "a", huge: 1}, "shard: xxxxxxxx"),
            ("/api/v1/placements/1/ack", {"step": "stage", "ok": True, "reason": huge}, "ack: reason: String should"),
            ("/api/v1/reshard", {"shard": "tp2", "reason": [1] * 100_000}, "reshard: reason: must be a non-empty"),
            ("/api/v1/reshard", {"shard": huge, "reason": "x"}, "reshard: shard: a shard id has at most 63"),
            # a valid string, kept and repeated in every shard list, plan and span: it was taken
            ("/api/v1/shards", {"id": "a", "model": huge}, "shard a: model: at most 256 characters"),
            ("/api/v1/shards", {"id": "a", "tenant": huge}, "shard a: tenant: at most 256 characters")):
        refused(client, sched, url, body, 400, field)
        error = client.post(url, json=body, headers=AUTH).get_json()["error"]
        assert len(error) < 300 and " characters)" in error, error[:300]


def test_a_long_list_of_bad_gpus_is_one_short_error(api: tuple[FlaskClient, Scheduler]) -> None:
    """Each bad item of a ``placement`` was an error of its own: a 1 MiB body of ``"1"`` (or ``true``, ``1.5``)
    answered a 17 MB 400 after seconds of CPU in an HTTP worker."""
    client, sched = api
    before = snapshot(sched)
    for item in ("1", True, 1.5):
        r = client.post("/api/v1/shards", json={"id": "a", "gpus": 2, "placement": [item] * 150_000}, headers=AUTH)
        error = r.get_json()["error"]
        assert len(error) < 300, (len(error), error[:300])
        assert r.status_code == 400 and error.startswith("shard: placement: must list 2 distinct GPU indices"), error
    assert snapshot(sched) == before


def test_shard_and_ack_fields_take_no_other_json_type(api: tuple[FlaskClient, Scheduler]) -> None:
    """Lax validation took ``true``, ``"2"`` and ``2.0`` for 1 or 2 GPUs, ``[true]`` for GPU 1, ``"0.5"`` for a
    fraction and ``"yes"`` for an ack's ``ok``: a client's mistake placed a shard it did not mean."""
    client, sched = api
    for field, bad in (("gpus", True), ("gpus", "2"), ("gpus", 2.0), ("placement", [True]), ("numa_node", "0"),
                       ("comm_intensity", "0.5"), ("priority", False), ("memory_per_gpu", 1e9), ("model", 7)):
        refused(client, sched, "/api/v1/shards", {"id": "typed", field: bad}, 400, f"shard: {field}")
    pid = sched.store.placements("tp2")[0].id
    for ok in ("yes", 1):
        refused(client, sched, f"/api/v1/placements/{pid}/ack", {"step": "stage", "ok": ok}, 400, "ack: ok: Input")
    r = client.post("/api/v1/shards", json={"id": "typed", "gpus": 1, "comm_intensity": 1}, headers=AUTH)
    assert (r.status_code, r.get_json()["shard"]["comm_intensity"]) == (201, 1.0)  # an integer is a number


def test_a_config_shard_takes_no_other_yaml_type() -> None:
    """The config's shards share the model: ``gpus: "2"`` is refused there too, naming the file and field."""
    from sits_observe.config import parse
    from sits_observe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"c.yaml: scheduler.shards\[0\].gpus: Input should be a valid integer, "
                                          "got '2'"):
        parse({"scheduler": {"shards": [{"id": "a", "gpus": "2"}]}}, "c.yaml", env={})


def test_a_numa_node_without_a_gpu_is_refused(api: tuple[FlaskClient, Scheduler],
                                              make_scheduler: Callable[..., Scheduler], tmp_path: Path) -> None:
    """``numa_node: 7`` on a 2-node host was taken and did nothing: every GPU set scored 0 on it, so the shard's
    NUMA preference was dropped without a word."""
    from sits_observe.config import parse
    from sits_observe.errors import ConfigError
    from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
    from sits_observe.topology import Topology, preset

    client, sched = api
    why = "shard far: numa_node: no GPU of this host is on NUMA node 7 (its GPUs are on nodes [0, 1])"
    refused(client, sched, "/api/v1/shards", {"id": "far", "numa_node": 7}, 400, why)
    assert client.post("/api/v1/shards", json={"id": "near", "numa_node": 1}, headers=AUTH).status_code == 201
    shards = [{"id": "far", "gpus": 1, "numa_node": 7}]
    with pytest.raises(ConfigError, match=re.escape(why)):
        make_scheduler(shards=shards, state="start")  # at start-up, before it waits for GPU values
    cooldown = sched.cfg.cooldown
    with pytest.raises(ConfigError, match=re.escape(why)):
        sched.reload(parse({"gpu": {"backend": "none"}, "scheduler": {"cooldown": 1, "shards": shards}}, env={}))
    assert sched.cfg.cooldown == cooldown
    unread = preset("pcie-8").to_dict()  # NVML could not read any GPU's NUMA node: any node is taken
    for g in unread["gpus"]:
        g["numa_node"] = None
    Scheduler(SchedulerConfig(shards=shards), OtlpConfig(), Topology.from_dict(unread), tmp_path / "unread").close()


def test_a_reshard_reason_is_one_line_in_the_log(api: tuple[FlaskClient, Scheduler],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A reason with a newline wrote a second, forged line into the daemon's log (``...\nERROR ...``)."""
    import logging

    client, sched = api
    body = {"shard": "tp2", "reason": "maintenance\n2026-12-02 ERROR sits_observe: disk on fire"}
    with caplog.at_level(logging.INFO, logger="sits_observe.scheduler"):
        r = client.post("/api/v1/reshard", json=body, headers=AUTH)
    assert r.status_code == 202 and r.get_json()["reason"] == "manual: maintenance 2026-12-02 ERROR sits_observe: " \
                                                              "disk on fire"
    assert all("\n" not in rec.getMessage() for rec in caplog.records)


def test_a_reshard_naming_its_target_is_a_400(api: tuple[FlaskClient, Scheduler]) -> None:
    """Fields a re-shard does not take were ignored: ``"gpus": [6, 7]`` answered 202 and moved the shard wherever
    the search chose, as if the client's target had been taken."""
    client, sched = api
    refused(client, sched, "/api/v1/reshard", {"shard": "tp2", "reason": "x", "gpus": [6, 7]}, 400,
            "reshard: gpus: unknown field; send shard and reason only")
