"""The daemon's state databases (SQLite, WAL, one file each under ``state_dir``): open, translate, commit.

A file that is not a database or whose pages are damaged will fail the same way on every start, so
opening one raises :class:`~sits_observe.errors.DamagedStateError` (exit code 2: a restart loop cannot
fix it) naming the file, what moving it aside loses, and how.  Any other sqlite error (locked, disk
full, a directory that cannot be written) is the caller's own error class, as before.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import DamagedStateError, SitsError

__all__ = ["StateFile", "read", "transaction"]

_DAMAGED = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes: extended ones add high bits)


class StateFile:
    """One state database: its ``path``, what it holds (``holds``, said when it must be moved aside) and
    the error class its other sqlite failures become (``error(message)``)."""

    def __init__(self, path: str | Path, holds: str, error: Callable[[str], SitsError]) -> None:
        self.path = Path(path)
        self.holds = holds
        self.error = error

    def failure(self, exc: sqlite3.Error, hint: str = "") -> SitsError:
        """The error to raise for ``exc`` while opening: damaged file, else :meth:`error_of`."""
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _DAMAGED:
            return self.damaged(str(exc))
        return self.error_of(exc, hint)

    def error_of(self, exc: sqlite3.Error, hint: str = "") -> SitsError:
        """The caller's error class for ``exc``, naming the file (``hint`` appended)."""
        return self.error(f"{self.path}: {exc}{hint}")

    def damaged(self, reason: str) -> DamagedStateError:
        """The error for this file damaged as ``reason`` says: what moving it aside loses, and how."""
        # with its -wal and -shm files: a WAL left behind is deleted by the next start, and what it held lost
        aside = self.path.parent / "damaged"
        return DamagedStateError(
            f"{self.path}: damaged ({reason}); move it and its -wal/-shm files aside (mkdir -p {aside} && mv "
            f"{self.path}* {aside}/) and start again to begin with an empty one ({self.holds} it holds are lost), "
            f"or restore it from a backup")

    def connect(self, synchronous: str = "NORMAL", timeout: float = 5.0,
                setup: Callable[[sqlite3.Connection], None] | None = None) -> sqlite3.Connection:
        """An autocommit connection in WAL mode, shared between threads, checked (``quick_check`` reads every
        page: 68 ms for a 25 MB file on a 2-core VM) and with ``setup(db)`` (schema, migrations) run on it; on
        any failure the connection is closed before the error is raised."""
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=timeout)
        except sqlite3.Error as exc:
            raise self.failure(exc, "; check state_dir") from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            problems = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise self.damaged("; ".join(p.replace("\n", " ") for p in problems))
            if setup is not None:
                setup(db)
        except sqlite3.Error as exc:
            db.close()
            raise self.failure(exc, "; check state_dir") from exc
        except BaseException:
            db.close()
            raise
        return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection, lock: threading.Lock | threading.RLock,
                error: Callable[[sqlite3.Error], SitsError],
                busy_ms: int | None = None, durable: bool = False) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` under ``lock`` (autocommit connection); sqlite errors raise ``error(exc)``.
    ``busy_ms``: wait at most this long for another process's lock (a write retried later anyway), not the
    connection's timeout.  ``durable``: committed with ``synchronous=FULL`` on a connection that is NORMAL
    otherwise: on disk when it returns, with every commit before it (the WAL is flushed whole)."""
    with lock:
        if busy_ms is not None:
            before = db.execute("PRAGMA busy_timeout").fetchone()[0]
            db.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        sync = None  # durable: the level to put back
        try:
            if durable:  # outside any transaction (SQLite refuses the change inside one)
                sync = db.execute("PRAGMA synchronous").fetchone()[0]
                db.execute("PRAGMA synchronous = FULL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # a statement that failed for a full disk has rolled it back itself
                    with contextlib.suppress(sqlite3.Error):  # and the error to raise is the statement's
                        db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:  # COMMIT itself failed (disk full, I/O error): or every later BEGIN fails
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise error(exc) from exc
        finally:
            if busy_ms is not None:
                db.execute(f"PRAGMA busy_timeout = {int(before)}")
            if sync is not None and not db.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the error to raise, if any, is the transaction's
                    db.execute(f"PRAGMA synchronous = {int(sync)}")


def read(db: sqlite3.Connection, lock: threading.Lock | threading.RLock, sql: str, args: tuple[Any, ...],
         error: Callable[[sqlite3.Error], SitsError]) -> list[Any]:
    """One statement's rows, under ``lock`` and outside any transaction (WAL: it waits for no writer and holds
    no write lock); sqlite errors raise ``error(exc)``."""
    with lock:
        try:
            return db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise error(exc) from exc
