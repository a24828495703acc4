"""REST API under /api/v1: read-only views of the store and the subsystems, plus mutating calls
(bearer token) that the subsystems define.  Query parameters are validated: bad ones get a 400 with
the parameter, the value and what is allowed."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, jsonify, request

from ..frame import STAGES

if TYPE_CHECKING:
    from ..daemon import Daemon

__all__ = ["register_api", "window_ticks"]

QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def query_arg(param: str) -> str | None:
    """The query parameter ``param``, or None; given more than once is a 400 (which one was meant?)."""
    from .http import ApiError

    if len(request.args.getlist(param)) > 1:
        raise ApiError(400, f"{param}: given more than once; give it once")
    return request.args.get(param)


def window_ticks(daemon: Daemon, param: str = "window", default: float = 300.0) -> int:
    """Parse ``?window=SECONDS`` into a tick count, bounded by the store's history."""
    from .http import ApiError

    raw = query_arg(param)
    limit = daemon.store.history * daemon.clock.interval
    if raw is None:
        seconds = min(default, limit)
    else:
        try:
            seconds = float(raw)
        except ValueError:
            raise ApiError(400, f"{param}: must be a number of seconds, got {raw[:40]!r}") from None
        if not math.isfinite(seconds) or seconds <= 0 or seconds > limit:
            raise ApiError(400, f"{param}: must be more than 0 and at most {limit:g} seconds (the history kept), "
                                f"got {raw[:40]!r}")
    return max(1, int(round(seconds / daemon.clock.interval)))


def _nan_none(x: float) -> float | None:
    return None if x != x else round(float(x), 9)


def _part(daemon: Daemon, name: str) -> Any:
    from .http import ApiError

    part = getattr(daemon, name)
    if part is None:
        raise ApiError(404, f"the {name} subsystem is not enabled in this daemon's config")
    return part


STAGES_ANSWERS_KEPT = 16  # /api/v1/stages answers kept for the tick they are of


def _stages(daemon: Daemon, last: int, workload: str | None) -> dict[str, Any]:
    out = []
    with daemon.store.reading():  # every figure of one answer of the same ticks (p99 was seen below p50)
        held = len(daemon.store.ts(last))
        for stage in [s for s in STAGES if s in daemon.store.stages()]:
            count, values = daemon.store.quantiles(tuple(v for _, v in QUANTILES), stage, workload, last)
            q = dict(zip((k for k, _ in QUANTILES), values))
            out.append({"stage": stage, "count": count, **{k: _nan_none(v) for k, v in q.items()},
                        "tail_delta": _nan_none(q["p99"] - q["p50"])})
    # the ticks the answer covers: fewer than asked for while the history fills
    return {"window_seconds": held * daemon.clock.interval, "workload": workload, "stages": out}


def register_api(app: Flask, daemon: Daemon) -> None:
    from .http import ApiError

    @app.get("/api/v1/status")
    def status() -> Response:
        return jsonify(daemon.status())

    # an hour's answer at the series cap holds the store's lock for about 0.1 s: one computed at a time, and each
    # (tick, window, workload) once, or a few clients polling it kept the tick's ingest waiting for seconds
    answering, answers = threading.Lock(), {}

    @app.get("/api/v1/stages")
    def stages() -> Response:
        last = window_ticks(daemon)
        workload = query_arg("workload")
        if workload is not None and workload not in daemon.store.workloads():
            raise ApiError(404, f"workload: unknown workload {workload[:40]!r}; known: {daemon.store.workloads()}")
        key = (daemon.store.ticks, last, workload)
        with answering:
            if key not in answers:
                if len(answers) >= STAGES_ANSWERS_KEPT:
                    answers.clear()
                answers[key] = _stages(daemon, last, workload)
            return jsonify(answers[key])

    @app.get("/api/v1/topology")
    def topology() -> Response:
        if daemon.topology is None:
            raise ApiError(404, f"no GPU topology known (gpu.backend {daemon.config.gpu.backend}: only nvml, with the "
                                "driver answering, and sim give one)")
        return jsonify(daemon.topology.to_dict())

    @app.get("/api/v1/slos")
    def slos() -> Response:
        return jsonify(_part(daemon, "slo").slos_state())

    @app.get("/api/v1/alerts")
    def alerts() -> Response:
        return jsonify(_part(daemon, "slo").alerts_state())

    @app.get("/api/v1/verdicts")
    def verdicts() -> Response:
        return jsonify(_part(daemon, "rca").verdicts_state())
