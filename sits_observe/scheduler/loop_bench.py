"""``sits-observe bench loop``: the closed loop on the simulator's ``mixed`` scenario, three ways.

* ``off``   no actions: the simulator, the SLO engine, nothing moves;
* ``naive`` re-shard on any SLO burn: the shard on the busiest GPUs goes to the least-loaded GPUs where
  it fits (placement weights: load only), at most once per cooldown, no classifier;
* ``full``  the scheduler fed with root-cause verdicts made while the SLO burns (and periodically
  otherwise), with its triggers, hysteresis, cooldown and topology-aware placement.

Verdicts come from the trained classifier (``models/rca-lstm.pt``) when it exists; otherwise (or with
``--verdicts oracle``) from the simulator's ground-truth fault labels, an *oracle* stand-in that the
output says it is.  Per fault: error budget burned, p99 e2e latency, onset-to-recovery time, and the
migrations made during it; overall, migrations made while only a non-fixable cause (or none) was active.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import DEFAULT_BUCKETS, RcaConfig, SimConfig
from ..errors import ConfigError, SchedulerError
from ..frame import GPU_FIELD_INDEX, BucketLayout, Frame
from ..histogram import snap_edges
from ..rca.verdict import Verdict
from ..sim.host import SimulatedHost
from ..slo.evaluate import SloEngine
from ..slo.spec import SloSpec
from ..store.quantiles import quantile_rows
from ..store.series import SeriesStore
from .config import OtlpConfig, SchedulerConfig, ScoreWeights
from .engine import Scheduler
from .triggers import FIXABLE

__all__ = ["add_arguments", "run"]

BUCKETS = (*DEFAULT_BUCKETS, 120.0, 300.0, 600.0)  # p99 e2e during a fault can pass 60 s
TAIL = 300.0        # seconds after a fault's end still counted as its impact (backlog drains)
RECOVERY_HOLD = 60  # ticks the trailing error ratio must stay within budget to count as recovered
NAIVE = ScoreWeights(comm=0, memory=0, load=1, balance=0, numa=0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="mixed")
    p.add_argument("--topology", default="nvswitch-8", choices=["nvswitch-8", "pcie-8"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verdicts", choices=["auto", "model", "oracle"], default="auto",
                   help="auto: the trained model if models/rca-lstm.pt exists, else the oracle")
    p.add_argument("--threshold", type=float, default=60.0, help="SLO: e2e latency threshold, seconds")
    p.add_argument("--objective", type=float, default=0.98, help="SLO: share of requests within the threshold")
    p.add_argument("--cooldown", type=float, default=300.0)


@dataclass
class _Run:
    """What one mode produced: per-tick e2e bucket counts and the migrations it made."""

    counts: np.ndarray
    moves: list[dict[str, Any]] = field(default_factory=list)


def _slo(args: argparse.Namespace) -> SloSpec:
    # a page tier sized to the scenario's 10-minute faults: fires when 5 min and 1 min both burn > 6x
    return SloSpec.model_validate(
        {"name": "chat-e2e", "objective": args.objective, "window": "1h",
         "latency": {"stage": "e2e", "threshold": args.threshold},
         "tiers": {"page_fast": {"long": "5m", "short": "1m", "budget": 0.5}, "page_slow": False,
                   "ticket_fast": False, "ticket_slow": False}},
        context={"buckets": list(BUCKETS)})


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


def _verdict_source(kind: str) -> str:
    model = RcaConfig().model_path()
    if kind == "model" and not Path(model).exists():
        raise ConfigError(f"bench loop: --verdicts model: no trained model at {model}; train one (sits-observe rca "
                          "train) or use --verdicts oracle")
    return "model" if kind == "model" or (kind == "auto" and Path(model).exists()) else "oracle"


def _run(mode: str, args: argparse.Namespace, source: str, work: Path) -> _Run:
    layout = BucketLayout(snap_edges(BUCKETS))
    sim = SimulatedHost(SimConfig(topology=args.topology, scenario=args.scenario, seed=args.seed), layout)
    duration = int(max(f.end for f in sim.scenario.faults) + 2 * TAIL)
    (work / mode).mkdir()
    slo = SloEngine([_slo(args)], BUCKETS, work / mode)
    sched = rca = oracle = None
    if mode != "off":
        cfg = SchedulerConfig(actuator="sim", cooldown=args.cooldown, decisions_kept=100000,
                              weights=NAIVE if mode == "naive" else None)
        sched = Scheduler(cfg, OtlpConfig(), sim.topology, work / mode, sim=sim, clock=lambda: 0.0)
    store = SeriesStore(layout, history=600) if mode == "full" and source == "model" else None
    if mode == "full" and source == "model":
        from ..rca.engine import RcaEngine

        rca = RcaEngine(RcaConfig(), work / mode, burning=lambda: any(slo.firing), on_verdict=sched.on_verdict)
    elif mode == "full":
        oracle = _Oracle(sim)
    run = _Run(np.zeros((duration, layout.n)))
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
            run.moves = [d for d in sched.decisions_state(100000)["decisions"] if d["action"] == "migrate"]
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


def _trailing(x: np.ndarray, n: int) -> np.ndarray:
    c = np.concatenate(([0.0], np.cumsum(x)))
    return c[n:] - c[:-n] if len(x) >= n else np.array([])


def _recovery(bad: np.ndarray, total: np.ndarray, lo: int, budget: float) -> tuple[bool, float | None]:
    """(impaired, seconds from onset until the trailing-minute error ratio is back within budget for a minute)."""
    ratio = np.divide(_trailing(bad, 60), _trailing(total, 60), out=np.zeros(max(len(bad) - 59, 0)),
                      where=_trailing(total, 60) > 0)
    ok = ratio <= budget  # ok[j]: the minute ending at tick j + 59
    first_bad = next((j for j in range(max(lo - 59, 0), len(ok)) if not ok[j]), None)
    if first_bad is None:
        return False, 0.0
    held = _trailing(ok[first_bad:].astype(float), RECOVERY_HOLD)
    back = np.flatnonzero(held == RECOVERY_HOLD)
    return True, (float(first_bad + back[0] + 59 - lo) if len(back) else None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the three modes on the same scenario and seed and compare them fault by fault."""
    logging.getLogger("sits_observe").setLevel(logging.WARNING)  # one line per decision is too much here
    source = _verdict_source(args.verdicts)
    with tempfile.TemporaryDirectory(prefix="sits-bench-loop-") as tmp:
        runs = {m: _run(m, args, source, Path(tmp)) for m in ("off", "naive", "full")}
    layout = BucketLayout(snap_edges(BUCKETS))
    k = BUCKETS.index(args.threshold)
    budget = 1.0 - args.objective
    faults = SimulatedHost(SimConfig(topology=args.topology, scenario=args.scenario, seed=args.seed),
                           layout).scenario.faults
    per_tick = {m: (r.counts.sum(axis=1) - r.counts[:, : k + 1].sum(axis=1), r.counts.sum(axis=1))
                for m, r in runs.items()}
    hourly = budget * per_tick["off"][1].sum() / len(per_tick["off"][1]) * 3600  # bad requests an hour allows
    report, windows = [], []
    for f in sorted(faults, key=lambda x: x.onset):
        lo, hi = int(f.onset), int(min(f.end + TAIL, len(per_tick["off"][1])))
        windows.append((lo, hi, f.kind))
        row: dict[str, Any] = {"kind": f.kind, "fixable": f.kind in FIXABLE, "onset_s": f.onset, "end_s": f.end}
        for m, r in runs.items():
            bad, total = per_tick[m]
            impaired, rec = _recovery(bad, total, lo, budget)
            row[m] = {"budget_burned": round(float(bad[lo:hi].sum()) / hourly, 3),
                      "bad_requests": int(bad[lo:hi].sum()),
                      "p99_e2e_s": round(float(quantile_rows(r.counts[lo:hi].sum(axis=0), layout.uppers(), 0.99)[0]), 2),
                      "impaired": bool(impaired), "recovery_s": rec,
                      "migrations": sum(lo <= d["ts"] < hi for d in r.moves)}
        report.append(row)

    def cause_at(ts: float) -> str:
        kinds = [kind for lo, hi, kind in windows if lo <= ts < hi]
        return "fixable" if any(k in FIXABLE for k in kinds) else "non_fixable" if kinds else "no_fault"

    totals = {}
    for m, r in runs.items():
        causes = [cause_at(d["ts"]) for d in r.moves]
        totals[m] = {"budget_burned_fixable": round(sum(x[m]["budget_burned"] for x in report if x["fixable"]), 3),
                     "budget_burned_all": round(sum(x[m]["budget_burned"] for x in report), 3),
                     "migrations": len(r.moves), "migrations_non_fixable": causes.count("non_fixable"),
                     "migrations_no_fault": causes.count("no_fault")}
    off, full, naive = totals["off"], totals["full"], totals["naive"]
    cut = 1.0 - full["budget_burned_fixable"] / off["budget_burned_fixable"] if off["budget_burned_fixable"] else None
    return {
        "bench": "loop", "scenario": args.scenario, "topology": args.topology, "seed": args.seed,
        "verdicts": "classifier (models/rca-lstm.pt)" if source == "model" else
                    "ORACLE: the simulator's ground-truth fault labels stand in for the classifier",
        "slo": {"stage": "e2e", "threshold_s": args.threshold, "objective": args.objective,
                "budget_unit": "bad requests one hour of the SLO allows at the actions-off request rate"},
        "faults": report, "totals": totals,
        "targets": {"full_vs_off_budget_cut_fixable": None if cut is None else round(cut, 3),
                    "full_burns_at_least_50pct_less": bool(cut is not None and cut >= 0.5),
                    "full_no_migration_for_non_fixable": bool(full["migrations_non_fixable"] == 0),
                    "full_fewer_migrations_than_naive": bool(full["migrations"] < naive["migrations"])},
    }
