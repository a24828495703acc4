"""`sits-observe bench soak` runs the real daemon as a child and measures it (figures in docs/performance.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from sits_observe import soak
from sits_observe.cli import main
from sits_observe.collectors.promtext import fetch_page
from sits_observe.errors import CollectorError, SitsError
from sits_observe.soak import next_mark
from sits_observe.soakread import growth, listens, proc_status, state_files

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_measures_the_real_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 6 simulated minutes at 50x: about 7 s of ticks, a sample every simulated minute (a poll every 12.5 simulated
    # seconds: a scrape slowed by a busy machine still finds each mark)
    assert main(["bench", "soak", "--json", "--hours", "0.1", "--warmup", "0.02", "--every", "60", "--speed", "50",
                 "--dir", str(tmp_path / "run")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] and out["stopped"] == "reached --hours" and out["simulated_hours"] >= 0.1
    assert out["daemon"]["exit_code"] == 0 and out["daemon"]["log_errors"] == 0
    assert not Path(f"/proc/{out['daemon']['pid']}").exists()  # drained and gone
    samples = out["samples"]
    assert len(samples) >= 6
    assert all(b["sim_hours"] > a["sim_hours"] and b["wall_s"] >= a["wall_s"] for a, b in zip(samples, samples[1:]))
    assert all(b["cpu_s"] >= a["cpu_s"] for a, b in zip(samples, samples[1:]))
    for s in samples:  # a Python daemon with numpy and torch; 8 GPUs, 3 SLOs, a classifier
        assert 50 < s["rss_mib"] <= s["rss_peak_mib"] and s["threads"] > 1 and s["fds"] > 3
        assert s["series"] > 500 and s["families"] > 20 and s["metrics_bytes"] > 10_000
        assert s["state_bytes"] == sum(s["files"].values()) > 0
        # a database busy past the read's timeout is counted as not read (None), not as 0 rows
        assert s["rows"].get("slo.db/slis", 3) == 3 and s["rows"].get("scheduler.sqlite/shards", 3) == 3
    read = [s for s in samples if "slo.db/slis" in s["rows"] and "scheduler.sqlite/shards" in s["rows"]]
    assert len(read) >= len(samples) // 2, [s["rows"] for s in samples]
    growth_keys = set(out["growth"])
    assert {"rss_mib", "threads", "fds", "series", "state_bytes", "rows/slo.db/edges"} <= growth_keys
    assert out["growing"] == sorted(k for k, v in out["growth"].items() if v["grows"])
    assert out["bounded"] is (not out["growing"])
    assert out["state_after_exit"]["rows"]["slo.db/slis"] == 3
    assert out["options"]["hours"] == 0.1 and out["machine"]["cpus"] >= 1


@pytest.mark.parametrize(("values", "grows", "slope", "last_slope"), [
    ([100.0] * 8, False, 0.0, 0.0),                              # flat
    ([100.0 + 10 * h for h in range(8)], True, 10.0, 10.0),      # steady growth
    ([100, 104, 101, 103, 102, 104, 103, 104], False, None, None),  # noise within 5 %
    ([100, 200, 300, 400, 500, 500, 500, 500], True, None, 0.0),  # grew, then a cap: still "grows", now flat
    ([0, 0, 0, 0, 0, 0, 1, 1], False, None, None),               # under 1 unit
    ([0, 0, 0, 0, 0, 0, 2, 2], True, None, None),                # rows where there were none
])
def test_growth_compares_the_last_quarter_with_the_first(values: list[float], grows: bool, slope: float | None,
                                                         last_slope: float | None) -> None:
    g = growth([(float(h), float(v)) for h, v in enumerate(values)], 0.05)
    assert g["grows"] is grows
    if slope is not None:
        assert g["slope_per_hour"] == pytest.approx(slope)
    if last_slope is not None:
        assert g["last_quarter_slope_per_hour"] == pytest.approx(last_slope)


@pytest.mark.parametrize(("argv", "message"), [
    (["--hours", "1", "--warmup", "1"], "bench soak: --warmup 1 must be less than --hours 1"),
    (["--hours", "0.1", "--warmup", "0.05", "--every", "600"], "leaves fewer than 4 samples after --warmup"),
    (["--hours", "168", "--every", "10"], "makes more than 10000 samples; raise --every"),
])
def test_soak_options_that_cannot_make_a_verdict_are_refused(argv: list[str], message: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "soak", *argv, "--dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_soak_needs_an_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old-state").write_text("x")
    assert main(["bench", "soak", "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"sits-observe: error: bench soak: --dir: {tmp_path} is not an empty "
                                               "directory; a soak starts from empty state")


def test_a_dir_that_cannot_be_made_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --dir below a file ended in a NotADirectoryError, exit 1."""
    (tmp_path / "file").write_text("x")
    assert main(["bench", "soak", "--dir", str(tmp_path / "file" / "run")]) == 2
    assert capsys.readouterr().err.strip() == (f"sits-observe: error: bench soak: --dir: cannot make "
                                               f"{tmp_path / 'file' / 'run'} (Not a directory); give an empty or new "
                                               "directory")


@pytest.mark.parametrize("given", [True, False])
def test_a_scenario_the_daemon_refuses_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, given: bool) -> None:
    """Without --dir the refused run left its temporary directory behind (a daemon.log and a state_dir)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run = ["--dir", str(tmp_path / "run")] if given else []
    assert main(["bench", "soak", "--scenario", "nosuch", *run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sits-observe: error: bench soak: the daemon exited with 2 before it "
                                               "was ready: <demo>: sim.scenario: unknown scenario 'nosuch'")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["run"] if given else [])


def _daemon_of(run: Path, bench: subprocess.Popen[bytes], ready: bool) -> int:
    """The pid of the bench's daemon once it has started (and answers /readyz, with ``ready``)."""
    needle = str(run / "scenario.yaml").encode()
    pid = port = 0
    while bench.poll() is None:
        for proc in Path("/proc").iterdir():
            with suppress(OSError, ValueError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if needle in argv and not pid:
                    pid, port = int(proc.name), int(argv[argv.index(b"--listen") + 1].rsplit(b":", 1)[1])
        if pid and not ready:
            return pid
        if pid:
            with suppress(CollectorError):
                fetch_page(f"http://127.0.0.1:{port}/readyz", 5.0)
                return pid
        time.sleep(0.05)
    raise AssertionError(f"the bench exited with {bench.returncode} before its daemon was found")


# `python -m sits_observe` with SIGINT as at a terminal: a shell starts a background job (`make test &`, a CI step run
# so) with SIGINT ignored, the bench inherited that, and an interrupt left it running to the end (exit 0)
INTERRUPTIBLE = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "runpy.run_module('sits_observe', run_name='__main__', alter_sys=True)")


@pytest.mark.parametrize(("sig", "group", "ready", "code"), [
    (signal.SIGTERM, False, True, 143),   # `kill BENCH` mid-run
    (signal.SIGINT, True, True, 130),     # Ctrl-C at a terminal: the whole foreground group
    (signal.SIGINT, False, False, 130),   # an interrupt while the daemon is still starting
])
def test_a_stopped_bench_leaves_no_daemon_running(sig: signal.Signals, group: bool, ready: bool, code: int,
                                                  tmp_path: Path) -> None:
    run = tmp_path / "run"
    bench = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, "bench", "soak", "--hours", "1", "--warmup",
                              "0.5", "--every", "300", "--speed", "100", "--dir", str(run)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pid = 0
    try:
        pid = _daemon_of(run, bench, ready)
        if group:
            os.killpg(bench.pid, sig)
        else:
            bench.send_signal(sig)
        assert bench.wait(timeout=120) == code
        assert not Path(f"/proc/{pid}").exists()  # stopped and reaped by the bench
        assert "without waiting for the drain" not in (run / "daemon.log").read_text()  # one SIGTERM, drained
    finally:
        for p in (bench.pid, pid):
            with suppress(ProcessLookupError):
                if p:
                    os.kill(p, signal.SIGKILL)
        bench.wait()


def test_samples_are_one_per_mark_even_on_a_mark() -> None:
    # 4800 s is 1.3333 h rounded, 4799.88 s: a mark taken from that would be 4800 again, sampled at the next poll
    assert next_mark(4800.0, 60.0) == 4860.0
    assert next_mark(4799.0, 60.0) == 4800.0 and next_mark(0.0, 300.0) == 300.0


def test_an_exited_unreaped_daemon_is_a_failed_measurement_not_a_crash() -> None:
    child = subprocess.Popen(["true"])
    while Path(f"/proc/{child.pid}/status").read_text().find("State:\tZ") < 0:  # a zombie: exited, not reaped
        time.sleep(0.01)
    try:
        with pytest.raises(OSError, match="has exited"):
            proc_status(child.pid)
    finally:
        child.wait()


def test_state_reads_survive_files_the_daemon_replaces(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a database")
    writer = subprocess.Popen([sys.executable, "-c", "from pathlib import Path; from sits_observe.files import "
                               f"replace_whole\nwhile True: replace_whole(Path({str(tmp_path / 'sim-clock')!r}), "
                               "lambda t: t.write_text('1.0'))"], cwd=ROOT)
    try:
        while not (tmp_path / "sim-clock").exists():
            time.sleep(0.01)
        for _ in range(3000):  # sim-clock.<unique>.tmp comes and goes between the listing and the stat
            state = state_files(tmp_path)
            assert state["rows"] == {}  # text files are not opened as databases
    finally:
        writer.kill()
        writer.wait()


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ready\n")

    def log_message(self, *args: object) -> None:
        pass


def test_a_port_another_process_took_first_is_not_taken_for_the_daemon(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The port is found free by binding and releasing it; another process (a second soak's daemon) that binds it
    first answered /readyz, and the bench measured that process's API beside its own child's /proc (the child
    then exited with the port in use). Now the listener must be the child's, and the child starts on another."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    ports = iter([taken])
    real = soak._free_port
    monkeypatch.setattr(soak, "_free_port", lambda: next(ports, None) or real())
    args = SimpleNamespace(speed=1.0, seed=1, topology="nvswitch-8", max_wall=60.0, config=None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SITS_")}
    (tmp_path / "again").mkdir()
    try:
        child, base = soak._start(args, tmp_path, "quiet", env)
        try:
            port = int(base.rsplit(":", 1)[1])
            assert port != taken and listens(child.pid, port) and not listens(child.pid, taken)
        finally:
            soak._stop(child)
        monkeypatch.setattr(soak, "_free_port", lambda: taken)  # every port found free is taken first
        with pytest.raises(SitsError, match=f"3 free ports were each taken .*\\(the last: listen: 127.0.0.1:{taken} "
                                            "is in use\\)$"):
            soak._start(args, tmp_path / "again", "quiet", env)
    finally:
        other.shutdown()
        other.server_close()
