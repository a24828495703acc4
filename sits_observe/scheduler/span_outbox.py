"""Sends the stored ShardDecisionSpans to the OTLP exporter: one thread, oldest first, in batches.

A span stays in ``scheduler.sqlite`` (see :mod:`.store`) until the exporter reported success, and is deleted
then, so a kill -9, a collector that is down or slow, or a stop while exports fail loses none: what is left
is sent by a later attempt or the next start, rebuilt from the stored body with the same ids, times and
attributes.  After a failed attempt (the export failed, or the database refused) the thread waits (back-off
1, 2, 4 ... 60 s, with jitter) before it tries again, whatever is stored meanwhile; a batch exported but
not deleted (the database refused) is not sent again: its deletion is retried first.  Otherwise it sends
what a wake (a new span) found ``otlp.schedule_delay`` seconds later, and looks for stored spans every
``IDLE_CHECK_S`` seconds anyway.  Storage is bounded: the newest ``otlp.max_queue`` spans are kept (older
ones are deleted and counted as dropped).  Exports and trims hold one lock, so a span in flight is never
trimmed: what is stored during an export is trimmed when it ends.

A span the collector refuses for good (a 400: a value it cannot take) must not hold back the spans after
it, yet the exporter reports that the same way as a collector that is down.  The exporter retries what
may pass (429, 502-504, connection errors), waiting a second or more first, so a failure back within
``QUICK_S`` was an answer, not an outage.  Only such a failure is followed at once by an empty request
(valid OTLP, no data).  Refused too, the collector refuses everything (a token, a path): back-off as
above.  Accepted, the next request, at once, carries half as many spans (each accepted request doubles the
size again, up to ``BATCH``, or for ``CAP_S`` up to the last size refused), until one span fails alone.  Then the newest
stored span is sent alone: if the collector takes it, it refused the other for its own sake (a strike);
if not, the strikes are cleared; with no other span stored, nothing is concluded.  A span struck
``STRIKES`` times in a row, a back-off apart, is dropped (logged, counted), and any sign of a collector
down clears its strikes.  So a collector down, overloaded (its 503s are retried, hence slow) or shedding
load (every span refused at once, empty requests accepted) loses nothing; a refused span whose newer
spans are refused too holds them back as before, until ``otlp.max_queue`` trims it.
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

from ..backoff import backoff_delay
from ..errors import SchedulerError
from .config import OtlpConfig
from .sdklog import ExporterLines
from .store import PlacementStore, SpanRecord

__all__ = ["SpanSender", "readable", "BATCH"]

log = logging.getLogger("sits_observe.scheduler")

BATCH = 512  # spans per export request (at most)
STRIKES = 2  # a span refused alone while the collector took a newer one, this often in a row, is dropped
QUICK_S = 0.5  # a failure back within this many seconds was not retried by the exporter: an answer, not an outage
CAP_S = 600.0  # a size refused (a request size limit) bounds the batches this long, or until a span is dropped
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

    def __init__(self, store: PlacementStore, exporter: SpanExporter, cfg: OtlpConfig,
                 rng: random.Random | None = None) -> None:
        super().__init__(name="sits-span-export", daemon=True)
        self.store, self.exporter, self.cfg = store, exporter, cfg
        self._sdk_lines = ExporterLines.installed()
        self.rng = rng or random.Random()
        self.dropped = 0  # spans never exported: not stored, over otlp.max_queue, unreadable, or refused
        self.failures = 0  # attempts failed in a row
        self._count = threading.Lock()
        self._sending = threading.Lock()  # exports and trims: a span is never in two requests, nor trimmed in one
        self._delivered: list[int] = []  # exported and not deleted yet (the database refused): never sent again
        self._trim_due = False  # a span was stored: trim as soon as no export holds _sending
        self._limit = BATCH  # spans in the next request: halved after a refusal, doubled after a success
        self._cap, self._cap_until = BATCH, 0.0  # up to this: the last size refused (a request size limit)
        self._suspect: int | None = None  # the span last refused alone while the collector took a newer one
        self._strikes = 0  # how often in a row
        self._wake, self._halt = threading.Event(), threading.Event()
        self._stop_by = math.inf
        self._tidy()  # a max_queue lowered since the last run applies at once

    def add(self, span: SpanRecord) -> None:
        """Store the span of a decision that wrote no row; one the database refuses is logged and counted as
        dropped: the decision stands without it."""
        try:
            self.store.add_span(span)
        except SchedulerError as exc:
            log.error("scheduler: span of decision %s not stored, dropped: %s", span.decision_id, exc)
            self._drop(1)

    def queued(self) -> None:
        """A span was stored: keep the storage bounded, and send it soon."""
        self._trim_due = True
        self._trim_when_free()
        self._wake.set()

    def _trim_when_free(self) -> None:
        """Trim now if a span stored asked for it, unless an export (or a flush) holds the lock: whoever holds
        it calls this again after releasing it.  A trim the database refuses waits for the next."""
        while self._trim_due and self._sending.acquire(blocking=False):
            try:
                self._trim_due = False
                self._tidy()
            except SchedulerError as exc:
                log.error("scheduler: stored ShardDecisionSpans not trimmed: %s", exc)
            finally:
                self._sending.release()

    def flush(self, timeout: float) -> bool:
        """Export what is stored now, within ``timeout`` seconds; True when none is left unexported."""
        deadline = time.monotonic() + timeout
        if not self._sending.acquire(timeout=timeout):
            return False
        try:
            return self._send(deadline)
        finally:
            self._sending.release()
            self._trim_when_free()

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
            self._trim_when_free()
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
        return backoff_delay(self.failures, RETRY_INITIAL_S, RETRY_MAX_S, 2.0, JITTER, self.rng)

    def _tidy(self) -> None:
        """Delete the spans exported, then all but the newest ``otlp.max_queue`` (dropped); under ``_sending``."""
        if self._delivered:
            self.store.drop_spans(self._delivered)
            self._delivered = []
        self._drop(self.store.trim_spans(self.cfg.max_queue))

    def _drop(self, n: int) -> None:
        with self._count:
            self.dropped += n

    def _send(self, deadline: float = math.inf) -> bool:
        """Export stored spans oldest first, a batch at a time while ``deadline`` (monotonic) has not passed;
        True when none is left.  A request failed while the collector is down ends it: its spans stay
        stored.  A stop ends it by its own deadline too, also a send that began before it (a backlog of
        many requests).  Under ``_sending``."""
        try:
            self._tidy()  # first what an earlier attempt exported and could not delete
            while time.monotonic() < min(deadline, self._stop_by):
                batch = self._batch(self._limit)
                if not batch:
                    self._succeeded()
                    return True
                started = time.monotonic()
                if why := self._export(batch):
                    if self._refused(batch, why, time.monotonic() - started, min(deadline, self._stop_by)):
                        continue
                    return self._failed(logging.WARNING, f"OTLP export of {len(batch)} ShardDecisionSpan(s) failed "
                                        f"({why}); they stay in {self.store.path} and are sent again with back-off")
                self._delivered = [q for q, _ in batch]
                self._tidy()
                if batch[0][0] == self._suspect or time.monotonic() >= self._cap_until:
                    self._cap = BATCH  # the refusals were the suspect's (passing now), or are old
                self._suspect, self._strikes = None, 0
                self._limit = min(self._cap, 2 * self._limit)
                self._succeeded()
            return not self.store.pending_spans(1)
        except SchedulerError as exc:  # the database itself (disk full, closed at shutdown)
            if self._halt.is_set():
                return False
            return self._failed(logging.ERROR, f"ShardDecisionSpans not sent, or sent and not deleted (they are not "
                                f"sent again), tried again with back-off: {exc}")

    def _failed(self, level: int, why: str) -> bool:
        """Count a failed attempt (the next one waits the back-off); the first of a streak logs ``why``."""
        if not self.failures:
            log.log(level, "scheduler: %s", why)
        self.failures += 1
        return False

    def _succeeded(self) -> None:
        if self.failures:
            log.info("scheduler: sending ShardDecisionSpans works again")
        self.failures = 0

    def _refused(self, batch: list[tuple[int, ReadableSpan]], why: str, took: float, deadline: float) -> bool:
        """After a failed request (``why``: :meth:`_export`'s words): True when the collector refused it for its spans
        and the attempt goes on at once (with half as many spans, or without the span dropped); False for a
        back-off."""
        if took >= QUICK_S or self._stopping(deadline) or self._export([]) is not None:
            self._strikes = 0  # down, retried, hung, or stopping
            return False
        if len(batch) > 1:
            self._limit = self._cap = max(1, len(batch) // 2)
            self._cap_until = time.monotonic() + CAP_S
            return True
        seq = batch[0][0]
        probe = self._batch(1, newest=True)
        if not probe or probe[0][0] == seq or self._stopping(deadline):
            return False  # nothing else to try: no evidence either way, the strikes stay
        if self._export(probe) is not None:
            self._strikes = 0  # it takes no data at all (shedding load)
            return False
        self._delivered = [probe[0][0]]
        self._tidy()
        self._strikes = self._strikes + 1 if seq == self._suspect else 1
        self._suspect = seq
        if self._strikes < STRIKES:
            return False  # once more after the back-off
        log.error("scheduler: OTLP collector refused ShardDecisionSpan %d of %s alone %d times in a row while it "
                  "took a newer one; dropped (%s; the collector's log says more)", seq, self.store.path, self._strikes,
                  why)
        self._drop(self.store.drop_spans([seq]))
        self._suspect, self._strikes, self._limit, self._cap = None, 0, BATCH, BATCH  # explained: no size limit
        return True

    def _stopping(self, deadline: float) -> bool:
        return self._halt.is_set() or time.monotonic() >= deadline

    def _batch(self, n: int, newest: bool = False) -> list[tuple[int, ReadableSpan]]:
        """The oldest (or newest) ``n`` stored spans, rebuilt; one that cannot be rebuilt is deleted (counted
        as dropped)."""
        while rows := self.store.pending_spans(n, newest):
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

    def _export(self, batch: list[tuple[int, ReadableSpan]]) -> str | None:
        """None when the exporter accepted ``batch``, else why not (with the first line the SDK's exporter logged)."""
        self._sdk_lines.reset()
        try:
            ok = self.exporter.export([s for _, s in batch]) is SpanExportResult.SUCCESS
        except Exception as exc:  # noqa: BLE001 - an exporter bug must cost a retry, not the thread
            return f"the exporter raised {type(exc).__name__}"
        said = getattr(getattr(self.exporter, "session", None), "error", None) or self._sdk_lines.first()
        return None if ok else "the exporter reported failure" + (f": {said}" if said else "")
