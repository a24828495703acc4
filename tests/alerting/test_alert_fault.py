"""Fault test: a receiver that refuses connections, answers 500/503, hangs past the timeout, and a
``kill -9`` of the delivering process mid-request; after a restart every state change has reached the
receiver exactly once (by delivery id), in order, signed, and the outbox is empty."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sits_observe.alerting.outbox import Outbox

from alert_daemon import CHANGES
from alert_receiver import Receiver, free_port

DAEMON = Path(__file__).with_name("alert_daemon.py")
SECRET = "fault-test-secret"


def _spawn(state_dir, url, phase):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, str(DAEMON), str(state_dir), url, SECRET, phase],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_flaky_receiver_and_kill_9_lose_nothing(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    first = _spawn(tmp_path, url, "first")
    rx = None
    try:
        assert first.stdout.readline().strip() == "queued", first.stderr.read()
        time.sleep(0.3)  # nothing listens yet: connection refused, retried with back-off
        rx = Receiver(port=port, script=[500, 503, "hang", 200, "hold"], secret=SECRET, hang_s=1.0)
        assert rx.holding.wait(30), "the fifth request never came"
        os.kill(first.pid, signal.SIGKILL)  # mid-delivery: the receiver has the request, no answer yet
        first.wait(10)
        assert first.returncode == -signal.SIGKILL
        rx.release.set()

        second = _spawn(tmp_path, url, "restart")
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0 and out.strip() == "empty", err
    finally:
        if first.poll() is None:
            first.kill()
        if rx is not None:
            rx.close()

    got = [(d.body["alerts"][0]["labels"]["slo"], d.body["status"]) for d in rx.accepted()]
    assert got == [(slo, status) for slo, status, _ in CHANGES]  # each change once, in order
    assert all(d.signed_ok for d in rx.deliveries)
    ids = [d.delivery_id for d in rx.deliveries]
    held = next(d.delivery_id for d in rx.deliveries if d.answer == "hold")
    assert ids.count(held) == 2  # the request cut by the kill was sent again with the same id
    box = Outbox(tmp_path / "outbox.db")
    assert box.depth() == {} and box.recent_failures() == []
    box.close()
