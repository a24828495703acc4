"""``sits-observe bench ui``: first render and live-update time of every page in headless Chromium.

A daemon with 8 GPUs and a full hour of history (the simulated host, ticked as fast as it goes) serves
the UI twice on loopback: the real one (incremental caches, patched updates) and a baseline that
recomputes every figure from the store and replaces it on each update.  While pages are open, new
ticks arrive at the real rate relative to the update interval (one tick per ``tick_interval``).
Targets (issue 8): first render <= 1.5 s, interval update <= 300 ms.  It also times ``/metrics`` scrapes
alone and under a flood of bad UI requests (each answered 400/404 before any work).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from ..argtypes import float_in, int_at_least
from ..config import parse
from ..errors import ConfigError
from ..export.http import Server, create_app
from .app import create_dash
from .browser import chromium, load_page, screenshot, wait_updates

__all__ = ["add_arguments", "run", "GRAPHS"]

GRAPHS = {"/topology": 2, "/load": 1, "/stages": 2, "/slos": 2, "/causes": 1}  # graphs drawn per page
TARGETS = {"first_render_ms": 1500.0, "update_ms": 300.0}
BAD_URLS = ("/stages?range=99999h", "/topology?gpu=99", "/load?field=fan", "/no-such-page", "/load?" + "a" * 600)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="nvswitch-8", help="simulated topology (default nvswitch-8: 8 GPUs)")
    p.add_argument("--history", type=int_at_least(60, 86400), default=3600,
                   help="ticks of history filled before measuring (1 h; 60-86400, as store.history)")
    p.add_argument("--updates", type=int_at_least(1, 1000), default=5,
                   help="live updates measured per page and variant, 1-1000")
    p.add_argument("--interval", type=float_in(0.5, 300.0), default=1.0,
                   help="ui.update_interval for the run, seconds (0.5-300, as ui.update_interval)")
    p.add_argument("--out", type=Path, help="directory for screenshots (default: a temporary directory)")


def _daemon(topology: str, history: int, interval: float) -> Any:
    """The demo's daemon (its SLOs, classifier and scheduler included) with ``history`` ticks already run."""
    from ..runtime import DEMO_DEFAULTS
    from ..wiring import build_daemon

    data = yaml.safe_load(DEMO_DEFAULTS.read_text())
    data.update(state_dir=tempfile.mkdtemp(prefix="sits-bench-ui-"), store={"history": history},
                ui={"update_interval": interval, "history": float(history)},
                sim={"topology": topology, "scenario": "mixed", "speed": 1000}, scheduler={"actuator": "sim"})
    daemon = build_daemon(parse(data))
    for _ in range(history):
        daemon.tick()
    return daemon


def _feed(daemon: Any, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        daemon.tick()


def _serve(daemon: Any, incremental: bool) -> Server:
    app = create_app(daemon, ui=False)
    create_dash(app, daemon, incremental=incremental)
    server = Server(app, "127.0.0.1", 0)
    server.start()
    return server


def _summary(updates: list[dict[str, float]]) -> dict[str, Any]:
    if not updates:
        return {"updates": 0}
    ms = sorted(u["ms"] for u in updates)
    return {"updates": len(ms), "update_ms_p50": round(statistics.median(ms), 1), "update_ms_max": round(ms[-1], 1),
            "update_server_ms_p50": round(statistics.median(u["server_ms"] for u in updates), 1),
            "update_bytes_p50": int(statistics.median(u["bytes"] for u in updates))}


def _scrapes(url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _flood(base: str, stop: threading.Event, sent: list[int]) -> None:
    while not stop.is_set():
        for path in BAD_URLS:
            try:
                urllib.request.urlopen(base + path, timeout=30).read()
            except urllib.error.HTTPError as exc:  # the 4xx we expect
                exc.read()
            sent.append(1)


def _metrics_under_flood(base: str, n: int = 40, threads: int = 4) -> dict[str, Any]:
    """/metrics scrape time alone and while ``threads`` clients send bad UI requests as fast as they can."""
    idle = _scrapes(base + "/metrics", n)
    stop, sent = threading.Event(), []
    flooders = [threading.Thread(target=_flood, args=(base, stop, sent), daemon=True) for _ in range(threads)]
    for t in flooders:
        t.start()
    t0 = time.perf_counter()
    flooded = _scrapes(base + "/metrics", n)
    rate = len(sent) / (time.perf_counter() - t0)
    stop.set()
    for t in flooders:
        t.join(timeout=30)
    return {"idle_ms_p50": round(statistics.median(idle), 2), "idle_ms_max": round(max(idle), 2),
            "flood_ms_p50": round(statistics.median(flooded), 2), "flood_ms_max": round(max(flooded), 2),
            "bad_requests_per_s": round(rate), "flood_clients": threads}


def _measure(browser: Any, port: int, args: argparse.Namespace, shots: Path | None) -> dict[str, Any]:
    """Per page: first render and live updates; the first load of this origin (bundles not cached) apart."""
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"cold_first_load_ms": round(load_page(browser, f"{base}/topology", GRAPHS["/topology"]), 1)}
    for path, graphs in GRAPHS.items():
        res = {"first_render_ms": round(load_page(browser, base + path, graphs), 1), **_summary(
            wait_updates(browser, args.updates, timeout=(args.updates + 3) * args.interval + 30))}
        if shots is not None:
            res["screenshot"] = screenshot(browser, shots / f"{path.strip('/')}.png")
        out[path.strip("/")] = res
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.out is not None:  # found before the work, not after it
        first = next(p for p in (args.out, *args.out.parents) if p.exists())  # the rest is created
        if not first.is_dir():
            raise ConfigError(f"bench ui: --out: {first} is a file; give a directory for the screenshots")
    t0 = time.perf_counter()
    daemon = _daemon(args.topology, args.history, args.interval)
    fill_s = time.perf_counter() - t0
    shots = args.out or Path(tempfile.mkdtemp(prefix="sits-bench-ui-shots-"))
    servers = {"patched": _serve(daemon, True), "baseline_full": _serve(daemon, False)}
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(daemon, daemon.config.tick_interval * args.interval /
                                                  daemon.config.ui.update_interval, stop), daemon=True)
    feeder.start()
    try:
        scrape = _metrics_under_flood(f"http://127.0.0.1:{servers['patched'].port}")
        with tempfile.TemporaryDirectory(prefix="sits-bench-ui-profile-") as profile:
            browser = chromium(Path(profile))
            try:
                runs = {v: _measure(browser, s.port, args, shots if v == "patched" else None)
                        for v, s in servers.items()}
            finally:
                browser.quit()
    finally:
        stop.set()
        for s in servers.values():
            s.close()
        daemon.close()
    pages = {p.strip("/"): {v: runs[v][p.strip("/")] for v in runs} for p in GRAPHS}
    worst_first = max(p["patched"]["first_render_ms"] for p in pages.values())
    worst_update = max(p["patched"].get("update_ms_p50", float("inf")) for p in pages.values())
    return {
        "gpus": daemon.topology.n, "history_ticks": args.history, "fill_seconds": round(fill_s, 1),
        "update_interval_s": args.interval, "pages": pages, "screenshots_dir": str(shots),
        "cold_first_load_ms": {v: r["cold_first_load_ms"] for v, r in runs.items()},
        "metrics_scrape_vs_bad_ui_requests": scrape, "targets": TARGETS, "worst_first_render_ms": worst_first,
        "worst_update_ms_p50": worst_update,
        "meets_targets": worst_first <= TARGETS["first_render_ms"] and worst_update <= TARGETS["update_ms"],
    }
