"""Start-up and shutdown: a part that hangs or raises while closing, a part that fails to start after others
did, a port in use, a second signal, signals that arrive while the daemon is still starting, and a simulated
host's clock kept across a restart."""

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.clock import SimClock, WallClock
from sits_observe.errors import ConfigError

DEMO_DEFAULTS = Path(__file__).parents[2] / "sits_observe" / "demo.yaml"

# Runs the CLI with one part's close (the simulated host's) hanging and the close budget given as argv[1];
# when argv[2] is "slow-build" the daemon takes 3 s to build, saying "building" first; "hup-loading": the process
# gets a SIGHUP while the command loads its config, before the daemon's handlers are set.
HANGING = textwrap.dedent("""
    import sys, threading, time
    from sits_observe import daemon, wiring
    from sits_observe.sim.host import SimulatedHost

    def hang(self):
        print("closing the simulator", file=sys.stderr, flush=True)
        threading.Event().wait()

    SimulatedHost.close = hang
    daemon.CLOSE_TIMEOUT = float(sys.argv[1])
    if sys.argv[2] == "slow-build":
        build = wiring.build_daemon

        def slow(cfg):
            print("building", file=sys.stderr, flush=True)
            time.sleep(3)
            return build(cfg)

        wiring.build_daemon = slow
    if sys.argv[2] == "hup-loading":
        import os, signal
        from sits_observe import runtime
        load = runtime.load

        def hup_then_load(*args, **kwargs):
            runtime.load = load  # once: the reload loads the file again
            os.kill(os.getpid(), signal.SIGHUP)
            return load(*args, **kwargs)

        runtime.load = hup_then_load
    from sits_observe.cli import main
    sys.exit(main(sys.argv[3:]))
""")


class Hangs:
    name = "hangs"

    def __init__(self):
        self.release = threading.Event()

    def close(self):
        self.release.wait()


class Raises:
    name = "raises"

    def close(self):
        raise RuntimeError("disk went away")


class Closes:
    name = "closes"
    closed = False

    def close(self):
        self.closed = True


def test_a_close_that_hangs_or_raises_neither_blocks_shutdown_nor_keeps_the_others_open(tmp_path, caplog):
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    hangs, closes = Hangs(), Closes()
    daemon.sources += [hangs, Raises()]
    daemon.consumers.append(closes)
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="sits_observe.daemon"):
            assert daemon.close(timeout=0.5) is False
        assert time.monotonic() - t0 < 5
    finally:
        hangs.release.set()
    assert closes.closed
    assert "closing hangs did not finish within 0.5 s" in caplog.text
    assert "closing raises failed: RuntimeError: disk went away" in caplog.text
    assert Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0)).close() is True


def _demo_config(tmp_path, **extra):
    data = {**yaml.safe_load(DEMO_DEFAULTS.read_text()), "state_dir": str(tmp_path / "state"),
            "sim": {"scenario": "quiet"}, **extra}
    return parse(data, env={})


def test_a_part_failing_to_start_closes_the_parts_started_before_it(tmp_path, monkeypatch):
    from sits_observe import wiring
    from sits_observe.rca import engine as rca_engine
    from sits_observe.scheduler.engine import Scheduler
    from sits_observe.slo.evaluate import SloEngine

    closed = []
    for cls in (SloEngine, Scheduler):
        monkeypatch.setattr(cls, "close", lambda self, real=cls.close: (closed.append(type(self).__name__), real(self)))

    def broken(*args, **kwargs):
        raise ConfigError("rca.model: cannot read it")

    monkeypatch.setattr(rca_engine, "RcaEngine", broken)
    with pytest.raises(ConfigError, match="rca.model"):
        wiring.build_daemon(_demo_config(tmp_path, rca={"enabled": True}))
    assert sorted(closed) == ["Scheduler", "SloEngine"]


def test_a_port_in_use_is_refused_before_the_state_is_touched(tmp_path, monkeypatch):
    from sits_observe import runtime, wiring

    built = []
    monkeypatch.setattr(wiring, "build_daemon", lambda cfg: built.append(cfg))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg = _demo_config(tmp_path, listen=f"127.0.0.1:{s.getsockname()[1]}")
        with pytest.raises(ConfigError, match="is in use"):
            runtime.serve(cfg)
    assert built == []  # the scheduler would have re-sent its steps in flight, next to the running copy
    after = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP)
    assert after == before  # serve() leaves the caller's handlers as it found them


def test_a_daemon_that_fails_to_build_releases_the_port(tmp_path, free_port, monkeypatch):
    from sits_observe import runtime, wiring

    def broken(cfg):
        raise ConfigError("rca.model: cannot read it")

    monkeypatch.setattr(wiring, "build_daemon", broken)
    port = free_port()
    with pytest.raises(ConfigError, match="rca.model"):
        runtime.serve(_demo_config(tmp_path, listen=f"127.0.0.1:{port}"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_dead_http_server_thread_stops_the_daemon_with_exit_code_1(tmp_path, free_port, monkeypatch, caplog):
    """The daemon ticked on for ever with /metrics and /healthz refusing every connection: nothing noticed."""
    import urllib.request

    from waitress import wasyncore

    from sits_observe import runtime

    real, broken = wasyncore.poll2, threading.Event()

    def poll2(timeout, map):  # the server's loop, as when select() met a descriptor past 1023
        if broken.is_set():
            raise ValueError("filedescriptor out of range in select()")
        return real(timeout, map)

    monkeypatch.setattr(wasyncore, "poll2", poll2)
    port = free_port()

    def break_it():  # once it has answered
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).close()
                break
            except OSError:
                time.sleep(0.05)
        broken.set()

    threading.Thread(target=break_it, daemon=True).start()
    with caplog.at_level(logging.INFO):
        assert runtime.serve(_demo_config(tmp_path, listen=f"127.0.0.1:{port}"), duration=30) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(
        "HTTP server died (its loop raised ValueError: filedescriptor out of range in select()); stopping"), errors


def test_a_reload_pending_when_a_stop_arrives_is_not_applied(tmp_path):
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}}, env={})
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 100.0, start=1000.0))
    loaded = []

    class StopsMidTick:  # SIGHUP, then SIGTERM, both during one tick
        name = "stops"

        def collect(self, frame):
            daemon.request_reload(lambda: loaded.append(1) or cfg)
            daemon.stop_event.set()

    daemon.sources.append(StopsMidTick())
    daemon.run(duration=5)
    assert loaded == []
    daemon.close()


def test_a_reload_asked_between_ticks_is_applied_before_the_next_tick(tmp_path):
    """The loop waited out the tick interval first: with tick_interval 20 a SIGHUP took effect up to 20 s later,
    with nothing in the log meanwhile."""
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}, "tick_interval": 20}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(20.0))
    loaded = threading.Event()
    loop = threading.Thread(target=daemon.run, kwargs={"duration": 60})
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while daemon.store.ticks < 1:
            assert loop.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        daemon.request_reload(lambda: loaded.set() or cfg)
        assert loaded.wait(10) and daemon.store.ticks == 1  # applied while waiting for the second tick
    finally:
        daemon.stop_event.set()
        loop.join(10)
        daemon.close()


@contextlib.contextmanager
def _started(tmp_path, free_port, budget, *, slow_build=False, mode=None):
    """The daemon in a child process (its simulator's close hangs ``budget`` s); killed if still running after."""
    port = free_port()
    err = tmp_path / "stderr"
    (tmp_path / "c.yaml").touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING, str(budget), mode or ("slow-build" if slow_build else "-"),
         "demo", "--scenario", "quiet", "--listen", f"127.0.0.1:{port}", "--config", str(tmp_path / "c.yaml")],
        stdout=subprocess.DEVNULL, stderr=err.open("w"), env={**os.environ, "SITS_STATE_DIR": str(tmp_path / "s")})
    try:
        yield proc, port, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _wait_for(err, text, proc, deadline=60):
    end = time.monotonic() + deadline
    while text not in err.read_text():
        assert proc.poll() is None and time.monotonic() < end, err.read_text()
        time.sleep(0.1)


def test_sigterm_exits_within_the_close_budget_when_a_part_hangs(tmp_path, free_port, wait_ready):
    with _started(tmp_path, free_port, 1.0) as (proc, port, err):
        wait_ready(port, proc)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    text = err.read_text()
    assert rc == 1, text
    assert "closing sim did not finish within 1 s" in text and "Traceback" not in text


def test_a_second_signal_exits_at_once_while_a_part_hangs_closing(tmp_path, free_port, wait_ready):
    with _started(tmp_path, free_port, 600) as (proc, port, err):
        wait_ready(port, proc)
        proc.send_signal(signal.SIGINT)
        _wait_for(err, "closing the simulator", proc)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
    assert rc == 128 + signal.SIGINT, err.read_text()
    assert "exiting now" in err.read_text()


def test_sighup_while_starting_is_applied_once_started(tmp_path, free_port, wait_ready):
    with _started(tmp_path, free_port, 1.0, slow_build=True) as (proc, port, err):
        _wait_for(err, "building", proc)
        proc.send_signal(signal.SIGHUP)  # the default action would end the process
        wait_ready(port, proc)
        _wait_for(err, "SIGHUP: config reloaded", proc)


def test_sighup_while_the_command_loads_its_config_is_applied_once_started(tmp_path, free_port, wait_ready):
    """Before the daemon's handlers were set, SIGHUP's default action ended it (exit 129), which systemd counts as a
    clean exit: `systemctl start` then `reload` at once left no daemon running."""
    with _started(tmp_path, free_port, 1.0, mode="hup-loading") as (proc, port, err):
        wait_ready(port, proc)
        _wait_for(err, "SIGHUP: config reloaded", proc)


def test_probes_while_starting_are_answered_503_at_once(tmp_path, free_port):
    """The port was bound, but served only once the daemon was built: a readiness probe or a scrape during a start
    of tens of seconds (bcc compiling, the classifier loading) got no answer at all, and timed out."""
    with _started(tmp_path, free_port, 1.0, slow_build=True) as (proc, port, err):
        _wait_for(err, "building", proc)
        for path, body in (("/readyz", {"ready": False}), ("/healthz", {"status": "starting"})):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2)
            assert answer.value.code == 503 and json.loads(answer.value.read()) == body, path
        assert "serving" not in err.read_text()  # still building


def test_sigterm_while_starting_stops_the_daemon_once_built(tmp_path, free_port):
    with _started(tmp_path, free_port, 1.0, slow_build=True) as (proc, _port, err):
        _wait_for(err, "building", proc)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    text = err.read_text()
    assert rc == 1 and "closing sim did not finish within 1 s" in text, text  # built, then closed (sim hangs)


def test_sighup_without_a_config_file_says_there_is_nothing_to_reload(tmp_path, free_port, monkeypatch, caplog):
    from sits_observe import runtime, wiring

    def build(cfg):  # SIGHUP while the daemon builds, then the build fails: no daemon runs
        os.kill(os.getpid(), signal.SIGHUP)
        raise ConfigError("rca.model: cannot read it")

    monkeypatch.setattr(wiring, "build_daemon", build)
    with pytest.raises(ConfigError):
        runtime.serve(_demo_config(tmp_path, listen=f"127.0.0.1:{free_port()}"), reload=None)
    assert "SIGHUP: started without a config file, nothing to reload" in caplog.text


def test_a_listen_host_the_resolver_cannot_answer_yet_exits_1_so_systemd_tries_again(tmp_path, monkeypatch, capsys):
    """EAI_AGAIN at boot (DNS not up yet) is no mistake in the file: exit 2 would stop the unit for good
    (RestartPreventExitStatus=2); a name that does not exist is still a config error (test_cli)."""
    from sits_observe import cli, wiring

    real = socket.getaddrinfo
    answer = {"sits-listen.test": socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")}

    def resolver(host, *args, **kwargs):
        if host in answer:
            raise answer[host]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    built = []
    monkeypatch.setattr(wiring, "build_daemon", lambda cfg: built.append(cfg))
    state = tmp_path / "state"
    config = tmp_path / "sits.yaml"
    config.write_text(f"listen: sits-listen.test:19483\nstate_dir: {state}\ngpu: {{backend: none}}\n")
    assert cli.main(["check-config", str(config)]) == 0  # loads: the bind decides
    capsys.readouterr()
    assert cli.main(["run", "--config", str(config)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "sits-observe: error: listen: sits-listen.test:19483: no answer from the DNS resolver for 'sits-listen.test' "
        "yet (Temporary failure in name resolution); exiting with 1 so that systemd tries again (an IP address in "
        "listen: does not depend on DNS)"]
    assert built == [] and not state.exists()
    answer["sits-listen.test"] = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert cli.main(["run", "--config", str(config)]) == 2  # the name does not exist: the file's mistake
    assert "listen: host 'sits-listen.test' does not resolve (Name or service not known)" in capsys.readouterr().err


def test_a_listen_address_the_host_does_not_have_yet_exits_1_so_systemd_tries_again(tmp_path, monkeypatch, capsys):
    """At boot the address may not be up yet (EADDRNOTAVAIL): exit 2 stopped the unit for good."""
    from sits_observe import cli, wiring

    built = []
    monkeypatch.setattr(wiring, "build_daemon", lambda cfg: built.append(cfg))
    config = tmp_path / "sits.yaml"
    config.write_text(f"listen: 192.0.2.10:19484\nstate_dir: {tmp_path / 'state'}\ngpu: {{backend: none}}\n")
    assert cli.main(["run", "--config", str(config)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "sits-observe: error: listen: 192.0.2.10:19484: no such address on this host (yet) (Cannot assign requested "
        "address); exiting with 1 so that systemd tries again once the network is up (or set listen: to an "
        "address of this host, e.g. 0.0.0.0)"]
    assert built == [] and not (tmp_path / "state").exists()


def test_a_simulated_host_restarted_on_its_state_dir_goes_on_from_where_its_clock_stopped(tmp_path, caplog):
    """The simulated clock runs ahead of the wall clock: a restart from wall time went back past what slo.db held,
    and the SLO windows and budgets started afresh at every restart."""
    from sits_observe.wiring import build_daemon

    data = yaml.safe_load(DEMO_DEFAULTS.read_text())
    data.update(state_dir=str(tmp_path), rca={"enabled": False}, scheduler={"enabled": False})
    cfg = parse(data, "<test>", env={})
    first = build_daemon(cfg)
    try:
        for _ in range(1000):  # 1000 simulated seconds: further ahead of the wall clock than the SLOs' slack
            last = first.tick().ts
    finally:
        assert first.close()
    again = build_daemon(cfg)
    try:
        with caplog.at_level(logging.WARNING):
            assert again.tick().ts > last
    finally:
        again.close()
    assert not [r for r in caplog.records if "went back" in r.getMessage()], caplog.text


@pytest.mark.parametrize("kept", [b"garbage\n", b"nan\n", b"\xff\xfe", None])
def test_a_simulated_clock_with_no_usable_kept_time_starts_from_wall_time(tmp_path, kept, caplog):
    keep = tmp_path / "sim-clock"
    if kept is not None:
        keep.write_bytes(kept)
    with caplog.at_level(logging.WARNING, logger="sits_observe.clock"):
        clock = SimClock(1.0, 20.0, start=1000.0, keep=keep)
    assert clock.next_ts() == 1001.0
    assert len(caplog.records) == (kept is not None), caplog.text
    clock.save()
    assert SimClock(1.0, 20.0, start=0.0, keep=keep).next_ts() == 1002.0


def test_a_simulated_clock_keeps_its_time_while_it_runs_so_a_killed_run_loses_little(tmp_path, monkeypatch):
    """Kept only at a clean close, a killed run's next start went back to wall time, behind slo.db: the SLO
    consumer failed every tick until the wall clock caught up."""
    from sits_observe import clock as clockmod

    now = [100.0]  # the clock module's own time (time.monotonic patched would be every thread's, pytest's too)
    monkeypatch.setattr(clockmod, "time", SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    keep = tmp_path / "sim-clock"
    clock = SimClock(1.0, 20.0, start=5000.0, keep=keep)
    for _ in range(400):  # 20 wall seconds at speed 20, never closed (the process is killed)
        now[0] += 0.05
        ts = clock.next_ts()
    assert ts == 5400.0
    assert 5400.0 - clockmod.SAVE_EVERY_S * 20 <= float(keep.read_text()) <= 5400.0  # at most 10 wall s behind
    assert SimClock(1.0, 20.0, start=0.0, keep=keep).next_ts() > 5200.0


def test_the_scheduler_of_a_simulated_host_starts_on_the_simulated_clock(tmp_path):
    """With the simulated clock kept across restarts (hours ahead of the wall clock after a long demo), the scheduler
    began on the wall clock: steps it sent again at start were stamped hours before the first tick and timed out
    at it (step_timeout 600 s), failing a migration the restart should have resumed."""
    from sits_observe.wiring import build_daemon

    (tmp_path / "sim-clock").write_text(f"{time.time() + 7200.0!r}\n")  # two hours ahead
    data = yaml.safe_load(DEMO_DEFAULTS.read_text())
    data.update(state_dir=str(tmp_path), rca={"enabled": False})
    daemon = build_daemon(parse(data, "<test>", env={}))
    try:
        assert daemon.scheduler is not None
        began = daemon.scheduler.seen.now
        first = daemon.tick().ts
    finally:
        daemon.close()
    assert 0 < first - began <= 1.0, (began, first)
