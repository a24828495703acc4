"""Fixtures: a scheduler on a tmp state_dir (closed after the test), an OTLP/HTTP receiver."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import Receiver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))  # in_thread.lock_held

from sits_observe.scheduler.config import OtlpConfig, SchedulerConfig
from sits_observe.scheduler.engine import Scheduler
from sits_observe.topology import preset


@pytest.fixture
def make_scheduler(tmp_path: Path) -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(topology: str = "pcie-8", actuator: Any = None, exporter: Any = None, state: str = "state",
             otlp: OtlpConfig | None = None, **cfg: Any) -> Scheduler:
        """``actuator``: an actuator object, or the name of one for the config (built by the scheduler)."""
        if isinstance(actuator, str):
            cfg["actuator"], actuator = actuator, None
        s = Scheduler(SchedulerConfig(**cfg), otlp or OtlpConfig(), preset(topology), tmp_path / state,
                      actuator=actuator, exporter=exporter, clock=lambda: 1000.0)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()
