"""`sits-observe probes --print-bpf NAME` and `--list`, called as the CLI calls them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sits_observe.probes import commands, specs


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    parser = argparse.ArgumentParser(prog="sits-observe")
    commands.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_print_bpf_shows_the_c_and_its_cflags(capsys: pytest.CaptureFixture) -> None:
    out = _run(["probes", "--print-bpf", "syscalls"], capsys)
    lines = out.splitlines()
    assert lines[0] == f"// bcc src_file: {specs.BPF_DIR / 'syscalls.bpf.c'}"
    flags = lines[1].removeprefix("// cflags: ").split()
    assert f"-I{specs.BPF_DIR}" in flags and "-DHIST_SUB_BITS=4" in flags and "-DSTAGE_EGRESS=4" in flags
    assert "-DHAVE_ACCEPT4" in flags and "-DHAVE_TASK_STORAGE" in flags
    for name in ("syscalls.bpf.c", "stage.h", "hist.h", "syscalls.h"):
        assert f"// ---- {name} ----" in out
    assert (specs.BPF_DIR / "hist.h").read_text().strip() in out


def test_print_bpf_unknown_name_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        _run(["probes", "--print-bpf", "gpu"], capsys)
    assert exit_.value.code == 2
    assert "invalid choice: 'gpu'" in capsys.readouterr().err


def test_print_bpf_with_json_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    from sits_observe.cli import main

    assert main(["probes", "--print-bpf", "syscalls", "--json"]) == 2  # it printed the C, --json ignored
    err = capsys.readouterr()
    assert err.out == ""
    assert err.err.strip() == "sits-observe: error: --json: goes with --list; --print-bpf prints C source"


def test_list_says_what_would_attach_and_why_not(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workloads: [{name: w, comm: sits-t-none}]\nprobes: {runq: {enabled: false}}\n")
    rows = {r["probe"]: r for r in json.loads(_run(["probes", "--list", "--json", "--config", str(cfg)],
                                                    capsys))["probes"]}
    assert rows["runq"] == {**rows["runq"], "would_attach": False, "why": "disabled in config"}
    assert rows["syscalls"]["would_attach"] and rows["block_io"]["would_attach"]
    assert rows["cuda"]["why"] == "no workload process maps libcuda.so.1 (now)"
    assert rows["cuda"]["program"] == "calls.bpf.c" and "launch" not in rows["cuda"]["timed"]
    text = _run(["probes", "--list", "--config", str(cfg)], capsys)
    assert "runq      off           runq.bpf.c        disabled in config" in text
    cfg.write_text("probes: {runq: {enabled: false}}\n")  # no workloads: the daemon loads no probe, block_io too
    rows = {r["probe"]: r for r in json.loads(_run(["probes", "--list", "--json", "--config", str(cfg)],
                                                    capsys))["probes"]}
    assert rows["block_io"] == {**rows["block_io"], "would_attach": False, "why": "no workloads configured"}


def test_list_and_print_bpf_follow_the_syscalls_attach_setting(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "c.yaml"
    for attach, flag in (("tracepoint", False), ("raw_tracepoint", True)):
        cfg.write_text(f"workloads: [{{name: w, comm: sits-t-none}}]\nprobes: {{syscalls: {{attach: {attach}}}}}\n")
        rows = {r["probe"]: r for r in json.loads(_run(["probes", "--list", "--json", "--config", str(cfg)],
                                                        capsys))["probes"]}
        assert rows["syscalls"]["attach"] == attach
        flags = _run(["probes", "--print-bpf", "syscalls", "--config", str(cfg)], capsys).splitlines()[1].split()
        assert ("-DUSE_RAW_TP" in flags) == flag
