"""The scheduler's self-metrics, from what its readers are given (published state and tallies)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..frame import Sample
from .states import State

__all__ = ["samples"]


def samples(counts: dict[Any, int], in_flight: int, states: dict[State, int], pending: int,
            dropped: int) -> Iterator[Sample]:
    """Decisions by trigger and action, re-shards in flight, placements by state, spans dropped and waiting."""
    for (trigger, action), n in sorted(counts.items()):
        yield Sample("sits_scheduler_decisions_total", "counter", "Scheduler decisions by trigger and action.",
                     (("trigger", trigger), ("action", action)), float(n))
    yield Sample("sits_scheduler_migrations_in_flight", "gauge", "Re-shards in flight (not first placements).", (),
                 float(in_flight))
    for state, n in states.items():
        yield Sample("sits_scheduler_placement_state", "gauge", "Placements kept, by state.",
                     (("state", state.value),), float(n))
    yield Sample("sits_scheduler_spans_dropped_total", "counter",
                 "ShardDecisionSpans never exported: not stored (database error), more than otlp.max_queue "
                 "waiting, unreadable, or refused by the collector for good.", (), float(dropped))
    yield Sample("sits_scheduler_spans_pending", "gauge",
                 "ShardDecisionSpans stored in scheduler.sqlite and not exported yet.", (), float(pending))
