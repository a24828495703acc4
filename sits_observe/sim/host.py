"""The simulated GPU host: a Source that fills Frames the way the real collectors and probes do.

Per tick: finish migrations whose engines are ready, start and end scheduled faults, replay the
trace's arrivals for the tick, route each to the least-loaded shard of its workload, run every shard's
continuous-batching engine under the conditions its GPUs, links and CPUs allow, and write request
stages (per-request values), device stages (mechanism-derived histograms), GPU, host and workload
gauges and counters.  ``shards()``, ``migrate()`` and ``pending_migrations()`` make it the scheduler's
actuator; ``active_faults()`` and ``fault_log()`` are ground truth for labels and tests only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..config import SimConfig
from ..errors import SimError
from ..frame import BucketLayout, Frame
from .device import StageSampler
from .emit import TickOutput
from .engine import ShardEngine
from .faults import FaultRecord, FaultSpec, Scenario
from .gpu import GpuModel
from .inputs import check_scenario, host_topology
from .mechanics import Effects, comm_intensity, network_delay, numa_load, pair_link, shard_timing
from .migration import Migration, check_migration, load_rate
from .perf import PerfModel, hardware_for
from .shards import (GPU_MEMORY_UTILIZATION, KV_MIN, Placement, ShardInfo, default_placement,
                     kv_bytes_per_gpu_token, static_bytes_per_gpu)
from .trace import Trace
from .variation import NOMINAL, HostVariation

__all__ = ["SimulatedHost"]

log = logging.getLogger("sits_observe.sim")

REFERENCE_SHARDS = 3  # the trace at rate 1 is spread over this many replicas; more replicas get more load


@dataclass
class _Shard:
    placement: Placement
    gpus: tuple[int, ...]
    perf: PerfModel
    engine: ShardEngine
    link: tuple[float, float]  # mechanics.pair_link of gpus

    @property
    def id(self) -> str:
        return self.placement.id


class SimulatedHost:
    """Simulated GPU host on ``cfg.topology`` replaying ``cfg.trace`` under ``scenario`` (default ``cfg.scenario``);
    ``variation`` departs from the preset's cooling, power limit and CPU load (the dataset generator's ``--vary``)."""

    name = "sim"

    def __init__(self, cfg: SimConfig, layout: BucketLayout, *, scenario: Scenario | None = None,
                 variation: HostVariation = NOMINAL) -> None:
        self.cfg = cfg
        self.variation = variation
        self.layout = layout
        self.topology = host_topology(cfg.topology)
        self.scenario = scenario if scenario is not None else Scenario.load(cfg.scenario)
        self.trace = Trace.load(cfg.trace, cfg.trace_path)
        hardware = hardware_for(self.topology.gpus[0].model)
        perf: dict[tuple[str, int], PerfModel] = {}
        self._shards: dict[str, _Shard] = {}
        for p in default_placement(self.topology):
            model = perf.setdefault((p.model, p.tp), PerfModel(p.model, hardware, p.tp))
            self._shards[p.id] = _Shard(p, p.gpus, model, ShardEngine(model, 0.0), pair_link(self.topology, p.gpus))
        self.workloads = sorted({s.placement.workload for s in self._shards.values()})
        self._numa = np.array([g.numa_node for g in self.topology.gpus])
        cores = {g.numa_node: len(g.cpu_affinity) for g in self.topology.gpus}
        self._numa_cores = np.array([float(cores.get(n, 1)) for n in range(int(self._numa.max()) + 1)])
        source = cfg.scenario if scenario is None else (scenario.name or "scenario")
        check_scenario(self.scenario, self.topology, source)
        self._pending = sorted(self.scenario.faults, key=lambda f: f.onset)
        net_seed, dev_seed = np.random.SeedSequence(cfg.seed).spawn(2)
        self._net_rng = np.random.default_rng(net_seed)
        self._route_rng = np.random.default_rng([cfg.seed, 29])  # session-affine routing (variation.affinity)
        self._sampler = StageSampler(layout, np.random.default_rng(dev_seed))
        self._gpu = GpuModel(self.topology, variation)
        self._cores_busy = np.zeros(len(self._numa_cores))
        self._origin: float | None = None
        self._now = 0.0
        self._tau = dict.fromkeys(self.workloads, 0.0)
        self._active: list[FaultRecord] = []
        self._log: list[FaultRecord] = []
        self._migrations: dict[str, Migration] = {}
        self._rate = cfg.rate * len(self._shards) / REFERENCE_SHARDS  # trace seconds per simulated second

    # ---- public API ------------------------------------------------------------------------------

    def shards(self) -> list[ShardInfo]:
        """Every shard with its current GPUs (a pending migration shows its old placement until done)."""
        return [ShardInfo(s.id, s.placement.workload, s.placement.model, s.gpus, s.placement.tp,
                          int(static_bytes_per_gpu(s.placement.model, s.placement.tp) + KV_MIN),
                          comm_intensity(s.perf), int(self._numa[s.gpus[0]]))
                for s in self._shards.values()]

    def migrate(self, shard_id: str, gpus: list[int] | tuple[int, ...]) -> None:
        """Start moving ``shard_id`` to ``gpus``; it keeps serving where it is until the new copy is ready."""
        if self._origin is None:
            raise SimError("the simulator has not ticked yet; migrate after the first collect()")
        shard = self._shards.get(shard_id)
        if shard is None:
            raise SimError(f"unknown shard {shard_id!r}; shards are {', '.join(self._shards)}")
        target = check_migration(shard_id, shard.gpus, gpus, shard.placement.tp, self._occupied(shard_id),
                                 self._free_bytes(), static_bytes_per_gpu(shard.placement.model, shard.placement.tp)
                                 + KV_MIN, self.topology.n, self._migrations)
        weights = shard.perf.spec.weight_bytes / shard.placement.tp
        self._migrations[shard_id] = m = Migration(shard_id, shard.gpus, target, self._now, weights)
        log.info("sim: migrating %s from GPUs %s to %s: %.0f GB onto each of GPUs %s", shard_id, shard.gpus,
                 target, weights / 1e9, m.new)

    def pending_migrations(self) -> dict[str, Migration]:
        """Migrations in flight by shard id (iterating gives the shard ids); the objects are the simulator's
        own, updated every tick: read them, do not change them."""
        return dict(self._migrations)

    def active_faults(self) -> list[FaultRecord]:
        """Faults in effect now (ground truth; not for the daemon's analysis)."""
        return list(self._active)

    def fault_log(self) -> list[FaultRecord]:
        """Every fault started so far, with its source-clock start and end."""
        return list(self._log)

    @property
    def elapsed(self) -> float:
        """Simulated seconds since the first tick began."""
        return 0.0 if self._origin is None else self._now - self._origin

    def close(self) -> None:
        """Nothing to release: the simulator holds no files or threads."""

    # ---- one tick --------------------------------------------------------------------------------

    def collect(self, frame: Frame) -> None:
        """Advance to ``frame.ts`` (by ``frame.interval`` on the first tick) and fill the frame."""
        if self._origin is None:
            self._origin = self._now = frame.ts - frame.interval
            for s in self._shards.values():
                s.engine.t = self._now
        t0, t1 = self._now, frame.ts
        if t1 <= t0:
            raise SimError(f"frame ts {t1} is not after the simulator's clock {t0}; ticks must move forward")
        self._finish_migrations(t0)  # first: a shard fault starting now hits the shard where it now runs
        self._update_faults(t0)
        eff = self._effects()
        dt = t1 - t0
        out = TickOutput(self.topology, len(self._numa_cores))
        rho = numa_load(self._cores_busy / self._numa_cores + self.variation.background_cpu, eff.numa_hog)
        self._arrivals(t0, t1, eff, frame)
        for s in self._shards.values():
            idx = list(s.gpus)
            p = s.placement
            kv = (GPU_MEMORY_UTILIZATION * self._gpu.total[idx] - eff.mem_foreign[idx]
                  - static_bytes_per_gpu(p.model, p.tp)).min()
            cond, timing = shard_timing(s.id, s.perf, s.gpus, s.link, eff, float(self._gpu.clock[idx].min()),
                                        float(rho[self._numa[idx]].max()),
                                        max(kv, 0.0) / kv_bytes_per_gpu_token(p.model, p.tp))
            stats = s.engine.step(t1, cond)
            out.gpu.backlog[idx] |= s.engine.backlog > 0  # what the replica's next /metrics page shows
            alloc = int(self._net_rng.poisson(timing.alloc_rate * p.tp * dt))
            out.add_shard(s, stats, timing, alloc, dt, int(self._numa[idx[0]]), self._sampler)
        for name, w in out.work.items():
            w.set_egress(network_delay(self._net_rng, len(w.done_at), self._nic(eff, name)))
        rates = load_rate(list(self._migrations.values()), eff.link_load)
        for m in self._migrations.values():
            moved, seconds = m.advance(t0, t1, rates.get(m.shard, 0.0))
            out.add_loading(m, moved, seconds, dt, self._shards[m.shard], self._sampler)
        self._cores_busy = out.cores_busy
        out.fill(frame, self.layout, self._gpu, self._sampler, eff, rho, self._numa_cores, len(self._shards), dt)
        self._now = t1

    # ---- internals -------------------------------------------------------------------------------

    def _effects(self) -> Effects:
        return Effects.from_faults(self._active, self.topology.n, len(self._numa_cores))

    def _nic(self, eff: Effects, workload: str) -> float:
        return max(eff.nic.get(None, 0.0), eff.nic.get(workload, 0.0))

    def _occupied(self, mover: str) -> dict[int, str]:
        """GPU -> shard holding it now or as a migration target (``mover`` excluded)."""
        held = {g: s.id for s in self._shards.values() if s.id != mover for g in s.gpus}
        held.update({g: m.shard for m in self._migrations.values() if m.shard != mover for g in m.target})
        return held

    def _free_bytes(self) -> np.ndarray:
        return GPU_MEMORY_UTILIZATION * self._gpu.total - self._effects().mem_foreign

    def _update_faults(self, t0: float) -> None:
        elapsed = t0 - self._origin
        ended = [f for f in self._active if f.end <= t0]
        self._active = [f for f in self._active if f.end > t0]
        for f in ended:
            log.info("sim: fault %s ended", f.kind)
        while self._pending and self._pending[0].onset <= elapsed:
            spec = self._pending.pop(0)
            if spec.end <= elapsed:  # it never was in force at a tick: no effect, so no fault in the ground truth
                log.warning("sim: fault %s at %gs for %gs fell between two ticks and had no effect; give it a "
                            "duration of a tick_interval or more", spec.kind, spec.onset, spec.duration)
            else:
                rec = self._resolve(spec, self._origin + spec.onset)
                self._active.append(rec)
                self._log.append(rec)
                log.info("sim: fault %s started (severity %.2f, gpus %s, shards %s)", rec.kind, rec.severity,
                         rec.gpus, rec.shards)

    def _resolve(self, spec: FaultSpec, start: float) -> FaultRecord:
        t = spec.target
        shard = self._shards[t.shard] if t.shard else None
        gpus: tuple[int, ...] = tuple(t.gpus) if t.gpus else (shard.gpus if shard else ())
        if spec.kind == "cpu_contention":
            nodes = (t.numa,) if t.numa is not None else tuple(sorted({int(self._numa[g]) for g in gpus}))
            hit = [s.id for s in self._shards.values() if int(self._numa[s.gpus[0]]) in nodes]
            return FaultRecord(spec.kind, spec.severity, start, start + spec.duration, (), nodes, tuple(hit))
        if spec.kind == "scheduler_stall":
            return FaultRecord(spec.kind, spec.severity, start, start + spec.duration, shard.gpus, (), (shard.id,))
        if not gpus:  # network_ingress, load_surge
            hit = [s.id for s in self._shards.values() if t.workload in (None, s.placement.workload)]
            return FaultRecord(spec.kind, spec.severity, start, start + spec.duration, shards=tuple(hit),
                               workload=t.workload)
        hit = [s.id for s in self._shards.values() if set(s.gpus) & set(gpus)]
        foreign: tuple[float, ...] = ()
        if spec.kind == "gpu_memory_pressure":  # take `severity` of the headroom the resident shard leaves
            foreign = tuple(spec.severity * self._headroom(g) for g in gpus)
        return FaultRecord(spec.kind, spec.severity, start, start + spec.duration, gpus, (), tuple(hit),
                           foreign_bytes=foreign)

    def _headroom(self, gpu: int) -> float:
        """Bytes the engine could use on ``gpu`` beyond the static footprint of the shard placed there and of one
        migrating there (its weights land there: sized without them, a fault put 146 GB on an 86 GB GPU)."""
        static = [static_bytes_per_gpu(s.placement.model, s.placement.tp) for s in self._shards.values()
                  if gpu in s.gpus]
        static += [static_bytes_per_gpu(self._shards[m.shard].placement.model, self._shards[m.shard].placement.tp)
                   for m in self._migrations.values() if gpu in m.target]
        return max(0.0, float(GPU_MEMORY_UTILIZATION * self._gpu.total[gpu] - sum(static)))

    def _finish_migrations(self, t0: float) -> None:
        for sid, m in list(self._migrations.items()):
            if m.ready_at <= t0:
                self._shards[sid].gpus = m.target
                self._shards[sid].link = pair_link(self.topology, m.target)
                del self._migrations[sid]
                log.info("sim: shard %s now on GPUs %s", sid, m.target)

    def _arrivals(self, t0: float, t1: float, eff: Effects, frame: Frame) -> None:
        """Replay the trace for ``[t0, t1)`` and route each request to the least-loaded shard, or, for the
        ``variation.affinity`` share, to its session's shard (a uniform draw) whatever its load."""
        for workload in self.workloads:
            rate = self._rate * max(eff.surge.get(None, 1.0), eff.surge.get(workload, 1.0))
            tau0 = self._tau[workload]
            tau1 = self._tau[workload] = tau0 + (t1 - t0) * rate
            taus, prompt, output = self.trace.window(tau0, tau1)
            arrival = t0 + (taus - tau0) / rate
            ingress = network_delay(self._net_rng, len(taus), self._nic(eff, workload))
            shards = [s for s in self._shards.values() if s.placement.workload == workload]
            load = [s.engine.outstanding for s in shards]
            choice = np.empty(len(taus), dtype=np.int64)
            affine = (self._route_rng.random(len(taus)) < self.variation.affinity if self.variation.affinity > 0
                      else np.zeros(len(taus), dtype=bool))
            for i in range(len(taus)):
                j = (int(self._route_rng.integers(len(load))) if affine[i]
                     else min(range(len(load)), key=load.__getitem__))
                choice[i] = j
                load[j] += 1
            for j, s in enumerate(shards):
                sel = choice == j
                s.engine.enqueue(arrival[sel], ingress[sel], prompt[sel], output[sel])
