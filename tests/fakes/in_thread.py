"""Threads in tests: run a call that might hang in a thread of its own, so a test fails instead of hanging with
it; hold a lock from another thread, as a tick stuck in a slow write holds its engine's."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def lock_held(lock: threading.Lock | threading.RLock) -> Iterator[None]:
    """``lock`` held by another thread for the body of the ``with`` (a tick stuck in a slow SQLite write)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5), "the lock was not taken"
    try:
        yield
    finally:
        release.set()
        thread.join()
