"""Durable shards, placements and decision spans in SQLite (WAL) under ``state_dir``.

A placement row changes only through :meth:`PlacementStore.update`, whose ``UPDATE ... WHERE id=? AND
version=? AND state=?`` either wins (version + 1) or is refused with the shard, the expected and the
actual state.  Each call is one transaction, so a crash leaves the last committed state only.

A decision's ShardDecisionSpan is written in the transaction that writes the decision's row (or alone
for a decision without one) and stays until the collector has accepted it, so no crash loses it; then
it is deleted.
The schema is versioned (``PRAGMA user_version``, :mod:`.schema`); opening a file applies the migrations it lacks.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SchedulerError, StateFileError
from ..statedb import StateFile, read, transaction
from .config import ShardSpec
from .schema import MIGRATIONS, SCHEMA_VERSION
from .states import TERMINAL, NotFound, State, StoreFailed, check_transition

__all__ = ["Placement", "PlacementStore", "SpanRecord", "DB_NAME", "SCHEMA_VERSION"]

DB_NAME = "scheduler.sqlite"
_COLUMNS = ("id", "shard_id", "kind", "source_id", "gpus", "node", "state", "version", "step", "step_ts",
            "decision_id", "reason", "created_ts", "updated_ts")
_MUTABLE = frozenset({"gpus", "node", "step", "step_ts", "reason"})


@dataclass(frozen=True, slots=True)
class Placement:
    id: int
    shard_id: str
    kind: str
    source_id: int | None
    gpus: tuple[int, ...]
    node: str
    state: State
    version: int
    step: str | None
    step_ts: float | None
    decision_id: str
    reason: str
    created_ts: float
    updated_ts: float

    def to_dict(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in _COLUMNS} | {"gpus": list(self.gpus), "state": self.state.value}


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """A decision's span as stored until exported: ``body`` is JSON-ready (see :mod:`.span_outbox`)."""

    decision_id: str
    body: dict[str, Any]


class PlacementStore:
    """Shards, placements and decision spans of one host; shared by the tick, HTTP and span export threads."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / DB_NAME
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SchedulerError(f"{self.path}: cannot open the scheduler database: {exc}") from exc
        self._file = StateFile(self.path, "the shards, placements and decision spans not yet exported",
                               StoreFailed)
        self._db = self._file.connect(setup=self._setup)

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA foreign_keys=ON")
        self._db = db
        self._migrate()

    def _migrate(self) -> None:
        """Bring the file to :data:`SCHEMA_VERSION`, one transaction per migration; a newer file is refused, and
        damage that ``quick_check`` does not see (an index out of step with its table) found by a migration is
        :class:`~sits_observe.errors.DamagedStateError` as at the check."""
        while True:
            with transaction(self._db, self._lock, self._file.failure) as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StateFileError(
                        f"{self.path}: schema version {version} is newer than this sits-observe knows "
                        f"({SCHEMA_VERSION}); run the version that wrote it, or move the file away")
                if version == SCHEMA_VERSION:
                    return
                for statement in MIGRATIONS[version]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version={version + 1}")

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return read(self._db, self._lock, sql, args, self._file.error_of)

    def _read_one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        rows = self._read(sql, args)
        return rows[0] if rows else None

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db, self._lock, self._file.error_of)

    # A row that cannot be read back stops the daemon (exit 2), unlike slo.db's or the outbox's, which are skipped:
    # a placement or shard the scheduler does not see would be placed anew beside the one that holds its GPUs.
    def _placement(self, row: tuple[Any, ...]) -> Placement:
        d = dict(zip(_COLUMNS, row))
        try:
            d["gpus"] = tuple(int(g) for g in json.loads(d["gpus"]))
            d["state"] = State(d["state"])
        except (ValueError, TypeError) as exc:  # another version's, or damaged
            raise self._file.damaged(f"table placements: placement {d['id']} of shard {d['shard_id']} cannot be "
                                     f"read: {type(exc).__name__}: {exc}") from None
        return Placement(**d)

    def _spec(self, shard_id: str, body: Any) -> ShardSpec:
        try:
            return ShardSpec.model_validate_json(body)
        except ValueError as exc:  # pydantic's ValidationError too
            raise self._file.damaged(f"table shards: shard {shard_id} cannot be read: "
                                     f"{type(exc).__name__}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # shards
    def add_shard(self, spec: ShardSpec, ts: float, origin: str = "api") -> None:
        """Store a new shard; ``origin`` says who declared it: ``config``, ``api`` or ``simulator``."""
        body = spec.model_dump_json(exclude={"placement"})
        with self._tx() as db:
            if db.execute("SELECT 1 FROM shards WHERE id=?", (spec.id,)).fetchone():
                raise SchedulerError(f"shard {spec.id}: already registered")
            db.execute("INSERT INTO shards(id, spec, created_ts, origin) VALUES (?, ?, ?, ?)",
                       (spec.id, body, ts, origin))

    def claim(self, origin: str, ids: Collection[str]) -> set[str]:
        """Mark the stored shards of ``ids`` as declared by ``origin`` (a shard the API registered that the config now
        lists is the config's); returns the ids of every shard ``origin`` declared."""
        with self._tx() as db:
            db.executemany("UPDATE shards SET origin=? WHERE id=? AND origin!=?", [(origin, i, origin) for i in ids])
            return {r[0] for r in db.execute("SELECT id FROM shards WHERE origin=?", (origin,))}

    def replace_shard(self, spec: ShardSpec) -> None:
        """Store a changed spec of a registered shard (its placements stay as they are)."""
        with self._tx() as db:
            if db.execute("UPDATE shards SET spec=? WHERE id=?", (spec.model_dump_json(exclude={"placement"}),
                                                                 spec.id)).rowcount != 1:
                raise NotFound(f"shard {spec.id}: not registered")

    def remove_shard(self, shard_id: str, live: list[Placement], span: SpanRecord | None = None) -> None:
        """Forget a shard and all its placements (the retired and failed ones too: the history of a shard gone would
        be kept for good), with the span of the decision that removed it; refused, changing nothing, if its live
        placements are no longer ``live`` as read (someone moved one since)."""
        with self._tx() as db:
            found = db.execute(f"SELECT id, version FROM placements WHERE shard_id=? AND state NOT IN "
                             f"({', '.join('?' * len(TERMINAL))}) ORDER BY id",
                             (shard_id, *[s.value for s in TERMINAL])).fetchall()
            if found != [(p.id, p.version) for p in live]:
                raise SchedulerError(f"shard {shard_id}: lost a race removing it: its live placements (id, version) "
                                     f"were {[(p.id, p.version) for p in live]}, now {found}")
            db.execute("DELETE FROM placements WHERE shard_id=?", (shard_id,))
            if db.execute("DELETE FROM shards WHERE id=?", (shard_id,)).rowcount != 1:
                raise NotFound(f"shard {shard_id}: not registered")
            if span is not None:
                self._insert_span(db, span)

    def shard(self, shard_id: str) -> ShardSpec:
        row = self._read_one("SELECT spec FROM shards WHERE id=?", (shard_id,))
        if row is None:
            raise NotFound(f"shard {shard_id}: not registered")
        return self._spec(shard_id, row[0])

    def shards(self) -> list[ShardSpec]:
        rows = self._read("SELECT id, spec FROM shards ORDER BY id")
        return [self._spec(i, body) for i, body in rows]

    # placements
    def create(self, shard_id: str, kind: str, ts: float, source_id: int | None = None,
               decision_id: str = "", reason: str = "", span: SpanRecord | None = None) -> Placement:
        """A new placement in ``pending`` at version 1, and the span of the decision that made it."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO placements(shard_id, kind, source_id, state, version, decision_id, reason, created_ts,"
                " updated_ts) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?)",
                (shard_id, kind, source_id, State.PENDING.value, decision_id, reason, ts, ts))
            pid = cur.lastrowid
            if span is not None:
                self._insert_span(db, span)
        return self.placement(int(pid or 0))

    def update(self, p: Placement, ts: float, state: State | None = None, **fields: Any) -> Placement:
        """Compare-and-swap ``p`` (as read) to ``state`` and/or new ``fields``; refused if anyone moved it."""
        target = state or p.state
        if state is not None:
            check_transition(p.shard_id, p.id, p.state, state)
        bad = set(fields) - _MUTABLE
        if bad:
            raise SchedulerError(f"placement {p.id}: fields {sorted(bad)} cannot change")
        if "gpus" in fields:
            fields["gpus"] = json.dumps(sorted(int(g) for g in fields["gpus"]))
        sets = "".join(f", {k}=?" for k in fields)
        with self._tx() as db:
            cur = db.execute(
                f"UPDATE placements SET state=?, version=version+1, updated_ts=?{sets} "
                "WHERE id=? AND version=? AND state=?",
                (target.value, ts, *fields.values(), p.id, p.version, p.state.value))
            if cur.rowcount != 1:
                row = db.execute("SELECT state, version FROM placements WHERE id=?", (p.id,)).fetchone()
                actual = f"{row[0]} (version {row[1]})" if row else "no such placement"
                raise SchedulerError(
                    f"shard {p.shard_id}: placement {p.id}: lost a race moving to {target.value}: expected "
                    f"{p.state.value} (version {p.version}), actual {actual}")
        return self.placement(p.id)

    def placement(self, placement_id: int) -> Placement:
        row = self._read_one(f"SELECT {', '.join(_COLUMNS)} FROM placements WHERE id=?", (placement_id,))
        if row is None:
            raise NotFound(f"placement {placement_id}: no such placement")
        return self._placement(row)

    def placements(self, shard_id: str | None = None, live: bool = False) -> list[Placement]:
        """Placements oldest first; ``live`` keeps the non-terminal ones."""
        where, args = [], []
        if shard_id is not None:
            where.append("shard_id=?")
            args.append(shard_id)
        if live:
            where.append(f"state NOT IN ({', '.join('?' * len(TERMINAL))})")
            args += [s.value for s in TERMINAL]
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(f"SELECT {', '.join(_COLUMNS)} FROM placements{clause} ORDER BY id", args)
        return [self._placement(r) for r in rows]

    def last_reshard_ts(self, shard_id: str) -> float | None:
        row = self._read_one("SELECT MAX(created_ts) FROM placements WHERE shard_id=? AND kind='reshard'",
                             (shard_id,))
        return row[0]

    def counts(self) -> dict[State, int]:
        rows = self._read("SELECT state, COUNT(*) FROM placements GROUP BY state")
        got = {State(s): n for s, n in rows}
        return {s: got.get(s, 0) for s in State}

    def prune(self, keep: int) -> None:
        """Keep the newest ``keep`` terminal placements of each shard (bounded history)."""
        with self._tx() as db:
            db.execute(
                f"DELETE FROM placements WHERE state IN ({', '.join('?' * len(TERMINAL))}) AND id NOT IN ("
                "SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY shard_id ORDER BY id DESC) AS r "
                f"FROM placements WHERE state IN ({', '.join('?' * len(TERMINAL))})) WHERE r <= ?)",
                (*[s.value for s in TERMINAL], *[s.value for s in TERMINAL], keep))

    # decision spans
    @staticmethod
    def _insert_span(db: sqlite3.Connection, span: SpanRecord) -> None:
        db.execute("INSERT INTO spans(decision_id, body, created_ts) VALUES (?, ?, ?)",
                   (span.decision_id, json.dumps(span.body), time.time()))

    def add_span(self, span: SpanRecord) -> None:
        """Store the span of a decision that wrote no row (a "no action")."""
        with self._tx() as db:
            self._insert_span(db, span)

    def replace_span(self, span: SpanRecord) -> None:
        """Store a decision's span anew, if it still waits for export (its placement failed at once)."""
        with self._tx() as db:
            db.execute("UPDATE spans SET body=? WHERE decision_id=?", (json.dumps(span.body), span.decision_id))

    def pending_spans(self, limit: int, newest: bool = False) -> list[tuple[int, str]]:
        """The oldest (or newest) ``limit`` spans stored (none is exported yet), as (seq, JSON body)."""
        order = "DESC" if newest else "ASC"
        return self._read(f"SELECT seq, body FROM spans ORDER BY seq {order} LIMIT ?", (limit,))

    def drop_spans(self, seqs: list[int]) -> int:
        """Delete spans: exported, or never to be; returns how many were still stored."""
        with self._tx() as db:
            return db.executemany("DELETE FROM spans WHERE seq=?", [(q,) for q in seqs]).rowcount

    def trim_spans(self, keep: int) -> int:
        """Keep the newest ``keep`` spans; returns how many were deleted."""
        with self._tx() as db:
            return db.execute("DELETE FROM spans WHERE seq IN (SELECT seq FROM spans ORDER BY seq DESC "
                              "LIMIT -1 OFFSET ?)", (keep,)).rowcount

    @property
    def lock(self) -> threading.RLock:
        """Held through every read and write (a write to a locked file holds it for SQLite's busy timeout)."""
        return self._lock

    def span_backlog(self) -> int:
        """Spans stored, waiting for export."""
        return int(self._read_one("SELECT COUNT(*) FROM spans")[0])
