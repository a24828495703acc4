"""`sits-observe doctor` says when the probes' C is missing (an installed copy without it, a checkout without bpf/).

It said "eBPF probes: can run" and exit 0 there: every probe then failed to load, which only the daemon's log
told, one probe at a time.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from sits_observe import doctor
from sits_observe.probes import specs


def _report(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bpf: Path) -> tuple[int, str]:
    monkeypatch.setattr(specs, "BPF_DIR", bpf)
    rc = doctor._doctor(argparse.Namespace())
    return rc, capsys.readouterr().out


def test_doctor_fails_when_the_probe_c_is_missing(monkeypatch, capsys, tmp_path):
    rc, out = _report(monkeypatch, capsys, tmp_path / "bpf")
    lines = [line for line in out.splitlines() if "probe C" in line]
    assert len(lines) == 1, out
    line = lines[0]
    assert line.startswith("[FAIL]") and f"{tmp_path / 'bpf'}: missing " in line and "runq.bpf.c" in line, out
    assert "fix: reinstall sits-observe" in out and "eBPF probes: cannot run" in out and rc == 1


def test_doctor_names_a_missing_header(monkeypatch, capsys, tmp_path):
    bpf = shutil.copytree(specs.BPF_DIR, tmp_path / "bpf")
    (bpf / "hist.h").unlink()
    _, out = _report(monkeypatch, capsys, bpf)
    assert f"[FAIL] probe C         {bpf}: missing hist.h\n" in out, out


def test_doctor_finds_the_shipped_probe_c(monkeypatch, capsys):
    _, out = _report(monkeypatch, capsys, specs.BPF_DIR)
    assert f"[ok  ] probe C         {specs.BPF_DIR}\n" in out, out
