"""What every actuator shares: a step's outcome, the actuator protocol, and the one background thread that carries out
the steps of the webhook and command actuators (slow work, never on the tick)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Pending", "StepOutcome", "Actuator", "Worker", "acked"]

# (placement_id, step) -> whether that step still waits for its outcome
Pending = Callable[[int, str], bool]


@dataclass(frozen=True, slots=True)
class StepOutcome:
    placement_id: int
    step: str
    ok: bool
    reason: str = ""


class Actuator(Protocol):
    name: str

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None: ...

    def poll(self) -> list[StepOutcome]: ...

    def close(self) -> None: ...


def acked(plan: dict[str, Any], reason: str = "") -> StepOutcome:
    return StepOutcome(int(plan["placement_id"]), str(plan["step"]), True, reason)


class Worker:
    """One background thread running ``work(plan) -> StepOutcome | None``; outcomes collected for poll().

    A plan whose step no longer waits (``pending`` says so: acked, timed out or failed while it queued) is
    dropped unsent: sending it would apply a move the scheduler has already settled."""

    def __init__(self, name: str, work: Callable[[dict[str, Any]], StepOutcome | None],
                 pending: Pending | None = None) -> None:
        self._work = work
        self.pending = pending
        self._jobs: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1024)
        self._done: list[StepOutcome] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"actuator-{name}", daemon=True)
        self._thread.start()

    def submit(self, plan: dict[str, Any]) -> StepOutcome | None:
        try:
            self._jobs.put_nowait(plan)
        except queue.Full:
            return StepOutcome(int(plan["placement_id"]), str(plan["step"]), False, "actuator queue full")
        return None

    def poll(self) -> list[StepOutcome]:
        with self._lock:
            out, self._done = self._done, []
        return out

    def _waiting(self, plan: dict[str, Any]) -> bool:
        return self.pending is None or self.pending(int(plan["placement_id"]), str(plan["step"]))

    def _run(self) -> None:
        while (plan := self._jobs.get()) is not None and not self._closing.is_set():
            try:
                outcome = self._work(plan) if self._waiting(plan) else None
            except Exception as exc:  # a broken receiver must not kill the worker
                outcome = StepOutcome(int(plan["placement_id"]), str(plan["step"]), False, f"actuator error: {exc}")
            if outcome is not None:
                with self._lock:
                    self._done.append(outcome)

    def close(self) -> None:
        """End the thread after the step it runs (the steps still queued stay pending: resent after a restart);
        never blocks on a full queue, which would wait out the step in flight first."""
        self._closing.set()
        with contextlib.suppress(queue.Full):
            self._jobs.put_nowait(None)
        self._thread.join(timeout=5)
