"""The placement state machine: states, the legal transitions, and the refusal messages.

A placement walks ``pending -> placed -> staged -> launched``; a re-shard makes a new placement walk
those states while the old one keeps serving, then the old one goes ``launched -> draining -> retired``
(make before break).  Any non-terminal state may go to ``failed``.
"""

from __future__ import annotations

from enum import Enum

from ..errors import SchedulerError

__all__ = ["State", "TRANSITIONS", "ACTIVE", "TERMINAL", "NotFound", "StoreFailed", "check_transition"]


class State(str, Enum):
    PENDING = "pending"      # decided to exist; GPUs not chosen yet
    PLACED = "placed"        # GPUs chosen and reserved
    STAGED = "staged"        # actuator prepared the target (weights loaded, process ready)
    LAUNCHED = "launched"    # serving
    DRAINING = "draining"    # replaced; finishing its requests
    RETIRED = "retired"      # gone, GPUs released
    FAILED = "failed"        # an actuator refused or timed out; GPUs released


TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.PLACED, State.FAILED}),
    State.PLACED: frozenset({State.STAGED, State.FAILED}),
    State.STAGED: frozenset({State.LAUNCHED, State.FAILED}),
    State.LAUNCHED: frozenset({State.DRAINING, State.FAILED}),
    State.DRAINING: frozenset({State.RETIRED, State.FAILED}),
    State.RETIRED: frozenset(),
    State.FAILED: frozenset(),
}
TERMINAL = frozenset({State.RETIRED, State.FAILED})
# States whose GPUs hold the shard's memory.
ACTIVE = frozenset({State.PLACED, State.STAGED, State.LAUNCHED, State.DRAINING})


class NotFound(SchedulerError):
    """The shard or placement named does not exist (HTTP 404)."""


class StoreFailed(SchedulerError):
    """``scheduler.sqlite`` refused a read or a write (a full disk, a lock held too long): nothing was refused
    for what was asked, so the API answers 503 (try again), not 409 (which tells an orchestrator to give up)."""


def check_transition(shard_id: str, placement_id: int, current: State, target: State) -> None:
    """Raise :class:`SchedulerError` naming the shard and both states unless ``current -> target`` is legal."""
    allowed = TRANSITIONS[current]
    if target not in allowed:
        options = ", ".join(sorted(s.value for s in allowed)) or "none (terminal state)"
        raise SchedulerError(
            f"shard {shard_id}: placement {placement_id}: illegal transition {current.value} -> {target.value}; "
            f"allowed from {current.value}: {options}")
