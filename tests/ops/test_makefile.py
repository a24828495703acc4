"""`make help` answers in a fresh clone (it was "No rule to make target 'help'"), plain `make` is still the demo, and
`make -j` keeps the order (the venv made before system-demo installed python3-venv on a fresh machine)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_help_lists_every_target_a_user_runs() -> None:
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = re.findall(r"^make (\S+)", r.stdout, re.M)
    assert listed == ["demo", "test", "venv", "bench", "clean"], r.stdout


def test_plain_make_is_still_the_demo() -> None:
    r = subprocess.run(["make", "-n", "-C", str(ROOT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "sits-observe demo" in r.stdout, r.stdout + r.stderr


def test_make_runs_one_step_at_a_time_even_with_jobs() -> None:
    # make's own database: .NOTPARALLEL applies to the whole file, so `make -j4 demo` sets up the system first
    r = subprocess.run(["make", "-p", "-n", "-C", str(ROOT), "help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\.NOTPARALLEL:", r.stdout, re.M), "Makefile: no .NOTPARALLEL"
