"""A command's work stopped by SIGTERM as by Ctrl-C: the signal raises ``SystemExit(128 + 15)`` where the work is,
so that its cleanup runs (temporary files removed, a child process stopped); its default action ended the process
at once and left them."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["sigterm_unwinds", "hold_sighup", "sighup_held"]

_hup = threading.Event()


def hold_sighup() -> None:
    """From here SIGHUP is noted, not acted on, until the daemon installs its own handler and asks
    :func:`sighup_held`: its default action ended a daemon still loading its config (``systemctl start`` and then
    ``reload`` at once), which systemd counts as a clean exit and does not restart."""
    _hup.clear()
    signal.signal(signal.SIGHUP, lambda *_: _hup.set())


def sighup_held() -> bool:
    """Whether a SIGHUP came since :func:`hold_sighup` (or since asked last: the daemon takes it over)."""
    came = _hup.is_set()
    _hup.clear()
    return came


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block SIGTERM exits with 143 (as the daemon's second one) by raising; the handler before is put
    back after it."""
    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:  # None: a handler not set from Python, which cannot be put back
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
