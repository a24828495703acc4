"""`sits-observe bench slo`: SLO evaluation cost per tick and alert outbox throughput, each with a baseline.

* Evaluation: ``--slos`` SLOs (latency and ratio SLIs over several stages and workloads, default tiers,
  28d/30d windows) evaluated by :class:`~.evaluate.SloEngine` each 1 s tick, SQLite writes included.
  Baseline in the same run: keep each SLO's raw per-tick good/total history and re-sum every window
  from it each tick, for windows up to ``--baseline-history`` only (longer ones would not fit in
  memory at 1 s ticks), so the baseline figure is a lower bound of that approach.
* Outbox: ``--deliveries`` alerts queued, then delivered to a loopback HTTP receiver (keep-alive) by the
  sender thread, one per request (webhook) and batched (Alertmanager).  Baseline: the same bodies POSTed
  straight over one connection, with no outbox (no durability).
"""

from __future__ import annotations

import argparse
import http.client
import logging
import platform
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from ..alerting.config import AlertingConfig
from ..alerting.dispatch import Dispatcher
from ..alerting.formats import Alert, render
from ..argtypes import float_in, int_at_least
from ..config import Config, parse
from ..frame import STAGES, BucketLayout, Frame
from .evaluate import SloEngine

__all__ = ["add_arguments", "run"]

EVAL_TARGET_MS = 10.0
DELIVERY_TARGET = 500.0
WORKLOADS = ("chat", "code", "batch", "embed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # upper bounds: the baseline's ring grows with SLOs x history (1000 SLOs x 24 h: 1.5 GB peak)
    parser.add_argument("--slos", type=int_at_least(1, 1000), default=100,
                        help="SLOs evaluated per tick, 1-1000 (default 100)")
    parser.add_argument("--ticks", type=int_at_least(1, 100_000), default=600,
                        help="ticks measured, 1-100000 (default 600)")
    # under 1 s of history the baseline divided by zero
    parser.add_argument("--baseline-history", type=float_in(0.01, 24.0), default=6.0,
                        help="hours of raw history for the baseline, 0.01-24")
    parser.add_argument("--baseline-ticks", type=int_at_least(1, 10_000), default=30,
                        help="ticks measured for the (slow) baseline, 1-10000")
    parser.add_argument("--deliveries", type=int_at_least(1, 100_000), default=2000,
                        help="alerts delivered per outbox run, 1-100000")


def _config(n: int, state_dir: str) -> Config:
    buckets = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
    slos = []
    for i in range(n):
        workload = WORKLOADS[i % len(WORKLOADS)]
        base = {"name": f"slo-{i}", "objective": (0.99, 0.999, 0.995)[i % 3], "window": ("28d", "30d")[i % 2]}
        if i % 4 == 3:
            slos.append({**base, "ratio": {"total": "requests_total", "bad": "request_errors_total",
                                           "workload": workload}, "min_rate": 0.1})
        else:
            stage = STAGES[i % 6]
            slos.append({**base, "latency": {"stage": stage, "workload": workload if i % 5 else None,
                                             "threshold": buckets[3 + i % 4]}})
    return parse({"state_dir": state_dir, "store": {"buckets": buckets}, "slos": slos}, env={})


def _frames(cfg: Config, ticks: int, seed: int = 1) -> list[Frame]:
    layout = BucketLayout(cfg.store.snapped())
    rng = np.random.default_rng(seed)
    lam = np.zeros(layout.n)
    lam[:3], lam[-1] = 20.0, 0.03
    out = []
    for k in range(ticks):
        frame = Frame(ts=1_700_000_000.0 + k, interval=1.0)
        for stage in STAGES[:6]:
            for w in WORKLOADS:  # healthy traffic: 1 event in 2000 over every threshold
                frame.add_hist(stage, w, rng.poisson(lam).astype(np.uint64), 1.0)
        for w in WORKLOADS:
            frame.add_counter("requests_total", w, 100.0)
            frame.add_counter("request_errors_total", w, float(rng.poisson(0.05)))
        out.append(frame)
    return out


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"mean": round(float(a.mean()), 4), "p50": round(float(np.percentile(a, 50)), 4),
            "p99": round(float(np.percentile(a, 99)), 4), "max": round(float(a.max()), 4)}


def _naive(engine: SloEngine, frames: list[Frame], history_ticks: int) -> list[float]:
    """Raw per-tick history in a ring; every window <= the history re-summed from it each tick."""
    n = len(engine.specs)
    ring = np.zeros((2, n, history_ticks))
    keep = engine.plan.windows <= history_ticks
    rows, windows = engine.plan.rows[keep], engine.plan.windows[keep].astype(np.int64)
    out = []
    for k, frame in enumerate(frames):
        t0 = time.perf_counter()
        good, total = engine.reader.read(frame)
        pos = k % history_ticks
        ring[0, :, pos], ring[1, :, pos] = good, total
        sums = np.empty((2, len(rows)))
        for p, (row, w) in enumerate(zip(rows, windows)):
            idx = np.arange(pos - w + 1, pos + 1) % history_ticks
            sums[:, p] = ring[:, row, idx].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            _ = 1.0 - sums[0] / sums[1]
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _evaluation(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("sits_observe.slo").setLevel(logging.WARNING)  # no line per alert while timing
    with tempfile.TemporaryDirectory(prefix="sits-bench-slo-") as tmp:
        cfg = _config(args.slos, tmp)
        frames = _frames(cfg, args.ticks + 20)
        engine = SloEngine.from_config(cfg)
        assert engine is not None
        for frame in frames[:20]:  # warm-up
            engine.on_tick(frame)
        ms = []
        for frame in frames[20:]:
            t0 = time.perf_counter()
            engine.on_tick(frame)
            ms.append((time.perf_counter() - t0) * 1e3)
        naive = _naive(engine, frames[20:20 + args.baseline_ticks], int(args.baseline_history * 3600))
        engine.close()
    ours, base = _stats(ms), _stats(naive)
    return {"slos": args.slos, "ticks": args.ticks, "eval_ms_per_tick": ours, "baseline_eval_ms_per_tick": base,
            "baseline": f"raw per-tick history, windows <= {args.baseline_history:g}h re-summed per tick (lower bound)",
            "eval_speedup_vs_baseline": round(base["mean"] / ours["mean"], 1),
            "target_eval_ms": EVAL_TARGET_MS, "meets_eval_target": ours["p99"] <= EVAL_TARGET_MS}


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _alerts(n: int) -> list[Alert]:
    return [Alert({"alertname": "SitsSloBurnRate", "slo": f"slo-{i}", "severity": "page", "burn_tier": "page_fast"},
                  {"summary": "bench"}, "firing", 1_700_000_000.0) for i in range(n)]


def _outbox_run(kind: str, url: str, alerts: list[Alert]) -> tuple[float, float]:
    """(queued per second, delivered per second) through a fresh outbox."""
    with tempfile.TemporaryDirectory(prefix="sits-bench-outbox-") as tmp:
        cfg = AlertingConfig.model_validate({"receivers": [{"type": kind, "name": "sink", "url": url}]})
        d = Dispatcher(cfg, Path(tmp))
        t0 = time.perf_counter()
        for a in alerts:
            d.notify(a)
        t1 = time.perf_counter()
        d.start()
        while d.outbox.depth():
            time.sleep(0.005)
        t2 = time.perf_counter()
        d.close()
    return len(alerts) / (t1 - t0), len(alerts) / (t2 - t1)


def _direct(port: int, alerts: list[Alert]) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    t0 = time.perf_counter()
    for a in alerts:
        body = render("webhook", [a], "sink", time.time())
        conn.request("POST", "/hook", body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
    conn.close()
    return len(alerts) / (time.perf_counter() - t0)


def _delivery(args: argparse.Namespace) -> dict[str, Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    alerts = _alerts(args.deliveries)
    try:
        queued, webhook = _outbox_run("webhook", f"http://127.0.0.1:{port}/hook", alerts)
        _, batched = _outbox_run("alertmanager", f"http://127.0.0.1:{port}", alerts)
        direct = _direct(port, alerts)
    finally:
        server.shutdown()
        server.server_close()
    return {"deliveries": args.deliveries, "queued_per_s": round(queued), "webhook_delivered_per_s": round(webhook),
            "alertmanager_batched_delivered_per_s": round(batched), "baseline_direct_post_per_s": round(direct),
            "target_delivered_per_s": DELIVERY_TARGET, "meets_delivery_target": webhook >= DELIVERY_TARGET}


def run(args: argparse.Namespace) -> dict[str, Any]:
    return {"bench": "slo", "machine": f"{platform.system()} {platform.machine()}, python {platform.python_version()}",
            **_evaluation(args), "outbox": _delivery(args)}
