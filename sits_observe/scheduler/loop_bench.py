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

from ..argtypes import NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT, float_in
from ..config import DEFAULT_BUCKETS, SimConfig, StoreConfig
from ..errors import ConfigError, ModelError, SchedulerError
from ..frame import GPU_FIELD_INDEX, BucketLayout, Frame
from ..histogram import snap_edges
from ..rca.config import RcaConfig
from ..rca.verdict import Verdict
from ..sim.host import SimulatedHost
from ..slo.evaluate import SloEngine
from ..slo.spec import SloSpec, format_duration, parse_duration
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
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=1)
    p.add_argument("--verdicts", choices=["auto", "model", "oracle"], default="auto",
                   help="auto: the trained model if it exists, else the oracle")
    p.add_argument("--model", default=None, help="RCA model file (default: the shipped models/rca-lstm.pt)")
    p.add_argument("--threshold", type=POSITIVE_FLOAT, default=30.0, help="SLO: e2e latency threshold, seconds")
    p.add_argument("--objective", type=float_in(0.0, 1.0, low_open=True, high_open=True), default=0.95,
                   help="SLO: share of requests within the threshold")
    p.add_argument("--cooldown", type=NON_NEGATIVE_FLOAT, default=300.0,
                   help="seconds between two re-shards of one shard (default 300)")
    p.add_argument("--decisions", action="store_true", help="add the full loop's decision log to the output")
    p.add_argument("--page", type=_page_windows, default=(60, 15), metavar="LONG,SHORT",
                   help="the SLOs' page windows (default 1m,15s); the burn-rate thresholds stay 2.4x (e2e) "
                        "and 5x (queue) whatever the windows")


def _page_windows(text: str) -> tuple[int, int]:
    try:
        long_s, short_s = (parse_duration(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two durations LONG,SHORT like 1m,15s, got {text!r}") from None
    if not short_s < long_s <= 720:  # the queue SLO's 5x burn over LONG must fit in its hourly budget
        raise argparse.ArgumentTypeError(f"need SHORT < LONG <= 12m, got {text!r}")
    return long_s, short_s


@dataclass
class _Run:
    """What one mode produced: per-tick e2e bucket counts and the migrations it made."""

    counts: np.ndarray
    moves: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)


def _slos(args: argparse.Namespace) -> list[SloSpec]:
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


def _verdict_source(args: argparse.Namespace) -> RcaConfig | None:
    """The classifier's config when its model is used, None for the oracle."""
    cfg = RcaConfig(model=args.model)
    found = Path(cfg.model_path()).exists()
    if args.verdicts == "model" and not found:
        raise ConfigError(f"bench loop: --verdicts model: no trained model at {cfg.model_path()}; train one "
                          "(sits-observe rca train) or use --verdicts oracle")
    if not found or args.verdicts == "oracle":
        return None
    from ..rca.model import RcaModel

    try:  # a model the engine cannot load would leave the full loop without verdicts, silently
        RcaModel.load(cfg.model_path())
    except ModelError as exc:
        raise ConfigError(f"bench loop: {exc}") from None
    return cfg


def _sim(args: argparse.Namespace, scenario: str) -> SimulatedHost:
    return SimulatedHost(SimConfig(topology=args.topology, scenario=scenario, seed=args.seed),
                         BucketLayout(snap_edges(BUCKETS)))


def _run(mode: str, args: argparse.Namespace, rca_cfg: RcaConfig | None, work: Path, duration: int) -> _Run:
    """One mode over ``duration`` ticks; ``quiet`` is the same trace without faults and without actions."""
    sim = _sim(args, "quiet" if mode == "quiet" else args.scenario)
    layout = sim.layout
    (work / mode).mkdir()
    slo = SloEngine(_slos(args), BUCKETS, work / mode)
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


def _minutes(x: np.ndarray) -> np.ndarray:
    """Trailing one-minute sums: element j covers ticks j-59 .. j (shorter at the start)."""
    c = np.cumsum(x)
    return c - np.concatenate((np.zeros(60), c[:-60]))[: len(c)]


def _recovery(bad: np.ndarray, total: np.ndarray, ref: np.ndarray, lo: int, hi: int,
              budget: float) -> tuple[bool, float | None]:
    """(impaired, seconds from onset to recovery).  A minute is impaired when its error ratio exceeds the
    no-fault run's ratio for the same minute by more than the budget; recovery is the end of the first
    impaired-free minute-long stretch after the first impaired minute of the fault."""
    ratio = _minutes(bad) / np.maximum(_minutes(total), 1.0)
    ok = ratio <= ref + budget
    impaired = np.flatnonzero(~ok[lo:hi])
    if not len(impaired):
        return False, 0.0
    start = lo + int(impaired[0])
    held = np.convolve(ok[start:].astype(float), np.ones(RECOVERY_HOLD))[RECOVERY_HOLD - 1: len(ok) - start]
    back = np.flatnonzero(held == RECOVERY_HOLD)
    return True, (float(start + back[0] - lo) if len(back) else None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the three modes (and the no-fault reference) on the same trace and seed; compare fault by fault."""
    logging.getLogger("sits_observe").setLevel(logging.WARNING)  # one line per decision is too much here
    if args.threshold not in BUCKETS:
        raise ConfigError(f"bench loop: --threshold {args.threshold:g} is not a bucket edge; use one of "
                          f"{', '.join(f'{b:g}' for b in BUCKETS if b >= 1)}")
    rca_cfg = _verdict_source(args)
    faults = sorted(_sim(args, args.scenario).scenario.faults, key=lambda x: x.onset)
    if not faults:
        raise ConfigError(f"bench loop: --scenario {args.scenario} has no faults; use mixed or a scenario file")
    duration = int(faults[-1].end + 2 * TAIL)
    with tempfile.TemporaryDirectory(prefix="sits-bench-loop-") as tmp:
        runs = {m: _run(m, args, rca_cfg, Path(tmp), duration) for m in ("quiet", "off", "naive", "full")}
    k = BUCKETS.index(args.threshold)
    budget = 1.0 - args.objective
    uppers = BucketLayout(snap_edges(BUCKETS)).uppers()
    per_tick = {m: (r.counts[:, k + 1:].sum(axis=1), r.counts.sum(axis=1)) for m, r in runs.items()}
    hourly = budget * per_tick["off"][1].mean() * 3600  # bad requests one hour of the SLO allows
    quiet_bad, quiet_total = per_tick["quiet"]
    ref = _minutes(quiet_bad) / np.maximum(_minutes(quiet_total), 1.0)
    modes = ("off", "naive", "full")
    report = []
    for f in faults:
        lo, hi = int(f.onset), int(min(f.end + TAIL, duration))
        row: dict[str, Any] = {"kind": f.kind, "fixable": f.kind in FIXABLE, "onset_s": f.onset, "end_s": f.end,
                               "no_fault_budget_burned": round(float(quiet_bad[lo:hi].sum()) / hourly, 3)}
        for m in modes:
            bad, total = per_tick[m]
            impaired, rec = _recovery(bad, total, ref, lo, hi, budget)
            burned = float(bad[lo:hi].sum())
            row[m] = {"budget_burned": round(burned / hourly, 3),
                      "fault_budget_burned": round(max(burned - float(quiet_bad[lo:hi].sum()), 0.0) / hourly, 3),
                      "bad_requests": int(burned),
                      "p99_e2e_s": round(float(quantile_rows(runs[m].counts[lo:hi].sum(axis=0), uppers, 0.99)[0]), 2),
                      "impaired": impaired, "recovery_s": rec,
                      "migrations": sum(lo <= d["ts"] < hi for d in runs[m].moves)}
        report.append(row)
    windows = [(int(f.onset), int(f.end + TAIL), f.kind in FIXABLE) for f in faults]

    def cause_at(ts: float) -> str:
        hits = [fixable for lo, hi, fixable in windows if lo <= ts < hi]
        return "fixable" if any(hits) else "non_fixable" if hits else "no_fault"

    totals: dict[str, dict[str, Any]] = {}
    for m in modes:
        causes = [cause_at(d["ts"]) for d in runs[m].moves]
        totals[m] = {key + "_fixable": round(sum(x[m][key] for x in report if x["fixable"]), 3)
                     for key in ("budget_burned", "fault_budget_burned")}
        totals[m] |= {"migrations": len(causes), "migrations_non_fixable": causes.count("non_fixable"),
                      "migrations_no_fault": causes.count("no_fault")}

    def cut(key: str) -> float | None:
        off = totals["off"][key]
        return round(1.0 - totals["full"][key] / off, 3) if off else None

    raw, attributable = cut("budget_burned_fixable"), cut("fault_budget_burned_fixable")
    log = [{k: d[k] for k in ("ts", "action", "trigger", "cause", "shard_id", "source_gpus", "target_gpus", "reason")}
           for d in runs["full"].decisions] if args.decisions else None
    return {
        "bench": "loop", "scenario": args.scenario, "topology": args.topology, "seed": args.seed,
        "verdicts": f"classifier ({rca_cfg.model_path()})" if rca_cfg is not None else
                    "ORACLE: the simulator's ground-truth fault labels stand in for the classifier",
        "slos": [s.model_dump(include={"name", "objective", "latency"}) for s in _slos(args)],
        "page_windows_s": list(args.page),
        "budget_unit": "bad e2e requests one hour of the chat-e2e SLO allows at the actions-off request rate; "
                       "fault_budget_burned subtracts what the same trace burns without faults",
        "faults": report, "totals": totals,
        "targets": {
            "full_vs_off_budget_cut_fixable": raw, "full_vs_off_fault_budget_cut_fixable": attributable,
            "full_burns_at_least_50pct_less": bool(raw is not None and raw >= 0.5),
            "full_burns_at_least_50pct_less_fault_budget": bool(attributable is not None and attributable >= 0.5),
            "full_no_migration_for_non_fixable": totals["full"]["migrations_non_fixable"] == 0,
            "full_fewer_migrations_than_naive": totals["full"]["migrations"] < totals["naive"]["migrations"]},
    } | ({"full_decisions": log} if log is not None else {})
