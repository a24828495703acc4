"""``rca dataset|train|eval`` as a user meets them: a bad file or path named on the command line is one error
line and exit 2, found before any long work starts, and leaves nothing half-written behind."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sits_observe.cli import main
from sits_observe.rca import dataset, writer
from sits_observe.rca.dataset import Dataset
from sits_observe.rca.model import RcaModel

TRAIN = ["--window", "16", "--hidden", "8,4", "--epochs", "1", "--batch", "64", "--stride", "4", "--threads", "1"]


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("sits-observe: error:")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


@pytest.fixture(name="data")
def data_fixture(tmp_path: Path, synth: Callable[..., Dataset]) -> Path:
    d = tmp_path / "data"
    writer.write(d, synth(steps=1200))
    return d


@pytest.mark.parametrize(("make", "needle"), [
    (lambda p: None, "no such model file"),
    (lambda p: p.mkdir(), "is a directory, not a model file"),
    (lambda p: os.mkfifo(p), "not a regular file (a device, FIFO or socket)"),  # it said: no such model file
    (lambda p: p.write_bytes(b""), "truncated, corrupt"),
    (lambda p: p.write_bytes(b"PK\x03\x04 half a zip"), "truncated, corrupt"),
])
def test_eval_with_a_bad_model_file_is_a_usage_error(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str],
                                                     make: Callable[[Path], None], needle: str) -> None:
    model = tmp_path / "m.pt"
    make(model)
    _usage_error(["rca", "eval", "--model", str(model), "--dataset", str(data)], capsys, str(model), needle)


def test_eval_on_a_dataset_without_the_models_features_is_a_usage_error(
        tmp_path: Path, tiny_model: RcaModel, synth: Callable[..., Dataset],
        capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.pt"
    tiny_model.save(model)
    short = tmp_path / "short"
    writer.write(short, synth(steps=300, features=tiny_model.features[:3]))
    _usage_error(["rca", "eval", "--model", str(model), "--dataset", str(short)], capsys,
                 f"{short} lacks 1 of the model's 4 features: stage.e2e.p99")


def test_eval_without_the_training_data_says_where_the_model_looked(
        tmp_path: Path, tiny_model: RcaModel, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.pt"
    tiny_model.save(model)
    _usage_error(["rca", "eval", "--model", str(model), "--dataset", str(data), "--train", "/nonexistent"], capsys,
                 "--train: '/nonexistent' is not a dataset directory")


def test_train_checks_out_before_training_and_leaves_no_tmp_file(tmp_path: Path, data: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "outdir"
    out.mkdir()
    _usage_error(["rca", "train", "--dataset", str(data), "--out", str(out), *TRAIN], capsys,
                 f"--out: {out} is a directory")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    _usage_error(["rca", "train", "--dataset", str(data), "--out", str(blocker / "m.pt"), *TRAIN], capsys,
                 f"--out: {blocker} is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "data", "outdir"] and not any(out.iterdir())


def test_a_failed_save_removes_its_tmp_file(tmp_path: Path, tiny_model: RcaModel,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def half_written(obj: object, f: Path) -> None:
        Path(f).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError):
        tiny_model.save(tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


def test_dataset_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "afile"
    out.write_text("keep me")
    _usage_error(["rca", "dataset", "--out", str(out), "--hours", "0.01"], capsys,
                 f"--out: {out} is a file; give a directory")
    assert out.read_text() == "keep me"


@pytest.mark.parametrize(("labels", "needle"), [
    ("entity,start,end,cause\n", "labels.csv: no labels: every training window is 'healthy'"),
    ("entity,start,end,cause\nhost0,0,99999,hot\nhost1,0,99999,hot\n",
     "labels.csv: every training window is 'hot'"),
])
def test_train_refuses_a_dataset_with_one_class(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                labels: str, needle: str) -> None:
    (data / "labels.csv").write_text(labels)
    _usage_error(["rca", "train", "--dataset", str(data), "--out", str(tmp_path / "m.pt"), *TRAIN], capsys,
                 needle, "at least two classes")
    assert not (tmp_path / "m.pt").exists()


def test_train_refuses_request_causes_not_in_the_dataset(data: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _usage_error(["rca", "train", "--dataset", str(data), "--out", str(tmp_path / "m.pt"), "--request-causes",
                  "cpu_contention,foo,bar", *TRAIN], capsys, "--request-causes: 'foo', 'bar' are not causes in")


def test_train_refuses_relative_only_names_that_are_not_features(data: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _usage_error(["rca", "train", "--dataset", str(data), "--out", str(tmp_path / "m.pt"), "--relative-only",
                  "gpu.clock", *TRAIN], capsys, "--relative-only: 'gpu.clock' is not a feature of",
                 "metrics.csv; name its columns")
    assert not (tmp_path / "m.pt").exists()


def test_training_needs_out_so_an_experiment_cannot_replace_the_shipped_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out defaulted to models/rca-lstm.pt: a quick `rca train --dataset DIR` replaced the model every daemon
    without rca.model loads."""
    with pytest.raises(SystemExit) as stop:
        main(["rca", "train", "--dataset", str(tmp_path)])
    assert stop.value.code == 2 and "the following arguments are required: --out" in capsys.readouterr().err


def test_train_and_dataset_keep_what_is_stored_at_out(tmp_path: Path, data: Path, tiny_model: RcaModel,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Both replaced what was there without a word: a model daemons load, a dataset, even the dataset being
    trained on (its metrics.csv became the model file)."""
    model = tmp_path / "m.pt"
    tiny_model.save(model)
    kept = model.read_bytes()
    _usage_error(["rca", "train", "--dataset", str(data), "--out", str(model), *TRAIN], capsys,
                 f"--out: {model} holds a file already; give another path, or --force to replace it")
    assert model.read_bytes() == kept
    metrics = (data / "metrics.csv").read_bytes()
    for inside in (data / "metrics.csv", data / "m.pt"):  # --force or not
        _usage_error(["rca", "train", "--dataset", str(data), "--out", str(inside), "--force", *TRAIN], capsys,
                     f"--out: {inside} is inside the dataset {data}; write the model elsewhere")
    assert (data / "metrics.csv").read_bytes() == metrics and not (data / "m.pt").exists()
    _usage_error(["rca", "dataset", "--out", str(data), "--hours", "0.01"], capsys,
                 f"--out: {data} holds a dataset already; give another path, or --force to replace it")
    assert (data / "metrics.csv").read_bytes() == metrics
    _usage_error(["rca", "dataset", "--out", "", "--hours", "0.01"], capsys, "--out: empty; give a path")
    assert main(["rca", "train", "--dataset", str(data), "--out", str(model), "--force", *TRAIN]) == 0
    assert model.read_bytes() != kept and "--force" in RcaModel.load(model).training["command"]


@pytest.mark.parametrize("labels", ["entity,start,end,cause\n", None])
def test_eval_with_a_train_set_the_baselines_cannot_fit_on_is_a_usage_error(
        tmp_path: Path, tiny_model: RcaModel, data: Path, synth: Callable[..., Dataset],
        capsys: pytest.CaptureFixture[str], labels: str | None) -> None:
    """A train set without labels, or too short for one window, failed inside the trees with a traceback."""
    model = tmp_path / "m.pt"
    tiny_model.save(model)
    train = tmp_path / "train"
    writer.write(train, synth(steps=1200 if labels else 8))
    if labels:
        (train / "labels.csv").write_text(labels)
    _usage_error(["rca", "eval", "--model", str(model), "--dataset", str(data), "--train", str(train)], capsys,
                 f"{train}: ", "fitting the baselines needs windows of at least two classes")


def test_eval_on_data_of_another_tick_step_is_a_usage_error(tmp_path: Path, tiny_model: RcaModel,
                                                            synth: Callable[..., Dataset],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon refuses a model trained at another tick step; eval scored one, its windows spanning 10x."""
    from dataclasses import replace

    model = tmp_path / "m.pt"
    tiny_model.save(model)
    ds = synth(steps=1200)
    ten = tmp_path / "ten"
    writer.write(ten, replace(ds, step=10.0, labels=[replace(lab, start=lab.start * 10, end=lab.end * 10)
                                                      for lab in ds.labels]))
    assert dataset.read(ten).step == 10.0
    _usage_error(["rca", "eval", "--model", str(model), "--dataset", str(ten)], capsys,
                 f"{ten}: steps of 10 s, but {model} was trained on ticks of 1 s", "data recorded every 1 s")


def test_dataset_out_may_be_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out .` was refused as empty (Path('') is '.') once empty paths were refused."""
    monkeypatch.chdir(tmp_path)
    assert main(["rca", "dataset", "--out", ".", "--hours", "0.01"]) == 0
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "labels.csv").exists()


def test_eval_takes_floors_per_cause(tmp_path: Path, tiny_model: RcaModel, data: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--min-confidence default=F,CAUSE=F``: the report says the floors and scores with them (the rule itself:
    test_model.py)."""
    model = tmp_path / "m.pt"
    tiny_model.save(model)
    cause = next(c for c in tiny_model.classes if c != "healthy")
    reports = []
    for floors in ("0", f"default=1,{cause}=0"):  # no abstaining; every cause but one held to 1
        assert main(["rca", "eval", "--model", str(model), "--dataset", str(data), "--train", str(data), "--json",
                     "--min-confidence", floors]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    free, held = reports
    assert (free["min_confidence"], held["min_confidence"]) == (0.0, {"default": 1.0, cause: 0.0})
    recall = free["lstm"]["per_class"][cause]["recall"]
    assert held["lstm"]["per_class"][cause]["recall"] == recall > 0.5  # its own floor, not the default
    assert held["lstm"]["unknown_rate"] >= free["lstm"]["unknown_rate"] == 0.0


def test_train_out_must_be_a_regular_file(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The model was renamed over whatever --out named: `--out /dev/null --force` as root replaced the null
    device with a model file, and a FIFO (not `is_file`) went without even --force."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for force in ([], ["--force"]):
        _usage_error(["rca", "train", "--dataset", str(data), "--out", str(fifo), *force, *TRAIN], capsys,
                     f"--out: {fifo} is not a regular file (a device, FIFO or socket)")
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "fifo"]


@pytest.mark.parametrize("command", [["rca", "dataset", "--out", "/proc/sits-data", "--hours", "0.01"],
                                     ["rca", "train", "--dataset", "DATA", "--out", "/proc/sits.pt", *TRAIN]])
def test_out_where_no_file_can_be_made_is_refused_before_the_work(data: Path, capsys: pytest.CaptureFixture[str],
                                                                  command: list[str]) -> None:
    """os.access says yes to root for /proc: the whole run went by before the write failed at the end."""
    _usage_error([str(data) if a == "DATA" else a for a in command], capsys, "--out: cannot write in /proc (",
                 "choose another --out path")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_failed_dataset_force_keeps_the_dataset_it_was_replacing(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A full disk (or Ctrl-C) in the write replaced metrics.csv with half a file beside the old labels.csv and
    generated.json, which a later `rca train` read as one dataset; the error line named no file."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], check=True)
    try:
        out = disk / "ds"
        assert main(["rca", "dataset", "--out", str(out), "--hours", "0.05"]) == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        capsys.readouterr()
        assert main(["rca", "dataset", "--out", str(out), "--hours", "0.5", "--force"]) != 0  # ~800 KB of CSV
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"{out / 'metrics.csv'}: No space left on device" in err, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # and no NAME.tmp left behind
        assert sorted(before) == ["generated.json", "labels.csv", "metrics.csv"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("severity", ["0.5,2", "0.5,inf", "nan,1"])
def test_dataset_severity_past_one_is_refused_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              severity: str) -> None:
    """0.5,2 passed the flag and failed in the simulator with "Scenario.random: need ... got severity_range=..."."""
    with pytest.raises(SystemExit) as stop:
        main(["rca", "dataset", "--out", str(tmp_path / "ds"), "--hours", "0.01", "--severity", severity])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"argument --severity: need 0 < LOW <= HIGH <= 1, got {severity!r}" in err
    assert not (tmp_path / "ds").exists()


def test_dataset_topology_of_several_hosts_is_refused_naming_the_flag(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the simulator only after the fabric's link matrices were built (fabric-99999x8: gigabytes)."""
    with pytest.raises(SystemExit) as stop:
        main(["rca", "dataset", "--out", str(tmp_path / "ds"), "--hours", "0.01", "--topology", "fabric-2x8"])
    assert stop.value.code == 2 and ("argument --topology: the simulator models one host and fabric-2x8 spans "
                                     "several") in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--bursty", "--vary"])
def test_sigterm_during_dataset_removes_its_temporary_files(tmp_path: Path, flag: str) -> None:
    """SIGTERM's default action ended the process at once: the trace copies stayed in /tmp (sits-rca-trace-*)
    and metrics.csv.tmp in --out. Now it unwinds like Ctrl-C and exits 128 + 15."""
    import signal
    import sys
    import time

    scratch, out = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "sits_observe", "rca", "dataset", "--out", str(out), flag,
                             "--hours", "2"], env={**os.environ, "TMPDIR": str(scratch)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # a guard against a hang, not a measure: the copy comes within seconds
    while not list(scratch.glob("sits-rca-trace-*/*.csv")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert list(scratch.iterdir()) == []
    assert not out.exists() or list(out.iterdir()) == []
