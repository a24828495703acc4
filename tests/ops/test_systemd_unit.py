"""The shipped systemd unit, checked by systemd itself: it parses, and its sandbox keeps exposure low."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "docs" / "sits-observe.service"
CAPS = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_RESOURCE", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH",
        "CAP_CHECKPOINT_RESTORE"}


def _settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_verifies(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name
    shutil.copy(UNIT, unit)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    # the only complaint allowed: the package is not installed at /opt/sits-observe on this machine
    problems = [line for line in (r.stdout + r.stderr).splitlines() if line and "is not executable" not in line]
    assert not problems, problems


def test_unit_sandbox_exposure(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name
    shutil.copy(UNIT, unit)
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 3.0, r.stdout


def test_capabilities_are_only_what_the_probes_need() -> None:
    s = _settings()
    assert set(s["CapabilityBoundingSet"][0].split()) == CAPS
    assert set(s["AmbientCapabilities"][0].split()) == CAPS
    assert s["ProtectSystem"] == ["strict"] and s["NoNewPrivileges"] == ["yes"] and s["User"] == ["sits-observe"]
    assert s["SystemCallFilter"] == ["@system-service bpf perf_event_open"]
