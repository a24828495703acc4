"""From a fired trigger to a decision: the shard to move, the placement search, and the record of it.

A cause a move cannot fix, GPU values too old to place on, no movable shard, ``max_migrations`` in
flight, no placement that fits, or (imbalance, saturation) none better than staying by ``min_gain``
each make a "no action" decision saying why; otherwise the migration starts.  Every decision, the API's
too, is recorded: a log line, ``sits_scheduler_decisions_total``, its span (stored with the decision's
rows, or alone for a "no action": one the database refuses then is logged and counted as dropped, and the
decision stands) and the tracer's ring.  A decision that wrote a row then prunes old placements; a prune the
database refuses is logged and retried at the next such decision: housekeeping fails no decision.  A decision
that starts a placement (a move, a registration, the API's re-shard) records the state the steps done at once
left it in; one the actuator refused at once is told as failed (decision, span status, log, alert annotation).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import SchedulerError
from ..topology import Topology
from .choose import avoid, pick_shard
from .config import SchedulerConfig, ShardSpec
from .migrate import Walker
from .observed import Observed
from .placement import Candidate, Planner, Result
from .states import State
from .store import Placement, PlacementStore, SpanRecord
from .tracing import Decision, DecisionTracer
from .triggers import Trigger, culprits
from .view import ShardView, in_flight, locked_gpus, request_for, shard_views

__all__ = ["Decider", "HISTORY_PER_SHARD"]

log = logging.getLogger("sits_observe.scheduler")
HISTORY_PER_SHARD = 20  # retired/failed placements kept per shard
WHY_NOT_SHOWN = 8  # shards a "no movable shard" reason names (then "and N more"): it goes into spans and alerts


def _some(why_not: list[str]) -> str:
    """``why_not`` joined, the first :data:`WHY_NOT_SHOWN` of them: one per shard would grow without bound."""
    more = len(why_not) - WHY_NOT_SHOWN
    return "; ".join(why_not[:WHY_NOT_SHOWN]) + (f"; and {more} more" if more > 0 else "")


class Decider:
    """Decides on fired triggers and records every decision; :meth:`configure` applies a new config.

    ``annotate`` receives alert annotations for causes a move cannot fix; ``alerts`` names the firing
    alerts a decision span links to.
    """

    def __init__(self, cfg: SchedulerConfig, topology: Topology, seen: Observed, store: PlacementStore,
                 walker: Walker, tracer: DecisionTracer, *,
                 annotate: Callable[[Mapping[str, str]], None] | None = None,
                 alerts: Callable[[], Iterable[str]] | None = None) -> None:
        self.topo, self.seen, self.store, self.walker, self.tracer = topology, seen, store, walker, tracer
        self.annotate, self.alerts = annotate, alerts
        self.counts: Counter[tuple[str, str]] = Counter()  # (trigger, action)
        self.configure(cfg)

    def configure(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.planner = Planner(self.topo, cfg.score_weights(), cfg.exact_limit, cfg.seeds)

    def views(self) -> dict[str, ShardView]:
        return shard_views(self.store.shards(), self.store.placements(live=True))

    def node(self, gpus: Iterable[int]) -> str:
        return ",".join(sorted({self.topo.gpus[g].node for g in gpus}))

    def decide(self, t: Trigger) -> None:
        if not t.fixable:
            self._no_action(t, t.reason, annotate=True)
            return
        if why := self.seen.gpus_unknown():
            self._no_action(t, f"{t.reason}; {why}: no placement decided on old ones")
            return
        views = self.views()
        implicated = set(t.gpus) or culprits(t.cause, self.seen.values, self.topo, self.seen.numa_cpu)
        view, why_not = pick_shard(t, implicated, views, self.cfg.cooldown, self.store.last_reshard_ts,
                                   self.walker.halted)
        if view is None:
            where = "on any node" if t.other_node else f"on GPUs {sorted(implicated)}"
            self._no_action(t, f"{t.reason}; no movable shard {where}" + (f": {_some(why_not)}" if why_not else ""))
            return
        if in_flight(views) >= self.cfg.max_migrations:
            self._no_action(t, f"{t.reason}; {self.cfg.max_migrations} migrations already in flight")
            return
        req = request_for(view.spec, views, self.seen.util, view.gpus, avoid(self.topo, t, implicated, view))
        load = self.seen.load(views)
        res = self.planner.place(req, load)
        current = self.planner.score(req, load, view.gpus).score
        if res.best is None:
            self._no_action(t, f"{t.reason}; {view.spec.id} {res.reason}", view)
        elif t.kind in ("imbalance", "saturation") and res.best.score < current + self.cfg.min_gain:
            self._no_action(t, f"{t.reason}; best placement for {view.spec.id} {list(res.best.gpus)} scores "
                               f"{res.best.score:.3f} vs {current:.3f} now (min_gain {self.cfg.min_gain})", view)
        else:
            self.migrate(t, view, res)

    def migrate(self, t: Trigger, view: ShardView, res: Result) -> dict[str, Any]:
        """Start moving ``view``'s shard to ``res.best``; returns the recorded decision."""
        d = self.decision(t, "shard.reshard", "migrate", t.reason, view.spec.id, res, view.gpus)
        span = self.tracer.span(d)
        p = self.walker.start(view.spec.id, "reshard", d.target_gpus, d.node, t.ts, source=view.serving,
                              decision_id=d.id, reason=t.reason, span=span)
        moving = f"{t.reason}; moving {view.spec.id} {list(view.gpus)} -> {list(d.target_gpus)}"
        self._started(d, p, span)
        if d.failure:  # the alert must not say the shard moved
            self._annotate("failed", f"{moving} failed: {d.failure}", d)
        else:
            self._annotate("migrate", moving, d)
        return self.record(d)

    def manual(self, t: Trigger, view: ShardView) -> dict[str, Any]:
        """``POST /api/v1/reshard`` of a launched shard: to its best other placement now (no cooldown)."""
        shard_id, views = view.spec.id, self.views()
        if view.state is not State.LAUNCHED or view.migrating:
            actual = view.state.value if view.state is not None else "unplaced"
            raise SchedulerError(f"shard {shard_id}: cannot re-shard: expected state launched, actual {actual}")
        if why := self.seen.gpus_unknown():  # the target could be full (as triggers refuse)
            raise SchedulerError(f"shard {shard_id}: cannot re-shard: {why}; try again when it reports")
        if in_flight(views) >= self.cfg.max_migrations:
            raise SchedulerError(f"shard {shard_id}: cannot re-shard: {self.cfg.max_migrations} migrations "
                                 "already in flight (scheduler.max_migrations)")
        if busy := sorted(set(view.gpus) & locked_gpus(views)):
            raise SchedulerError(f"shard {shard_id}: cannot re-shard: GPUs {busy} are in a migration in "
                                 "flight (one migration per GPU); try again when it has finished")
        req = request_for(view.spec, views, self.seen.util, view.gpus)
        res = self.planner.place(req, self.seen.load(views))
        others: list[Candidate] = [c for c in res.candidates if c.gpus != view.gpus]
        if not others:
            raise SchedulerError(f"shard {shard_id}: cannot re-shard: no other placement fits "
                                 f"({res.reason or 'it is on the only one'})")
        return self.migrate(t, view, Result(others[0], others, res.method, res.evaluated))

    def assign(self, spec: ShardSpec, t: Trigger, res: Result) -> dict[str, Any]:
        """Adopt ``spec`` where its ``placement`` says, or start placing it on ``res.best``; the recorded decision."""
        d = self.decision(t, "shard.assign", t.kind if spec.placement else "assign", t.reason, spec.id, res, ())
        span = self.tracer.span(d)
        if spec.placement is not None:
            p = self.walker.adopt(spec.id, d.target_gpus, d.node, t.ts, t.reason, span)
        else:
            p = self.walker.start(spec.id, "assign", d.target_gpus, d.node, t.ts, decision_id=d.id,
                                  reason=t.reason, span=span)
        self._started(d, p, span)
        return self.record(d)

    def place_again(self, spec: ShardSpec, t: Trigger) -> dict[str, Any]:
        """Place anew a registered shard without a live placement (its placing failed, was refused or timed out),
        as at its registration."""
        if why := self.seen.gpus_unknown():
            raise SchedulerError(f"shard {spec.id}: cannot place: {why}; try again when it reports")
        views = self.views()
        res = self.planner.place(request_for(spec, views, self.seen.util), self.seen.load(views))
        if res.best is None:
            raise SchedulerError(f"shard {spec.id}: fits nowhere: {res.reason}")
        return self.assign(spec.model_copy(update={"placement": None}), t, res)

    def _started(self, d: Decision, p: Placement, span: SpanRecord | None) -> None:
        """Note on ``d`` the placement it started as the steps done at once left it; one that failed then (the
        actuator refused its first step) is told by the decision (``failure``) and its span (status ERROR)."""
        d.placement_id, d.outcome = p.id, p.state.value
        if p.state is State.FAILED:
            d.failure = p.reason
            self.tracer.failed(span, p.reason)

    def _no_action(self, t: Trigger, reason: str, view: ShardView | None = None,
                   annotate: bool = False) -> None:
        if t.repeat:  # the episode's first decision already said why; a persisting condition is not news
            return
        d = self.decision(t, "shard.reshard", "no_action", reason, view.spec.id if view else "", None,
                          view.gpus if view else ())
        self.tracer.add_span(d)  # no row to go with
        self.record(d)
        if annotate:
            self._annotate("none", reason, d)

    def _annotate(self, action: str, reason: str, d: Decision) -> None:
        """What the scheduler did about the firing alerts: a move, or why none (for causes a move cannot fix); a
        later move replaces an earlier "none" on the alert."""
        if self.annotate is None:
            return
        try:
            self.annotate({"scheduler_action": action, "scheduler_reason": reason, "scheduler_decision_id": d.id})
        except Exception as exc:  # an alerting hook must not stop decisions
            log.warning("scheduler: annotate hook failed: %s", exc)

    def decision(self, t: Trigger, name: str, action: str, reason: str, shard_id: str, res: Result | None,
                 source: tuple[int, ...]) -> Decision:
        best = res.best if res is not None else None
        gpus = best.gpus if best else ()
        return Decision(
            id=uuid.uuid4().hex[:16], ts=t.ts, name=name, action=action, trigger=t.kind, reason=reason,
            strategy=self.cfg.strategy if self.cfg.weights is None else "custom", shard_id=shard_id,
            node=self.node(gpus), target_gpus=gpus, source_gpus=source, score=best.score if best else 0.0,
            cause=t.cause, confidence=t.confidence, node_cpu=self.seen.host_cpu, method=res.method if res else "",
            evaluated=res.evaluated if res else 0, verdict_id=t.verdict.id if t.verdict else None,
            alerts=tuple(self.alerts()) if self.alerts else (), candidates=res.candidates if res else [])

    def record(self, d: Decision) -> dict[str, Any]:
        """Log and count ``d`` and keep it in the ring (its span is stored already)."""
        self.counts[(d.trigger, d.action)] += 1
        log.log(logging.WARNING if d.failure else logging.INFO, "scheduler: %s %s shard=%s gpus=%s->%s: %s%s", d.name,
                d.action, d.shard_id or "-", list(d.source_gpus), list(d.target_gpus), d.reason,
                f"; its placement failed at once: {d.failure}" if d.failure else "")
        if d.placement_id is not None:
            try:
                self.store.prune(HISTORY_PER_SHARD)
            except SchedulerError as exc:  # disk full: the decision's rows are stored, its migration under way
                log.error("scheduler: old placements not pruned (retried at the next decision): %s", exc)
        return self.tracer.record(d)
