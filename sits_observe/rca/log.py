"""The verdict log: every verdict in SQLite (``<state_dir>/rca.sqlite``, WAL), the newest kept in memory."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections import deque
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..statedb import StateFile
from .verdict import Verdict

__all__ = ["VerdictLog"]

log = logging.getLogger("sits_observe.rca")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    ts REAL NOT NULL,
    cause TEXT NOT NULL,
    confidence REAL NOT NULL,
    body TEXT NOT NULL
)
"""


class VerdictLog:
    """Append-only with a cap of ``keep`` rows, held at open and after every append (so a daemon restarted
    often, or given a smaller ``keep``, never lets the file grow past it); ``recent()`` answers from
    memory (thread-safe), without waiting for a write (one to a locked file waits SQLite's busy timeout)."""

    def __init__(self, path: Path, keep: int = 10000, memory: int = 200) -> None:
        self.path = path
        self.keep = keep
        self._lock = threading.Lock()  # the database
        self._memory = threading.Lock()  # the newest verdicts
        self._recent: deque[Verdict] = deque(maxlen=memory)
        rows: list[tuple[str]] = []

        def setup(db: sqlite3.Connection) -> None:
            db.execute(_SCHEMA)
            self._prune(db)
            rows.extend(db.execute("SELECT body FROM verdicts ORDER BY seq DESC LIMIT ?", (memory,)).fetchall())

        file = StateFile(path, "the verdicts", lambda m: StoreError(f"verdict log {m}"))
        self._db = file.connect("FULL", setup=setup)
        damaged = 0
        for (body,) in reversed(rows):
            try:
                self._recent.append(Verdict.from_dict(json.loads(body)))
            except (ValueError, TypeError, KeyError, AttributeError):  # a row changed by hand or by a disk error
                damaged += 1
        if damaged:
            log.warning("rca: %s: %d of the last %d stored verdicts cannot be read back (damaged rows); left in "
                        "the file, not served", path, damaged, len(rows))

    def append(self, v: Verdict) -> None:
        with self._memory:
            self._recent.append(v)
        with self._lock:
            try:
                self._db.execute("INSERT INTO verdicts (id, ts, cause, confidence, body) VALUES (?, ?, ?, ?, ?)",
                                 (v.id, v.ts, v.cause, v.confidence, json.dumps(v.to_dict())))
                self._prune(self._db)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot write a verdict: {exc}") from exc

    def _prune(self, db: sqlite3.Connection) -> None:
        """Keep the newest ``keep`` rows (an index range delete on the primary key: cheap per append)."""
        db.execute("DELETE FROM verdicts WHERE seq <= (SELECT MAX(seq) FROM verdicts) - ?", (self.keep,))

    def set_keep(self, keep: int) -> None:
        """SIGHUP: a new ``rca.keep_verdicts``, applied at once."""
        with self._lock:
            self.keep = keep
            try:
                self._prune(self._db)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot prune the verdict log: {exc}") from exc

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest verdicts first."""
        with self._memory:
            return [v.to_dict() for v in list(self._recent)[::-1][:limit]]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
