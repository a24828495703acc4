"""``sits-observe bench soak``: the whole daemon's memory, state and cardinality over a long simulated run.

The real daemon runs as a child process (``sits-observe demo``: the simulated GPU host with the demo's SLOs,
classifier and scheduler) at ``--speed`` simulated seconds per wall second, 10000 by default, which on any
machine means as fast as the ticks go.  Its state directory starts empty.  Every ``--every`` simulated seconds
the bench reads the child's ``/proc/PID`` (VmRSS, VmHWM, threads, open files, CPU time), the files under its
``state_dir`` with the rows of each SQLite table, and one ``/metrics`` scrape (series, families, and
``sits_store_ticks_total``, the tick the sample is at).  Simulated time is ticks x ``tick_interval``.

Baseline in the same run: the samples of the first quarter after ``--warmup`` (default 1 h, the store's
history) against those of the last quarter, by median; a quantity *grows* when the last quarter's median is
more than ``--tolerance`` above the baseline's.  The slopes per simulated hour (least squares, after warm-up and
over the last quarter alone) are given beside it: a table that filled up to its cap during the run grows, and its
last quarter's slope is 0.  ``bounded`` is true only when nothing measured grows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from .argtypes import NON_NEGATIVE_INT, PROBABILITY, float_in
from .collectors.promtext import fetch_page
from .config import Config, load
from .errors import CollectorError, ConfigError, SitsError
from .interrupts import sigterm_unwinds
from .sim.faults import Scenario
from .soakread import families_changed, growths, last_line, listens, log_counts, proc_status, state_files

__all__ = ["add_arguments", "run", "next_mark"]

POLL_S = 0.25  # wall seconds between two reads of /api/v1/status
READY_S = 120.0  # wall seconds the daemon may take to start (imports torch, loads the classifier)
STOP_S = 60.0  # wall seconds it may take to drain after SIGTERM before it is killed
MAX_SAMPLES = 10_000  # samples in one run (about 3 KB each, in memory and in the JSON)
PORT_TRIES = 3  # ports tried for the daemon (each found free, taken by another process before the daemon bound it)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hours", type=float_in(0.0, 168.0, low_open=True), default=6.0,
                   help="simulated hours to run, up to 168 (default 6)")
    p.add_argument("--warmup", type=float_in(0.0, 167.0), default=1.0,
                   help="simulated hours left out of the growth verdict, less than --hours (default 1: the store's "
                        "history)")
    p.add_argument("--every", type=float_in(10.0, 3600.0), default=300.0,
                   help="simulated seconds between two samples, 10-3600 (default 300)")
    p.add_argument("--speed", type=float_in(0.0, 10000.0, low_open=True), default=10000.0,
                   help="simulated seconds per wall second, up to 10000 (default 10000: as fast as it goes)")
    p.add_argument("--max-wall", type=float_in(10.0, 86400.0), default=3600.0,
                   help="stop after this many wall seconds even short of --hours, 10-86400 (default 3600)")
    p.add_argument("--tolerance", type=PROBABILITY, default=0.05,
                   help="growth of the last quarter's median over the baseline's that counts as growing, a fraction "
                        "of the baseline (at least 1 unit), 0-1 (default 0.05)")
    p.add_argument("--scenario", default="random",
                   help="random (faults of every class throughout the run, from --seed), quiet, mixed, stress or a "
                        "scenario YAML file")
    p.add_argument("--topology", choices=["nvswitch-8", "pcie-8"], default="nvswitch-8")
    p.add_argument("--seed", type=NON_NEGATIVE_INT, default=1)
    p.add_argument("--config", help="YAML config for the daemon, as `demo --config` takes it")
    p.add_argument("--dir", type=Path, help="an empty or new directory for the state, the log and the scenario "
                                            "(default: a new temporary directory, left there)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.warmup >= args.hours:
        raise ConfigError(f"bench soak: --warmup {args.warmup:g} must be less than --hours {args.hours:g}")
    if (args.hours - args.warmup) * 3600.0 / args.every < 4:
        raise ConfigError(f"bench soak: --every {args.every:g} leaves fewer than 4 samples after --warmup "
                          f"{args.warmup:g} h in --hours {args.hours:g}; lower --every or raise --hours")
    if args.hours * 3600.0 / args.every > MAX_SAMPLES:
        raise ConfigError(f"bench soak: --hours {args.hours:g} at --every {args.every:g} makes more than "
                          f"{MAX_SAMPLES} samples; raise --every")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SITS_")}  # the run is what the flags say
    cfg = load(args.config, env)  # refused here, exit 2, before the daemon starts; no $SITS_CONFIG in env
    where = _workdir(args.dir)
    try:
        return _run(args, where, env, cfg)
    except ConfigError:  # refused before any result: a directory made here holds nothing worth keeping
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)
        raise


def _run(args: argparse.Namespace, where: Path, env: dict[str, str], cfg: Config) -> dict[str, Any]:
    scenario = args.scenario
    if scenario == "random":
        scenario = str(where / "scenario.yaml")
        faults = Scenario.random(args.seed, args.hours, args.topology).model_dump(mode="json", exclude_none=True)
        Path(scenario).write_text(yaml.safe_dump(faults, sort_keys=False))
    load_before = os.getloadavg()
    with sigterm_unwinds():  # the child is stopped on the way out, as for Ctrl-C
        families: dict[str, dict[str, int]] = {}  # series per family: "first" after warm-up, "last"
        child, base = _start(args, where, scenario, env)
        try:
            t0 = time.monotonic()
            samples, stopped = _soak(child, base, where / "state", cfg, args, t0, families)
            wall_s = time.monotonic() - t0  # the run, without the drain after it (drain_seconds)
        finally:
            exit_code, drain_s = _stop(child)
    sim_h = samples[-1]["sim_hours"] if samples else 0.0
    changes = growths(samples, args.warmup, args.tolerance)
    growing = sorted(k for k, v in changes.items() if v["grows"])
    return {
        "bench": "soak", "completed": stopped == "reached --hours", "stopped": stopped,
        "simulated_hours": sim_h, "wall_seconds": round(wall_s, 1),
        "simulated_per_wall_second": round(sim_h * 3600.0 / wall_s, 1) if wall_s > 0 else None,
        "machine": {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "daemon": {"pid": child.pid, "exit_code": exit_code, "drain_seconds": drain_s, "dir": str(where),
                   **log_counts(where / "daemon.log")},
        "scenario": scenario, "tick_interval": cfg.tick_interval, "warmup_hours": args.warmup,
        "tolerance": args.tolerance, "samples": samples, "growth": changes, "growing": growing,
        "bounded": not growing if sum(s["sim_hours"] >= args.warmup for s in samples) >= 4 else None,
        "families_changed": families_changed(families),
        "state_after_exit": state_files(where / "state"),
    }


def _workdir(given: Path | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="sits-bench-soak-"))
    if given.exists() and (not given.is_dir() or any(given.iterdir())):
        raise ConfigError(f"bench soak: --dir: {given} is not an empty directory; a soak starts from empty state")
    try:
        given.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, a read-only mount
        raise ConfigError(f"bench soak: --dir: cannot make {given} ({exc.strerror}); give an empty or new "
                          "directory") from None
    return given


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: argparse.Namespace, where: Path, scenario: str, env: dict[str, str]
           ) -> tuple[subprocess.Popen[bytes], str]:
    """``sits-observe demo`` as a child, its state under ``where/state``, its log in ``where/daemon.log``; returns
    once it answers /readyz (its first tick ran).  It has a session of its own: a Ctrl-C at the terminal reaches
    the bench alone, which stops the child with one SIGTERM (a second would skip its drain).  The port is a free
    one found by binding it; another process that takes it before the child binds it (a second soak) makes the
    child exit with the port in use: it is started again on another, up to :data:`PORT_TRIES` times."""
    argv = [sys.executable, "-m", "sits_observe", "demo", "--speed", repr(args.speed), "--seed", str(args.seed),
            "--topology", args.topology, "--scenario", scenario,
            "--duration", repr(args.max_wall + READY_S + STOP_S)]  # an orphaned child ends by itself
    if args.config:
        argv += ["--config", args.config]
    (where / "state").mkdir()
    for _ in range(PORT_TRIES):
        port, child = _free_port(), None
        try:
            # a Ctrl-C or SIGTERM inside Popen() would leave its child unknown here, and running: held until the child
            # is ours (the daemon unblocks them for itself as it starts)
            old = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
            try:
                with (where / "daemon.log").open("wb") as log:
                    child = subprocess.Popen([*argv, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                             stderr=log, start_new_session=True,
                                             env={**env, "SITS_STATE_DIR": str(where / "state")})
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            _wait_ready(child, port, where)
            return child, f"http://127.0.0.1:{port}"
        except PortTaken:  # the child has exited
            continue
        except BaseException:  # not ready, or interrupted while starting it: no child left running
            if child is not None:
                _stop(child)
            raise
    raise SitsError(f"bench soak: {PORT_TRIES} free ports were each taken by another process before the daemon could "
                    f"bind it; run again (the last: {_bind_error(where)})")


class PortTaken(SitsError):
    """The port found free was bound by another process first: the child exited, refused it."""


def _bind_error(where: Path) -> str:
    """The daemon's one-line error without its prefix, and without the listen hint a bench user cannot act on."""
    return last_line(where / "daemon.log").removeprefix("sits-observe: error: ").split("; set listen:")[0]


def _wait_ready(child: subprocess.Popen[bytes], port: int, where: Path) -> None:
    """Until the child answers /readyz on ``port``: a listener there that is not the child's is not it."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if child.poll() is not None:  # exit 2: what it was given (a scenario, a config) is a usage error here too
            why = _bind_error(where)
            if why == f"listen: 127.0.0.1:{port} is in use":
                raise PortTaken(why)
            raise (ConfigError if child.returncode == 2 else SitsError)(
                f"bench soak: the daemon exited with {child.returncode} before it was ready: {why}")
        try:
            fetch_page(f"http://127.0.0.1:{port}/readyz", 5.0)
            if listens(child.pid, port):
                return
        except CollectorError:
            pass
        time.sleep(POLL_S)
    raise SitsError(f"bench soak: the daemon was not ready within {READY_S:g} s; see {where / 'daemon.log'}")


def _soak(child: subprocess.Popen[bytes], base: str, state: Path, cfg: Config, args: argparse.Namespace,
          t0: float, families: dict[str, dict[str, int]]) -> tuple[list[dict[str, Any]], str]:
    samples: list[dict[str, Any]] = []
    target, mark = args.hours * 3600.0, 0.0
    while True:
        if child.poll() is not None:
            return samples, f"the daemon exited with {child.returncode}"
        try:
            sim_s = json.loads(fetch_page(base + "/api/v1/status", 10.0))["ticks"] * cfg.tick_interval
            if sim_s >= mark or sim_s >= target:
                sample, per_family, at_s = _sample(child.pid, base, state, cfg.tick_interval, time.monotonic() - t0)
                samples.append(sample)
                if sample["sim_hours"] >= args.warmup:
                    families.setdefault("first", per_family)
                    families["last"] = per_family
                mark = next_mark(at_s, args.every)
        except (CollectorError, OSError) as exc:  # the API or /proc/PID: the run ends with what was measured
            if child.poll() is not None:
                return samples, f"the daemon exited with {child.returncode}"
            return samples, f"a measurement failed: {exc}"
        if sim_s >= target:
            return samples, "reached --hours"
        if time.monotonic() - t0 >= args.max_wall:
            return samples, "reached --max-wall"
        time.sleep(POLL_S)


def next_mark(sim_s: float, every: float) -> float:
    """The simulated second of the sample after one at ``sim_s`` (exact, not the rounded ``sim_hours``: a sample
    on a mark would otherwise be taken again at the next poll)."""
    return (sim_s // every + 1) * every


def _sample(pid: int, base: str, state: Path, interval: float, wall_s: float
            ) -> tuple[dict[str, Any], dict[str, int], float]:
    """One sample, the series of each family on /metrics, and the simulated second it is at."""
    proc = proc_status(pid)
    t = time.perf_counter()
    text = fetch_page(base + "/metrics", 30.0)
    scrape_ms = (time.perf_counter() - t) * 1e3
    families: dict[str, int] = {}
    ticks = errors = 0.0
    for fam in text_string_to_metric_families(text):
        families[fam.name] = len(fam.samples)
        if fam.name == "sits_store_ticks":
            ticks = fam.samples[0].value
        elif fam.name == "sits_source_errors":
            errors = sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return {"sim_hours": round(ticks * interval / 3600.0, 4), "wall_s": round(wall_s, 1), **proc,
            "series": sum(families.values()), "families": len(families), "metrics_bytes": len(text.encode()),
            "scrape_ms": round(scrape_ms, 1), "source_errors": errors, **state_files(state)}, families, ticks * interval


def _stop(child: subprocess.Popen[bytes]) -> tuple[int | None, float | None]:
    """SIGTERM and wait for the drain: (exit code, seconds); killed after :data:`STOP_S` (None, None)."""
    if child.poll() is not None:
        return child.returncode, None
    t = time.monotonic()
    child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=STOP_S), round(time.monotonic() - t, 2)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return None, None


