"""ShardDecisionSpan: one OpenTelemetry span per scheduler decision, exported over OTLP, plus a bounded
local ring of the same decisions (with their trace and span ids) for the API and the UI.

Wiring is done once here: TracerProvider (resource ``service.name=sits-observe``, ``host.name``) ->
bounded processor -> BatchSpanProcessor -> OTLP exporter (http/protobuf by default, grpc optional).  The
endpoint comes from ``otlp.endpoint``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``; with neither, spans are
made (the ring keeps their ids) but not exported.  Ending a span only enqueues it, so a collector that
is down never blocks a tick; spans that overflow the queue or fail to export are counted as dropped.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, TraceFlags

from .. import __version__
from .config import OtlpConfig
from .placement import Candidate

__all__ = ["Decision", "DecisionTracer", "link_context", "make_exporter"]


@dataclass(slots=True)
class Decision:
    """What the scheduler decided and why; ``name`` is ``shard.assign`` or ``shard.reshard``."""

    id: str
    ts: float                        # source clock
    name: str
    action: str                      # migrate | assign | adopt | no_action
    trigger: str                     # verdict | imbalance | saturation | manual | register | adopt
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

    def attributes(self) -> dict[str, Any]:
        return {
            "shard.id": self.shard_id, "shard.strategy": self.strategy, "target.node": self.node,
            "target.gpus": list(self.target_gpus), "source.gpus": list(self.source_gpus),
            "decision.score": self.score, "decision.trigger": self.trigger, "decision.action": self.action,
            "decision.reason": self.reason, "decision.id": self.id, "decision.ts": self.ts,
            "decision.search": self.method, "decision.candidates_evaluated": self.evaluated,
            "rca.cause": self.cause, "rca.confidence": self.confidence, "node.load.cpu": self.node_cpu,
        }


def link_context(kind: str, ident: str) -> SpanContext:
    """A stable span context for a verdict or alert id (sha256 of ``kind:id``), so links are reproducible."""
    h = hashlib.sha256(f"{kind}:{ident}".encode()).digest()
    return SpanContext(int.from_bytes(h[:16], "big") or 1, int.from_bytes(h[16:24], "big") or 1, is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))


def make_exporter(cfg: OtlpConfig, env: Mapping[str, str]) -> SpanExporter | None:
    """The OTLP span exporter the config (or environment) names, or None when no endpoint is set."""
    base = cfg.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not base:
        return None
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=base, timeout=cfg.timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=base.rstrip("/") + "/v1/traces", timeout=cfg.timeout)


class _Counting(SpanExporter):
    """Wraps the exporter: counts spans handed over, exported, and lost to failed exports."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.handed = self.finished = self.failed = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter bug must cost spans, not the batch thread
            result = SpanExportResult.FAILURE
        with self._lock:
            self.finished += len(spans)
            if result is not SpanExportResult.SUCCESS:
                self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _Bounded(SpanProcessor):
    """Forwards ended spans to the batch processor while fewer than ``cap`` wait; drops (and counts) the rest."""

    def __init__(self, inner: BatchSpanProcessor, counting: _Counting, cap: int) -> None:
        self.inner, self.counting, self.cap = inner, counting, cap
        self.overflow = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        c = self.counting
        if c.handed - c.finished >= self.cap:
            self.overflow += 1
            return
        c.handed += 1
        self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class DecisionTracer:
    """Makes the span of each decision and keeps the last ``keep`` decisions as dicts."""

    def __init__(self, cfg: OtlpConfig, host_name: str, keep: int = 256, *,
                 exporter: SpanExporter | None = None, env: Mapping[str, str] | None = None) -> None:
        exporter = exporter or make_exporter(cfg, os.environ if env is None else env)
        resource = Resource.create({"service.name": "sits-observe", "service.version": __version__,
                                    "host.name": host_name})
        self.provider = TracerProvider(resource=resource)
        self._bounded: _Bounded | None = None
        if exporter is not None:
            counting = _Counting(exporter)
            batch = BatchSpanProcessor(counting, max_queue_size=cfg.max_queue + 1,
                                       schedule_delay_millis=cfg.schedule_delay * 1000,
                                       max_export_batch_size=min(512, cfg.max_queue),
                                       export_timeout_millis=cfg.timeout * 1000)
            self._bounded = _Bounded(batch, counting, cfg.max_queue)
            self.provider.add_span_processor(self._bounded)
        self.tracer = self.provider.get_tracer("sits_observe.scheduler", __version__)
        self.ring: deque[dict[str, Any]] = deque(maxlen=keep)

    @property
    def exporting(self) -> bool:
        return self._bounded is not None

    @property
    def dropped(self) -> int:
        b = self._bounded
        return 0 if b is None else b.overflow + b.counting.failed

    def record(self, d: Decision) -> dict[str, Any]:
        """End the decision's span now (wall-clock timestamps) and keep it in the ring."""
        links = ([Link(link_context("rca.verdict", d.verdict_id),
                       {"link.kind": "rca.verdict", "rca.verdict.id": d.verdict_id})] if d.verdict_id else [])
        links += [Link(link_context("alert", a), {"link.kind": "alert", "alert.id": a}) for a in d.alerts]
        span = self.tracer.start_span(d.name, attributes=d.attributes(), links=links)
        for rank, c in enumerate(d.candidates):
            span.add_event("candidate.scored", {
                "candidate.rank": rank, "candidate.gpus": list(c.gpus), "candidate.score": c.score,
                **{f"score.{t}": v for t, v in c.terms.items()}})
        span.end()
        ctx = span.get_span_context()
        entry = asdict(d) | {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
        entry["candidates"] = [{"gpus": list(c.gpus), "score": c.score, "terms": c.terms} for c in d.candidates]
        entry["node_cpu"] = None if d.node_cpu != d.node_cpu else d.node_cpu
        self.ring.append(entry)
        return entry

    def recent(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Newest first."""
        out = list(reversed(self.ring))
        return out if limit is None else out[:limit]

    def flush(self, timeout: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout * 1000))

    def close(self) -> None:
        self.provider.shutdown()
