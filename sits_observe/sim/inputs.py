"""The simulator's inputs, checked before a :class:`~.host.SimulatedHost` is made from them: a topology preset of
one host (:func:`host_topology`), a scenario whose fault targets the default placement has
(:func:`check_scenario`), a readable trace file; config load runs the same (:func:`check_inputs`), so
``check-config`` refuses what the simulator would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..config import SimConfig
from ..errors import ConfigError
from ..topology import PRESETS, Topology, one_host, preset
from .faults import Scenario
from .shards import default_placement
from .trace import Trace

if TYPE_CHECKING:
    from ..scheduler.config import ShardSpec

__all__ = ["check_inputs", "check_scenario", "host_topology"]


def check_inputs(cfg: SimConfig, shards: Sequence[ShardSpec] = ()) -> None:
    """Raise ConfigError for what ``SimulatedHost(cfg)`` would refuse (topology, scenario file and targets, trace
    file), and for config ``shards`` the scheduler would refuse on it (a ``placement`` of GPUs it does not have, a
    ``numa_node`` no GPU is on); config load calls it, so ``check-config`` refuses the same."""
    topology = host_topology(cfg.topology)
    check_scenario(Scenario.load(cfg.scenario), topology, cfg.scenario)
    if cfg.trace_path is not None:
        Trace.load(cfg.trace, cfg.trace_path)
    nodes = sorted(topology.numa_nodes())
    for i, spec in enumerate(shards):
        if bad := [g for g in spec.placement or () if not 0 <= g < topology.n]:
            raise ConfigError(f"scheduler.shards[{i}].placement: GPUs {bad} not on the simulated {cfg.topology} "
                              f"host (GPUs 0-{topology.n - 1}); give GPUs it has")
        if spec.numa_node is not None and spec.numa_node not in nodes:
            raise ConfigError(f"scheduler.shards[{i}].numa_node: no GPU of the simulated {cfg.topology} host is on "
                              f"NUMA node {spec.numa_node} (its GPUs are on nodes {nodes}); leave it unset")


def host_topology(name: str) -> Topology:
    """The preset topology ``name``; ConfigError where there is none or it spans several hosts (refused by its name,
    before a fabric's link matrices are built)."""
    try:
        one_host(name)
    except ValueError as exc:
        raise ConfigError(f"sim.topology: {exc}") from None
    try:
        return preset(name)
    except ConfigError:  # its list offers fabric-Nx8 as well, which spans several hosts
        raise ConfigError(f"sim.topology: unknown topology {name!r}; choose one of {', '.join(PRESETS)}") from None


def check_scenario(scenario: Scenario, topology: Topology, source: str) -> None:
    """Refuse fault targets the default placement on ``topology`` does not have."""
    placed = default_placement(topology)
    scenario.check([p.id for p in placed], topology.n, 1 + max(g.numa_node for g in topology.gpus),
                   sorted({p.workload for p in placed}), source)

