"""Helpers for tests that start the daemon as a subprocess."""

import socket
import time
import urllib.request

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port, proc, deadline=90):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "daemon exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail("daemon did not become ready")


@pytest.fixture
def free_port():
    """A function returning a free loopback port."""
    return _free_port


@pytest.fixture
def wait_ready():
    """A function waiting until a daemon subprocess answers /readyz."""
    return _wait_ready
