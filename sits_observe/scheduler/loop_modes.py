"""The modes of ``sits-observe bench loop`` (see :mod:`.loop_bench`): one run of the simulator's scenario
each, with the SLO engine and, for ``naive`` and ``full``, the scheduler on the ``sim`` actuator.

A run records the per-tick e2e bucket counts and the scheduler's decisions; ``quiet`` is the same trace
without faults and without actions (the reference).  ``full`` gets verdicts from the trained classifier
or, without one, from the simulator's ground-truth fault labels (an oracle).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import SimConfig
from ..store.config import DEFAULT_BUCKETS, StoreConfig
from ..errors import ConfigError, ModelError, SchedulerError
from ..frame import GPU_FIELD_INDEX, BucketLayout, Frame
from ..histogram import snap_edges
from ..rca.config import RcaConfig
from ..rca.verdict import Verdict
from ..sim.host import SimulatedHost
from ..slo.evaluate import SloEngine
from ..slo.spec import SloSpec
from ..slo.tiers import format_duration
from ..store.series import SeriesStore
from .config import OtlpConfig, SchedulerConfig, ScoreWeights
from .engine import Scheduler

__all__ = ["BUCKETS", "MODES", "Run", "run_mode", "simulator", "slos", "verdict_source"]

BUCKETS = (*DEFAULT_BUCKETS, 120.0, 300.0, 600.0)  # p99 e2e during a fault can pass 60 s
MODES = ("quiet", "off", "naive", "full")
NAIVE = ScoreWeights(comm=0, memory=0, load=1, balance=0, numa=0)


@dataclass
class Run:
    """What one mode produced: per-tick e2e bucket counts and the migrations it made."""

    counts: np.ndarray
    moves: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)


def slos(args: argparse.Namespace) -> list[SloSpec]:
    """The service's SLOs over one hour: e2e latency (whose budget the report counts) and queueing delay
    (the scheduling part of time to first token).  One page tier each, sized to the scenario's 10-minute
    faults: it fires when the last ``--page`` LONG and SHORT windows both burn faster than 2.4x (e2e) or
    5x (queue) the budget rate.  (The SRE workbook's 1h/5m fast-burn pair for a 30-day SLO, scaled to a
    one-hour SLO, would be 5 s/0.4 s; the default 1m/15s is slower than that.)"""
    long_s, short_s = args.page
    tiers = {"page_slow": False, "ticket_fast": False, "ticket_slow": False}

    def page(rate: float) -> dict[str, Any]:
        return {"page_fast": {"long": format_duration(long_s), "short": format_duration(short_s),
                              "budget": rate * long_s / 3600.0}, **tiers}

    specs = [
        {"name": "chat-e2e", "objective": args.objective, "window": "1h",
         "latency": {"stage": "e2e", "threshold": args.threshold}, "tiers": page(2.4)},
        {"name": "chat-queue", "objective": 0.99, "window": "1h", "latency": {"stage": "queue", "threshold": 1.0},
         "tiers": page(5.0)},
    ]
    return [SloSpec.model_validate(s, context={"buckets": list(BUCKETS)}) for s in specs]


class _Oracle:
    """Ground-truth verdicts from the simulator's active faults (labelled as an oracle in the output)."""

    name = "oracle"

    def __init__(self, sim: SimulatedHost, every: int = 60) -> None:
        self.sim, self.every, self.ticks = sim, every, 0

    def verdict(self, ts: float, burning: bool) -> Verdict | None:
        self.ticks += 1
        if not burning and self.ticks % self.every:
            return None
        faults = [f for f in self.sim.active_faults() if f.cause != "healthy"]
        if not faults:
            return Verdict("healthy", 0.95, ts, trigger="slo_burn" if burning else "periodic")
        f = max(faults, key=lambda r: r.severity)
        where = {s.id: s.gpus for s in self.sim.shards()}
        gpus = f.gpus or tuple(g for s in f.shards for g in where.get(s, ()))
        return Verdict(f.cause, 0.95, ts, gpus=tuple(gpus), trigger="slo_burn" if burning else "periodic")


def verdict_source(args: argparse.Namespace) -> RcaConfig | None:
    """The classifier's config when its model is used, None for the oracle."""
    cfg = RcaConfig(model=args.model)
    found = Path(cfg.model_path()).exists()
    named = args.model is not None and args.verdicts != "oracle"  # a --model named is meant to be used
    if (args.verdicts == "model" or named) and not found:
        flag = "--model" if args.model is not None else "--verdicts model"  # (a typo ran the oracle, exit 0)
        raise ConfigError(f"bench loop: {flag}: no trained model at {cfg.model_path()}; train one "
                          "(sits-observe rca train) or use --verdicts oracle")
    if not found or args.verdicts == "oracle":
        return None
    from ..rca.model import RcaModel

    try:  # a model the engine cannot load would leave the full loop without verdicts, silently
        RcaModel.load(cfg.model_path())
    except ModelError as exc:
        raise ConfigError(f"bench loop: {exc}") from None
    return cfg


def simulator(args: argparse.Namespace, scenario: str) -> SimulatedHost:
    return SimulatedHost(SimConfig(topology=args.topology, scenario=scenario, seed=args.seed),
                         BucketLayout(snap_edges(BUCKETS)))


def run_mode(mode: str, args: argparse.Namespace, rca_cfg: RcaConfig | None, work: Path, duration: int) -> Run:
    """One mode over ``duration`` ticks; ``quiet`` is the same trace without faults and without actions."""
    sim = simulator(args, "quiet" if mode == "quiet" else args.scenario)
    layout = sim.layout
    (work / mode).mkdir()
    slo = SloEngine(slos(args), BUCKETS, work / mode)
    sched = rca = oracle = None
    if mode in ("naive", "full"):
        cfg = SchedulerConfig(actuator="sim", cooldown=args.cooldown, decisions_kept=100000,
                              weights=NAIVE if mode == "naive" else None)
        sched = Scheduler(cfg, OtlpConfig(), sim.topology, work / mode, sim=sim, clock=lambda: 0.0)
    # the daemon's default store (1 h): the classifier's host baseline spans that much, as in training
    store = SeriesStore(layout, history=StoreConfig().history) if mode == "full" and rca_cfg is not None else None
    if mode == "full" and rca_cfg is not None:
        from ..rca.engine import RcaEngine

        rca = RcaEngine(rca_cfg, work / mode, on_verdict=sched.on_verdict,
                        firing=lambda: [s.name for s, tier in zip(slo.specs, slo.firing) if tier is not None])
    elif mode == "full":
        oracle = _Oracle(sim)
    run = Run(np.zeros((duration, layout.n)))
    last_move = -np.inf
    try:
        for i in range(duration):
            f = Frame(float(i + 1), 1.0)
            sim.collect(f)
            for (stage, _), h in f.hists.items():
                if stage == "e2e":
                    run.counts[i] += h.counts
            slo.on_tick(f)
            burning = any(slo.firing)
            if store is not None and rca is not None:
                store.ingest(f)
                rca.on_tick(f, store)
            elif oracle is not None and sched is not None and (v := oracle.verdict(f.ts, burning)) is not None:
                sched.on_verdict(v)
            if mode == "naive" and sched is not None and burning and f.ts - last_move >= args.cooldown:
                last_move = f.ts if _naive_move(sched, f) else last_move
            if sched is not None:
                sched.on_tick(f)
        if sched is not None:
            run.decisions = sorted(sched.decisions_state(100000)["decisions"], key=lambda d: d["ts"])
            run.moves = [d for d in run.decisions if d["action"] == "migrate"]
    finally:
        slo.close()
        if rca is not None:
            rca.close()
        if sched is not None:
            sched.close()
    return run


def _naive_move(sched: Scheduler, f: Frame) -> bool:
    """Move the shard on the busiest GPUs (mean utilization) to the least-loaded GPUs where it fits."""
    state = sched.shards_state()
    if state["migrations_in_flight"] or f.gpu is None:
        return False
    util = np.nan_to_num(f.gpu.values[:, GPU_FIELD_INDEX["utilization_ratio"]])
    busiest = max(state["shards"], key=lambda v: float(np.mean(util[v["gpus"]])) if v["gpus"] else -1.0)
    try:
        sched.manual_reshard(busiest["shard"]["id"], "naive: the SLO burns")
    except SchedulerError:  # nowhere to go: the naive policy waits for its next chance
        return False
    return True
