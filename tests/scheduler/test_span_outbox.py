"""No ShardDecisionSpan is lost: spans are stored with their decision and marked exported only on success.

A child process decides and is killed with SIGKILL before any export (the collector is down); a fresh
scheduler on the same state_dir sends what it left to a local receiver decoding the real OTLP protobuf,
with the ids the decisions had.  Failed or raising exports keep spans for the next attempt, with the same
ids; exported ones are deleted; storage stays bounded, and never by deleting a span in flight.  A span the
database refuses (to store, to trim, to delete once exported) costs neither the decision nor a flood of
copies at the collector.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otlp_receiver import Receiver, attributes
from sched_helpers import GiB, frame

from sits_observe.scheduler import span_outbox
from sits_observe.scheduler.actuators import LogActuator
from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.store import PlacementStore, SpanRecord
from sits_observe.scheduler.tracing import Decision, DecisionTracer, decision_ids
from sits_observe.scheduler.triggers import Trigger
from sits_observe.topology import preset

SHARD = {"id": "tp2", "gpus": 2, "memory_per_gpu": 20 * GiB, "comm_intensity": 1.0, "placement": [0, 1]}

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, HELPERS)
    from sched_helpers import frame
    from sits_observe.scheduler import store as st
    from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
    from sits_observe.scheduler.engine import Scheduler
    from sits_observe.topology import preset

    state_dir, endpoint, when = sys.argv[1:4]
    s = Scheduler(SchedulerConfig(shards=[SHARD]), OtlpConfig(endpoint=endpoint, schedule_delay=60),
                  preset("pcie-8"), state_dir, clock=lambda: 1000.0)
    s.on_tick(frame(1000.0))
    if when == "write":  # killed in the re-shard's first write: its placement row and its span
        create = st.PlacementStore.create

        def killed(*args, **kwargs):
            create(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        st.PlacementStore.create = killed
    s.manual_reshard("tp2", "span outbox test")
    ring = [{k: d[k] for k in ("id", "name", "trace_id", "span_id")} for d in s.decisions_state()["decisions"]]
    print(json.dumps(ring), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""").replace("SHARD", repr(SHARD)).replace("HELPERS", repr(str(Path(__file__).parent)))


def refused_url() -> str:
    """A loopback URL nothing listens on: the collector is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("when", ["decision", "write"])
def test_spans_of_a_process_killed_before_export_are_sent_by_the_next_start(tmp_path: Path, receiver: Receiver,
                                                                            when: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), refused_url(), when], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    s = Scheduler(SchedulerConfig(shards=[SHARD]), OtlpConfig(endpoint=receiver.url), preset("pcie-8"), tmp_path,
                  actuator=LogActuator(), clock=lambda: 2000.0)
    try:
        assert s.tracer.flush()
        assert s.store.span_backlog() == 0
        (reshard,) = [p for p in s.store.placements("tp2") if p.kind == "reshard"]
    finally:
        s.close()
    received = {attributes(sp)["decision.id"]: (res, sp) for res, sp in receiver.spans()}
    assert len(receiver.spans()) == len(received) == 2  # the adoption at start-up and the re-shard, once each
    res, span = received[reshard.decision_id]
    attrs = attributes(span)
    assert (span.name, attrs["decision.action"], attrs["decision.trigger"]) == ("shard.reshard", "migrate", "manual")
    assert attrs["shard.id"] == "tp2" and attrs["source.gpus"] == [0, 1] and attrs["target.gpus"] == [2, 3]
    assert (span.trace_id.hex(), span.span_id.hex()) == decision_ids(reshard.decision_id)
    assert [e.name for e in span.events] and {e.name for e in span.events} == {"candidate.scored"}
    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    assert res["service.name"] == "sits-observe" and res["host.name"] == socket.gethostname()
    if when == "decision":  # the ids the killed process showed in its decision log
        ring = json.loads(done.stdout)
        assert {(d["trace_id"], d["span_id"], d["name"]) for d in ring} == {
            (sp.trace_id.hex(), sp.span_id.hex(), sp.name) for _, sp in received.values()}


class FlakyExporter(SpanExporter):
    """Fails (``down="fail"``) or raises (``down="raise"``) while down, or (``down="busy"``) fails every
    request with spans and accepts empty ones, as a collector shedding load does; records the span ids of
    every try with spans and counts the empty ones."""

    def __init__(self) -> None:
        self.down: str | None = "fail"
        self.tries: list[list[str]] = []
        self.empty = 0
        self.accepted = InMemorySpanExporter()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            self.empty += 1
        else:
            self.tries.append([f"{s.context.span_id:016x}" for s in spans])
        if self.down == "raise":
            raise ConnectionError("collector gone")
        if self.down == "fail" or (self.down == "busy" and spans):
            return SpanExportResult.FAILURE
        return self.accepted.export(spans)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def no_sender_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the test's flush() calls send: no sender thread races them (its send at start-up, its retries),
    so the requests counted are the test's own."""
    monkeypatch.setattr(span_outbox.SpanSender, "start", lambda self: None)


def register(s: Scheduler, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        s.register_shard({"id": f"s{i}", "gpus": 1, "memory_per_gpu": GiB})


def test_failed_exports_keep_spans_and_send_them_again_with_the_same_ids(
        make_scheduler: Callable[..., Scheduler]) -> None:
    exporter = FlakyExporter()
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 1)
    assert not s.tracer.flush()
    exporter.down = "raise"
    register(s, 1, start=1)
    assert not s.tracer.flush()
    assert s.store.span_backlog() == 2 and s.tracer.dropped == 0
    exporter.down = None
    assert s.tracer.flush()
    assert s.store.span_backlog() == 0
    sent = {f"{sp.context.span_id:016x}": sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()}
    assert sent == {d["span_id"]: d["shard_id"] for d in s.decisions_state()["decisions"]}
    assert {i for t in exporter.tries for i in t} == set(sent)  # every try carried the same ids
    assert s.tracer.flush() and len(exporter.accepted.get_finished_spans()) == 2  # nothing is sent twice


def test_span_storage_is_bounded(make_scheduler: Callable[..., Scheduler], no_sender_thread: None) -> None:
    exporter = FlakyExporter()
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60, max_queue=3))
    s.on_tick(frame(1000.0))
    register(s, 6)
    assert s.store.span_backlog() == 3 and s.tracer.dropped == 3  # the oldest unexported ones go
    exporter.down = None
    assert s.tracer.flush()
    assert [sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()] == ["s3", "s4", "s5"]
    assert s.store.span_backlog() == 0 and s.tracer.dropped == 3


@pytest.mark.parametrize("broken", ["no ids", "resource not a mapping"])
def test_a_span_that_cannot_be_rebuilt_is_dropped_and_the_rest_sent(make_scheduler: Callable[..., Scheduler],
                                                                    broken: str) -> None:
    exporter = FlakyExporter()
    exporter.down = None
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60))
    if broken == "no ids":
        body: dict[str, Any] = {"name": "shard.reshard"}  # no ids, no times
    else:  # well-formed but for one field: the SDK raises AttributeError on it, which must not end the sender
        d = Decision(id="bad", ts=1000.0, name="shard.reshard", action="no_action", trigger="manual", reason="x",
                     strategy="balanced")
        body = s.tracer.span(d).body | {"resource": ["service.name"]}  # type: ignore[union-attr]
    s.store.add_span(SpanRecord("broken", body))
    s.on_tick(frame(1000.0))
    register(s, 1)
    assert s.tracer.flush()
    assert s.store.span_backlog() == 0 and s.tracer.dropped == 1
    assert [sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()] == ["s0"]


def test_a_clean_stop_sends_what_is_stored(tmp_path: Path) -> None:
    exporter = FlakyExporter()
    exporter.down = None
    s = Scheduler(SchedulerConfig(), OtlpConfig(schedule_delay=60), preset("pcie-8"), tmp_path, exporter=exporter,
                  clock=lambda: 1000.0)
    s.on_tick(frame(1000.0))
    register(s, 2)  # sent after schedule_delay (60 s), or at the stop
    s.close()
    assert [sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()] == ["s0", "s1"]


class SlowExporter(SpanExporter):
    """Accepts every span after ``delay`` seconds; notes a shutdown that came while an export was in flight."""

    def __init__(self, delay: float) -> None:
        self.delay, self.sent, self.in_flight, self.shut_in_flight = delay, 0, False, False
        self.started = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.in_flight = True
        self.started.set()
        time.sleep(self.delay)
        self.sent += len(spans)
        self.in_flight = False
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_in_flight = self.in_flight


def test_a_stop_while_a_backlog_is_sent_ends_within_the_export_timeout(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_outbox, "BATCH", 1)  # a backlog of many requests
    exporter = SlowExporter(0.2)
    store = PlacementStore(tmp_path)
    tracer = DecisionTracer(OtlpConfig(timeout=0.5, schedule_delay=0.01), "h", store, exporter=exporter)
    try:
        for i in range(20):  # 4 s of exports at 0.2 s each
            d = Decision(id=f"d{i}", ts=1000.0, name="shard.reshard", action="no_action", trigger="manual",
                         reason="test", strategy="balanced")
            store.add_span(tracer.span(d))  # type: ignore[arg-type]
            tracer.record(d)
        assert exporter.started.wait(5)
        t0 = time.monotonic()
        tracer.close()
        took = time.monotonic() - t0
        assert not tracer.sender.is_alive()  # type: ignore[union-attr]  # nothing uses the store after the stop
        assert not exporter.shut_in_flight  # the exporter is shut down after its last export, not during it
        assert took < 1.5  # otlp.timeout (0.5 s) and the export in flight, with slack; not the 2 s the join allows
        assert 0 < exporter.sent and store.span_backlog() == 20 - exporter.sent  # the rest waits for the next start
    finally:
        store.close()


def no_action(i: int) -> Decision:
    return Decision(id=f"d{i}", ts=1000.0, name="shard.reshard", action="no_action", trigger="manual", reason="test",
                    strategy="balanced")


def spans_of(decided: list[Decision], state_dir: Path) -> list[SpanRecord]:
    """The spans a tracer makes for ``decided``, to store as an earlier run would have."""
    store = PlacementStore(state_dir)
    maker = DecisionTracer(OtlpConfig(), "h", store, exporter=InMemorySpanExporter())
    try:
        return [span for d in decided if (span := maker.span(d)) is not None]
    finally:
        maker.close()
        store.close()


def refuse(path: Path, *ops: str) -> Callable[[], None]:
    """Make the database refuse ``ops`` (INSERT, UPDATE, DELETE) on stored spans, as a full disk would; returns
    the undo."""
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        for op in ops:
            db.execute(f"CREATE TRIGGER refuse_{op} BEFORE {op} ON spans BEGIN "
                       "SELECT RAISE(ABORT, 'database or disk is full'); END")

    def undo() -> None:
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            for op in ops:
                db.execute(f"DROP TRIGGER refuse_{op}")
    return undo


def stored(path: Path) -> int:
    """Spans in the file, exported or not."""
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT COUNT(*) FROM spans").fetchone()[0])


class GatedExporter(SpanExporter):
    """Accepts every span; its first export waits for ``release``.  ``delivered``: span ids, in order."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.delivered: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.started.set()
        self.release.wait(10)
        self.delivered += [f"{s.context.span_id:016x}" for s in spans]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_spans_in_flight_are_never_trimmed_and_dropped_counts_only_undelivered_ones(tmp_path: Path) -> None:
    exporter = GatedExporter()
    store = PlacementStore(tmp_path)
    decided = [no_action(i) for i in range(7)]
    name = {decision_ids(d.id)[1]: d.id for d in decided}
    spans = spans_of(decided, tmp_path / "earlier")
    for span in spans[:2]:  # left by an earlier run: the first request of the next start
        store.add_span(span)
    tracer = DecisionTracer(OtlpConfig(max_queue=2, schedule_delay=0.01), "h", store, exporter=exporter)
    try:
        assert exporter.started.wait(5)  # d0 and d1 in flight
        for span, d in zip(spans[2:], decided[2:]):  # stored while they are: over max_queue
            store.add_span(span)
            tracer.record(d)
        exporter.release.set()
        assert tracer.flush()
        assert [name[s] for s in exporter.delivered] == ["d0", "d1", "d5", "d6"]  # the newest max_queue waited
        assert tracer.dropped == 3  # d2, d3, d4: each span was either delivered or dropped, never both
        assert stored(store.path) == 0
    finally:
        tracer.close()
        store.close()


def test_spans_exported_but_not_removed_are_not_sent_again_and_back_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(span_outbox, "IDLE_CHECK_S", 0.01)  # a sender that counts no failure would look again soon
    monkeypatch.setattr(span_outbox, "RETRY_INITIAL_S", 0.1)
    caplog.set_level(logging.INFO, "sits_observe.scheduler")
    exporter = FlakyExporter()
    exporter.down = None
    store = PlacementStore(tmp_path)
    (span,) = spans_of([no_action(0)], tmp_path / "earlier")
    store.add_span(span)  # left by an earlier run: sent at the start
    heal = refuse(store.path, "UPDATE", "DELETE")  # the disk is full: an exported span cannot be marked nor deleted
    tracer = DecisionTracer(OtlpConfig(schedule_delay=0.01), "h", store, exporter=exporter)
    try:
        time.sleep(0.7)  # attempts at about 0, 0.1 and 0.3 s (back-off), and maybe 0.7 s
        assert exporter.tries == [[decision_ids("d0")[1]]]  # delivered once, not sent again while it stays stored
        heal()
        assert tracer.flush()
        assert exporter.tries == [[decision_ids("d0")[1]]] and stored(store.path) == 0 and tracer.dropped == 0
    finally:
        tracer.close()
        store.close()
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING and str(tmp_path) in r.getMessage()]
    assert len(problems) == 1 and "disk is full" in problems[0].getMessage()  # once for the streak


def test_exported_spans_are_not_kept(make_scheduler: Callable[..., Scheduler]) -> None:
    exporter = FlakyExporter()
    exporter.down = None
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 3)
    assert s.tracer.flush()
    assert len(exporter.accepted.get_finished_spans()) == 3 and stored(s.store.path) == 0


def test_a_span_the_database_refuses_is_dropped_and_the_decision_stands(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    annotations: list[Mapping[str, str]] = []
    s = Scheduler(SchedulerConfig(), OtlpConfig(schedule_delay=60), preset("pcie-8"), tmp_path,
                  exporter=FlakyExporter(), annotate=annotations.append, clock=lambda: 1000.0)
    try:
        refuse(s.store.path, "INSERT")
        s.decider.decide(Trigger("verdict", "thermal_throttling", False, 1000.0, "GPU 3 throttles"))
        (d,) = s.decisions_state()["decisions"]
        assert (d["action"], d["reason"]) == ("no_action", "GPU 3 throttles")
        assert annotations == [{"scheduler_action": "none", "scheduler_reason": "GPU 3 throttles",
                                "scheduler_decision_id": d["id"]}]
        assert s.decisions_state()["spans_dropped"] == 1
        assert {m.name: m.value for m in s.metrics()}["sits_scheduler_spans_dropped_total"] == 1.0
    finally:
        s.close()
    (line,) = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert line.levelno == logging.ERROR and d["id"] in line.getMessage() and line.exc_info is None


def test_a_trim_the_database_refuses_does_not_refuse_a_started_reshard(make_scheduler: Callable[..., Scheduler],
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    exporter = FlakyExporter()
    exporter.down = None
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60, max_queue=1), shards=[SHARD])
    s.on_tick(frame(1000.0))
    assert s.tracer.flush()  # the adoption's span is sent; the sender waits for a decision, then 60 s
    s.register_shard({"id": "s0", "gpus": 1, "memory_per_gpu": GiB, "placement": [7]})  # its span waits
    refuse(s.store.path, "DELETE")  # the re-shard's span is one too many, and cannot be deleted
    d = s.manual_reshard("tp2", "maintenance")
    assert (d["action"], list(d["source_gpus"]), len(set(d["target_gpus"]) - {0, 1})) == ("migrate", [0, 1], 2)
    assert [p.kind for p in s.store.placements("tp2", live=True)] == ["reshard"]  # it moved: launched, source retired
    (line,) = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert line.levelno == logging.ERROR and "not trimmed" in line.getMessage() and line.exc_info is None


def _poisoned(receiver: Receiver, bad: set[str]) -> None:
    receiver.refuse = lambda span: attributes(span).get("shard.id") in bad


def _flush_until_done(s: Scheduler, tries: int = 40) -> int:
    """Attempts (each ends at its first failed request) until nothing is left; how many it took."""
    for n in range(1, tries + 1):
        if s.tracer.flush():
            return n
    return tries + 1


@pytest.mark.parametrize("bad", [{"s5"}, {"s0"}, {"s37"}, {"s5", "s6"}, {"s3", "s20", "s21"}])
def test_spans_the_collector_refuses_for_good_are_dropped_and_hold_back_none_after_them(
        make_scheduler: Callable[..., Scheduler], receiver: Receiver, bad: set[str],
        caplog: pytest.LogCaptureFixture, no_sender_thread: None) -> None:
    _poisoned(receiver, bad)
    s = make_scheduler(otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 40)  # 40 spans stored, sent oldest first; a 400 for any request holding a bad one
    with caplog.at_level(logging.ERROR, logger="sits_observe.scheduler"):
        assert _flush_until_done(s) == len(bad) + 1  # each bad span: struck, a back-off, struck and dropped
    got = [attributes(sp)["shard.id"] for _, sp in receiver.spans()]
    assert sorted(got) == sorted(f"s{i}" for i in range(40) if f"s{i}" not in bad)  # each good one once
    assert s.store.span_backlog() == 0 and s.tracer.dropped == len(bad)
    assert sum("refused ShardDecisionSpan" in r.getMessage() for r in caplog.records) == len(bad)


@pytest.mark.parametrize("deny", [401, 404])
def test_a_collector_that_refuses_every_request_loses_nothing(make_scheduler: Callable[..., Scheduler],
                                                              receiver: Receiver, deny: int,
                                                              no_sender_thread: None) -> None:
    receiver.deny = deny  # a token missing, a wrong path: the probes are refused too
    s = make_scheduler(otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 12)
    assert _flush_until_done(s, tries=30) == 31 and receiver.refused >= 30
    assert s.store.span_backlog() == 12 and s.tracer.dropped == 0
    receiver.deny = None  # fixed: every span goes, once
    assert _flush_until_done(s) < 10
    assert sorted(attributes(sp)["shard.id"] for _, sp in receiver.spans()) == sorted(f"s{i}" for i in range(12))
    assert s.tracer.dropped == 0


def test_a_refused_span_with_none_after_it_waits_for_newer_ones_to_probe_with(
        make_scheduler: Callable[..., Scheduler], receiver: Receiver, no_sender_thread: None) -> None:
    _poisoned(receiver, {"s4"})
    s = make_scheduler(otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 5)
    assert _flush_until_done(s, tries=12) == 13  # alone, it cannot be told from a collector refusing data
    assert s.store.span_backlog() == 1 and s.tracer.dropped == 0
    register(s, 1, start=5)
    assert not s.tracer.flush()  # s5 taken alone while s4 is refused alone: one strike
    register(s, 1, start=6)
    assert s.tracer.flush()  # and a second
    assert sorted(attributes(sp)["shard.id"] for _, sp in receiver.spans()) == ["s0", "s1", "s2", "s3", "s5", "s6"]
    assert s.store.span_backlog() == 0 and s.tracer.dropped == 1


def test_a_collector_shedding_load_loses_nothing(make_scheduler: Callable[..., Scheduler],
                                                 no_sender_thread: None) -> None:
    exporter = FlakyExporter()
    exporter.down = "busy"  # every request with spans refused, empty ones accepted (a memory limiter)
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 12)
    assert _flush_until_done(s, tries=30) == 31 and exporter.empty >= 30
    assert s.store.span_backlog() == 12 and s.tracer.dropped == 0
    exporter.down = None
    assert _flush_until_done(s) == 1
    assert sorted(sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()) == sorted(
        f"s{i}" for i in range(12))
    assert s.tracer.dropped == 0


@pytest.mark.parametrize(("cap_s", "sizes"), [(600.0, [9, 4, 4, 1]), (0.0, [9, 4, 5])])
def test_a_collector_back_before_the_probe_takes_the_rest_at_once(make_scheduler: Callable[..., Scheduler],
                                                                  monkeypatch: pytest.MonkeyPatch, cap_s: float,
                                                                  sizes: list[int], no_sender_thread: None) -> None:
    class BackAfterOne(FlakyExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            result = super().export(spans)
            self.down = None  # the first request failed; the collector is up from the next one on
            return result

    monkeypatch.setattr(span_outbox, "CAP_S", cap_s)
    exporter = BackAfterOne()
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 9)
    assert s.tracer.flush()  # the failed 9, an accepted empty request, then half as many: 4, and 4 again while
    assert [len(t) for t in exporter.tries] == sizes and exporter.empty == 1  # the size refused bounds them
    assert s.store.span_backlog() == 0 and s.tracer.dropped == 0


def test_a_slow_failure_is_a_collector_down_and_is_not_probed(make_scheduler: Callable[..., Scheduler],
                                                              no_sender_thread: None) -> None:
    class SlowFailure(FlakyExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            if spans:
                time.sleep(0.6)  # the exporter retried a 503 or a refused connection (it waits 1 s or more)
            return super().export(spans)

    exporter = SlowFailure()
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 4)
    assert not s.tracer.flush() and not s.tracer.flush()
    assert exporter.empty == 0 and [len(t) for t in exporter.tries] == [4, 4]


def _struck_once(make_scheduler: Callable[..., Scheduler], receiver: Receiver, n: int) -> Scheduler:
    """``n`` spans stored, s0 refused for good: one attempt ends with s0 struck once (s{n-1} taken alone)."""
    _poisoned(receiver, {"s0"})
    s = make_scheduler(otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, n)
    assert not s.tracer.flush() and s.tracer.dropped == 0
    return s


def test_a_collector_down_between_strikes_clears_them(make_scheduler: Callable[..., Scheduler], receiver: Receiver,
                                                      no_sender_thread: None) -> None:
    s = _struck_once(make_scheduler, receiver, 6)
    receiver.deny = 401  # down for one attempt: the empty request refused too
    assert not s.tracer.flush()
    receiver.deny = None
    assert not s.tracer.flush() and s.tracer.dropped == 0  # struck once again: the first strike was cleared
    assert s.tracer.flush() and s.tracer.dropped == 1
    assert sorted(attributes(sp)["shard.id"] for _, sp in receiver.spans()) == [f"s{i}" for i in range(1, 6)]


def test_strikes_wait_through_an_attempt_with_nothing_to_probe_with(make_scheduler: Callable[..., Scheduler],
                                                                    receiver: Receiver, no_sender_thread: None) -> None:
    s = _struck_once(make_scheduler, receiver, 2)  # s1 taken as the probe: s0 alone is left
    assert not s.tracer.flush() and s.store.span_backlog() == 1  # nothing to probe with: no conclusion
    register(s, 1, start=2)
    assert s.tracer.flush() and s.tracer.dropped == 1  # the strike before the lone attempt still counts
    assert sorted(attributes(sp)["shard.id"] for _, sp in receiver.spans()) == ["s1", "s2"]


def test_the_sender_thread_gets_past_a_refused_span(tmp_path: Path, receiver: Receiver,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_outbox, "RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(span_outbox, "RETRY_MAX_S", 0.05)
    _poisoned(receiver, {"s2"})
    s = Scheduler(SchedulerConfig(), OtlpConfig(endpoint=receiver.url, schedule_delay=0.01), preset("pcie-8"),
                  tmp_path, clock=lambda: 1000.0)
    try:
        s.on_tick(frame(1000.0))
        register(s, 10)
        deadline = time.monotonic() + 30
        while len(receiver.spans()) < 9 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = sorted(attributes(sp)["shard.id"] for _, sp in receiver.spans())
    finally:
        s.close()
    assert got == sorted(f"s{i}" for i in range(10) if i != 2)
    assert s.tracer.dropped == 1


def test_a_collector_down_is_one_log_line_naming_the_cause(make_scheduler: Callable[..., Scheduler],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's OTLP/HTTP exporter logged a warning at each retry and an error at each failed export while the
    collector was down (33 lines in a 24 h soak's 6 wall minutes, for as long as an outage lasts); the sender's own
    line said only "the exporter reported failure". Now: one line per outage, with the SDK's first line as cause."""
    s = make_scheduler(otlp=OtlpConfig(endpoint=refused_url(), timeout=1, schedule_delay=60))
    s.on_tick(frame(1000.0))
    with caplog.at_level(logging.DEBUG):
        register(s, 1)
        assert not s.tracer.flush()
        register(s, 1, start=1)
        assert not s.tracer.flush()
    assert s.store.span_backlog() == 2
    sdk = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert not sdk, sdk
    ours = [r.getMessage() for r in caplog.records if r.name == "sits_observe.scheduler" and "OTLP export" in
            r.getMessage()]
    assert len(ours) == 1 and "(the exporter reported failure: Connection refused)" in ours[0], ours


def test_a_dropped_span_is_logged_with_what_the_exporter_said(make_scheduler: Callable[..., Scheduler],
                                                                receiver: Receiver, caplog: pytest.LogCaptureFixture,
                                                                no_sender_thread: None) -> None:
    """The SDK exporter's lines are held back; its error for each refused request ("code: 400") was the only line
    saying how the collector refused the span the sender then dropped."""
    _poisoned(receiver, {"s5"})
    s = make_scheduler(otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=60))
    s.on_tick(frame(1000.0))
    register(s, 40)
    with caplog.at_level(logging.DEBUG):
        assert _flush_until_done(s) == 2
    (line,) = [r.getMessage() for r in caplog.records if "refused ShardDecisionSpan" in r.getMessage()]
    assert "dropped (the exporter reported failure: Failed to export spans batch code: 400, reason: Bad Request" in line


def test_a_grpc_collector_down_is_named_also_at_debug_level(make_scheduler: Callable[..., Scheduler],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """At debug level the gRPC exporter's first line of a failed export is its debug "Reinitializing gRPC channel ...":
    it was held back and given as the outage's cause, in place of the error that names it."""
    s = make_scheduler(otlp=OtlpConfig(endpoint=refused_url(), protocol="grpc", timeout=1, schedule_delay=60))
    s.on_tick(frame(1000.0))
    with caplog.at_level(logging.DEBUG):
        register(s, 1)
        assert not s.tracer.flush()
    (line,) = [r.getMessage() for r in caplog.records if "OTLP export" in r.getMessage()]
    assert "(the exporter reported failure: " in line and "StatusCode.UNAVAILABLE" in line, line
    assert "Reinitializing" not in line
    sdk = [r.levelno for r in caplog.records if r.name.startswith("opentelemetry")]
    assert sdk and set(sdk) == {logging.DEBUG}  # asked for, passed; the warnings and errors held back


def test_a_grpc_outage_soon_after_another_is_named(make_scheduler: Callable[..., Scheduler],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The gRPC exporter's own filter drops a line the same as the one before it within 20 s; it ran before ours, so
    the line of an outage soon after another never reached it, and the outage's one line named no cause."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    deny = threading.Event()

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC API)
            if deny.is_set():
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        s = make_scheduler(otlp=OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol="grpc", schedule_delay=60))
        s.on_tick(frame(1000.0))
        with caplog.at_level(logging.WARNING):
            for i in range(2):
                deny.set()
                register(s, 1, start=i)
                assert not s.tracer.flush()
                deny.clear()
                assert s.tracer.flush()  # the outage ends
    finally:
        server.stop(None)
    lines = [r.getMessage() for r in caplog.records if "OTLP export" in r.getMessage()]
    assert len(lines) == 2 and all("StatusCode.UNAUTHENTICATED" in line for line in lines), lines
