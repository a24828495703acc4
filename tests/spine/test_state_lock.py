"""One daemon a state_dir: a second one started on it (on another port) is refused with exit 2 and the holder's pid;
the lock is the kernel's, so it goes with the daemon, and a lock file left behind blocks nothing."""

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from sits_observe.config import parse
from sits_observe.errors import ConfigError
from sits_observe.wiring import LOCK_FILE, lock_state_dir


def _demo(port, state, *extra):
    return [sys.executable, "-m", "sits_observe", "demo", "--scenario", "quiet", "--listen", f"127.0.0.1:{port}",
            *extra], {**os.environ, "SITS_STATE_DIR": str(state)}


def test_a_second_daemon_on_the_same_state_dir_exits_2_and_the_first_serves_on(tmp_path, free_port, wait_ready):
    state, port = tmp_path / "state", free_port()
    argv, env = _demo(port, state)
    err = tmp_path / "first.err"
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err.open("w"), env=env)
    try:
        wait_ready(port, first)
        argv, env = _demo(free_port(), state, "--duration", "5")  # not refused: it would run 5 s and exit 0
        second = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        errors = [line for line in second.stderr.splitlines() if line.startswith("sits-observe: error:")]
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        assert errors == [f"sits-observe: error: state_dir {state} is in use by another sits-observe daemon "
                          f"(pid {first.pid}); stop it, or give this one another state_dir (state_dir or "
                          "SITS_STATE_DIR)"], second.stderr
        # a command that only reads the state takes no lock
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"state_dir: {state}\n")
        check = subprocess.run([sys.executable, "-m", "sits_observe", "check-config", str(cfg)], capture_output=True,
                               text=True, timeout=60, env=env)
        assert check.returncode == 0, check.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            assert r.status == 200
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, err.read_text()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    assert (state / LOCK_FILE).exists()  # left behind, and no obstacle
    argv, env = _demo(free_port(), state, "--duration", "1")
    third = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert third.returncode == 0, third.stderr


def test_the_lock_is_held_per_descriptor_not_inherited_and_a_stale_file_blocks_nothing(tmp_path):
    cfg = parse({"state_dir": str(tmp_path / "s")}, env={})
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / LOCK_FILE).write_text("999999\n")  # a killed daemon's
    fd = lock_state_dir(cfg)
    try:
        assert not os.get_inheritable(fd)  # a program the command actuator starts does not keep it
        assert (tmp_path / "s" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(ConfigError, match=rf"in use by another sits-observe daemon \(pid {os.getpid()}\)"):
            lock_state_dir(cfg)
    finally:
        os.close(fd)
    os.close(lock_state_dir(cfg))  # closed: free again
