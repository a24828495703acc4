"""The simulated GPU host: the embedded default source behind ``sits-observe demo``.

:class:`~.host.SimulatedHost` replays the Azure LLM trace on shards placed on a preset topology, serves
it with continuous batching timed by the Splitwise performance table, injects the faults of a
:class:`~.faults.Scenario` through their mechanisms, and fills Frames like the real sources.
See docs/simulator.md.
"""

from __future__ import annotations

from .faults import FaultRecord, FaultSpec, FaultTarget, Scenario
from .host import SimulatedHost
from .migration import Migration
from .shards import ShardInfo

__all__ = ["SimulatedHost", "Scenario", "FaultSpec", "FaultTarget", "FaultRecord", "Migration", "ShardInfo"]
