"""Scheduler benchmarks.

``sits-observe bench scheduler``: placement decision latency (p50/p99) on synthetic fabrics of 8-GPU
NVSwitch boxes (8, 64, 1024 GPUs) while 100 shards are placed one after another, against exhaustive
search on the same requests and states (run where its candidate count is under ``--exact-cap``), and the
score a naive least-loaded choice would get.  ``sits-observe bench loop``: see :mod:`.loop_bench`.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from ..argtypes import NON_NEGATIVE_INT, int_at_least
from ..errors import ConfigError
from ..topology import preset
from .config import STRATEGIES
from .placement import GpuLoad, Planner, Request

__all__ = ["add_arguments_scheduler", "run_scheduler", "add_arguments_loop", "run_loop"]

GiB = 2**30
TARGET_P99_MS = {64: 10.0, 1024: 100.0}


def add_arguments_scheduler(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int_at_least(1, 4096), nargs="+", default=[8, 64, 1024],
                   help="fabric sizes, multiples of 8 up to 4096")
    p.add_argument("--shards", type=int_at_least(1, 10_000), default=100, help="shards placed per size, 1-10000")
    p.add_argument("--strategy", default="topology-aware", choices=sorted(STRATEGIES))
    p.add_argument("--exact-cap", type=int_at_least(1, 100_000_000), default=700_000,
                   help="largest candidate count searched exhaustively, 1-100000000")
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=1)


def _shards(n: int, count: int, rng: np.random.Generator) -> list[Request]:
    """``count`` shards of 1-8 GPUs, 30 GiB per GPU on average, scaled down to fill at most 70 % of the fabric."""
    sizes = rng.choice([1, 2, 4, 8], size=count, p=[0.4, 0.3, 0.2, 0.1])
    sizes = np.minimum(sizes, max(1, n // 2))
    per_slot = min(30 * GiB, 0.7 * n * 80 * GiB / sizes.sum())
    return [Request(int(k), float(per_slot * rng.uniform(0.5, 1.5)),
                    comm=float(rng.uniform(0.3, 1.0)) if k > 1 else 0.0, load=float(rng.uniform(0.05, 0.3)))
            for k in sizes]


def _naive(req: Request, load: GpuLoad, total: np.ndarray) -> tuple[int, ...] | None:
    """Least-loaded GPUs where the memory fits, ignoring links and NUMA."""
    fits = np.flatnonzero(load.eligible & (load.reserved + load.foreign + req.memory <= total))
    if len(fits) < req.k:
        return None
    return tuple(int(g) for g in fits[np.argsort(load.util[fits], kind="stable")[: req.k]])


def _ms(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    a = np.array(xs) * 1e3
    return {"p50": round(float(np.percentile(a, 50)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3)}


def _timed(fn: Any, wall: list[float], cpu: list[float]) -> Any:
    """Call ``fn()`` recording wall time and this thread's CPU time (which preemption does not inflate)."""
    w, c = time.perf_counter(), time.thread_time()
    out = fn()
    cpu.append(time.thread_time() - c)
    wall.append(time.perf_counter() - w)
    return out


def _one_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    topo = preset(f"fabric-{n // 8}x8")
    planner = Planner(topo, STRATEGIES[args.strategy])
    rng = np.random.default_rng(args.seed)
    total = np.array([g.memory_total_bytes for g in topo.gpus], dtype=np.float64)
    util = rng.uniform(0.0, 0.3, n)
    reserved = np.zeros(n)
    ours, ours_cpu, exact, exact_cpu, gaps, naive_gap, one_host = [], [], [], [], [], [], []
    placed, scored, skipped = 0, 0, []
    for req in _shards(n, args.shards, rng):
        load = GpuLoad(util.copy(), reserved.copy(), np.zeros(n), np.ones(n, dtype=bool))
        res = _timed(lambda: planner.place(req, load), ours, ours_cpu)  # noqa: B023 (called at once)
        if res.best is None:
            continue
        combos = math.comb(int((reserved + req.memory <= total).sum()), req.k)
        if combos <= args.exact_cap:
            ref = _timed(lambda: planner.place(req, load, method="exact"), exact, exact_cpu)  # noqa: B023
            gaps.append(ref.best.score - res.best.score)
            scored += combos
        else:
            skipped.append(combos)
        naive = _naive(req, load, total)
        if naive is not None:
            naive_gap.append(res.best.score - planner.score(req, load, naive).score)
        if req.k > 1:
            one_host.append(len({topo.gpus[g].node for g in res.best.gpus}) == 1)
        placed += 1
        reserved[list(res.best.gpus)] += req.memory
        util[list(res.best.gpus)] += req.load
    return {
        "gpus": n, "topology": topo.name, "shards": args.shards, "placed": placed,
        "placement_ms": _ms(ours), "placement_cpu_ms": _ms(ours_cpu), "target_p99_ms": TARGET_P99_MS.get(n),
        "exhaustive_ms": _ms(exact), "exhaustive_cpu_ms": _ms(exact_cpu), "exhaustive_runs": len(exact),
        "exhaustive_skipped_over_cap": len(skipped),
        # what the skipped searches would take at the rate the exhaustive runs scored sets
        "exhaustive_estimated_ms_for_skipped": _ms([c * sum(exact) / scored for c in skipped]) if scored else None,
        "score_gap_vs_exhaustive": {"mean": round(float(np.mean(gaps)), 5) if gaps else None,
                                    "max": round(float(np.max(gaps)), 5) if gaps else None},
        "score_gain_vs_naive_least_loaded": round(float(np.mean(naive_gap)), 4) if naive_gap else None,
        "multi_gpu_shards_within_one_box": round(float(np.mean(one_host)), 3) if one_host else None,
    }


def run_scheduler(args: argparse.Namespace) -> dict[str, Any]:
    """Placement latency per fabric size, with the exhaustive and naive baselines."""
    bad = [n for n in args.gpus if n <= 0 or n % 8]
    if bad:
        raise ConfigError(f"bench scheduler: --gpus: {bad} are not positive multiples of 8 (8-GPU boxes)")
    sizes = [_one_size(n, args) for n in args.gpus]
    return {"bench": "scheduler", "strategy": args.strategy, "seed": args.seed, "sizes": sizes,
            "targets_met": all(s["placement_ms"]["p99"] <= s["target_p99_ms"] for s in sizes if s["target_p99_ms"])}


def add_arguments_loop(p: argparse.ArgumentParser) -> None:
    from .loop_bench import add_arguments

    add_arguments(p)


def run_loop(args: argparse.Namespace) -> dict[str, Any]:
    from .loop_bench import run

    return run(args)
