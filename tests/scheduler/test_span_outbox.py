"""No ShardDecisionSpan is lost: spans are stored with their decision and marked exported only on success.

A child process decides and is killed with SIGKILL before any export (the collector is down); a fresh
scheduler on the same state_dir sends what it left to a local receiver decoding the real OTLP protobuf,
with the ids the decisions had.  Failed or raising exports keep spans for the next attempt, with the same
ids; storage stays bounded.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
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
        assert s.store.span_counts() == (0, 2)
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
    """Fails (``down="fail"``) or raises (``down="raise"``) while down; records the span ids of every try."""

    def __init__(self) -> None:
        self.down: str | None = "fail"
        self.tries: list[list[str]] = []
        self.accepted = InMemorySpanExporter()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.tries.append([f"{s.context.span_id:016x}" for s in spans])
        if self.down == "raise":
            raise ConnectionError("collector gone")
        if self.down == "fail":
            return SpanExportResult.FAILURE
        return self.accepted.export(spans)

    def shutdown(self) -> None:
        pass


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
    assert s.store.span_counts() == (2, 0) and s.tracer.dropped == 0
    exporter.down = None
    assert s.tracer.flush()
    assert s.store.span_counts() == (0, 2)
    sent = {f"{sp.context.span_id:016x}": sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()}
    assert sent == {d["span_id"]: d["shard_id"] for d in s.decisions_state()["decisions"]}
    assert {i for t in exporter.tries for i in t} == set(sent)  # every try carried the same ids
    assert s.tracer.flush() and len(exporter.accepted.get_finished_spans()) == 2  # nothing is sent twice


def test_span_storage_is_bounded(make_scheduler: Callable[..., Scheduler]) -> None:
    exporter = FlakyExporter()
    s = make_scheduler(exporter=exporter, otlp=OtlpConfig(schedule_delay=60, max_queue=3), decisions_kept=16)
    s.on_tick(frame(1000.0))
    register(s, 6)
    assert s.store.span_counts() == (3, 0) and s.tracer.dropped == 3  # the oldest unexported ones go
    exporter.down = None
    assert s.tracer.flush()
    assert [sp.attributes["shard.id"] for sp in exporter.accepted.get_finished_spans()] == ["s3", "s4", "s5"]
    for i in range(6, 26):
        register(s, 1, start=i)
        assert s.tracer.flush()
    assert s.store.span_counts() == (0, 16) and s.tracer.dropped == 3  # exported ones: decisions_kept


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
    assert s.store.span_counts() == (0, 1) and s.tracer.dropped == 1
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
        pending, exported = store.span_counts()
        assert 0 < exporter.sent == exported and pending == 20 - exported  # the rest waits for the next start
    finally:
        store.close()
