"""One running stack for the end-to-end and dashboard tests, started once per session:

capture server (alert webhook, Alertmanager's webhook, OTLP/HTTP traces) -> real Alertmanager ->
``sits-observe demo --scenario mixed`` at high speed -> real Prometheus scraping it every second.
Logs of every process are copied to tests/artifacts/e2e/ at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e_servers import ARTIFACTS, Capture, Proc, Stack, free_port

SPEED = 60  # simulated seconds per wall second: the mixed scenario's first fault starts 10 s in
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
PROMETHEUS = "/usr/bin/prometheus"


def daemon_config(tmp: Path, port: int, capture: Capture, am_url: str) -> dict:
    """The demo's own SLOs (sits_observe/demo.yaml) stay; receivers and OTLP point at the test's servers."""
    return {
        "listen": f"127.0.0.1:{port}",
        "state_dir": str(tmp / "state"),
        "log_level": "info",
        "ui": {"update_interval": 1.0},
        "alerting": {
            "receivers": [
                {"type": "webhook", "name": "e2e-hook", "url": f"{capture.url}/webhook", "timeout": 5},
                {"type": "alertmanager", "url": am_url, "timeout": 5},
            ],
            "resend_interval": 2.0,
            "backoff": {"initial": 0.5, "max": 5},
        },
        "scheduler": {"actuator": "sim"},
        "otlp": {"endpoint": capture.url, "schedule_delay": 0.5},
    }


def _alertmanager(tmp: Path, capture: Capture) -> tuple[Proc, str]:
    port = free_port()
    cfg = tmp / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump({
        "route": {"receiver": "capture", "group_by": ["alertname", "slo"], "group_wait": "1s",
                  "group_interval": "2s", "repeat_interval": "1h"},
        "receivers": [{"name": "capture", "webhook_configs": [{"url": f"{capture.url}/alertmanager",
                                                               "send_resolved": True}]}],
    }))
    proc = Proc("alertmanager", [ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={tmp / 'am-data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="], tmp)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/-/ready", 30)
    return proc, url


def _prometheus(tmp: Path, target: str) -> tuple[Proc, str]:
    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "sits-observe", "static_configs": [{"targets": [target]}]}],
    }))
    proc = Proc("prometheus", [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'prom-data'}",
                               f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"], tmp)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/-/ready", 60)
    return proc, url


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    capture = Capture()
    procs: dict[str, Proc] = {}
    try:
        procs["alertmanager"], am_url = _alertmanager(tmp, capture)
        port = free_port()
        cfg = tmp / "sits-observe.yaml"
        cfg.write_text(yaml.safe_dump(daemon_config(tmp, port, capture, am_url)))
        procs["daemon"] = Proc("sits-observe", [sys.executable, "-m", "sits_observe", "demo", "--config", str(cfg),
                                                "--scenario", "mixed", "--speed", str(SPEED)], tmp,
                               env={**{k: v for k, v in os.environ.items() if not k.startswith(("SITS_", "OTEL_"))},
                                    "PYTHONUNBUFFERED": "1"})
        daemon = f"http://127.0.0.1:{port}"
        procs["daemon"].wait_http(f"{daemon}/readyz", 90)
        procs["prometheus"], prom_url = _prometheus(tmp, f"127.0.0.1:{port}")
        yield Stack(daemon, am_url, prom_url, capture, f"127.0.0.1:{port}", procs)
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for p in procs.values():
            p.stop()
            shutil.copy(p.log, ARTIFACTS / p.log.name)
        capture.close()
