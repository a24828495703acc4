"""Scheduler routes under /api/v1 as a Flask blueprint: ``app.register_blueprint(scheduler_blueprint(...))``.

GET /api/v1/shards, GET /api/v1/decisions?limit=N, and (behind ``auth``, the bearer-token decorator)
POST /api/v1/shards, DELETE /api/v1/shards/<id>, POST /api/v1/reshard, POST /api/v1/placements/<id>/ack.
Malformed input (also JSON nested past Python's recursion limit, or a string with a lone surrogate that SQLite
cannot store) -> 400 (a value it echoes cut short), a body over :data:`MAX_BODY_BYTES` -> 413, unknown shard or
placement -> 404, a refused transition (or removal, or registration past ``scheduler.max_shards``) -> 409,
``scheduler.sqlite`` refusing a read or write (a full disk) -> 503 with ``Retry-After``; every answer names the
reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from ..errors import ConfigError, SchedulerError
from ..scheduler.bodies import clip, shorten
from ..scheduler.config import MAX_ID_CHARS
from ..scheduler.states import NotFound, StoreFailed
from .api import query_arg

__all__ = ["scheduler_blueprint", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 1 << 20  # a shard, a re-shard or an ack is well under 1 KiB
RETRY_AFTER_S = 5  # a 503 for a database that refused a write (a full disk): when to try again


def _body() -> Any:
    where = f"{request.method} {request.path}"
    size = request.content_length  # waitress gives a chunked body's length too
    if size is not None and size > MAX_BODY_BYTES:  # refused before it is read into memory and parsed
        raise RequestEntityTooLarge(f"{where}: body of {size} bytes; at most {MAX_BODY_BYTES}")
    try:
        body = request.get_json(silent=True)
        if body is not None:
            json.dumps(body, ensure_ascii=False).encode()  # what the store and the actuators will write
    except RecursionError:
        raise ConfigError(f"{where}: body nests too deeply; send a flat JSON object") from None
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{where}: body holds {exc.object[exc.start:exc.end]!r}, a lone UTF-16 surrogate that "
                          "is not Unicode text; send valid UTF-8") from None
    if body is None:
        raise ConfigError(f"{where}: body is not JSON; send a JSON object with Content-Type: application/json")
    return body


def scheduler_blueprint(scheduler: Any, auth: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Blueprint:
    """Routes backed by ``scheduler`` (an :class:`~sits_observe.scheduler.engine.Scheduler`)."""
    bp = Blueprint("scheduler", __name__)

    @bp.get("/api/v1/shards")
    def shards() -> Response:
        return jsonify(scheduler.shards_state())

    @bp.get("/api/v1/decisions")
    def decisions() -> Response:
        raw = query_arg("limit")
        raw = "100" if raw is None else raw
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or not 1 <= int(raw) <= 10000:
            raise ConfigError(f"limit: must be an integer from 1 to 10000, got {raw[:40]!r}")
        return jsonify(scheduler.decisions_state(int(raw)))

    @bp.post("/api/v1/shards")
    @auth
    def register() -> tuple[Response, int]:
        return jsonify(scheduler.register_shard(_body())), 201

    @bp.delete("/api/v1/shards/<shard_id>")
    @auth
    def remove(shard_id: str) -> Response:
        if len(shard_id) > MAX_ID_CHARS:  # no shard has it; not echoed whole in a 404
            raise ConfigError(f"remove: a shard id has at most {MAX_ID_CHARS} characters, got {clip(shard_id)}")
        return jsonify(scheduler.remove_shard(shard_id))

    @bp.post("/api/v1/reshard")
    @auth
    def reshard() -> tuple[Response, int]:
        body = _body()
        if not isinstance(body, dict) or not isinstance(body.get("shard"), str):
            raise ConfigError('reshard: body must be {"shard": "<id>", "reason": "<why>"}, got ' + clip(body))
        if unknown := sorted(set(body) - {"shard", "reason"}):  # e.g. target GPUs: it picks them itself
            raise ConfigError(f"reshard: {shorten(unknown[0])}: unknown field; send shard and reason only")
        if len(body["shard"]) > MAX_ID_CHARS:  # no shard has it; not echoed whole in a 404
            raise ConfigError(f"reshard: shard: a shard id has at most {MAX_ID_CHARS} characters, got "
                              f"{clip(body['shard'])}")
        return jsonify(scheduler.manual_reshard(body["shard"], body.get("reason"))), 202

    @bp.post("/api/v1/placements/<placement_id>/ack")
    @auth
    def ack(placement_id: str) -> Response:
        # ASCII digits only: Werkzeug's int took every script's digits (/placements/\u0663/ack was placement 3)
        if not (placement_id.isascii() and placement_id.isdigit()) or len(placement_id) > 40:  # int() past 4300 raised
            raise NotFound(f"placement {clip(placement_id)}: no such placement")
        if (pid := int(placement_id)) >= 2**63:  # past SQLite's integer: no such placement
            raise NotFound(f"placement {pid}: no such placement")
        return jsonify(scheduler.ack(pid, _body()))

    @bp.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge) -> tuple[Response, int]:
        return jsonify({"error": exc.description}), 413

    @bp.errorhandler(NotFound)
    def not_found(exc: NotFound) -> tuple[Response, int]:
        return jsonify({"error": str(exc)}), 404

    @bp.errorhandler(StoreFailed)
    def store_failed(exc: StoreFailed) -> tuple[Response, int, dict[str, str]]:
        return jsonify({"error": f"{exc}; try again"}), 503, {"Retry-After": str(RETRY_AFTER_S)}

    @bp.errorhandler(SchedulerError)
    def refused(exc: SchedulerError) -> tuple[Response, int]:
        return jsonify({"error": str(exc)}), 409

    @bp.errorhandler(ConfigError)
    def bad_input(exc: ConfigError) -> tuple[Response, int]:
        return jsonify({"error": str(exc)}), 400

    return bp
