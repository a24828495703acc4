"""ShardDecisionSpan over real OTLP/HTTP: a local receiver decodes the protobuf the SDK exporter sends.

The migration is real end to end: the simulated host, the ``sim`` actuator (``sim.migrate``), the
scheduler walking the placement states, the span outbox in scheduler.sqlite and the OTLP/HTTP exporter.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otlp_receiver import Receiver, attributes
from sched_helpers import PendingActuator, frame

from sits_observe.config import SimConfig, parse
from sits_observe.errors import ConfigError
from sits_observe.frame import BucketLayout, Frame
from sits_observe.rca.verdict import Verdict
from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.scheduler.store import PlacementStore
from sits_observe.scheduler.tracing import DecisionTracer, link_context
from sits_observe.sim.host import SimulatedHost

ATTRIBUTES = {"shard.id", "shard.strategy", "target.node", "target.gpus", "source.gpus", "decision.score",
              "decision.trigger", "rca.cause", "rca.confidence", "node.load.cpu"}
TERMS = {"score.comm", "score.memory", "score.load", "score.balance", "score.numa"}


def test_reshard_span_after_a_simulated_migration(receiver: Receiver, tmp_path: Path) -> None:
    layout = BucketLayout(parse({}).store.snapped())
    sim = SimulatedHost(SimConfig(topology="nvswitch-8", scenario="quiet"), layout)
    sched = Scheduler(SchedulerConfig(actuator="sim", verdict_consecutive=2), OtlpConfig(endpoint=receiver.url,
                      schedule_delay=0.1), sim.topology, tmp_path, sim=sim, clock=lambda: 1000.0)
    try:
        ts = 1000.0
        verdicts = [Verdict("thermal_throttling", 0.93, ts + i, gpus=(0, 1), trigger="slo_burn", id=f"v{i}")
                    for i in (3, 4)]
        for _ in range(120):
            ts += 1.0
            f = Frame(ts, 1.0)
            sim.collect(f)
            for v in verdicts:
                if v.ts == ts:
                    sched.on_verdict(v)
            sched.on_tick(f)
        shards = {s.id: s.gpus for s in sim.shards()}
        assert shards["chat-0"] == (6, 7)  # the simulator applied the migration
        view = next(v for v in sched.shards_state()["shards"] if v["shard"]["id"] == "chat-0")
        assert (view["state"], view["gpus"], view["migrating"]) == ("launched", [6, 7], False)
        assert sched.tracer.flush()
        assert receiver.got.wait(10)
    finally:
        sched.close()

    moves = [(res, s) for res, s in receiver.spans()
             if s.name == "shard.reshard" and attributes(s)["decision.action"] == "migrate"]
    assert len(moves) == 1
    res, span = moves[0]
    assert res["service.name"] == "sits-observe" and res["host.name"] == socket.gethostname()
    attrs = attributes(span)
    assert set(attrs) >= ATTRIBUTES
    assert attrs["shard.id"] == "chat-0" and attrs["shard.strategy"] == "topology-aware"
    assert attrs["target.gpus"] == [6, 7] and attrs["source.gpus"] == [0, 1] and attrs["target.node"] == "localhost"
    assert attrs["decision.trigger"] == "verdict" and attrs["decision.action"] == "migrate"
    assert attrs["rca.cause"] == "thermal_throttling" and attrs["rca.confidence"] == pytest.approx(0.93)
    assert 0 < attrs["decision.score"] <= 1 and 0 <= attrs["node.load.cpu"] <= 1
    events = [e for e in span.events if e.name == "candidate.scored"]
    assert events, "one candidate.scored event per candidate"
    for e in events:
        ev = attributes(e)
        assert TERMS | {"candidate.gpus", "candidate.score", "candidate.rank"} <= set(ev)
    best = attributes(events[0])
    assert best["candidate.gpus"] == [6, 7] and best["candidate.score"] == pytest.approx(attrs["decision.score"])
    (link,) = span.links
    want = link_context("rca.verdict", "v4")
    assert int.from_bytes(link.trace_id, "big") == want.trace_id and int.from_bytes(link.span_id, "big") == want.span_id
    assert attributes(link) == {"link.kind": "rca.verdict", "rca.verdict.id": "v4"}
    # the same decision is in the local ring with the exported ids
    ring = next(d for d in sched.decisions_state()["decisions"] if d["action"] == "migrate")
    assert ring["trace_id"] == span.trace_id.hex() and ring["span_id"] == span.span_id.hex()
    assert sorted(attributes(s)["shard.id"] for _, s in receiver.spans() if s.name == "shard.assign") == [
        "chat-0", "chat-1", "chat-2"]  # the simulator's shards, adopted at start-up


def test_a_decision_whose_first_step_fails_at_once_says_so(receiver: Receiver, tmp_path: Path) -> None:
    """The simulator refuses to launch a shard it does not run: the placement failed within the decision, yet the
    decision, its span, the API answer and the alert said ``migrate`` / ``assign`` as if it were under way."""
    layout = BucketLayout(parse({}).store.snapped())
    sim = SimulatedHost(SimConfig(topology="nvswitch-8", scenario="quiet"), layout)
    notes: list[dict[str, str]] = []
    sched = Scheduler(SchedulerConfig(actuator="sim"), OtlpConfig(endpoint=receiver.url, schedule_delay=60),
                      sim.topology, tmp_path, sim=sim, annotate=lambda n: notes.append(dict(n)), clock=lambda: 1000.0)
    why = "launch failed: unknown shard 'extra'; shards are chat-0, chat-1, chat-2"
    try:
        f = Frame(1001.0, 1.0)
        sim.collect(f)
        sched.on_tick(f)
        shard = sched.register_shard({"id": "extra", "gpus": 1, "memory_per_gpu": 2**30})
        assert (shard["state"], shard["outcome"], shard["failure"]) == ("unplaced", "failed", why)
        sched.register_shard({"id": "extra-2", "gpus": 1, "memory_per_gpu": 2**30, "placement": [6]})
        moved = sched.manual_reshard("extra-2", "maintenance")
        assert (moved["action"], moved["outcome"]) == ("migrate", "failed")
        assert moved["failure"] == why.replace("'extra'", "'extra-2'")
        assert notes[-1]["scheduler_action"] == "failed" and notes[-1]["scheduler_reason"].endswith(
            f"moving extra-2 [6] -> {list(moved['target_gpus'])} failed: {moved['failure']}")
        ring = {d["id"]: d for d in sched.decisions_state()["decisions"]}
        assert ring[shard["decision_id"]]["outcome"] == "failed" and ring[moved["id"]]["failure"] == moved["failure"]
        assert {d["outcome"] for d in ring.values() if d["shard_id"].startswith("chat")} == {"launched"}
        assert sched.tracer.flush()
    finally:
        sched.close()
    status = {attributes(s)["decision.id"]: (s.status.code, s.status.message) for _, s in receiver.spans()}
    assert status[shard["decision_id"]] == (2, why)  # STATUS_CODE_ERROR
    assert status[moved["id"]] == (2, moved["failure"])
    assert {status[d][0] for d in ring if d not in (shard["decision_id"], moved["id"])} == {0}  # UNSET


def test_collector_down_never_blocks_keeps_spans_and_counts_drops(tmp_path: Path, receiver: Receiver) -> None:
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts connections, never answers
    topology = SimulatedHost(SimConfig(), BucketLayout((0.1, 1.0))).topology
    try:
        otlp = OtlpConfig(endpoint=f"http://127.0.0.1:{hung.getsockname()[1]}", timeout=1.0, max_queue=2,
                          schedule_delay=60)
        sched = Scheduler(SchedulerConfig(), otlp, topology, tmp_path, clock=lambda: 1000.0)
        sched.on_tick(frame(1000.0, n=sched.topo.n))  # GPU values: a new shard is placed where memory is free
        for i in range(5):
            sched.register_shard({"id": f"s{i}", "gpus": 1, "memory_per_gpu": 2**30})
        # the stored ones fail against the hung collector (1 s timeout), after the sender's own first export if
        # that was in flight meanwhile: spans stored during an export are trimmed when it ends
        assert not sched.tracer.flush()
        # max_queue spans wait, kept to be sent again; the 3 oldest were dropped, while the collector hangs
        assert sched.tracer.dropped == 3 and sched.store.span_backlog() == 2
        assert len(sched.decisions_state()["decisions"]) == 5
        got = {s.name: s.value for s in sched.metrics() if s.name.startswith("sits_scheduler_spans_")}
        assert got == {"sits_scheduler_spans_dropped_total": 3.0, "sits_scheduler_spans_pending": 2.0}
        kept = {d["span_id"]: d["shard_id"] for d in sched.decisions_state()["decisions"][:2]}
        sched.close()
    finally:
        hung.close()
    # the next start sends them, with the span ids the decisions had
    again = Scheduler(SchedulerConfig(), OtlpConfig(endpoint=receiver.url), topology, tmp_path, clock=lambda: 2000.0)
    try:
        assert again.tracer.flush()
        assert again.store.span_backlog() == 0
    finally:
        again.close()
    assert {s.span_id.hex(): attributes(s)["shard.id"] for _, s in receiver.spans()} == kept


class WaitsForItsStep(PendingActuator):
    """Closing waits for its step in flight (as the webhook and command actuators do, up to 5 s): here until the
    stored spans have been sent, at most 10 s."""

    def __init__(self) -> None:
        super().__init__()
        self.store: PlacementStore | None = None
        self.spans_sent_meanwhile: bool | None = None

    def close(self) -> None:
        if self.store is None or self.spans_sent_meanwhile is not None:  # closed already (the fixture closes again)
            return
        deadline = time.monotonic() + 10
        while self.store.span_backlog() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.spans_sent_meanwhile = not self.store.span_backlog()


def test_closing_sends_the_stored_spans_beside_the_actuators_wait(make_scheduler: Any, receiver: Receiver) -> None:
    """The last export waited for the actuator's close: with the daemon's 10 s for all parts, a step in flight
    (5 s) left the export (up to 2 * otlp.timeout + 1 s) too little time to send what was stored."""
    act = WaitsForItsStep()
    sched = make_scheduler(actuator=act, otlp=OtlpConfig(endpoint=receiver.url, schedule_delay=60))
    act.store = sched.store
    for i in range(2):  # the sender, woken by the first, waits a minute before it sends: the second stays stored
        sched.register_shard({"id": f"s{i}", "gpus": 1, "memory_per_gpu": 2**30, "placement": [i]})
    assert sched.store.span_backlog() >= 1
    sched.close()
    assert act.spans_sent_meanwhile
    assert sorted(attributes(s)["shard.id"] for _, s in receiver.spans()) == ["s0", "s1"]


def test_grpc_protocol_reaches_a_grpc_collector(tmp_path: Path) -> None:
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    got: list[ExportTraceServiceRequest] = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802
            got.append(request)
            return ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        otlp = OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol="grpc", timeout=5.0)
        sched = Scheduler(SchedulerConfig(), otlp, SimulatedHost(SimConfig(), BucketLayout((0.1, 1.0))).topology,
                          tmp_path, clock=lambda: 1000.0)
        sched.on_tick(frame(1000.0, n=sched.topo.n))  # GPU values: a new shard is placed where memory is free
        sched.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": 2**30, "comm_intensity": 1.0})
        assert sched.tracer.flush()
        sched.close()
    finally:
        server.stop(None)
    spans = [s for req in got for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for s in spans] == ["shard.assign"]
    attrs = attributes(spans[0])
    assert attrs["shard.id"] == "tp2" and len(attrs["target.gpus"]) == 2 and sched.tracer.dropped == 0


def test_a_collector_redirecting_keeps_the_spans_and_says_where_to(tmp_path: Path, receiver: Receiver,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    # the SDK follows no redirect and takes any 3xx for success: the spans were deleted, never delivered
    receiver.redirect = "https://user:pw@collector.example:4318/v1/traces?token=t"
    sched = Scheduler(SchedulerConfig(), OtlpConfig(endpoint=receiver.url, schedule_delay=60),
                      SimulatedHost(SimConfig(), BucketLayout((0.1, 1.0))).topology, tmp_path, clock=lambda: 1000.0)
    try:
        sched.on_tick(frame(1000.0, n=sched.topo.n))
        sched.register_shard({"id": "tp2", "gpus": 2, "memory_per_gpu": 2**30, "comm_intensity": 1.0})
        with caplog.at_level(logging.ERROR, logger="sits_observe.scheduler"):
            assert not sched.tracer.flush()
        assert sched.store.span_backlog() == 1 and sched.tracer.dropped == 0 and receiver.refused >= 1
        (said,) = [r.getMessage() for r in caplog.records if "redirect" in r.getMessage()]
        assert "https://collector.example:4318/v1/traces " in said and "pw" not in said and "token" not in said
        receiver.redirect = None  # the endpoint fixed (here: the collector stops redirecting)
        assert sched.tracer.flush()
    finally:
        sched.close()
    assert [attributes(s)["shard.id"] for _, s in receiver.spans()] == ["tp2"]


def test_spans_a_collector_rejects_in_a_200_are_logged_and_counted(tmp_path: Path, receiver: Receiver,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    receiver.reject = lambda span: attributes(span)["shard.id"] == "s1"  # partial_success: 1 rejected
    sched = Scheduler(SchedulerConfig(), OtlpConfig(endpoint=receiver.url, schedule_delay=60),
                      SimulatedHost(SimConfig(), BucketLayout((0.1, 1.0))).topology, tmp_path, clock=lambda: 1000.0)
    try:
        sched.on_tick(frame(1000.0, n=sched.topo.n))
        for i in range(3):
            sched.register_shard({"id": f"s{i}", "gpus": 1, "memory_per_gpu": 2**30})
        with caplog.at_level(logging.ERROR, logger="sits_observe.scheduler"):
            assert sched.tracer.flush()  # not sent again: the spec says a partial success is not retried
        got = {s.name: s.value for s in sched.metrics() if s.name.startswith("sits_scheduler_spans_")}
        assert got == {"sits_scheduler_spans_dropped_total": 1.0, "sits_scheduler_spans_pending": 0.0}
        assert sched.decisions_state()["spans_dropped"] == 1
    finally:
        sched.close()
    assert sorted(attributes(s)["shard.id"] for _, s in receiver.spans()) == ["s0", "s2"]
    assert any("rejected 1 of" in r.getMessage() and "span attribute value too long" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize(("value", "shown"), [("collector:4318", ""), ("localhost", ""), ("http://", ""),
                                              ("htp://user:pw@collector/SEKRIT?k=1", ": 'htp://collector/<hidden>'")])
def test_a_bad_endpoint_in_the_environment_is_refused_at_start(tmp_path: Path, value: str, shown: str) -> None:
    # otlp.endpoint is checked at load; the environment's stood unchecked and failed every export, quietly; it is
    # shown as config errors show a URL (scheme://host at most: its path and query may be a credential)
    store = PlacementStore(tmp_path)
    try:
        with pytest.raises(ConfigError, match=f"^OTEL_EXPORTER_OTLP_ENDPOINT{re.escape(shown)} must be an http"):
            DecisionTracer(OtlpConfig(), "h", store, env={"OTEL_EXPORTER_OTLP_ENDPOINT": value})
    finally:
        store.close()
