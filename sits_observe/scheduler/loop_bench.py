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
from pathlib import Path
from typing import Any

import numpy as np

from ..argtypes import NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT, float_in
from ..errors import ConfigError
from ..frame import BucketLayout
from ..histogram import snap_edges
from ..slo.tiers import parse_duration
from ..store.quantiles import quantile_rows
from .loop_modes import BUCKETS, MODES, run_mode, simulator, slos, verdict_source
from .triggers import FIXABLE

__all__ = ["add_arguments", "run"]

TAIL = 300.0        # seconds after a fault's end still counted as its impact (backlog drains)
RECOVERY_HOLD = 60  # ticks the trailing error ratio must stay within budget to count as recovered


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
    rca_cfg = verdict_source(args)
    faults = sorted(simulator(args, args.scenario).scenario.faults, key=lambda x: x.onset)
    if not faults:
        raise ConfigError(f"bench loop: --scenario {args.scenario} has no faults; use mixed or a scenario file")
    duration = int(faults[-1].end + 2 * TAIL)
    with tempfile.TemporaryDirectory(prefix="sits-bench-loop-") as tmp:
        runs = {m: run_mode(m, args, rca_cfg, Path(tmp), duration) for m in MODES}
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
        "slos": [s.model_dump(include={"name", "objective", "latency"}) for s in slos(args)],
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
