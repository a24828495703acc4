"""The scheduler consumer: triggers -> decision (placement search) -> migration walk -> span.

``on_tick`` reads the frame (source clock ``frame.ts`` for every duration), applies actuator outcomes,
fails steps past their timeout, and hands fired triggers to the :class:`~.decide.Decider`.  The API methods
(``register_shard``, ``remove_shard``, ``manual_reshard``, ``ack``) raise :class:`ConfigError` for malformed input and
:class:`SchedulerError` (:class:`NotFound` for unknown ids) for refused requests, changing nothing then.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..closing import side_by_side
from ..errors import ConfigError, SchedulerError
from ..frame import Frame, Sample
from ..rca.verdict import Verdict
from ..snapshot import Snapshot
from ..topology import Topology
from .actuators import Actuator, StepOutcome, build_actuator
from .bodies import AckBody, clip, parse_body
from .config import OtlpConfig, SchedulerConfig, ShardSpec
from .decide import Decider
from .migrate import Walker
from .metrics import samples
from .observed import Observed
from .placement import Result
from .registry import on_this_host, register, remove, remove_unlisted, unlisted
from .states import NotFound, State
from .store import Placement, PlacementStore
from .tracing import DecisionTracer
from .triggers import Trigger, Triggers
from .view import ShardView, in_flight, request_for, spec_changes

__all__ = ["Scheduler", "AckBody"]

log = logging.getLogger("sits_observe.scheduler")


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
        for spec in cfg.shards:  # refused before anything is opened, as at a SIGHUP
            on_this_host(spec, topology)
        self.store = PlacementStore(state_dir)
        self.actuator = actuator or build_actuator(cfg, sim, self._step_pending)
        self.walker = Walker(self.store, self.actuator, self._choose, cfg.step_timeout)
        self.triggers = Triggers(cfg, topology.n)
        self.tracer = DecisionTracer(otlp, socket.gethostname(), self.store, cfg.decisions_kept, exporter=exporter)
        self.seen = Observed(topology, clock(), dry_run=self.actuator.name == "log")
        self.decider = Decider(cfg, topology, self.seen, self.store, self.walker, self.tracer, annotate=annotate,
                               alerts=alerts)
        self._lock = threading.RLock()
        # decision counts, shard views, and the time of the newest frame then (source clock): _changing
        self._published: tuple[dict[Any, int], dict[str, Any], float] = ({}, {}, self.seen.now)
        # placements by state and spans waiting, read under the store's lock: the last ones while a write holds it
        self._tallies: Snapshot[tuple[dict[State, int], int]] = Snapshot(self.store.lock, ({}, 0))
        self._verdicts: deque[Verdict] = deque(maxlen=256)
        self._unplaced: dict[str, ShardSpec] = {}  # config shards waiting for GPU values to be placed
        self._simulated = frozenset(s.id for s in sim.shards()) if sim is not None else frozenset()
        with self._changing():
            self._remove_unlisted()  # before steps in flight are sent again: a dropped shard's are not
            self.walker.resume(self.seen.now)
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
        with self._changing():
            ts = frame.ts
            if sampled := self.seen.read(frame):
                self._place_deferred()
            self.walker.poll(ts)
            self.walker.expire(ts)
            if self.walker.halted:  # dropped from the config while a placement was in flight
                self.walker.halted = remove_unlisted(self.decider, self.walker.halted, announce=False)
            fired = self.triggers.on_verdicts(self._verdicts, ts, frozenset(g.index for g in self.topo.gpus))
            fired += self.triggers.on_frame(ts, *self.seen.windows(sampled), self.seen.host_cpu)
            failed: list[SchedulerError] = []
            for t in fired:  # one that cannot be recorded (scheduler.sqlite locked) neither costs the others nor
                try:  # its own next chance: it may fire again at the next verdict or tick
                    self.decider.decide(t)
                except SchedulerError as exc:
                    self.triggers.retract(t)
                    failed.append(exc)
            if failed:
                raise failed[0]

    # ---- placements ------------------------------------------------------------------------------

    def _place_deferred(self) -> None:
        """On fresh GPU values: choose the GPUs put off while they were unknown (pending placements found at
        restart, config shards without a placement)."""
        self.walker.place_waiting(self.seen.now)
        unplaced, self._unplaced = self._unplaced, {}
        self._ensure_each(unplaced.values())

    def _ensure_each(self, specs: Iterable[ShardSpec]) -> None:
        """:meth:`_ensure` each config shard; one refused (fits nowhere) is logged and the others go on."""
        for spec in specs:
            try:
                self._ensure(spec, "config")
            except SchedulerError as exc:  # e.g. fits nowhere: a tick goes on; the shard stays unplaced
                log.error("scheduler: config shard %s not placed: %s", spec.id, exc)

    def _step_pending(self, placement_id: int, step: str) -> bool:
        """Whether ``step`` of the placement still waits for its outcome (asked from actuator threads)."""
        try:
            return self.store.placement(placement_id).step == step
        except SchedulerError:  # gone (pruned), or the store is closed at shutdown
            return False

    def _choose(self, p: Placement) -> tuple[tuple[int, ...], str] | str | None:
        """GPUs for a placement found pending at restart (its search is redone, away from its source); None
        while the GPU values are unknown (it stays pending until they come: see :meth:`_place_deferred`)."""
        if why := self.seen.gpus_unknown():
            log.info("scheduler: shard %s: placement %d waits for GPU values: %s", p.shard_id, p.id, why)
            return None
        views = self.decider.views()
        src = self.store.placement(p.source_id).gpus if p.source_id is not None else ()
        req = request_for(self.store.shard(p.shard_id), views, self.seen.util, src, frozenset(src))
        res = self.decider.planner.place(req, self.seen.load(views))
        return res.reason if res.best is None else (res.best.gpus, self.decider.node(res.best.gpus))

    # ---- API -------------------------------------------------------------------------------------

    def _ensure(self, spec: ShardSpec, origin: str) -> None:
        """Start-up registration of a config or simulator shard.  A known config shard's changed spec is stored (its
        placements stay where they are until it is re-sharded).  A known shard keeps its state, except that a
        simulator shard runs where the simulator says (it restarts from its own layout) and a shard left with
        no live placement is adopted again where it is said to run, or, given no placement, placed again.  A
        config shard to be placed waits for GPU values (:meth:`_place_deferred`) while they are unknown."""
        v = self.decider.views().get(spec.id)
        if v is not None and origin == "config":
            v = self._respec(v, spec)
        if (v is None or not v.live) and spec.placement is None and origin == "config" and self.seen.gpus_unknown():
            self._unplaced[spec.id] = spec  # registered (and placed) when GPU values come
            log.info("scheduler: config shard %s waits for GPU values to be placed", spec.id)
        elif v is None:
            self.register_shard(spec.model_dump(), origin)
        elif not v.live and spec.placement is None and origin == "config":  # its placing failed before a restart
            self.decider.place_again(v.spec, Trigger("register", "none", True, self.seen.now, "placed again (config)"))
        elif spec.placement is not None and tuple(sorted(spec.placement)) != v.gpus and (
                origin == "simulator" or not v.live):
            on_this_host(spec, self.topo)
            now, views = self.seen.now, self.decider.views()
            for p in v.live:
                self.store.update(p, now, State.FAILED, step=None, reason=f"{origin} runs it on {spec.placement}")
            c = self.decider.planner.score(request_for(spec, views, self.seen.util), self.seen.load(views),
                                           tuple(sorted(spec.placement)))
            self.decider.assign(spec, Trigger("adopt", "none", True, now, f"running on start-up ({origin})"),
                                Result(c, [c], "given", 1))  # recorded and traced as any adoption

    def _remove_unlisted(self) -> None:
        """Remove the shards the config no longer lists (its own: see :mod:`.registry`); those with a placement in
        flight are halted (no stage or launch sent for them any more) and removed once it has failed or finished.
        Not looked for (the database refused), those halted stay so, unless the config lists them again."""
        gone = unlisted(self.decider, self._simulated)
        if gone is None:
            self.walker.halted -= {s.id for s in self.cfg.shards}
            return
        self.walker.halted = remove_unlisted(self.decider, gone, announce=True)

    def _respec(self, v: ShardView, spec: ShardSpec) -> ShardView:
        """Store the changed fields of a registered config shard; not while it migrates (the plans of the steps
        still to come would describe another shard than the GPUs they carry)."""
        if not (changed := spec_changes(v.spec, spec)):
            return v
        what = ", ".join(changed.values())
        if v.migrating:
            log.warning("scheduler: config shard %s changed: %s; not applied while it migrates: reload again when "
                        "it has finished", spec.id, what)
            return v
        self.store.replace_shard(spec.model_copy(update={"placement": None}))
        resize = v.live and {"gpus", "memory_per_gpu"} & set(changed)
        log.warning("scheduler: config shard %s changed: %s%s", spec.id, what,
                    "; re-shard it (POST /api/v1/reshard) to place it for the new spec" if resize else "")
        return self.decider.views()[spec.id]

    def register_shard(self, body: Any, origin: str = "api") -> dict[str, Any]:
        """``POST /api/v1/shards``: validate, place (or adopt ``placement``), then store; refused -> unchanged."""
        spec: ShardSpec = parse_body(ShardSpec, body, "shard")
        on_this_host(spec, self.topo)
        with self._changing():
            return register(self.decider, spec, origin)

    def remove_shard(self, shard_id: str) -> dict[str, Any]:
        """``DELETE /api/v1/shards/<id>``: stop tracking a shard; refused (in flight, declared by the config or the
        simulator) -> unchanged (see :mod:`.registry`)."""
        with self._changing():
            removed = remove(self.decider, shard_id, self._simulated)
            self.walker.halted.discard(shard_id)  # the same id registered again is not the config's dropped shard
            return removed

    def manual_reshard(self, shard_id: str, reason: Any) -> dict[str, Any]:
        """``POST /api/v1/reshard``: move a launched shard to its best other placement now (no cooldown), or
        place again a shard that serves nowhere (its placing failed)."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"reshard: reason: must be a non-empty string saying why, got {clip(reason)}")
        with self._changing():
            view = self.decider.views().get(shard_id)
            if view is None:
                raise NotFound(f"shard {shard_id}: not registered")
            if shard_id in self.walker.halted:  # its next placement would fail at once, and the shard go with it
                raise SchedulerError(f"shard {shard_id}: cannot re-shard: it is no longer in the config "
                                     "(scheduler.shards) and is removed at the next tick")
            t = Trigger("manual", "none", True, self.seen.now, f"manual: {' '.join(reason.split())[:200]}")  # 1 line
            return self.decider.place_again(view.spec, t) if view.state is None else self.decider.manual(t, view)

    def ack(self, placement_id: int, body: Any) -> dict[str, Any]:
        """``POST /api/v1/placements/{id}/ack`` from the orchestrator (webhook actuator)."""
        a: AckBody = parse_body(AckBody, body, f"placement {placement_id} ack")
        with self._changing():
            return self.walker.complete(StepOutcome(placement_id, a.step, a.ok, a.reason), self.seen.now).to_dict()

    def shards_state(self) -> dict[str, Any]:
        _, views, as_of = self._published
        return {"strategy": self.cfg.strategy, "actuator": self.actuator.name, "as_of": as_of,
                "migrations_in_flight": in_flight(views), "shards": [v.to_dict() for v in views.values()]}

    def decisions_state(self, limit: int = 100) -> dict[str, Any]:
        return {"exporting": self.tracer.exporting, "spans_dropped": self.tracer.dropped,
                "decisions": self.tracer.recent(limit), "last_move": self.tracer.last_move}

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """The lock, for a change; the state the readers see (/metrics, /api/v1/shards, the UI) is published once
        it is made (or refused), so that they never wait for a tick (one stuck in a slow database write held them,
        and with them the HTTP workers) nor read the database themselves."""
        with self._lock:
            try:
                yield
            finally:
                with contextlib.suppress(SchedulerError):  # a database error while reading: the last state stays
                    self._published = (dict(self.decider.counts), self.decider.views(), self.seen.now)

    def metrics(self) -> Iterable[Sample]:
        counts, views, _ = self._published
        states, pending = self._tallies.read(lambda: (self.store.counts(), self.store.span_backlog()))
        return samples(counts, in_flight(views), states, pending, self.tracer.dropped)

    def reload(self, config: Any) -> None:
        """SIGHUP: new thresholds, strategy, timeouts and shards apply now (trigger windows start afresh; a shard the
        config no longer lists is removed); a different actuator or ``otlp`` section needs a restart."""
        new: SchedulerConfig = config.scheduler
        keep = {"actuator": self.cfg.actuator, "webhook": self.cfg.webhook, "command": self.cfg.command}
        if any(getattr(new, k) != v for k, v in keep.items()):
            log.warning("SIGHUP: scheduler actuator settings changed; they take effect after a restart")
        if self.cfg.actuator == "command" and new.step_timeout <= self.cfg.command.timeout:  # the running command's
            log.warning("SIGHUP: scheduler.step_timeout %g s kept at %g s: it must stay above the running "
                        "command.timeout (%g s)", new.step_timeout, self.cfg.step_timeout, self.cfg.command.timeout)
            keep["step_timeout"] = self.cfg.step_timeout
        for spec in new.shards:  # refused before anything is swapped: a bad shard leaves all settings as they were
            on_this_host(spec, self.topo)
        with self._changing():
            self.cfg = new = new.model_copy(update=keep)
            self.decider.configure(new)
            self.triggers = Triggers(new, self.topo.n)
            self.walker.step_timeout = new.step_timeout
            self._remove_unlisted()
            self._unplaced = {}  # the new config says which still wait
            self._ensure_each(new.shards)

    def close(self) -> None:
        """Stop the actuator and the span sender side by side, then the store; each runs even if another raised.
        Side by side: the sender's last export of what is stored (up to ``2 * otlp.timeout + 1`` s) is not left to
        what remains of the daemon's close budget after the actuator's wait for its step in flight (up to 5 s)."""
        with contextlib.ExitStack() as steps:  # run last-in first-out
            steps.callback(self.store.close)
            steps.callback(side_by_side, self.actuator.close, self.tracer.close)
