"""The demo's daemon (simulated host, its SLOs and scheduler; the classifier off, its verdicts are
tested through the end-to-end run), ticked by hand (no loop, no server), for the UI tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.runtime import DEMO_DEFAULTS
from sits_observe.wiring import build_daemon


@pytest.fixture(scope="module")
def make_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []
    tmp = tmp_path_factory.mktemp("ui")

    def make(ticks: int = 0, **cfg: Any) -> Daemon:
        data = {**yaml.safe_load(DEMO_DEFAULTS.read_text()), "state_dir": str(tmp / f"state{len(made)}"),
                "sim": {"scenario": "mixed", "speed": 1000}, "store": {"history": 600},
                "scheduler": {"actuator": "sim"}, "rca": {"enabled": False}, **cfg}
        d = build_daemon(parse(data))
        made.append(d)
        for _ in range(ticks):
            d.tick()
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture(scope="module")
def daemon(make_daemon: Callable[..., Daemon]) -> Daemon:
    return make_daemon(ticks=120)


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Any:
    return create_app(daemon).test_client()
