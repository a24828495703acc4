"""The probes inside the daemon: kernel histograms reach /metrics, and promtool finds the page clean."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from probe_helpers import OFF
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.clock import WallClock
from sits_observe.export.http import create_app
from sits_observe.probes.source import ProbeSource


def test_runq_histogram_and_probe_metrics_on_the_metrics_page(tmp_path: Path) -> None:
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"},
                 "workloads": [{"name": "tests", "pids": [os.getpid()]}],
                 "probes": {"syscalls": OFF, "block_io": OFF, "cuda": OFF, "nccl": OFF}}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    source = ProbeSource(cfg, daemon.layout)  # as sits_observe.wiring adds it
    daemon.sources.append(source)
    try:
        client = create_app(daemon, ui=False).test_client()
        daemon.tick()
        for _ in range(60):  # each sleep that blocks is one wake-up, one run-queue wait
            time.sleep(0.001)
        daemon.tick()
        body = client.get("/metrics").data.decode()
    finally:
        source.close()
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check.stdout + check.stderr
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    count = [s.value for s in fams["sits_stage_latency_seconds"].samples
             if s.name.endswith("_count") and s.labels == {"stage": "runq", "workload": "tests"}]
    # at least half: a timer that fires before the task has left the CPU wakes nothing (seen: 29 of 30)
    assert count and count[0] >= 30
    attached = {s.labels["probe"]: s.value for s in fams["sits_probe_attached"].samples}
    assert attached == {"runq": 1.0, "syscalls": 0.0, "block_io": 0.0, "cuda": 0.0, "nccl": 0.0}
    assert {s.labels["probe"] for s in fams["sits_probe_errors"].samples} == set(attached)
