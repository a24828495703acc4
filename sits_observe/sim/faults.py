"""Fault scenarios: which fault starts when, for how long, how hard and where.

A scenario is a YAML file (``sim/scenarios/<name>.yaml`` for the built-in ones) with a list of faults.
Each fault kind is one root-cause class of DESIGN.md; ``load_surge`` is a non-fault load increase (a
hard negative for the classifier).  What a fault *does* lives in :mod:`.mechanics`; this module only
describes and validates schedules.  Targets name GPUs, a shard (resolved to its GPUs when the fault
starts, so the fault then stays with those GPUs), a NUMA node, or a workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Literal

import numpy as np
from pydantic import Field, StrictInt, model_validator

from ..config import Section, parse_yaml, validate
from ..errors import ConfigError
from ..yamlfile import read_text
from ..topology import Topology, preset
from .shards import default_placement

__all__ = ["CAUSES", "LOAD_SURGE", "KINDS", "GPU_KINDS", "BUILTIN", "FaultTarget", "FaultSpec", "Scenario",
           "FaultRecord"]

CAUSES = ("gpu_compute_saturation", "gpu_memory_pressure", "interconnect_contention", "cpu_contention",
          "network_ingress", "thermal_throttling", "scheduler_stall")
LOAD_SURGE = "load_surge"
KINDS = CAUSES + (LOAD_SURGE,)
GPU_KINDS = ("gpu_compute_saturation", "gpu_memory_pressure", "interconnect_contention", "thermal_throttling")
BUILTIN = ("quiet", "mixed", "stress")

# Which target fields each kind accepts; an empty target means the whole host.
_TARGETS: dict[str, tuple[frozenset[str], bool]] = {
    **{k: (frozenset({"gpus", "shard"}), True) for k in GPU_KINDS},
    "cpu_contention": (frozenset({"numa", "gpus", "shard"}), True),
    "scheduler_stall": (frozenset({"shard"}), True),
    "network_ingress": (frozenset({"workload"}), False),
    LOAD_SURGE: (frozenset({"workload"}), False),
}


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """A fault as it happened, resolved at onset: ground truth for labels and tests, never analysis input.

    ``start``/``end`` are on the source clock (``frame.ts``); ``shards`` are the shards it hit at onset;
    ``foreign_bytes`` (gpu_memory_pressure) is the foreign allocation on each GPU of ``gpus``.
    """

    kind: str
    severity: float
    start: float
    end: float
    gpus: tuple[int, ...] = ()
    numa_nodes: tuple[int, ...] = ()
    shards: tuple[str, ...] = ()
    workload: str | None = None
    foreign_bytes: tuple[float, ...] = ()

    @property
    def cause(self) -> str:
        """The root-cause class a classifier should answer (a load surge is ``healthy``)."""
        return self.kind if self.kind in CAUSES else "healthy"


class FaultTarget(Section):
    # strict: `true`, "1" and 1.0 all became GPU 1
    gpus: list[StrictInt] | None = Field(None, min_length=1, description="GPU indices")
    shard: str | None = Field(None, description="shard id, resolved to its GPUs (or NUMA node) at onset")
    numa: StrictInt | None = Field(None, ge=0, description="NUMA node (cpu_contention)")
    workload: str | None = Field(None, description="workload (network_ingress, load_surge); none = all")

    def given(self) -> set[str]:
        return {k for k in ("gpus", "shard", "numa", "workload") if getattr(self, k) is not None}


class FaultSpec(Section):
    kind: Literal[KINDS]  # type: ignore[valid-type]
    onset: float = Field(ge=0, allow_inf_nan=False, description="seconds after the simulation starts")
    duration: float = Field(gt=0, allow_inf_nan=False, description="seconds")
    severity: float = Field(ge=0, le=1)
    target: FaultTarget = Field(default_factory=FaultTarget)

    @model_validator(mode="after")
    def _target_fits_kind(self) -> FaultSpec:
        allowed, required = _TARGETS[self.kind]
        given = self.target.given()
        if given - allowed or len(given) > 1 or (required and not given):
            need = "exactly one of" if required else "nothing (the whole host) or one of"
            raise ValueError(f"target of {self.kind} must give {need} {', '.join(sorted(allowed))}; "
                             f"got {', '.join(sorted(given)) or 'nothing'}")
        return self

    @property
    def end(self) -> float:
        return self.onset + self.duration


class Scenario(Section):
    name: str = ""
    description: str = ""
    faults: list[FaultSpec] = Field(default_factory=list)

    @classmethod
    def load(cls, name: str) -> Scenario:
        """A built-in scenario by name, or a scenario YAML file by path."""
        if name in BUILTIN:
            text = resources.files("sits_observe.sim").joinpath(f"scenarios/{name}.yaml").read_text()
            return cls.parse(text, f"scenario {name}")
        if not name.endswith((".yaml", ".yml")) and "/" not in name:
            raise ConfigError(f"sim.scenario: unknown scenario {name!r}; choose one of {', '.join(BUILTIN)} "
                              "or give the path of a scenario .yaml file")
        text = read_text(name, 1 << 20, "sim.scenario", "scenario file", f"choose one of {', '.join(BUILTIN)} or a readable "
                         "scenario .yaml file")
        return cls.parse(text, name)

    @classmethod
    def parse(cls, text: str, source: str) -> Scenario:
        data = parse_yaml(text, source)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a scenario is a mapping with 'faults', got {type(data).__name__}")
        return validate(cls, data, source)

    def check(self, shards: list[str], gpus: int, numa_nodes: int, workloads: list[str], source: str) -> None:
        """Refuse targets this host does not have (one line per problem)."""
        bad = []
        for i, f in enumerate(self.faults):
            t, at = f.target, f"{source}: faults[{i}].target"
            if t.shard is not None and t.shard not in shards:
                bad.append(f"{at}.shard: unknown shard {t.shard!r}; choose one of {', '.join(shards)}")
            if t.gpus is not None and (len(set(t.gpus)) != len(t.gpus) or not all(0 <= g < gpus for g in t.gpus)):
                bad.append(f"{at}.gpus: must be distinct GPU indices 0-{gpus - 1}, got {t.gpus}")
            if t.numa is not None and t.numa >= numa_nodes:
                bad.append(f"{at}.numa: this host has NUMA nodes 0-{numa_nodes - 1}, got {t.numa}")
            if t.workload is not None and t.workload not in workloads:
                bad.append(f"{at}.workload: unknown workload {t.workload!r}; choose one of {', '.join(workloads)}")
        if bad:
            raise ConfigError("\n".join(bad))

    @classmethod
    def random(cls, seed: int, hours: float, topology: Topology | str, *,
               severity_range: tuple[float, float] = (0.5, 1.0), surge_share: float = 0.125) -> Scenario:
        """Faults one after another with random kind, onset, duration, severity and target shard.

        Targets are the shards the simulator places on ``topology`` by default.  Gaps of 5-15 min keep
        healthy time between faults; about ``surge_share`` of the events are load surges.
        Deterministic under ``seed``.
        """
        lo, hi = severity_range
        if not (0 <= lo <= hi <= 1) or hours <= 0:
            raise ConfigError(f"Scenario.random: need 0 <= lo <= hi <= 1 and hours > 0; got "
                              f"severity_range={severity_range}, hours={hours}")
        topo = preset(topology) if isinstance(topology, str) else topology
        shards = [p.id for p in default_placement(topo)]
        rng = np.random.default_rng(seed)
        end = hours * 3600.0
        t = float(rng.uniform(300, 600))
        faults = []
        while t + 240 < end:
            kind = LOAD_SURGE if rng.random() < surge_share else CAUSES[int(rng.integers(len(CAUSES)))]
            duration = min(float(rng.uniform(240, 900)), end - t)
            host_wide = kind in ("network_ingress", LOAD_SURGE)
            target = {} if host_wide else {"shard": shards[int(rng.integers(len(shards)))]}
            faults.append(FaultSpec(kind=kind, onset=round(t, 1), duration=round(duration, 1),
                                    severity=round(float(rng.uniform(lo, hi)), 3), target=FaultTarget(**target)))
            t += duration + float(rng.uniform(300, 900))
        return cls(name=f"random-{seed}", description=f"{len(faults)} random faults over {hours:g} h", faults=faults)
