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

from ..config import parse
from ..daemon import Daemon, WallClock
from ..frame import GPU_FIELD_INDEX, GPU_FIELDS, STAGES, BucketLayout, Frame, GpuFrame, GpuInfo
from .http import create_app

__all__ = ["add_arguments", "run"]

EXTRA_STAGES = ("ttft", "tpot", "network")  # 14 vocabulary stages + 3 = 17, as the issue asks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    p.add_argument("--workloads", type=int, default=8)
    p.add_argument("--events-per-second", type=float, default=20000.0,
                   help="latency events per tick over all series (default: about the demo's rate)")
    p.add_argument("--ticks", type=int, default=200)
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)


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


def _ms(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples) * 1e3, 4), "p99_ms": round(float(np.percentile(samples, 99)) * 1e3, 4)}


def _ours(cfg: Any, events: list[dict], gpu: GpuFrame, layout: BucketLayout, args: argparse.Namespace) -> dict:
    deltas = [{k: (layout.counts_of(v), float(v.sum())) for k, v in tick.items()} for tick in events]
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources.append(_ReplaySource(deltas, gpu))
    client = create_app(daemon, ui=False).test_client()
    for _ in range(len(deltas)):  # warm-up: series registration and ring growth happen once
        daemon.tick()
    ticks = []
    for _ in range(args.ticks):
        t0 = time.perf_counter()
        daemon.tick()
        ticks.append(time.perf_counter() - t0)
    scrapes, size = [], 0
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        body = client.get("/metrics").data
        scrapes.append(time.perf_counter() - t0)
        size = len(body)
    return {"tick": _ms(ticks), "scrape": _ms(scrapes), "scrape_bytes": size}


def _baseline(events: list[dict], gpu: GpuFrame, layout: BucketLayout, args: argparse.Namespace) -> dict:
    reg = CollectorRegistry()
    hist = Histogram("sits_stage_latency_seconds", "per event", ["stage", "workload"], buckets=layout.edges, registry=reg)
    gauges = [Gauge(f"sits_gpu_{f.name.removesuffix('_total')}", f.help, ["gpu"], registry=reg) for f in GPU_FIELDS]
    ticks = []
    for i in range(args.ticks):
        t0 = time.perf_counter()
        for (stage, wl), values in events[i % len(events)].items():
            child = hist.labels(stage, wl)
            for v in values.tolist():
                child.observe(v)
        for j, g in enumerate(gauges):
            for k in range(len(gpu.info)):
                g.labels(str(k)).set(float(gpu.values[k, j]))
        ticks.append(time.perf_counter() - t0)
    scrapes = []
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        generate_latest(reg)
        scrapes.append(time.perf_counter() - t0)
    return {"tick": _ms(ticks), "scrape": _ms(scrapes)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    cfg = parse({"state_dir": "/tmp", "store": {"history": 3600}}, env={})
    layout = BucketLayout(cfg.store.snapped())
    stages = STAGES + EXTRA_STAGES
    keys = [(s, f"w{w}") for s in stages for w in range(args.workloads)]
    per_tick = int(args.events_per_second)
    events = _events(rng, keys, per_tick, ticks=20)
    results = []
    for n in args.gpus:
        gpu = _gpu(n, rng)
        ours = _ours(cfg, events, gpu, layout, args)
        base = _baseline(events, gpu, layout, args)
        results.append({
            "gpus": n, "stages": len(stages), "workloads": args.workloads, "events_per_tick": per_tick,
            "ours": ours, "baseline_observe_per_event": base,
            "tick_speedup": round(base["tick"]["median_ms"] / ours["tick"]["median_ms"], 1),
        })
    return {"bench": "pipeline", "results": results,
            "targets": {"tick_ms_8gpu": 5.0, "scrape_ms_8gpu": 20.0, "min_speedup": 10.0}}
