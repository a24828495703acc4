"""`sits-observe bench pipeline`: tick cost and /metrics render time vs per-event Histogram.observe().

Our path: a source hands the tick's per-bucket deltas (as the BPF drain and the simulator do), the daemon
ingests them into the ring store, and a scrape renders cumulative histograms from the store's totals.
Baseline: the same events fed one by one to ``prometheus_client.Histogram.observe()`` (what an exporter
that instruments per event does), GPU gauges set per field, and the same registry rendered.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from ..argtypes import NON_NEGATIVE_INT, float_in, int_at_least
from ..clock import WallClock
from ..config import parse
from ..daemon import Daemon
from ..frame import GPU_FIELD_INDEX, GPU_FIELDS, STAGES, BucketLayout, Frame, GpuFrame, GpuInfo
from .http import create_app

__all__ = ["add_arguments", "run"]

EXTRA_STAGES = ("ttft", "tpot", "network")  # 14 vocabulary stages + 3 = 17, as the issue asks


def add_arguments(p: argparse.ArgumentParser) -> None:
    # upper bounds: memory and run time grow with each (the store's ring takes about 0.75 MB a GPU)
    p.add_argument("--gpus", type=int_at_least(1, 1024), nargs="+", default=[8, 64], help="GPUs per host run, 1-1024")
    p.add_argument("--workloads", type=int_at_least(1, 64), default=8, help="workloads per stage, 1-64")
    p.add_argument("--events-per-second", type=float_in(0, 1e6, low_open=True), default=None,
                   help="latency events per tick over all series, at most 1e6 (default: the demo's rate, measured on "
                        "the simulator)")
    p.add_argument("--ticks", type=int_at_least(1, 100_000), default=200, help="ticks timed, 1-100000")
    p.add_argument("--scrapes", type=int_at_least(1, 10_000), default=20, help="scrapes timed, 1-10000")
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=1)


class _ReplaySource:
    """Hands out pre-built per-tick deltas, like a drained BPF map."""

    name = "replay"

    def __init__(self, deltas: list[dict[tuple[str, str], tuple[np.ndarray, float]]], gpu: GpuFrame) -> None:
        self.deltas = deltas
        self.gpu = gpu
        self.i = 0

    def collect(self, frame: Frame) -> None:
        for (stage, wl), (counts, total) in self.deltas[self.i % len(self.deltas)].items():
            frame.add_hist(stage, wl, counts, total)
        frame.gpu = GpuFrame(self.gpu.info, self.gpu.values, self.gpu.healthy)
        self.i += 1


def _events(rng: np.random.Generator, keys: list[tuple[str, str]], per_tick: int, ticks: int) -> list[dict]:
    out = []
    for _ in range(ticks):
        share = rng.multinomial(per_tick, np.full(len(keys), 1 / len(keys)))
        out.append({k: rng.lognormal(-6, 1.5, n) for k, n in zip(keys, share)})
    return out


def _gpu(n: int, rng: np.random.Generator) -> GpuFrame:
    info = tuple(GpuInfo(i, f"GPU-{i:08x}", "NVIDIA H100 80GB HBM3", f"00000000:{i:02X}:00.0") for i in range(n))
    g = GpuFrame.empty(info)
    g.values[:] = rng.random(g.values.shape) * 100
    g.values[:, GPU_FIELD_INDEX["throttle_reasons"]] = 0x4  # one reason
    return g


def _timed(call: Any, n: int) -> dict[str, float]:
    """Median and p99 wall time of ``n`` calls, and median CPU time of this thread (robust to other load)."""
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        call()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return {"median_ms": round(statistics.median(wall) * 1e3, 4),
            "p99_ms": round(float(np.percentile(wall, 99)) * 1e3, 4),
            "cpu_median_ms": round(statistics.median(cpu) * 1e3, 4)}


def _ours(cfg: Any, events: list[dict], gpu: GpuFrame, layout: BucketLayout, args: argparse.Namespace) -> dict:
    deltas = [{k: (layout.counts_of(v), float(v.sum())) for k, v in tick.items()} for tick in events]
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources.append(_ReplaySource(deltas, gpu))
    client = create_app(daemon, ui=False).test_client()
    for _ in range(len(deltas)):  # warm-up: series registration and ring growth happen once
        daemon.tick()
    tick = _timed(daemon.tick, args.ticks)
    scrape = _timed(lambda: client.get("/metrics"), args.scrapes)
    return {"tick": tick, "scrape": scrape, "scrape_bytes": len(client.get("/metrics").data)}


def _baseline(events: list[dict], gpu: GpuFrame, layout: BucketLayout, args: argparse.Namespace) -> dict:
    reg = CollectorRegistry()
    hist = Histogram("sits_stage_latency_seconds", "per event", ["stage", "workload"], buckets=layout.edges,
                     registry=reg)
    gauges = [Gauge(f"sits_gpu_{f.name.removesuffix('_total')}", f.help, ["gpu"], registry=reg) for f in GPU_FIELDS]
    ticks = iter(range(args.ticks))

    def tick() -> None:
        for (stage, wl), values in events[next(ticks) % len(events)].items():
            child = hist.labels(stage, wl)
            for v in values.tolist():
                child.observe(v)
        for j, g in enumerate(gauges):
            for k in range(len(gpu.info)):
                g.labels(str(k)).set(float(gpu.values[k, j]))

    return {"tick": _timed(tick, args.ticks), "scrape": _timed(lambda: generate_latest(reg), args.scrapes)}


def _demo_rate(cfg: Any, layout: BucketLayout, ticks: int = 120) -> float:
    """Latency events per tick the demo's simulated host emits (mixed scenario, default seed)."""
    from ..sim.host import SimulatedHost

    sim = SimulatedHost(cfg.sim, layout)
    total = 0
    for i in range(ticks):
        frame = Frame(float(i + 1), 1.0)
        sim.collect(frame)
        total += sum(h.count for h in frame.hists.values())
    return total / ticks


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    cfg = parse({"state_dir": "/tmp", "store": {"history": 3600}}, env={})
    layout = BucketLayout(cfg.store.snapped())
    stages = STAGES + EXTRA_STAGES
    keys = [(s, f"w{w}") for s in stages for w in range(args.workloads)]
    per_tick = int(args.events_per_second or _demo_rate(cfg, layout))
    events = _events(rng, keys, per_tick, ticks=20)
    results = []
    for n in args.gpus:
        gpu = _gpu(n, rng)
        ours = _ours(cfg, events, gpu, layout, args)
        base = _baseline(events, gpu, layout, args)
        results.append({
            "gpus": n, "stages": len(stages), "workloads": args.workloads, "events_per_tick": per_tick,
            "ours": ours, "baseline_observe_per_event": base,
            "tick_speedup": round(base["tick"]["cpu_median_ms"] / ours["tick"]["cpu_median_ms"], 1),
            "scrape_speedup": round(base["scrape"]["cpu_median_ms"] / ours["scrape"]["cpu_median_ms"], 1),
        })
    return {"bench": "pipeline", "results": results,
            "targets": {"tick_ms_8gpu": 5.0, "scrape_ms_8gpu": 20.0, "min_speedup": 10.0}}
