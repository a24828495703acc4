"""What the SLO engine keeps across restarts, in ``state_dir/slo.db`` (SQLite, WAL).

* ``edges``: the window rings' cumulative counts per SLO, level and edge (so a restart remembers the
  budget already burned); dropped for an SLO whose SLI changed, and for a level whose slot size changed
  (the shortest alert window of all SLOs sets the finest slot);
* ``now``: per SLO, the cumulative counts at the last evaluation, stored at a clean shutdown, so a restart
  keeps the events since the last edge too; dropped with the SLO's last edges (a new timeline);
* ``tiers``: per SLO, the tiers whose condition is kept by ``keep_firing_for``: the start of the
  tier's alert if it fires, and when its condition last held (NULL: at the last evaluation), so a
  restart neither re-pages nor forgets to resolve nor resets the flap guard; replaces the ``alerts``
  (one row per SLO) and ``firing`` tables of earlier versions, migrated on open;
* ``held``: per SLO, the tiers held quiet because a faster tier took over the incident, and until when
  their windows may lag it (a list of tier names from earlier versions: held until their condition lapses);
* ``notes``: annotations added through ``annotate()`` (likely cause) for the current incident;
* ``announced``: every alert announced as firing and not yet resolved, by fingerprint, recorded before it
  is queued, so that one that does not fire after a restart (an SLO removed, a tier turned off, labels
  changed; or the daemon killed before ``tiers`` recorded it) is resolved at the receivers instead of
  firing there for ever.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from ..alerting.formats import Alert
from ..errors import SloError
from ..statedb import StateFile, transaction

__all__ = ["SloState"]

log = logging.getLogger("sits_observe.slo")

# a tick's writes wait this long for another process's lock on slo.db (a backup, an sqlite3 shell), not the
# connection's 5 s, which held every tick of a burn 5 s: unstored edges are stored with a later tick's, and a
# transition not recorded is made again at the next tick (the clean stop's write waits the 5 s)
TICK_BUSY_MS = 250

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS slis (slo TEXT PRIMARY KEY, sli TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS edges (
    level INTEGER NOT NULL, idx INTEGER NOT NULL, slo TEXT NOT NULL, good REAL NOT NULL, total REAL NOT NULL,
    PRIMARY KEY (level, idx, slo)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tiers (
    slo TEXT NOT NULL, tier TEXT NOT NULL, since REAL, last_true REAL, PRIMARY KEY (slo, tier)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS notes (slo TEXT PRIMARY KEY, annotations TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS held (slo TEXT PRIMARY KEY, tiers TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS announced (fingerprint TEXT PRIMARY KEY, alert TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS now (slo TEXT PRIMARY KEY, ts REAL NOT NULL, good REAL NOT NULL, total REAL NOT NULL);
"""


class SloState:
    """Persistence for one engine; ``names[i]`` is row ``i`` of the engine's arrays."""

    def __init__(self, path: Path, names: Sequence[str], sli_keys: Sequence[str], levels: Sequence[float]) -> None:
        self.path = Path(path)
        self.names = list(names)
        self._lock = threading.Lock()
        self._file = StateFile(self.path, "the SLOs' history and the alerts announced",
                               lambda m: SloError(f"SLO state {m}"))
        self.db = self._file.connect(setup=lambda db: self._setup(db, sli_keys, levels))

    def _setup(self, db: sqlite3.Connection, sli_keys: Sequence[str], levels: Sequence[float]) -> None:
        db.executescript(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")  # a failure closes the connection, which rolls this back
        self._reconcile(db, sli_keys, json.dumps([float(r) for r in levels]))
        db.execute("COMMIT")

    def _tx(self, busy_ms: int | None = TICK_BUSY_MS,
            durable: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self.db, self._lock, self._file.error_of, busy_ms, durable)

    def _reconcile(self, db: sqlite3.Connection, sli_keys: Sequence[str], levels: str) -> None:
        for table, last_true in (("alerts", "NULL"), ("firing", "cleared")):  # earlier versions' firing alerts
            if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone():
                db.execute(f"INSERT OR IGNORE INTO tiers SELECT slo, tier, since, {last_true} FROM {table}")
                db.execute(f"DROP TABLE {table}")
        row = db.execute("SELECT value FROM meta WHERE key='levels'").fetchone()
        old_res, new_res = json.loads(row[0]) if row else [], json.loads(levels)
        same = 0
        while same < min(len(old_res), len(new_res)) and old_res[same] == new_res[same]:
            same += 1
        db.execute("DELETE FROM edges WHERE level >= ?", (same,))  # levels whose slots changed start afresh
        db.execute("INSERT OR REPLACE INTO meta VALUES ('levels', ?)", (levels,))
        old = dict(db.execute("SELECT slo, sli FROM slis").fetchall())
        for name, key in zip(self.names, sli_keys):
            if old.get(name) != key:
                db.execute("DELETE FROM edges WHERE slo=?", (name,))
                db.execute("INSERT OR REPLACE INTO slis VALUES (?, ?)", (name, key))
        gone = [(n,) for n in old if n not in self.names]
        for table in ("slis", "edges", "tiers", "notes", "held"):
            db.executemany(f"DELETE FROM {table} WHERE slo=?", gone)
        db.execute("DELETE FROM now WHERE slo NOT IN (SELECT slo FROM edges)")  # counts of a timeline now gone

    def edges(self, level: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Stored edges of one level: ascending indices and ``(len, 2, n)`` values, NaN where an SLO has none."""
        with self._lock:
            rows = self.db.execute("SELECT slo, idx, good, total FROM edges WHERE level=? ORDER BY idx",
                                   (level,)).fetchall()
        if not rows:
            return None
        pos = {n: i for i, n in enumerate(self.names)}
        idx = np.unique(np.array([r[1] for r in rows], dtype=np.int64))
        values = np.full((len(idx), 2, len(self.names)), np.nan)
        where = np.searchsorted(idx, [r[1] for r in rows])
        for (slo, _, good, total), k in zip(rows, where):
            values[k, :, pos[slo]] = (good, total)
        return idx, values

    def save(self, written: Iterable[tuple[int, int, np.ndarray]], prune: Sequence[tuple[int, int]] = (),
             seen: float | None = None, wait: bool = False) -> None:
        """Store written ring edges ``(level, idx, (2, n))`` and drop edges below ``(level, idx)`` in one commit;
        with edges written, ``seen`` (the source time evaluated) too; ``wait``: SQLite's 5 s for a lock."""
        rows = [(lvl, idx, name, float(v[0, i]), float(v[1, i]))
                for lvl, idx, v in written for i, name in enumerate(self.names)]
        if rows or prune:
            with self._tx(None if wait else TICK_BUSY_MS) as db:
                db.executemany("INSERT OR REPLACE INTO edges VALUES (?, ?, ?, ?, ?)", rows)
                db.executemany("DELETE FROM edges WHERE level=? AND idx<?", prune)
                if seen is not None and rows:
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('seen', ?)", (repr(float(seen)),))

    def seen(self) -> float | None:
        """The last source time an engine evaluated, as far as stored (at each slot edge, and at a clean stop):
        kept when a config change drops the edges, so the downtime still counts against the flap guard."""
        with self._lock:
            row = self.db.execute("SELECT value FROM meta WHERE key='seen'").fetchone()
        return float(row[0]) if row else None

    def clear_edges(self) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM edges")
            db.execute("DELETE FROM now")
            db.execute("DELETE FROM meta WHERE key='seen'")  # a time of the abandoned timeline

    def now(self) -> tuple[float, np.ndarray] | None:
        """The source time and ``(2, n)`` cumulative counts stored by :meth:`save_now` (NaN where an SLO has none)."""
        with self._lock:
            rows = self.db.execute("SELECT slo, ts, good, total FROM now").fetchall()
        if not rows:
            return None
        pos = {n: i for i, n in enumerate(self.names)}
        cum = np.full((2, len(self.names)), np.nan)
        for slo, _, good, total in rows:
            cum[:, pos[slo]] = (good, total)
        return max(r[1] for r in rows), cum

    def save_now(self, ts: float, cum: np.ndarray) -> None:
        """Store the window rings' cumulative counts ``(2, n)`` at source time ``ts`` (at shutdown: the events
        since the last slot edge); older than the edges by a later run, they are outdone by them."""
        with self._tx(None) as db:
            db.execute("DELETE FROM now")
            db.executemany("INSERT INTO now VALUES (?, ?, ?, ?)",
                           [(name, float(ts), float(cum[0, i]), float(cum[1, i])) for i, name in enumerate(self.names)])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('seen', ?)", (repr(float(ts)),))

    def tiers(self) -> dict[str, dict[str, tuple[float | None, float | None]]]:
        """Kept tiers: ``{slo: {tier: (since, last_true)}}``; ``since`` None unless the tier's alert fires,
        ``last_true`` None while the condition held at the last evaluation."""
        with self._lock:
            rows = self.db.execute("SELECT slo, tier, since, last_true FROM tiers").fetchall()
        out: dict[str, dict[str, tuple[float | None, float | None]]] = {}
        for slo, tier, since, last_true in rows:
            if isinstance(tier, str) and all(_time(t) for t in (since, last_true)):
                out.setdefault(slo, {})[tier] = (since, last_true)
            else:
                self._skip("tiers", f"{slo}/{tier}", "its tier starts afresh: an alert it fired may page again, "
                           "and its flap guard is reset")
        return out

    def set_tiers(self, slo: str, tiers: dict[str, tuple[float | None, float | None]],
                  ended: Sequence[Alert] = ()) -> None:
        """Record the SLO's kept tiers (as :meth:`tiers` returns them) and the alerts that ``ended`` firing
        with them; none firing also drops its notes.  Alerts that start are recorded before, by
        :meth:`set_announced`."""
        with self._tx() as db:
            self._announce(db, (), ended)
            db.execute("DELETE FROM tiers WHERE slo=?", (slo,))
            db.executemany("INSERT INTO tiers VALUES (?, ?, ?, ?)",
                           [(slo, t, since, last) for t, (since, last) in tiers.items()])
            if all(since is None for since, _ in tiers.values()):
                db.execute("DELETE FROM notes WHERE slo=?", (slo,))

    def announced(self) -> list[Alert]:
        """Alerts announced as firing and not resolved since, whatever the configuration now says."""
        with self._lock:
            rows = self.db.execute("SELECT fingerprint, alert FROM announced").fetchall()
        out = []
        for fingerprint, text in rows:
            try:
                out.append(Alert.from_json(json.loads(text)))
            except (ValueError, TypeError, KeyError, AttributeError):  # another version's, or damaged
                self._skip("announced", fingerprint, "at worst, if that alert no longer fires, the receivers are "
                           "never told it resolved")
        return out

    def set_announced(self, started: Sequence[Alert] = (), ended: Sequence[Alert] = ()) -> None:
        """Record alerts that ``started`` firing (before they are queued) and that ``ended``.  A start is committed
        with a flush to disk (``synchronous=FULL`` for it alone: the window edges written every slot are not): the
        outbox's copy is flushed too, and after a power loss the outbox must not hold a firing alert slo.db never
        recorded, which the restarted engine would then never resolve."""
        with self._tx(durable=bool(started)) as db:
            self._announce(db, started, ended)

    @staticmethod
    def _announce(db: sqlite3.Connection, started: Sequence[Alert], ended: Sequence[Alert]) -> None:
        db.executemany("DELETE FROM announced WHERE fingerprint=?", [(a.fingerprint,) for a in ended])
        db.executemany("INSERT OR REPLACE INTO announced VALUES (?, ?)",
                       [(a.fingerprint, json.dumps(a.to_json())) for a in started])

    def held(self) -> dict[str, dict[str, float]]:
        """Per SLO, ``{tier: held until}``."""
        with self._lock:
            rows = self.db.execute("SELECT slo, tiers FROM held").fetchall()
        out = {}
        for slo, text in rows:
            try:
                held = json.loads(text)
                out[slo] = ({t: float("inf") for t in held} if isinstance(held, list)
                            else {str(t): float(until) for t, until in held.items()})
            except (ValueError, TypeError, AttributeError):
                self._skip("held", slo, "its tiers held quiet are not held: one may page for an incident a faster "
                           "tier pages already")
        return out

    def set_held(self, slo: str, until: dict[str, float]) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO held VALUES (?, ?)", (slo, json.dumps(until)))

    def notes(self) -> dict[str, dict[str, str]]:
        with self._lock:
            rows = self.db.execute("SELECT slo, annotations FROM notes").fetchall()
        out = {}
        for slo, text in rows:
            try:
                notes = json.loads(text)
                out[slo] = {str(k): str(v) for k, v in notes.items()}
            except (ValueError, TypeError, AttributeError):
                self._skip("notes", slo, "the annotations (likely cause) of its current incident are lost")
        return out

    def set_notes(self, slo: str, annotations: dict[str, str]) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO notes VALUES (?, ?)", (slo, json.dumps(annotations)))

    def _skip(self, table: str, key: str, lost: str) -> None:
        # a row skipped, not the daemon stopped: monitoring goes on, and what is lost is said (the row stays in the
        # file; it goes when the engine next writes that key)
        log.warning("SLO state %s: table %s: row %s cannot be read back (damaged, or another version's); skipped: %s",
                    self.path, table, key, lost)

    def close(self) -> None:
        with self._lock:
            self.db.close()


def _time(value: object) -> bool:
    """A stored time: None or a finite number (SQLite keeps whatever type was written in a REAL column)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
