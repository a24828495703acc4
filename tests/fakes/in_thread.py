"""Run a call that might hang in a thread of its own, so a test fails instead of hanging with it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def in_thread(call: Callable[[], object], wait: float) -> tuple[object, float]:
    """What ``call`` returned or raised, and the seconds it took; the test fails if ``call`` runs past ``wait`` s."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # noqa: BLE001 (checked by the caller, in the test's thread)
            outcome.append(exc)

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait)
    assert not thread.is_alive(), f"still waiting after {wait:g} s"
    return outcome[0], time.monotonic() - t0
