"""Sends the stored ShardDecisionSpans to the OTLP exporter: one thread, oldest first, in batches.

A span stays in ``scheduler.sqlite`` (see :mod:`.store`) until the exporter reported success, so a kill -9,
a collector that is down or slow, or a stop while exports fail loses none: what is left is sent by a
later attempt or the next start, rebuilt from the stored body with the same ids, times and attributes.
After a failed export the thread waits (back-off 1, 2, 4 ... 60 s, with jitter) before it tries again,
whatever is stored meanwhile; otherwise it sends what a wake (a new span) found ``otlp.schedule_delay``
seconds later, and looks for stored spans every ``IDLE_CHECK_S`` seconds anyway.  Storage is bounded:
the newest ``otlp.max_queue`` unexported spans are kept (older ones are deleted and counted as dropped),
and the newest ``decisions_kept`` exported ones.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..errors import SchedulerError
from .config import OtlpConfig
from .store import PlacementStore

__all__ = ["SpanSender", "readable", "BATCH"]

log = logging.getLogger("sits_observe.scheduler")

BATCH = 512  # spans per export request
RETRY_INITIAL_S, RETRY_MAX_S, JITTER = 1.0, 60.0, 0.1
IDLE_CHECK_S = 10.0  # a span stored without a wake (its decision's walk raised after the write) waits no longer


def _context(d: dict[str, Any], remote: bool) -> SpanContext:
    return SpanContext(int(d["trace_id"], 16), int(d["span_id"], 16), is_remote=remote,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))


def readable(body: str) -> ReadableSpan:
    """The span stored as ``body`` (JSON, made by :meth:`.tracing.DecisionTracer.span`), for the exporter."""
    b = json.loads(body)
    return ReadableSpan(
        name=b["name"], context=_context(b, remote=False), kind=SpanKind[b["kind"]],
        resource=Resource(b["resource"]), instrumentation_scope=InstrumentationScope(**b["scope"]),
        attributes=b["attributes"], start_time=b["start_ns"], end_time=b["end_ns"],
        events=[Event(e["name"], e["attributes"], e["ts_ns"]) for e in b["events"]],
        links=[Link(_context(k, remote=True), k["attributes"]) for k in b["links"]],
        status=Status(StatusCode[b["status"]["code"]], b["status"]["description"]))


class SpanSender(threading.Thread):
    """Exports the spans ``store`` holds; :meth:`queued` after storing one, :meth:`stop` to end."""

    def __init__(self, store: PlacementStore, exporter: SpanExporter, cfg: OtlpConfig, kept: int,
                 rng: random.Random | None = None) -> None:
        super().__init__(name="sits-span-export", daemon=True)
        self.store, self.exporter, self.cfg, self.kept = store, exporter, cfg, kept
        self.rng = rng or random.Random()
        self.dropped = 0  # unexported spans deleted (over otlp.max_queue, or unreadable)
        self.failures = 0  # exports failed in a row
        self._count = threading.Lock()
        self._sending = threading.Lock()  # one export at a time: a span is never in two requests
        self._wake, self._halt = threading.Event(), threading.Event()
        self._stop_by = math.inf
        self._trim()  # a max_queue lowered since the last run applies at once

    def queued(self) -> None:
        """A span was stored: keep the storage bounded, and send it soon."""
        self._trim()
        self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Export what is stored now, within ``timeout`` seconds; True when none is left unexported."""
        deadline = time.monotonic() + timeout
        if not self._sending.acquire(timeout=timeout):
            return False
        try:
            return self._send(deadline)
        finally:
            self._sending.release()

    def stop(self) -> None:
        """End the thread and shut the exporter down.  Unless exports are failing, what is stored is sent
        first, for at most ``otlp.timeout`` seconds; anything left is sent by the next start."""
        self._stop_by = time.monotonic() + self.cfg.timeout
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join(2 * self.cfg.timeout + 1)  # an export in flight, then the last one
        self.exporter.shutdown()

    def run(self) -> None:
        while not self._halt.is_set():
            with self._sending:
                self._send()
            if self.failures:  # a collector that is down is not asked sooner, whatever is stored meanwhile
                self._halt.wait(self._delay())
                continue
            self._wake.wait(IDLE_CHECK_S)
            self._wake.clear()
            self._halt.wait(self.cfg.schedule_delay)  # what follows a wake goes in the same request
        if not self.failures:
            with self._sending:
                self._send(self._stop_by)

    def _delay(self) -> float:
        delay = min(RETRY_MAX_S, RETRY_INITIAL_S * 2.0 ** min(self.failures - 1, 16))
        return delay * (1.0 + self.rng.uniform(-JITTER, JITTER))

    def _trim(self) -> None:
        self._drop(self.store.trim_spans(self.cfg.max_queue, self.kept))

    def _drop(self, n: int) -> None:
        with self._count:
            self.dropped += n

    def _send(self, deadline: float = math.inf) -> bool:
        """Export stored spans oldest first, a batch at a time while ``deadline`` (monotonic) has not passed;
        True when none is left.  A failed export ends it: its spans stay stored.  A stop ends it by its own
        deadline too, also a send that began before it (a backlog of many requests)."""
        try:
            while time.monotonic() < min(deadline, self._stop_by):
                batch = self._batch()
                if not batch:
                    return True
                if not self._export(batch):
                    return False
            return not self.store.pending_spans(1)
        except SchedulerError as exc:  # the database itself (disk full, closed at shutdown)
            if not self._halt.is_set():
                log.error("scheduler: ShardDecisionSpans not sent: %s", exc)
            return False

    def _batch(self) -> list[tuple[int, ReadableSpan]]:
        """The oldest stored spans, rebuilt; one that cannot be rebuilt is deleted (counted as dropped)."""
        while rows := self.store.pending_spans(BATCH):
            batch, bad = [], []
            for seq, body in rows:
                try:
                    batch.append((seq, readable(body)))
                except Exception as exc:  # noqa: BLE001 - the SDK's classes raise more than these (AttributeError)
                    log.error("%s: span %d cannot be rebuilt (%s: %s); dropped", self.store.path, seq,
                              type(exc).__name__, exc)
                    bad.append(seq)
            if bad:
                self.store.drop_spans(bad)
                self._drop(len(bad))
            if batch:
                return batch
        return []

    def _export(self, batch: list[tuple[int, ReadableSpan]]) -> bool:
        try:
            ok = self.exporter.export([s for _, s in batch]) is SpanExportResult.SUCCESS
        except Exception as exc:  # noqa: BLE001 - an exporter bug must cost a retry, not the thread
            log.error("scheduler: span exporter raised %s", type(exc).__name__)
            ok = False
        if not ok:
            if not self.failures:
                log.warning("scheduler: OTLP export of %d ShardDecisionSpan(s) failed; they stay in %s and are "
                            "sent again with back-off", len(batch), self.store.path)
            self.failures += 1
            return False
        if self.failures:
            log.info("scheduler: OTLP export of ShardDecisionSpans works again")
        self.failures = 0
        self.store.spans_exported([q for q, _ in batch], time.time())
        self._trim()
        return True
