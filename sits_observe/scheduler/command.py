"""The command actuator: an operator's program carries out each step, the plan on its stdin."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
from typing import Any

from .worker import Pending, StepOutcome, Worker, acked

__all__ = ["CommandActuator", "SECRET_ENV", "STOP_GRACE_S"]

STDERR_KEPT = 4096  # bytes of a failed command's stderr read back (its last line is the reason)
# the daemon's own secrets, kept out of the actuator program's environment (it acks by its exit code, not the
# API), so out of what it logs or hands on; a program running as the daemon's user can still read the daemon's
# /proc/<pid>/environ: see docs/scheduler.md for running it as another user
SECRET_ENV = ("SITS_API_TOKEN", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
# seconds a running command has after SIGTERM at close before its group is killed: with the worker's join, inside
# the daemon's close budget (closing.CLOSE_TIMEOUT)
STOP_GRACE_S = 3.0


class CommandActuator(Worker):
    """Runs ``argv`` with the plan JSON on stdin; exit code 0 acks the step, anything else fails it.

    The program runs in its own process group; past ``timeout`` the whole group is killed (a helper it
    started must not go on applying a step that has been failed).  At close a running program's group gets
    SIGTERM, then SIGKILL once it exits or after :data:`STOP_GRACE_S`: no copy outlives the daemon to run beside
    the one sent after the restart; its step gets no outcome (it stays pending, so it is sent again).  Messages
    name ``argv[0]`` only: the other arguments may hold credentials (still readable by every local user in
    ``/proc/<pid>/cmdline`` while it runs: pass them in a file).  Its stdout is discarded; the last stderr line
    is the reason.  It gets the daemon's environment without the daemon's secrets (:data:`SECRET_ENV`)."""

    name = "command"

    def __init__(self, argv: list[str], timeout: float = 60.0, pending: Pending | None = None) -> None:
        self.argv, self.timeout = list(argv), timeout
        self._running: subprocess.Popen[bytes] | None = None  # the program now running, for close() to end
        self._starting = threading.Lock()  # a program is started, or close() looks for one, not both at once
        super().__init__("command", self._run_command, pending)

    def close(self) -> None:
        """End the running program's group (SIGTERM, SIGKILL for what is left after :data:`STOP_GRACE_S`), then
        the worker; a program left running would go on with its step while the restart sends it again."""
        with self._starting:  # no program starts after this: the worker sees the closing mark first
            self._closing.set()
            proc = self._running
        if proc is not None and proc.poll() is None:
            self._end_group(proc, STOP_GRACE_S)  # the worker's wait for it returns: its join below is short
        super().close()

    @staticmethod
    def _end_group(proc: subprocess.Popen[bytes], grace: float) -> None:
        """End the program and what it started (its own process group) and reap it: SIGTERM first when
        ``grace`` gives it time to stop cleanly, then SIGKILL for whatever is left."""
        # PermissionError: only members running as another user are left (a program run through sudo -u, which
        # passes the SIGTERM it got on to them); they are not the daemon's to kill
        if grace > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _run_command(self, plan: dict[str, Any]) -> StepOutcome | None:
        pid, step, prog = int(plan["placement_id"]), str(plan["step"]), self.argv[0]
        # stderr to a file, not a pipe: read whole, a chatty program's output would sit in memory; and a
        # program that exits 0, leaving a helper it started (a server launched in the background) holding a
        # pipe, would be waited for until the timeout, then killed with its helper (on a failure it is killed)
        with tempfile.TemporaryFile() as err:
            try:
                env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
                with self._starting:
                    if self._closing.is_set():  # close() has looked for a program to end: none may start now
                        return None
                    proc = self._running = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                                            stdout=subprocess.DEVNULL, stderr=err,
                                                            start_new_session=True, env=env)
            except OSError as exc:
                return StepOutcome(pid, step, False, f"{prog}: cannot run: {exc.strerror or exc}")
            with proc:
                try:
                    proc.communicate(json.dumps(plan, sort_keys=True).encode(), timeout=self.timeout)
                except subprocess.TimeoutExpired:
                    self._end_group(proc, 0)  # at once: the step has had its time
                    return StepOutcome(pid, step, False, f"{prog}: no exit within {self.timeout:g} s; killed")
                finally:
                    self._running = None
            if proc.returncode != 0:  # failed (or ended by close()): a helper it left must not go on with the step
                self._end_group(proc, 0)
            # ended by close() (or exiting just as it began): no outcome, whatever the exit code; the step stays
            # pending and is sent again after the restart (steps are idempotent)
            if self._closing.is_set():
                return None
            if proc.returncode == 0:
                return acked(plan)
            err.seek(max(0, err.seek(0, os.SEEK_END) - STDERR_KEPT))
            text = err.read()
        tail = text.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return StepOutcome(pid, step, False, f"{prog} exited {proc.returncode}: {tail[0][:200]}")
