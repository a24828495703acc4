"""When to consider a re-shard: classifier verdicts, load imbalance, saturation.

Every trigger is edge-triggered with hysteresis: it fires once when its condition has held long enough
(``k`` verdicts in a row, or a sustained window on the source clock), re-arms only after the condition
clears below ``level - hysteresis`` (or ``threshold - hysteresis`` for confidence), and fires again for
a condition that persists only after ``cooldown`` seconds.  Causes a move cannot fix come out as
triggers with ``fixable=False``: the engine records a "no action" decision for them and nothing else.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, replace

import numpy as np

from ..frame import GPU_FIELD_INDEX
from ..rca.verdict import HEALTHY, UNKNOWN, Verdict
from ..topology import Topology
from .config import SchedulerConfig

__all__ = ["FIXABLE", "NON_FIXABLE", "Trigger", "Sustained", "Triggers", "culprits", "VERDICT_STALE_S"]

log = logging.getLogger("sits_observe.scheduler")

# a verdict older than this on the source clock when the scheduler reads it (it waited in the queue while ticks
# failed, e.g. scheduler.sqlite locked) is dropped: a minutes-old streak would fire on a host that has moved on
VERDICT_STALE_S = 60.0

FIXABLE = frozenset({"gpu_compute_saturation", "gpu_memory_pressure", "interconnect_contention",
                     "cpu_contention", "thermal_throttling"})
NON_FIXABLE = {
    "network_ingress": "requests are slow before they reach the GPUs; moving shards between GPUs cannot help",
    "scheduler_stall": "the serving engine's own scheduler stalls; a new placement would stall the same way",
    UNKNOWN: "the classifier is not confident about the cause; moving shards blindly risks making it worse",
}

# GPU field that points at the culprit when a verdict names no GPU (utilization otherwise)
_CULPRIT_FIELD = {"gpu_memory_pressure": "memory_used_bytes", "thermal_throttling": "temperature_celsius",
                  "interconnect_contention": "nvlink_tx_bytes_per_second",
                  "gpu_compute_saturation": "foreign_utilization_ratio"}


def culprits(cause: str, values: np.ndarray | None, topo: Topology, numa_cpu: dict[int, float]) -> set[int]:
    """The GPUs most implicated in ``cause`` when the verdict names none (none without GPU values).

    ``cpu_contention``: the GPUs fed by the busiest NUMA node that has GPUs (``numa_cpu``: node -> busy
    share from the tick's per-node CPU samples; the serving processes run on the cores of their GPUs'
    node).  The samples carry the node number only, so on a topology of several hosts the node's GPUs
    on every host are named (the simulator models one CPU load per node number).  Otherwise, and when
    no per-node CPU is reported: the GPU with the highest value of the field that points at the cause
    in the latest ``(gpus, GPU_FIELDS)`` values (utilization when no field does, or when that field is
    absent or zero on every GPU, e.g. the per-process fields on the DCGM backend).
    """
    if cause == "cpu_contention":
        nodes = {n: gs for n, gs in topo.numa_nodes().items() if not np.isnan(numa_cpu.get(n, np.nan))}
        if nodes:
            return set(nodes[max(nodes, key=lambda n: numa_cpu[n])])
    if values is None:  # no GPU values yet: name none rather than GPU 0
        return set()
    col = values[:, GPU_FIELD_INDEX[_CULPRIT_FIELD.get(cause, "utilization_ratio")]]
    if not (np.nan_to_num(col) > 0).any():  # nobody reports it, or it points nowhere
        col = values[:, GPU_FIELD_INDEX["utilization_ratio"]]
    return {int(np.argmax(np.nan_to_num(col, nan=-np.inf)))}


@dataclass(frozen=True, slots=True)
class Trigger:
    """A reason to decide: ``kind`` is verdict, imbalance, saturation or manual."""

    kind: str
    cause: str
    fixable: bool
    ts: float
    reason: str
    gpus: tuple[int, ...] = ()
    confidence: float = 0.0
    verdict: Verdict | None = None
    other_node: bool = False   # only a placement on another node can help (host CPU saturation)
    repeat: bool = False       # the same episode fired before (a "no action" then is not recorded again)
    previous: float | None = None  # a verdict trigger: when its streak fired before it (Triggers.retract)


class Sustained:
    """A level that must hold ``sustain`` seconds to fire; re-arms below ``level - hysteresis``; fires again after
    ``refire`` seconds while above the level."""

    def __init__(self, level: float, hysteresis: float, sustain: float, refire: float) -> None:
        self.level, self.clear, self.sustain, self.refire = level, level - hysteresis, sustain, refire
        self.onset: float | None = None
        self.fired: float | None = None
        self.repeat = False  # the last fire was not the episode's first
        self._before: tuple[float | None, bool] = (None, False)  # (fired, repeat) before the last fire

    def update(self, ts: float, value: float) -> bool:
        if not value > self.clear:  # cleared, or no data (NaN): re-arm
            self.onset = self.fired = None
            return False
        if value > self.level and self.onset is None:
            self.onset = ts
        if self.onset is None or ts - self.onset < self.sustain:
            return False
        # a fire again needs the level itself: a value left inside the band only keeps the episode from re-arming
        if self.fired is None or (ts - self.fired >= self.refire and value > self.level):
            self._before = (self.fired, self.repeat)
            self.repeat = self.fired is not None
            self.fired = ts
            return True
        return False

    def retract(self) -> None:
        """The last fire was not decided on: it may fire again at the next update."""
        self.fired, self.repeat = self._before


class Triggers:
    """Holds the streak and window state of all triggers of one host."""

    def __init__(self, cfg: SchedulerConfig, gpus: int) -> None:
        self.cfg = cfg
        refire = cfg.cooldown
        self.imbalance = Sustained(cfg.imbalance_stddev, cfg.hysteresis, cfg.imbalance_sustain, refire)
        self.gpu_memory = Sustained(cfg.saturation_ratio, cfg.hysteresis, cfg.saturation_sustain, refire)
        self.host_cpu = Sustained(cfg.saturation_ratio, cfg.hysteresis, cfg.saturation_sustain, refire)
        self._cause: str | None = None
        self._streak = 0
        self._named: deque[tuple[int, ...]] = deque(maxlen=cfg.verdict_consecutive)  # the streak's last GPUs
        self._fired: float | None = None
        self._last: float | None = None  # the source time of the streak's last verdict
        self._gpus_said: set[int] = set()  # GPU indices of verdicts this topology lacks, each said once

    def on_verdicts(self, queued: deque[Verdict], now: float, gpus: frozenset[int]) -> list[Trigger]:
        """Take the verdicts off ``queued`` and count them into the streak at ``now`` (the tick's source time);
        ``gpus``: the GPU indices of the topology (a verdict naming another is not acted on for it)."""
        fired, stale = [], 0
        while queued:
            v = queued.popleft()
            if now - v.ts > VERDICT_STALE_S:  # and the streak it belonged to is over: the host has moved on since
                stale += 1
                self._end_streak()
                continue
            if self.cfg.verdict_on_burn_only and v.trigger != "slo_burn" and v.cause != HEALTHY:
                continue  # made while nothing burns: only a healthy verdict (which ends a streak) counts
            if unknown := set(v.gpus) - gpus:  # IndexError in avoid(), or a negative index widening it
                if unknown - self._gpus_said:
                    log.warning("scheduler: verdicts name GPUs %s, which the topology does not have: left out",
                                sorted(unknown))
                    self._gpus_said |= unknown
                v = replace(v, gpus=tuple(g for g in v.gpus if g in gpus))
            if (t := self.on_verdict(v, now)) is not None:
                fired.append(t)
        if stale:
            log.warning("scheduler: %d verdicts older than %g s dropped (they waited while ticks failed)", stale,
                        VERDICT_STALE_S)
        return fired

    def on_verdict(self, v: Verdict, now: float) -> Trigger | None:
        """Count ``v`` into the streak; a trigger once ``verdict_consecutive`` agree, at ``now``."""
        cfg = self.cfg
        counts = v.cause == UNKNOWN or (v.cause != HEALTHY and v.confidence >= cfg.verdict_threshold)
        if self._last is not None and v.ts - self._last > VERDICT_STALE_S:  # a gap in the verdicts: not "in a row"
            self._end_streak()
        if not counts:
            held = v.cause == self._cause and v.confidence >= cfg.verdict_threshold - cfg.hysteresis
            if not held:
                self._end_streak()
            elif self._last is not None:  # the condition holds (the hysteresis band): no gap in it
                self._last = v.ts
            return None
        if v.cause != self._cause:
            self._end_streak()
            self._cause = v.cause
        self._last = v.ts
        self._streak += 1
        self._named.append(tuple(v.gpus))
        if self._streak < cfg.verdict_consecutive:
            return None
        repeat = self._fired is not None
        if repeat and now - self._fired < cfg.cooldown:
            return None
        previous, self._fired = self._fired, now
        fixable = v.cause in FIXABLE
        reason = (f"{self._streak} verdicts in a row: {v.cause} (confidence {v.confidence:.2f})" if fixable
                  else f"{v.cause}: {NON_FIXABLE.get(v.cause, 'not a cause a re-shard can fix')}")
        return Trigger("verdict", v.cause, fixable, now, reason, self._agreed(), v.confidence, v, repeat=repeat,
                       previous=previous)

    def _end_streak(self) -> None:
        self._cause, self._streak, self._fired, self._last = None, 0, None, None
        self._named.clear()

    def _agreed(self) -> tuple[int, ...]:
        """The GPUs more than half of the streak's last ``verdict_consecutive`` verdicts name, most named first (then
        as the last verdict ranks them): verdicts naming GPU 0, then 2, then 6 are no evidence against GPU 6."""
        named = Counter(g for gpus in self._named for g in gpus)
        last = self._named[-1]
        order = sorted(named, key=lambda g: (-named[g], last.index(g) if g in last else len(last), g))
        return tuple(g for g in order if 2 * named[g] > len(self._named))

    def retract(self, t: Trigger) -> None:
        """``t`` was not decided on (scheduler.sqlite locked or full): it may fire again, not a cooldown later."""
        if t.kind == "verdict":
            if self._cause == t.cause and self._fired == t.ts:  # its streak, not fired again since (nor another's)
                self._fired = t.previous
        elif (held := {"load_imbalance": self.imbalance, "gpu_memory_saturation": self.gpu_memory,
                       "host_cpu_saturation": self.host_cpu}.get(t.cause)) is not None:
            held.retract()

    def on_frame(self, ts: float, util: np.ndarray | None, mem_ratio: np.ndarray | None,
                 host_cpu: float) -> list[Trigger]:
        """Window triggers from one tick's per-GPU utilization and memory fraction and host CPU; ``None``
        for a tick without a new GPU sample leaves the GPU windows as they are (NaN re-arms them)."""
        out = self._gpu_windows(ts, util, mem_ratio) if util is not None and mem_ratio is not None else []
        if self.host_cpu.update(ts, host_cpu):
            out.append(Trigger("saturation", "host_cpu_saturation", True, ts,
                               f"host CPU {host_cpu:.0%} > {self.cfg.saturation_ratio:.0%} for "
                               f"{self.cfg.saturation_sustain:g} s", other_node=True, repeat=self.host_cpu.repeat))
        return out

    def _gpu_windows(self, ts: float, util: np.ndarray, mem_ratio: np.ndarray) -> list[Trigger]:
        out = []
        cfg = self.cfg
        valid = util[~np.isnan(util)]
        std = float(valid.std()) if len(valid) > 1 else float("nan")
        if self.imbalance.update(ts, std):
            busiest = tuple(int(i) for i in np.argsort(-np.nan_to_num(util, nan=-1.0))[:1])
            out.append(Trigger("imbalance", "load_imbalance", True, ts,
                               f"GPU utilization stddev {std:.2f} > {cfg.imbalance_stddev:.2f} for "
                               f"{cfg.imbalance_sustain:g} s; busiest GPU {busiest[0]}", busiest,
                               repeat=self.imbalance.repeat))
        fullest = float(np.nanmax(mem_ratio)) if not np.isnan(mem_ratio).all() else float("nan")
        if self.gpu_memory.update(ts, fullest):  # one episode for the host: any GPU over the level
            full = tuple(int(g) for g in np.flatnonzero(np.nan_to_num(mem_ratio) > self.gpu_memory.clear))
            out.append(Trigger("saturation", "gpu_memory_saturation", True, ts,
                               f"GPU memory > {cfg.saturation_ratio:.0%} for {cfg.saturation_sustain:g} s on GPUs "
                               f"{list(full)} (fullest {fullest:.0%})", full, repeat=self.gpu_memory.repeat))
        return out
