"""The scheduler consumer: triggers -> decision (placement search) -> migration walk -> span.

``on_tick`` reads the frame (source clock ``frame.ts`` for every duration), applies actuator outcomes,
fails steps past their timeout, and turns fired triggers into decisions.  The API methods
(``register_shard``, ``manual_reshard``, ``ack``) raise :class:`ConfigError` for malformed input and
:class:`SchedulerError` (:class:`NotFound` for unknown ids) for refused requests, changing nothing then.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..config import validate
from ..errors import ConfigError, SchedulerError
from ..frame import GPU_FIELD_INDEX, Frame, Sample, numa_cpu_by_node
from ..rca.verdict import HEALTHY, Verdict
from ..topology import Topology
from .actuators import Actuator, StepOutcome, build_actuator
from .choose import avoid, pick_shard
from .config import OtlpConfig, SchedulerConfig, ShardSpec
from .migrate import Walker
from .placement import Candidate, GpuLoad, Planner, Result
from .states import NotFound, State
from .store import Placement, PlacementStore
from .tracing import Decision, DecisionTracer
from .triggers import Trigger, Triggers, culprits
from .view import ShardView, gpu_load, in_flight, locked_gpus, request_for, shard_views

__all__ = ["Scheduler", "AckBody"]

log = logging.getLogger("sits_observe.scheduler")
HISTORY_PER_SHARD = 20  # retired/failed placements kept per shard
GPU_STALE_S = 15.0  # GPU values older than this (the GPU source stopped reporting) are not decided on


class AckBody(BaseModel):
    """``POST /api/v1/placements/{id}/ack`` body."""

    model_config = ConfigDict(extra="forbid")
    step: str = Field(pattern=r"^(stage|launch|drain)$")
    ok: bool
    reason: str = Field("", max_length=500)


def _parse(model: type[BaseModel], body: Any, where: str) -> Any:
    """Validate an API body: :class:`ConfigError` (HTTP 400) naming each bad field and value."""
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: body must be a JSON object, got {type(body).__name__}")
    return validate(model, body, where, sep="; ")


class Scheduler:
    """Consumer ``scheduler``; also a metrics provider and the backend of the scheduler API.

    ``sim`` (the simulated host) makes its shards registered at start-up and, with ``actuator: sim``,
    the target of migrations; ``annotate`` receives alert annotations for causes a move cannot fix;
    ``alerts`` names the firing alerts a decision span links to.
    """

    name = "scheduler"

    def __init__(self, cfg: SchedulerConfig, otlp: OtlpConfig, topology: Topology, state_dir: str | Path, *,
                 sim: Any = None, actuator: Actuator | None = None, exporter: Any = None,
                 annotate: Callable[[Mapping[str, str]], None] | None = None,
                 alerts: Callable[[], Iterable[str]] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.topo = cfg, topology
        self.store = PlacementStore(state_dir)
        self.actuator = actuator or build_actuator(cfg, sim, self._step_pending)
        self.planner = Planner(topology, cfg.score_weights(), cfg.exact_limit, cfg.seeds)
        self.walker = Walker(self.store, self.actuator, self._choose, cfg.step_timeout)
        self.triggers = Triggers(cfg, topology.n)
        self.tracer = DecisionTracer(otlp, socket.gethostname(), cfg.decisions_kept, exporter=exporter)
        self.annotate, self.alerts = annotate, alerts
        self._lock = threading.RLock()
        self._verdicts: deque[Verdict] = deque(maxlen=256)
        self._counts: Counter[tuple[str, str]] = Counter()
        n = topology.n
        self._util, self._mem, self._healthy = np.zeros(n), np.full(n, np.nan), np.ones(n, dtype=bool)
        self._total = np.array([g.memory_total_bytes for g in topology.gpus], dtype=np.float64)
        self._values: np.ndarray | None = None
        self._gpu_ts = float("-inf")  # source time of the GPU values above
        self._host_cpu = float("nan")
        self._numa_cpu: dict[int, float] = {}
        self._now = clock()
        self._unplaced: dict[str, ShardSpec] = {}  # config shards waiting for GPU values to be placed
        with self._lock:
            self.walker.resume(self._now)
            for spec in cfg.shards:
                self._ensure(spec, "config")
            for s in sim.shards() if sim is not None else ():
                self._ensure(ShardSpec(id=s.id, model=s.model, workload=s.workload, gpus=len(s.gpus),
                                       memory_per_gpu=int(s.memory_per_gpu), comm_intensity=s.comm_intensity,
                                       placement=list(s.gpus)), "simulator")

    # ---- tick ------------------------------------------------------------------------------------

    def on_verdict(self, verdict: Verdict) -> None:
        """From the RCA engine (any thread); counted into the triggers on the next tick."""
        self._verdicts.append(verdict)

    def on_tick(self, frame: Frame, store: Any = None) -> None:
        with self._lock:
            self._now = ts = frame.ts
            g = frame.gpu
            sampled = g is not None and len(g.info) == self.topo.n
            if sampled:
                self._values, self._gpu_ts = g.values, ts
                self._util = np.nan_to_num(g.values[:, GPU_FIELD_INDEX["utilization_ratio"]], nan=0.0)
                self._mem = g.values[:, GPU_FIELD_INDEX["memory_used_bytes"]]
                self._healthy = np.asarray(g.healthy, dtype=bool)
            self._host_cpu = float(frame.host.get("cpu_utilization_ratio", float("nan")))
            self._numa_cpu = numa_cpu_by_node(frame.samples)
            if sampled:
                self._place_deferred()
            self.walker.poll(ts)
            self.walker.expire(ts)
            fired = []
            while self._verdicts:
                v = self._verdicts.popleft()
                if self.cfg.verdict_on_burn_only and v.trigger != "slo_burn" and v.cause != HEALTHY:
                    continue  # made while nothing burns: only a healthy verdict (which ends a streak) counts
                if (t := self.triggers.on_verdict(v)) is not None:
                    fired.append(t)
            # a tick without a GPU sample counts nothing into the GPU windows; a source silent for longer
            # than GPU_STALE_S re-arms them (NaN) rather than letting its last sample sustain a trigger
            util = mem = None
            if sampled:
                util, mem = np.where(self._healthy, self._util, np.nan), self._mem / self._total
            elif not self._gpu_fresh():
                util = mem = np.full(self.topo.n, np.nan)
            fired += self.triggers.on_frame(ts, util, mem, self._host_cpu)
            for t in fired:
                self._decide(t)

    # ---- decisions -------------------------------------------------------------------------------

    def _gpu_fresh(self) -> bool:
        return self._now - self._gpu_ts <= GPU_STALE_S

    def _gpus_unknown(self) -> str:
        """Why no GPUs may be chosen now, "" when they may: without GPU values for ``GPU_STALE_S`` (none yet
        after a start, or the GPU source silent) every GPU looks empty, also one another tenant has filled."""
        if self._gpu_fresh():
            return ""
        return (f"no GPU values for {GPU_STALE_S:g} s (the GPU source is not reporting), so the targets' free "
                "memory is unknown")

    def _place_deferred(self) -> None:
        """On fresh GPU values: choose the GPUs put off while they were unknown (pending placements found at
        restart, config shards without a placement)."""
        self.walker.place_waiting(self._now)
        unplaced, self._unplaced = self._unplaced, {}
        for spec in unplaced.values():
            try:
                self._ensure(spec, "config")
            except SchedulerError as exc:  # e.g. fits nowhere: a tick goes on; the shard stays unregistered
                log.error("scheduler: config shard %s not registered: %s", spec.id, exc)

    def _decide(self, t: Trigger) -> None:
        if not t.fixable:
            self._no_action(t, t.reason, annotate=True)
            return
        if why := self._gpus_unknown():
            self._no_action(t, f"{t.reason}; {why}: no placement decided on old ones")
            return
        views = self._views()
        implicated = set(t.gpus) or culprits(t.cause, self._values, self.topo, self._numa_cpu)
        view, why_not = pick_shard(t, implicated, views, self.cfg.cooldown, self.store.last_reshard_ts)
        if view is None:
            where = "on any node" if t.other_node else f"on GPUs {sorted(implicated)}"
            self._no_action(t, f"{t.reason}; no movable shard {where}" + (f": {'; '.join(why_not)}" if why_not else ""))
            return
        if in_flight(views) >= self.cfg.max_migrations:
            self._no_action(t, f"{t.reason}; {self.cfg.max_migrations} migrations already in flight")
            return
        req = request_for(view.spec, views, self._util, view.gpus, avoid(self.topo, t, implicated, view))
        load = self._load(views)
        res = self.planner.place(req, load)
        current = self.planner.score(req, load, view.gpus).score
        if res.best is None:
            self._no_action(t, f"{t.reason}; {view.spec.id} {res.reason}", view)
        elif t.kind in ("imbalance", "saturation") and res.best.score < current + self.cfg.min_gain:
            self._no_action(t, f"{t.reason}; best placement for {view.spec.id} {list(res.best.gpus)} scores "
                               f"{res.best.score:.3f} vs {current:.3f} now (min_gain {self.cfg.min_gain})", view)
        else:
            self._migrate(t, view, res)

    def _migrate(self, t: Trigger, view: ShardView, res: Result) -> dict[str, Any]:
        d = self._decision(t, "shard.reshard", "migrate", t.reason, view.spec.id, res, view.gpus)
        p = self.walker.start(view.spec.id, "reshard", d.target_gpus, d.node, t.ts, source=view.serving,
                              decision_id=d.id, reason=t.reason)
        d.placement_id = p.id
        return self._record(d)

    def _no_action(self, t: Trigger, reason: str, view: ShardView | None = None,
                   annotate: bool = False) -> None:
        if t.repeat:  # the episode's first decision already said why; a persisting condition is not news
            return
        d = self._decision(t, "shard.reshard", "no_action", reason, view.spec.id if view else "", None,
                           view.gpus if view else ())
        self._record(d)
        if annotate and self.annotate is not None:
            try:
                self.annotate({"scheduler_action": "none", "scheduler_reason": reason, "scheduler_decision_id": d.id})
            except Exception as exc:  # an alerting hook must not stop decisions
                log.warning("scheduler: annotate hook failed: %s", exc)

    def _decision(self, t: Trigger, name: str, action: str, reason: str, shard_id: str, res: Result | None,
                  source: tuple[int, ...]) -> Decision:
        best = res.best if res is not None else None
        gpus = best.gpus if best else ()
        return Decision(
            id=uuid.uuid4().hex[:16], ts=t.ts, name=name, action=action, trigger=t.kind, reason=reason,
            strategy=self.cfg.strategy if self.cfg.weights is None else "custom", shard_id=shard_id,
            node=self._node(gpus), target_gpus=gpus, source_gpus=source, score=best.score if best else 0.0,
            cause=t.cause, confidence=t.confidence, node_cpu=self._host_cpu, method=res.method if res else "",
            evaluated=res.evaluated if res else 0, verdict_id=t.verdict.id if t.verdict else None,
            alerts=tuple(self.alerts()) if self.alerts else (), candidates=res.candidates if res else [])

    def _record(self, d: Decision) -> dict[str, Any]:
        self._counts[(d.trigger, d.action)] += 1
        log.info("scheduler: %s %s shard=%s gpus=%s->%s: %s", d.name, d.action, d.shard_id or "-",
                 list(d.source_gpus), list(d.target_gpus), d.reason)
        if d.placement_id is not None:
            self.store.prune(HISTORY_PER_SHARD)
        return self.tracer.record(d)

    def _views(self) -> dict[str, ShardView]:
        return shard_views(self.store.shards(), self.store.placements(live=True))

    def _load(self, views: dict[str, ShardView]) -> GpuLoad:
        return gpu_load(views, self._util, self._mem, self._healthy)

    def _node(self, gpus: Iterable[int]) -> str:
        return ",".join(sorted({self.topo.gpus[g].node for g in gpus}))

    def _step_pending(self, placement_id: int, step: str) -> bool:
        """Whether ``step`` of the placement still waits for its outcome (asked from actuator threads)."""
        try:
            return self.store.placement(placement_id).step == step
        except SchedulerError:  # gone (pruned), or the store is closed at shutdown
            return False

    def _choose(self, p: Placement) -> tuple[tuple[int, ...], str] | str | None:
        """GPUs for a placement found pending at restart (its search is redone, away from its source); None
        while the GPU values are unknown (it stays pending until they come: see :meth:`_place_deferred`)."""
        if why := self._gpus_unknown():
            log.info("scheduler: shard %s: placement %d waits for GPU values: %s", p.shard_id, p.id, why)
            return None
        views = self._views()
        src = self.store.placement(p.source_id).gpus if p.source_id is not None else ()
        req = request_for(self.store.shard(p.shard_id), views, self._util, src, frozenset(src))
        res = self.planner.place(req, self._load(views))
        return res.reason if res.best is None else (res.best.gpus, self._node(res.best.gpus))

    # ---- API -------------------------------------------------------------------------------------

    def _ensure(self, spec: ShardSpec, origin: str) -> None:
        """Start-up registration of a config or simulator shard.  A known shard keeps its state, except that a
        simulator shard runs where the simulator says (it restarts from its own layout) and a shard left with
        no live placement is adopted again where it is said to run.  A config shard to be placed waits for GPU
        values (:meth:`_place_deferred`) while they are unknown."""
        v = self._views().get(spec.id)
        if v is None and spec.placement is None and origin == "config" and self._gpus_unknown():
            self._unplaced[spec.id] = spec  # registered (and placed) when GPU values come
            log.info("scheduler: config shard %s waits for GPU values to be placed", spec.id)
        elif v is None:
            self.register_shard(spec.model_dump(), origin)
        elif spec.placement is not None and tuple(sorted(spec.placement)) != v.gpus and (
                origin == "simulator" or not v.live):
            for p in v.live:
                self.store.update(p, self._now, State.FAILED, step=None, reason=f"{origin} runs it on {spec.placement}")
            gpus = tuple(sorted(spec.placement))
            self.walker.adopt(spec.id, gpus, self._node(gpus), self._now, f"running on start-up ({origin})")

    def register_shard(self, body: Any, origin: str = "api") -> dict[str, Any]:
        """``POST /api/v1/shards``: validate, place (or adopt ``placement``), then store; refused -> unchanged."""
        spec: ShardSpec = _parse(ShardSpec, body, "shard")
        with self._lock:
            views = self._views()
            if spec.id in views:
                raise SchedulerError(f"shard {spec.id}: already registered; re-shard it instead")
            if spec.placement is None and (why := self._gpus_unknown()):  # as a re-shard: the target could be full
                raise SchedulerError(f"shard {spec.id}: cannot place: {why}; try again when it reports, or give "
                                     "the placement it runs on")
            req, load = request_for(spec, views, self._util), self._load(views)
            t = Trigger("adopt" if spec.placement else "register", "none", True, self._now, f"registered by {origin}")
            if spec.placement is not None:
                bad = [g for g in spec.placement if not 0 <= g < self.topo.n]
                if bad:
                    raise ConfigError(f"shard {spec.id}: placement: GPUs {bad} not on this host (0-{self.topo.n - 1})")
                c = self.planner.score(req, load, tuple(sorted(spec.placement)))
                res = Result(c, [c], "given", 1)
            else:
                res = self.planner.place(req, load)
                if res.best is None:
                    raise SchedulerError(f"shard {spec.id}: fits nowhere: {res.reason}")
            self.store.add_shard(spec, self._now)
            d = self._decision(t, "shard.assign", t.kind if spec.placement else "assign", t.reason, spec.id, res, ())
            if spec.placement is not None:
                p = self.walker.adopt(spec.id, d.target_gpus, d.node, self._now, t.reason)
            else:
                p = self.walker.start(spec.id, "assign", d.target_gpus, d.node, self._now, decision_id=d.id,
                                      reason=t.reason)
            d.placement_id = p.id
            self._record(d)
            return self._views()[spec.id].to_dict() | {"decision_id": d.id}

    def manual_reshard(self, shard_id: str, reason: Any) -> dict[str, Any]:
        """``POST /api/v1/reshard``: move a launched shard to its best other placement now (no cooldown)."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"reshard: reason: must be a non-empty string saying why, got {reason!r}")
        with self._lock:
            views = self._views()
            view = views.get(shard_id)
            if view is None:
                raise NotFound(f"shard {shard_id}: not registered")
            if view.state is not State.LAUNCHED or view.migrating:
                actual = view.state.value if view.state else "unplaced"
                raise SchedulerError(f"shard {shard_id}: cannot re-shard: expected state launched, actual {actual}")
            if why := self._gpus_unknown():  # the target could be full (as triggers refuse)
                raise SchedulerError(f"shard {shard_id}: cannot re-shard: {why}; try again when it reports")
            if in_flight(views) >= self.cfg.max_migrations:
                raise SchedulerError(f"shard {shard_id}: cannot re-shard: {self.cfg.max_migrations} migrations "
                                     "already in flight (scheduler.max_migrations)")
            if busy := sorted(set(view.gpus) & locked_gpus(views)):
                raise SchedulerError(f"shard {shard_id}: cannot re-shard: GPUs {busy} are in a migration in "
                                     "flight (one migration per GPU); try again when it has finished")
            res = self.planner.place(request_for(view.spec, views, self._util, view.gpus), self._load(views))
            others: list[Candidate] = [c for c in res.candidates if c.gpus != view.gpus]
            if not others:
                raise SchedulerError(f"shard {shard_id}: cannot re-shard: no other placement fits "
                                     f"({res.reason or 'it is on the only one'})")
            t = Trigger("manual", "none", True, self._now, f"manual: {reason.strip()[:200]}")
            return self._migrate(t, view, Result(others[0], others, res.method, res.evaluated))

    def ack(self, placement_id: int, body: Any) -> dict[str, Any]:
        """``POST /api/v1/placements/{id}/ack`` from the orchestrator (webhook actuator)."""
        a: AckBody = _parse(AckBody, body, f"placement {placement_id} ack")
        with self._lock:
            return self.walker.complete(StepOutcome(placement_id, a.step, a.ok, a.reason), self._now).to_dict()

    def shards_state(self) -> dict[str, Any]:
        with self._lock:
            views = self._views()
        return {"strategy": self.cfg.strategy, "actuator": self.actuator.name, "migrations_in_flight": in_flight(views),
                "shards": [v.to_dict() for v in views.values()]}

    def decisions_state(self, limit: int = 100) -> dict[str, Any]:
        return {"exporting": self.tracer.exporting, "spans_dropped": self.tracer.dropped,
                "decisions": self.tracer.recent(limit)}

    def metrics(self) -> Iterable[Sample]:
        with self._lock:
            counts, views, states = dict(self._counts), self._views(), self.store.counts()
        for (trigger, action), n in sorted(counts.items()):
            yield Sample("sits_scheduler_decisions_total", "counter", "Scheduler decisions by trigger and action.",
                         (("trigger", trigger), ("action", action)), float(n))
        yield Sample("sits_scheduler_migrations_in_flight", "gauge", "Shards with a placement on its way.", (),
                     float(in_flight(views)))
        for state, n in states.items():
            yield Sample("sits_scheduler_placement_state", "gauge", "Placements kept, by state.",
                         (("state", state.value),), float(n))
        yield Sample("sits_scheduler_spans_dropped_total", "counter",
                     "ShardDecisionSpans dropped (export queue full or export failed).", (), float(self.tracer.dropped))

    def reload(self, config: Any) -> None:
        """SIGHUP: new thresholds, strategy, timeouts and shards apply now (trigger windows start afresh);
        a different actuator or ``otlp`` section needs a restart."""
        new: SchedulerConfig = config.scheduler
        keep = {"actuator": self.cfg.actuator, "webhook": self.cfg.webhook, "command": self.cfg.command}
        if any(getattr(new, k) != v for k, v in keep.items()):
            log.warning("SIGHUP: scheduler actuator settings changed; they take effect after a restart")
        with self._lock:
            self.cfg = new = new.model_copy(update=keep)
            self.planner = Planner(self.topo, new.score_weights(), new.exact_limit, new.seeds)
            self.triggers = Triggers(new, self.topo.n)
            self.walker.step_timeout = new.step_timeout
            self._unplaced = {}  # the new config says which still wait
            for spec in new.shards:
                self._ensure(spec, "config")

    def close(self) -> None:
        self.actuator.close()
        self.tracer.close()
        self.store.close()
