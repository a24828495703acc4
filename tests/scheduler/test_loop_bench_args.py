"""``bench loop`` refuses what would make its figures meaningless, before simulating anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "sits_observe", "bench", "loop", "--json"]


def _error(args: list[str]) -> str:
    res = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    return res.stderr


@pytest.mark.parametrize(("page", "says"), [("15s,1m", "need SHORT < LONG <= 12m"),
                                            ("15m,1m", "need SHORT < LONG <= 12m"),
                                            ("1m", "expected two durations LONG,SHORT like 1m,15s")])
def test_page_windows_are_checked(page: str, says: str) -> None:
    assert says in _error(["--page", page])


def test_a_model_the_engine_cannot_load_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "rca.pt"
    bad.write_bytes(b"not a model")
    err = _error(["--model", str(bad)])
    assert f"bench loop: {bad}: not a readable model file" in err


def test_a_model_named_that_is_not_there_is_refused(tmp_path: Path) -> None:
    """With --verdicts auto (the default) a mistyped --model ran the oracle instead, and exited 0."""
    typo = tmp_path / "typo.pt"
    assert f"bench loop: --model: no trained model at {typo}" in _error(["--model", str(typo)])


def test_an_oracle_run_does_not_ask_for_the_model_it_will_not_use(tmp_path: Path) -> None:
    """--verdicts oracle with a --model that is not there was refused, and told to use --verdicts oracle."""
    import argparse

    from sits_observe.scheduler.loop_modes import verdict_source

    args = argparse.Namespace(model=str(tmp_path / "typo.pt"), verdicts="oracle")
    assert verdict_source(args) is None
