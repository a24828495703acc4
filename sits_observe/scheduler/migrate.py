"""Walks placements through their states with an actuator; the same walk resumes after a crash.

A step is marked on the row (``step``) before it is sent, and the state moves when the actuator's
outcome or the orchestrator's ack arrives.  On restart every live placement has its marker cleared
and is advanced again, so a step in flight at the crash is sent once more (receivers dedupe on
``placement_id`` + ``step``).  Order of a re-shard, one committed write each::

    new: create (pending) -> placed -> [stage sent] -> staged -> [launch sent] -> launched
    old: launched -> draining -> [drain sent] -> retired
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import SchedulerError
from .actuators import Actuator, StepOutcome
from .states import NotFound, State
from .store import Placement, PlacementStore, SpanRecord

__all__ = ["STEPS", "StepRefused", "Walker"]

class StepRefused(SchedulerError):
    """An outcome or ack for a step the placement is not waiting for (HTTP 409)."""


# step -> (state it is sent from, state it leads to)
STEPS = {"stage": (State.PLACED, State.STAGED), "launch": (State.STAGED, State.LAUNCHED),
         "drain": (State.DRAINING, State.RETIRED)}
_STEP_OF = {src: step for step, (src, _) in STEPS.items()}
_WALK = (State.PENDING, State.PLACED, State.STAGED, State.LAUNCHED, State.DRAINING, State.RETIRED)

# chooses GPUs for a placement found pending at restart: (gpus, node), a reason why none fit, or None for
# "not now" (GPU values unknown): it stays pending until ``place_waiting``
Chooser = Callable[[Placement], "tuple[tuple[int, ...], str] | str | None"]


class Walker:
    def __init__(self, store: PlacementStore, actuator: Actuator, choose: Chooser, step_timeout: float) -> None:
        self.store, self.actuator, self.choose, self.step_timeout = store, actuator, choose, step_timeout
        self.waiting: set[int] = set()  # pending placements whose choice ``choose`` put off
        # shards dropped from the config while a placement was in flight: no stage or launch is sent for them any
        # more (the placement fails at its next step, and the shard is removed then); a drain still is
        self.halted: set[str] = set()
        self._unwritten: list[StepOutcome] = []  # outcomes whose write failed: applied at the next poll

    def start(self, shard_id: str, kind: str, gpus: tuple[int, ...], node: str, ts: float, *,
              source: Placement | None = None, decision_id: str = "", reason: str = "",
              span: SpanRecord | None = None) -> Placement:
        """Create a placement on ``gpus`` (stored with the decision's ``span``) and walk it as far as the
        actuator allows now."""
        p = self.store.create(shard_id, kind, ts, source.id if source else None, decision_id, reason, span)
        p = self.store.update(p, ts, State.PLACED, gpus=gpus, node=node)
        return self.advance(p, ts)

    def adopt(self, shard_id: str, gpus: tuple[int, ...], node: str, ts: float, reason: str,
              span: SpanRecord | None = None) -> Placement:
        """Record a placement that already runs: it walks to launched without actuator steps."""
        p = self.store.create(shard_id, "adopt", ts, reason=reason, span=span)
        return self.advance(self.store.update(p, ts, State.PLACED, gpus=gpus, node=node), ts)

    def advance(self, p: Placement, ts: float) -> Placement:
        """Do every action that does not wait on an actuator; returns the placement as left."""
        while (nxt := self._next(p, ts)) is not None:
            p = nxt
        return p

    def _next(self, p: Placement, ts: float) -> Placement | None:
        if p.step is not None or p.state in (State.RETIRED, State.FAILED):
            return None
        if p.kind == "adopt" and p.state in (State.PENDING, State.PLACED, State.STAGED):  # it already runs there
            if p.state is State.PENDING:  # a crash came before its GPUs were written
                return self.store.update(p, ts, State.FAILED, reason="interrupted before its GPUs were recorded")
            return self.store.update(p, ts, _WALK[_WALK.index(p.state) + 1])
        if p.state is State.PENDING:
            chosen = self.choose(p)
            if chosen is None:
                self.waiting.add(p.id)
                return None
            self.waiting.discard(p.id)
            if isinstance(chosen, str):
                return self.store.update(p, ts, State.FAILED, reason=chosen)
            return self.store.update(p, ts, State.PLACED, gpus=chosen[0], node=chosen[1])
        if p.state is State.LAUNCHED:
            if (src := self._source(p)) is not None and src.state is State.LAUNCHED:
                self.advance(self.store.update(src, ts, State.DRAINING, reason=f"replaced by placement {p.id}"), ts)
            return None
        step = _STEP_OF[p.state]
        if step != "drain" and p.shard_id in self.halted:
            return self.store.update(p, ts, State.FAILED, reason=f"{step} not sent: the shard is no longer in the "
                                     "config (scheduler.shards)")
        p = self.store.update(p, ts, step=step, step_ts=ts)
        outcome = self.actuator.submit(self.plan(p, step))
        return p if outcome is None else self._apply(p, outcome, ts)

    def _apply(self, p: Placement, o: StepOutcome, ts: float) -> Placement:
        if o.ok:
            return self.store.update(p, ts, STEPS[o.step][1], step=None, step_ts=None)
        return self.store.update(p, ts, State.FAILED, step=None, step_ts=None, reason=f"{o.step} failed: {o.reason}")

    def complete(self, o: StepOutcome, ts: float) -> Placement:
        """Apply an actuator outcome or an orchestrator ack; a repeated ack of a done step is a no-op."""
        p = self.store.placement(o.placement_id)
        if p.step != o.step:
            if p.state in _WALK and _WALK.index(p.state) >= _WALK.index(STEPS[o.step][1]):
                return p  # that step was done already (a repeated ack)
            waiting = f"waiting for step {p.step}" if p.step else "not waiting for any step"
            raise StepRefused(f"shard {p.shard_id}: placement {p.id}: ack for step {o.step} refused: expected "
                                 f"state {STEPS[o.step][0].value}, actual {p.state.value} ({waiting})")
        return self.advance(self._apply(p, o, ts), ts)

    def poll(self, ts: float) -> None:
        """Outcomes the actuator finished since the last tick; stale ones (step already moved on) are ignored,
        and one whose write the database refused (a full disk) is tried again at the next tick, not lost (the
        step would time out as failed although it was carried out)."""
        unwritten, self._unwritten = self._unwritten, []
        for o in [*unwritten, *self.actuator.poll()]:
            try:
                self.complete(o, ts)
            except (StepRefused, NotFound):
                continue
            except SchedulerError:
                self._unwritten.append(o)

    def expire(self, ts: float) -> None:
        """Fail steps not acked within ``step_timeout`` (source clock), and walk on placements left between
        steps: an outcome or ack applied whose next write failed (a full disk) left no step to wait for, so
        nothing would have moved them again, nor timed them out."""
        for p in self.store.placements(live=True):
            if p.step is not None:
                if p.step_ts is not None and ts - p.step_ts > self.step_timeout:
                    self.complete(StepOutcome(p.id, p.step, False, f"no ack within {self.step_timeout:g} s"), ts)
            elif self._between_steps(p):
                self.advance(p, ts)

    def _source(self, p: Placement) -> Placement | None:
        """The placement ``p`` replaces; None for none, or once it was pruned (old history)."""
        if p.source_id is None:
            return None
        try:
            return self.store.placement(p.source_id)
        except NotFound:
            return None

    def _between_steps(self, p: Placement) -> bool:
        if p.state is State.PENDING:
            return p.id not in self.waiting
        if p.state is State.LAUNCHED:  # at rest, unless the placement it replaces still runs
            return (src := self._source(p)) is not None and src.state is State.LAUNCHED
        return True  # placed, staged, draining: each waits on a step

    def place_waiting(self, ts: float) -> None:
        """Ask ``choose`` again for the placements it put off (they may have been failed meanwhile)."""
        for pid in sorted(self.waiting):
            self.waiting.discard(pid)
            try:
                p = self.store.placement(pid)
            except NotFound:  # failed and pruned meanwhile
                continue
            self.advance(p, ts)

    def resume(self, ts: float) -> list[Placement]:
        """After a restart: re-send every step in flight and continue every live placement."""
        out = []
        for p in self.store.placements(live=True):
            p = self.store.placement(p.id)  # an earlier advance may have moved it
            if p.step is not None:
                p = self.store.update(p, ts, step=None, step_ts=None)
            out.append(self.advance(p, ts))
        return out

    def plan(self, p: Placement, step: str) -> dict[str, Any]:
        """The plan JSON an actuator receives for one step."""
        src = self._source(p)  # None also for one pruned from the history
        return {
            "placement_id": p.id, "step": step, "kind": p.kind, "state": p.state.value,
            "shard": self.store.shard(p.shard_id).model_dump(exclude={"placement"}),
            "node": p.node, "gpus": list(p.gpus),
            "source": None if src is None else {"placement_id": src.id, "gpus": list(src.gpus), "node": src.node},
            "decision_id": p.decision_id, "reason": p.reason, "ts": p.updated_ts,
            "ack_url": f"/api/v1/placements/{p.id}/ack",
        }
