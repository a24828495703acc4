"""Helpers for the SLO engine tests: a scaled-down config with one signed webhook receiver, a Frame
feeder on a fixed source clock, and waiting for the sender threads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sits_observe.config import Config, parse
from sits_observe.frame import BucketLayout, Frame
from sits_observe.slo.evaluate import SloEngine

SECRET = "s3cret-hmac-key"


def config_for(state_dir: Path | str, url: str) -> Config:
    return parse({
        "state_dir": str(state_dir),
        "slos": [{"name": "chat-latency", "objective": 0.99, "window": "1h", "description": "Chat under 250 ms",
                  "latency": {"stage": "e2e", "workload": "chat", "threshold": 0.25},
                  # scaled-down tiers so a test burns in seconds of source time
                  "tiers": {"page_fast": {"long": "60s", "short": "10s"}, "page_slow": False,
                            "ticket_fast": False, "ticket_slow": {"long": "10m", "short": "1m"}}}],
        "alerting": {"receivers": [{"type": "webhook", "name": "hook", "url": url, "secret": SECRET, "timeout": 2}],
                     "backoff": {"initial": 0.05, "max": 0.2}, "external_labels": {"host": "gpu-7"}},
    }, env={})


class Feeder:
    def __init__(self, cfg: Config) -> None:
        self.layout = BucketLayout(cfg.store.snapped())
        self.ts = 1_700_000_000.0

    def frame(self, bad_fraction: float, n: int = 100) -> Frame:
        self.ts += 1.0
        frame = Frame(ts=self.ts, interval=1.0)
        self.add(frame, "chat", bad_fraction, n)
        frame.add_values("e2e", "other", np.full(50, 2.0), self.layout)  # another workload: not this SLO
        return frame

    def add(self, frame: Frame, workload: str, bad_fraction: float, n: int = 100) -> None:
        """``n`` requests of ``workload``, ``bad_fraction`` of them slower than the 250 ms threshold."""
        bad = int(n * bad_fraction)
        frame.add_values("e2e", workload, np.r_[np.full(n - bad, 0.01), np.full(bad, 0.9)], self.layout)


def wait(pred: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def burning(cfg: Config, clean: int = 100, bad: float = 0.5) -> tuple[Feeder, SloEngine]:
    """An engine that saw ``clean`` good ticks, then 30 with a ``bad`` error share: page_fast fires."""
    feed = Feeder(cfg)
    engine = SloEngine.from_config(cfg)
    for _ in range(clean):
        engine.on_tick(feed.frame(0.0))
    for _ in range(30):
        engine.on_tick(feed.frame(bad))
    return feed, engine
