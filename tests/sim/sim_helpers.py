"""Helpers for the simulator tests: a tick loop into a SeriesStore on a fixed source clock."""

from __future__ import annotations

from sits_observe.frame import Frame
from sits_observe.sim.faults import FaultSpec, FaultTarget, Scenario
from sits_observe.sim.host import SimulatedHost
from sits_observe.store.series import SeriesStore

T0 = 1_700_000_000.0  # source clock of the first tick's start


def run_until(sim: SimulatedHost, store: SeriesStore | None, elapsed: float) -> Frame:
    """Tick (1 s) until ``elapsed`` simulated seconds have passed; returns the last frame."""
    frame = None
    while sim.elapsed < elapsed:
        frame = Frame(T0 + sim.elapsed + 1.0, 1.0)
        sim.collect(frame)
        if store is not None:
            store.ingest(frame)
    assert frame is not None
    return frame


def one_fault(kind: str, onset: float, severity: float, **target) -> Scenario:
    """A scenario of one hour-long fault starting ``onset`` seconds in."""
    return Scenario(name=kind, faults=[FaultSpec(kind=kind, onset=onset, duration=3600, severity=severity,
                                                 target=FaultTarget(**target))])
