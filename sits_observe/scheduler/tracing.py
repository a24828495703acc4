"""ShardDecisionSpan: one OpenTelemetry span per scheduler decision, exported over OTLP, plus a bounded
local ring of the same decisions (with their trace and span ids) for the API and the UI.

A decision's span is made as data (:class:`~.store.SpanRecord`: ids, times, attributes, events, links,
status, resource and scope) and written to ``scheduler.sqlite`` in the transaction that writes the
decision's rows; :class:`~.span_outbox.SpanSender` hands the stored spans to the OTLP exporter
(http/protobuf by default, grpc optional) and deletes each only when its export succeeded.  Trace
and span ids are derived from the decision id, so a span sent again after a crash or a failed export
carries the same ids and a collector can de-duplicate.  The endpoint comes from ``otlp.endpoint``, else
``OTEL_EXPORTER_OTLP_ENDPOINT``; with neither, spans are not stored nor exported (the ring keeps their
ids).  Exports run on their own thread: a collector that is down never blocks a tick.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from .. import __version__
from ..collectors.config import redirect_target
from ..errors import SchedulerError
from .config import OtlpConfig, otlp_endpoint
from .placement import Candidate
from .sdklog import recording_session
from .span_outbox import SpanSender
from .store import PlacementStore, SpanRecord

__all__ = ["Decision", "DecisionTracer", "decision_ids", "link_context", "make_exporter"]

SCOPE = "sits_observe.scheduler"
log = logging.getLogger("sits_observe.scheduler")


@dataclass(slots=True)
class Decision:
    """What the scheduler decided and why; ``name`` is ``shard.assign``, ``shard.reshard`` or ``shard.remove``."""

    id: str
    ts: float                        # source clock
    name: str
    action: str                      # migrate | assign | adopt | no_action | remove
    trigger: str                     # verdict | imbalance | saturation | manual | register | adopt | unregister
    reason: str
    strategy: str
    shard_id: str = ""
    node: str = ""
    target_gpus: tuple[int, ...] = ()
    source_gpus: tuple[int, ...] = ()
    score: float = 0.0
    cause: str = "none"
    confidence: float = 0.0
    node_cpu: float = float("nan")
    method: str = ""
    evaluated: int = 0
    placement_id: int | None = None
    verdict_id: str | None = None
    alerts: tuple[str, ...] = ()
    candidates: list[Candidate] = field(default_factory=list)
    outcome: str = ""                # its placement's state once the steps done at once are ("" without one)
    failure: str = ""                # why that placement failed, when it failed at once

    def attributes(self) -> dict[str, Any]:
        return {
            "shard.id": self.shard_id, "shard.strategy": self.strategy, "target.node": self.node,
            "target.gpus": list(self.target_gpus), "source.gpus": list(self.source_gpus),
            "decision.score": self.score, "decision.trigger": self.trigger, "decision.action": self.action,
            "decision.reason": self.reason, "decision.id": self.id, "decision.ts": self.ts,
            "decision.search": self.method, "decision.candidates_evaluated": self.evaluated,
            "rca.cause": self.cause, "rca.confidence": self.confidence, "node.load.cpu": self.node_cpu,
        }


def _derived(kind: str, ident: str) -> tuple[int, int]:
    """(trace id, span id) from sha256 of ``kind:id``: first 16 bytes, next 8 (never 0)."""
    h = hashlib.sha256(f"{kind}:{ident}".encode()).digest()
    return int.from_bytes(h[:16], "big") or 1, int.from_bytes(h[16:24], "big") or 1


def link_context(kind: str, ident: str) -> SpanContext:
    """A stable span context for a verdict or alert id (sha256 of ``kind:id``), so links are reproducible."""
    trace_id, span_id = _derived(kind, ident)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _hex(kind: str, ident: str) -> tuple[str, str]:
    trace_id, span_id = _derived(kind, ident)
    return f"{trace_id:032x}", f"{span_id:016x}"


def decision_ids(decision_id: str) -> tuple[str, str]:
    """(trace id, span id) in hex of a decision's span, derived as links are (``shard.decision:<id>``)."""
    return _hex("shard.decision", decision_id)


def _link(kind: str, ident: str, attributes: dict[str, Any]) -> dict[str, Any]:
    trace_id, span_id = _hex(kind, ident)
    return {"trace_id": trace_id, "span_id": span_id, "attributes": attributes}


def make_exporter(cfg: OtlpConfig, env: Mapping[str, str]) -> SpanExporter | None:
    """The OTLP span exporter the config (or environment) names, or None when no endpoint is set."""
    base = otlp_endpoint(cfg, env)
    if not base:
        return None
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=base, timeout=cfg.timeout)
    return _HttpExporter(base.rstrip("/") + "/v1/traces", cfg.timeout)


class _HttpExporter(SpanExporter):
    """The SDK's OTLP/HTTP exporter, and the two answers it does not check.  It takes any 3xx for success (it
    follows no redirect), so the spans would be deleted undelivered: a redirect fails the export instead, and
    is logged (once in a row) with where it points.  Spans a 200 reports rejected (``partial_success``, which
    the OTLP spec says not to retry) are logged with the collector's message and counted in ``rejected``."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        self.session = session = recording_session()
        session.hooks["response"].append(self._answered)
        self._sdk = OTLPSpanExporter(endpoint=endpoint, timeout=timeout, session=session)
        self._last: Any = None  # the last answer of the export in progress (the SDK may retry)
        self._redirected = False
        self.rejected = 0  # spans the collector took and reported rejected (partial_success)

    def _answered(self, resp: Any, *args: Any, **kwargs: Any) -> None:
        self._last = resp

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._last = None
        result = self._sdk.export(spans)
        resp, self._last = self._last, None
        if result is not SpanExportResult.SUCCESS or resp is None:
            return result
        if 300 <= resp.status_code < 400:
            if not self._redirected:
                log.error("scheduler: OTLP collector answered HTTP %d, a redirect to %s (not followed: it would lose "
                          "the spans); they stay stored; set otlp.endpoint to the base URL it points to",
                          resp.status_code, redirect_target(resp.headers.get("Location")))
            self._redirected = True
            return SpanExportResult.FAILURE
        self._redirected = False
        if "protobuf" in resp.headers.get("Content-Type", ""):  # the OTLP answer to a protobuf request
            self._rejected(resp.content, len(spans))
        return result

    def _rejected(self, body: bytes, sent: int) -> None:
        try:
            partial = ExportTraceServiceResponse.FromString(body).partial_success
        except DecodeError:  # not an OTLP protobuf answer (a proxy's page): nothing to learn from it
            return
        if n := min(partial.rejected_spans, sent):
            self.rejected += n
            log.error("scheduler: OTLP collector rejected %d of %d ShardDecisionSpan(s), dropped (not sent again): "
                      "%s", n, sent, partial.error_message[:300] or "it gave no reason")

    def shutdown(self) -> None:
        self._sdk.shutdown()


class DecisionTracer:
    """Makes the span of each decision and keeps the last ``keep`` decisions as dicts.

    ``store`` keeps the spans until they are exported; a sender starts at once and sends what an earlier
    run left unexported.
    """

    def __init__(self, cfg: OtlpConfig, host_name: str, store: PlacementStore, keep: int = 256, *,
                 exporter: SpanExporter | None = None, env: Mapping[str, str] | None = None) -> None:
        exporter = exporter or make_exporter(cfg, os.environ if env is None else env)
        resource = Resource.create({"service.name": "sits-observe", "service.version": __version__,
                                    "host.name": host_name})
        self.resource = dict(resource.attributes)
        self.store = store
        self.ring: deque[dict[str, Any]] = deque(maxlen=keep)
        self.last_move: dict[str, Any] | None = None  # the newest migration, however many decisions came since
        self._http = exporter if isinstance(exporter, _HttpExporter) else None
        self.sender = None if exporter is None else SpanSender(store, exporter, cfg)
        if self.sender is not None:
            self.sender.start()

    @property
    def exporting(self) -> bool:
        return self.sender is not None

    @property
    def dropped(self) -> int:
        rejected = 0 if self._http is None else self._http.rejected  # by the collector, in a 200
        return rejected + (0 if self.sender is None else self.sender.dropped)

    def span(self, d: Decision) -> SpanRecord | None:
        """The decision's span, ended now (wall clock), to store with the decision's rows; None when spans
        are not exported."""
        return None if self.sender is None else self._span(d)

    def add_span(self, d: Decision) -> None:
        """Store the span of a decision that writes no row (a "no action"); one the database refuses is logged
        and counted as dropped, and the decision stands."""
        if self.sender is not None:
            self.sender.add(self._span(d))

    def failed(self, span: SpanRecord | None, why: str) -> None:
        """Mark the stored span of a decision whose placement failed at once (status ERROR, ``why``), unless it is
        gone already (exported, trimmed); one the database refuses to rewrite is logged and stays as stored."""
        if span is None:
            return
        span.body["status"] = {"code": "ERROR", "description": why}
        try:
            self.store.replace_span(span)
        except SchedulerError as exc:
            log.error("scheduler: span of decision %s not marked failed: %s", span.decision_id, exc)

    def _span(self, d: Decision) -> SpanRecord:
        now = time.time_ns()
        trace_id, span_id = decision_ids(d.id)
        links = ([_link("rca.verdict", d.verdict_id, {"link.kind": "rca.verdict", "rca.verdict.id": d.verdict_id})]
                 if d.verdict_id else [])
        links += [_link("alert", a, {"link.kind": "alert", "alert.id": a}) for a in d.alerts]
        events = [{"name": "candidate.scored", "ts_ns": now, "attributes": {
            "candidate.rank": rank, "candidate.gpus": list(c.gpus), "candidate.score": c.score,
            **{f"score.{t}": v for t, v in c.terms.items()}}} for rank, c in enumerate(d.candidates)]
        return SpanRecord(d.id, {
            "trace_id": trace_id, "span_id": span_id, "name": d.name, "kind": "INTERNAL",
            "start_ns": now, "end_ns": now, "attributes": d.attributes(), "events": events, "links": links,
            "status": {"code": "UNSET", "description": None}, "resource": self.resource,
            "scope": {"name": SCOPE, "version": __version__}})

    def record(self, d: Decision) -> dict[str, Any]:
        """Keep the decision in the ring and have its stored span (if any) sent soon."""
        trace_id, span_id = decision_ids(d.id)
        entry = asdict(d) | {"trace_id": trace_id, "span_id": span_id}
        entry["candidates"] = [{"gpus": list(c.gpus), "score": c.score, "terms": c.terms} for c in d.candidates]
        entry["node_cpu"] = None if d.node_cpu != d.node_cpu else d.node_cpu
        self.ring.append(entry)
        if d.action == "migrate":
            self.last_move = entry
        if self.sender is not None:
            self.sender.queued()
        return entry

    def recent(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Newest first."""
        return list(itertools.islice(reversed(self.ring), limit))

    def flush(self, timeout: float = 5.0) -> bool:
        """Export the stored spans now; True when none is left unexported."""
        return self.sender is None or self.sender.flush(timeout)

    def close(self) -> None:
        if self.sender is not None:
            self.sender.stop()
