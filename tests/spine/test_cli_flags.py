"""Out-of-range command-line flags are refused while the command line is parsed: one line naming the flag and
the value, exit 2, no traceback, and no work started."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from sits_observe.argtypes import FRACTION, NON_NEGATIVE_INT, POSITIVE_FLOAT, float_in
from sits_observe.cli import BENCHES, main

SEEDS = [["demo"], ["rca", "dataset", "--out", "{tmp}/ds"], ["rca", "train", "--dataset", "{tmp}"], ["bench", "loop"],
         ["bench", "scheduler"], ["bench", "pipeline"]]
DURATIONS = [[cmd, "--duration", v] for cmd in ("run", "demo") for v in ("0", "-1", "nan", "inf")]
BENCH_COUNTS = [
    ["collectors", "--samples", "0"], ["collectors", "--samples", "-1"], ["collectors", "--processes", "0"],
    ["collectors", "--dcgm-gpus", "0"], ["collectors", "--pages", "0"], ["collectors", "--host-cpus", "0"],
    ["collectors", "--host-ticks", "0"], ["pipeline", "--ticks", "-1"], ["pipeline", "--gpus", "0"],
    ["pipeline", "--workloads", "0"], ["pipeline", "--scrapes", "0"], ["pipeline", "--events-per-second", "-5"],
    ["scheduler", "--shards", "0"], ["scheduler", "--gpus", "-8"], ["scheduler", "--exact-cap", "0"],
    ["slo", "--slos", "0"], ["slo", "--ticks", "-1"], ["slo", "--baseline-ticks", "0"], ["slo", "--deliveries", "0"],
    ["slo", "--baseline-history", "nan"], ["slo", "--baseline-history", "0.0001"], ["probes", "--rounds", "0"],
    ["probes", "--writes", "0"],
    ["probes", "--calls", "0"], ["probes", "--octaves", "0"], ["rca", "--samples", "0"], ["rca", "--epochs", "0"],
    ["rca", "--threads", "0"], ["rca", "--threads", "100000"], ["ui", "--history", "0"], ["ui", "--history", "59"],
    ["ui", "--history", "86401"], ["ui", "--updates", "0"], ["ui", "--interval", "0"], ["ui", "--interval", "0.1"],
    ["loop", "--objective", "2"], ["loop", "--objective", "1"], ["loop", "--cooldown", "-5"],
    ["loop", "--cooldown", "inf"], ["loop", "--threshold", "nan"], ["soak", "--hours", "0"], ["soak", "--every", "5"],
    ["soak", "--max-wall", "1"], ["soak", "--speed", "0"], ["soak", "--tolerance", "-0.1"], ["soak", "--seed", "-1"],
]
# past these a run needed tens of GB (pipeline --gpus 100000: a MemoryError, then it ran on) or hung (slo --slos 1e7)
BENCH_SIZES = [
    ["pipeline", "--gpus", "100000", "1024"], ["pipeline", "--workloads", "65", "64"],
    ["pipeline", "--events-per-second", "1e7", "1e+06"], ["pipeline", "--ticks", "100001", "100000"],
    ["pipeline", "--scrapes", "10001", "10000"],
    ["slo", "--slos", "10000000", "1000"], ["slo", "--ticks", "100001", "100000"],
    ["slo", "--baseline-history", "25", "24"], ["slo", "--baseline-ticks", "10001", "10000"],
    ["slo", "--deliveries", "100001", "100000"],
    ["collectors", "--samples", "100001", "100000"], ["collectors", "--processes", "65", "64"],
    ["collectors", "--dcgm-gpus", "1025", "1024"], ["collectors", "--pages", "10001", "10000"],
    ["collectors", "--host-cpus", "4097", "4096"], ["collectors", "--host-ticks", "100001", "100000"],
    ["probes", "--writes", "10000001", "10000000"], ["probes", "--calls", "10000001", "10000000"],
    ["probes", "--rounds", "101", "100"], ["probes", "--octaves", "33", "32"],
    ["rca", "--epochs", "1001", "1000"], ["rca", "--samples", "100001", "100000"],
    ["scheduler", "--gpus", "4104", "4096"], ["scheduler", "--shards", "10001", "10000"],
    ["scheduler", "--exact-cap", "100000001", "100000000"], ["ui", "--updates", "1001", "1000"],
    ["soak", "--hours", "169", "168"], ["soak", "--every", "3601", "3600"], ["soak", "--max-wall", "86401", "86400"],
    ["soak", "--speed", "10001", "10000"],
]
RCA = [
    # under 2 ticks a ValueError traceback ("need at least one array to concatenate")
    ["rca", "dataset", "--out", "{tmp}/ds", "--hours", v] for v in ("0", "-1", "nan", "inf", "1000", "0.0001")
] + [
    # past what a model file may hold: written, then refused by its own loader (or torch's allocator failed)
    ["rca", "train", "--dataset", "{tmp}", "--out", "{tmp}/m.pt", "--hidden", "200000,2"],
    ["rca", "train", "--dataset", "{tmp}", "--out", "{tmp}/m.pt", "--summary", "4097"],
    ["rca", "dataset", "--out", "{tmp}/ds", "--entities", "0"],
    ["rca", "eval", "--dataset", "{tmp}", "--threads", "0"], ["rca", "eval", "--dataset", "{tmp}", "--threads", "-3"],
    ["rca", "eval", "--dataset", "{tmp}", "--min-confidence", "1.5"],
    ["rca", "eval", "--dataset", "{tmp}", "--min-confidence", "network_ingress=0.9"],  # no default floor
    ["rca", "eval", "--dataset", "{tmp}", "--min-confidence", "default=0.6,network_ingress"],
    ["rca", "eval", "--dataset", "{tmp}", "--min-confidence", "default=0.6,healthy=0.5"],
    ["rca", "eval", "--dataset", "{tmp}", "--healthy-min-confidence", "nan"],
    ["rca", "train", "--dataset", "{tmp}", "--window", "0"], ["rca", "train", "--dataset", "{tmp}", "--dropout", "1"],
    ["rca", "train", "--dataset", "{tmp}", "--batch", "-2"], ["rca", "train", "--dataset", "{tmp}", "--margin", "-1"],
    # torch failed to start 100 000 threads with a traceback, after reading the dataset
    ["rca", "train", "--dataset", "{tmp}", "--out", "{tmp}/m.pt", "--threads", "100000"],
    ["rca", "eval", "--dataset", "{tmp}", "--threads", "65"],
]


def _refused(argv: list[str], tmp: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in-process; it must stop in argument parsing with exit 2 and one error line."""
    with pytest.raises(SystemExit) as stop:
        main([a.format(tmp=tmp) for a in argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("argv", SEEDS, ids=" ".join)
def test_a_negative_seed_is_a_usage_error(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused([*argv, "--seed", "-1"], tmp_path, capsys)
    assert "argument --seed: must be an integer >= 0, got '-1'" in line


@pytest.mark.parametrize("argv", DURATIONS, ids=" ".join)
def test_a_duration_must_be_finite_and_positive(argv: list[str], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(argv, tmp_path, capsys)
    assert f"argument --duration: must be a finite number > 0, got '{argv[-1]}'" in line


@pytest.mark.parametrize("speed", ["0", "100000"])  # past sim.speed's 10000 the error named sim.speed, not the flag
def test_demo_speed_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str], speed: str) -> None:
    line = _refused(["demo", "--speed", speed], tmp_path, capsys)
    assert "argument --speed:" in line and f"got '{speed}'" in line


@pytest.mark.parametrize("argv", BENCH_COUNTS, ids=" ".join)
def test_bench_flags_out_of_range_are_usage_errors(argv: list[str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["bench", *argv], tmp_path, capsys)
    assert line.startswith(f"sits-observe bench {argv[0]}: error: argument {argv[1]}: must be") and argv[2] in line


@pytest.mark.parametrize("argv", BENCH_SIZES, ids=" ".join)
def test_bench_sizes_have_an_upper_bound(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bench, flag, value, high = argv
    module, func = BENCHES[bench]
    monkeypatch.setattr(importlib.import_module(module), func, lambda _args: {})  # a bound missed: no run, exit 0
    line = _refused(["bench", bench, flag, value], tmp_path, capsys)
    assert line.startswith(f"sits-observe bench {bench}: error: argument {flag}: must be") and value in line
    assert high in line


@pytest.mark.parametrize("argv", RCA, ids=" ".join)
def test_rca_flags_out_of_range_are_usage_errors(argv: list[str], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(argv, tmp_path, capsys)
    assert f"argument {argv[-2]}: must be" in line and f"got '{argv[-1]}'" in line
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(("parse", "text", "ok"), [
    (NON_NEGATIVE_INT, "0", True), (NON_NEGATIVE_INT, "-1", False), (NON_NEGATIVE_INT, "1.5", False),
    (POSITIVE_FLOAT, "1e-9", True), (POSITIVE_FLOAT, "0", False), (POSITIVE_FLOAT, "nan", False),
    (POSITIVE_FLOAT, "-inf", False), (POSITIVE_FLOAT, "x", False),
    (FRACTION, "0", True), (FRACTION, "0.999", True), (FRACTION, "1", False),
    (float_in(0, 1, low_open=True, high_open=True), "0", False), (float_in(0, 1, low_open=True), "1", True),
])
def test_argument_types(parse, text: str, ok: bool) -> None:  # type: ignore[no-untyped-def]
    if ok:
        assert parse(text) == float(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
            parse(text)
