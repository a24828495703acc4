"""Durable alert outbox: one SQLite database (WAL) under ``state_dir``, written before any delivery attempt.

A message is one alert in one state for one receiver.  It leaves the outbox only when the receiver
answered 2xx (deleted) or refused it for good (moved to ``failed`` with the reason).  Because a
``kill -9`` can land between a receiver's 2xx and the delete, a message may reach a receiver twice;
both copies carry the same ``X-Sits-Delivery`` id (``instance:id.version``; the version counts updates
of a queued message, so an update is a new delivery).

Deduplication by label fingerprint, per receiver:

* a state change equal to the last one queued (same status and annotations, but for
  :data:`~.formats.QUIET_ANNOTATIONS`) is dropped, so a restarted evaluator that re-announces its alerts
  sends nothing new, even one killed after queuing a firing alert and before recording it, which
  re-announces it with a later start;
* a change with the same status as a message still pending (new annotations) updates that message in
  place instead of queuing another;
* a *refresh* (Alertmanager re-send) is queued only when nothing is pending for that alert and its state
  was not refused for good, or, at a *retry* refresh (one in :data:`~.dispatch.REFUSED_RETRY_ROUNDS`), was
  refused with an answer a fix on the receiver's side can lift (:func:`~.answers.refusal_may_lift`: a proxy's
  404 or 403 in front of Alertmanager is fixed there, without a restart here, and the alert would stay unseen
  until its next state change; a 400 for the alert's content would only be refused again); a webhook receiver
  gets no re-sends, only the retry (``resend=False``);
* a state refused for good is not remembered as queued (unless a newer message is pending), so it goes
  again when it is announced again.

Bounded while a receiver is down: an alert that flaps queues one message per state change, so at most
:data:`PENDING_PER_ALERT` stay queued per alert and receiver.  Past that, the two oldest after the head (the
head may be in flight) are folded: one resolve-and-fire cycle the receiver will not see, counted in the
``unsent_flaps`` annotation of the message after them and as ``(receiver, "folded")`` in ``counts``.  Statuses still
alternate, so a resolution never arrives without its firing before it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AlertingError
from ..statedb import StateFile, read, transaction
from .answers import refusal_may_lift
from .formats import QUIET_ANNOTATIONS, Alert

__all__ = ["Message", "Outbox"]

FAILED_KEPT = 1000
PENDING_PER_ALERT = 4  # per alert and receiver: the head (maybe in flight) and three more
FLAPS = "unsent_flaps"  # the annotation counting the resolve-and-fire cycles folded before a message

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    refresh INTEGER NOT NULL DEFAULT 0,
    alert TEXT NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_receiver ON outbox (receiver, id);
CREATE TABLE IF NOT EXISTS last_queued (
    receiver TEXT NOT NULL, fingerprint TEXT NOT NULL, digest TEXT NOT NULL,
    PRIMARY KEY (receiver, fingerprint)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS failed (
    id INTEGER PRIMARY KEY, receiver TEXT NOT NULL, fingerprint TEXT NOT NULL, status TEXT NOT NULL,
    alert TEXT NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    receiver: str
    alert: Alert
    attempts: int
    version: int


def _digest(alert: Alert) -> str:
    # not the start: the same status twice in a row is one incident (a new one resolves the last first);
    # not the quiet annotations: a change of those alone is no new message
    loud = {k: v for k, v in alert.annotations.items() if k not in QUIET_ANNOTATIONS}
    key = json.dumps([alert.status, loud], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _fold(db: sqlite3.Connection, receiver: str, fp: str) -> int:
    """Fold an alert's queue for one receiver back to :data:`PENDING_PER_ALERT` messages; how many were folded.
    Usually one cycle past the bound; more in an outbox queued before it (a receiver down across the upgrade)."""
    rows = db.execute("SELECT id, alert FROM outbox WHERE receiver=? AND fingerprint=? ORDER BY id",
                      (receiver, fp)).fetchall()
    if len(rows) <= PENDING_PER_ALERT:
        return 0
    # the head may be in flight; the ones after it come in resolve-and-fire pairs (a queued state of the same
    # status is updated in place, so queued statuses alternate), never in flight (one message per alert is)
    cycles = (len(rows) - PENDING_PER_ALERT + 1) // 2
    folded, (after, after_body) = rows[1:1 + 2 * cycles], rows[1 + 2 * cycles]
    kept = json.loads(after_body)
    before = sum(int(json.loads(body)["annotations"].get(FLAPS, "0")) for _, body in folded)
    kept["annotations"][FLAPS] = str(before + cycles)
    db.execute("UPDATE outbox SET alert=? WHERE id=?", (json.dumps(kept), after))
    db.executemany("DELETE FROM outbox WHERE id=?", [(i,) for i, _ in folded])
    return 2 * cycles


class Outbox:
    """Thread-safe; one connection guarded by a lock (every statement is short)."""

    def __init__(self, path: Path, counts: Counter[tuple[str, str]] | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.counts = Counter() if counts is None else counts  # (receiver, "folded"): messages folded
        self._file = StateFile(self.path, "the alerts not yet delivered",
                               lambda m: AlertingError(f"alert outbox {m}"))
        # FULL: a queued alert survives power loss before the SLO state that says it was announced
        self._db = self._file.connect("FULL", timeout=10, setup=self._setup)

    def _setup(self, db: sqlite3.Connection) -> None:
        db.executescript(_SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key='instance'").fetchone()
        if row is None:
            row = (uuid.uuid4().hex[:12],)
            db.execute("INSERT INTO meta VALUES ('instance', ?)", row)
        self.instance: str = row[0]

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        return read(self._db, self._lock, sql, args, self._file.error_of)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db, self._lock, self._file.error_of)

    def enqueue(self, receivers: Sequence[str], alert: Alert, *, refresh: bool = False,
                retry_refused: bool = False, resend: bool = True) -> int:
        """Queue ``alert`` for each receiver (deduplicated, see the module docstring); returns how many were queued.
        ``retry_refused``: a refresh that also offers again a state the receiver refused; ``resend=False``: a refresh
        that offers only that (a webhook receiver's)."""
        with self._tx() as db:
            return self._enqueue(db, receivers, alert, refresh, retry_refused, resend)

    def _enqueue(self, db: sqlite3.Connection, receivers: Sequence[str], alert: Alert, refresh: bool,
                 retry_refused: bool, resend: bool) -> int:
        fp, body, queued = alert.fingerprint, json.dumps(alert.to_json()), 0
        digest = _digest(alert)
        for r in receivers:
            pending = db.execute("SELECT id, status FROM outbox WHERE receiver=? AND fingerprint=? "
                                 "ORDER BY id DESC LIMIT 1", (r, fp)).fetchone()
            last = db.execute("SELECT digest FROM last_queued WHERE receiver=? AND fingerprint=?", (r, fp)).fetchone()
            if refresh:  # a state refused for good (forgotten as queued) only at a retry: it may be refused again
                retried = pending is None and last is None and retry_refused and refusal_may_lift(db.execute(
                    "SELECT reason FROM failed WHERE receiver=? AND fingerprint=? "
                    "ORDER BY at DESC, id DESC LIMIT 1", (r, fp)).fetchone())
                if retried:  # remembered as queued again: delivered, it is re-sent at every interval from then on
                    db.execute("INSERT OR REPLACE INTO last_queued VALUES (?, ?, ?)", (r, fp, digest))
                    last = (digest,)
                if pending is None and last is not None and (resend or retried):
                    db.execute("INSERT INTO outbox (receiver, fingerprint, status, refresh, alert, created) "
                               "VALUES (?, ?, ?, 1, ?, ?)", (r, fp, alert.status, body, time.time()))
                    queued += 1
                continue
            if last is not None and last[0] == digest:
                continue
            db.execute("INSERT OR REPLACE INTO last_queued VALUES (?, ?, ?)", (r, fp, digest))
            if pending is not None and pending[1] == alert.status:
                db.execute("UPDATE outbox SET alert=?, refresh=0, version=version+1 WHERE id=?", (body, pending[0]))
            else:
                db.execute("INSERT INTO outbox (receiver, fingerprint, status, alert, created) VALUES (?, ?, ?, ?, ?)",
                           (r, fp, alert.status, body, time.time()))
                queued += 1
                self.counts[(r, "folded")] += _fold(db, r, fp)
        return queued

    def head(self, receiver: str, limit: int = 1) -> list[Message]:
        """The oldest pending messages of a receiver, in order, stopping before an alert seen twice; one that
        cannot be read back moves to ``failed`` (a queue must not stop behind it)."""
        while True:
            rows = self._read("SELECT id, fingerprint, alert, attempts, version FROM outbox WHERE receiver=? "
                              "ORDER BY id LIMIT ?", (receiver, limit))
            out, seen = [], set()
            for mid, fp, body, attempts, version in rows:
                if fp in seen:
                    return out
                try:
                    alert = Alert.from_json(json.loads(body))
                except (ValueError, TypeError, KeyError, AttributeError) as exc:  # another version's, or damaged
                    self.failed([mid], f"unreadable message ({type(exc).__name__}); not sent")
                    break  # and read the head again
                seen.add(fp)
                out.append(Message(mid, receiver, alert, attempts, version))
            else:
                return out

    def delivered(self, messages: Sequence[Message]) -> None:
        """Remove delivered messages; one updated while in flight stays, to be sent again with its new content."""
        with self._tx() as db:
            db.executemany("DELETE FROM outbox WHERE id=? AND version=?", [(m.id, m.version) for m in messages])

    def attempted(self, ids: Sequence[int], error: str) -> None:
        """Record a failed attempt that will be retried."""
        with self._tx() as db:
            db.executemany("UPDATE outbox SET attempts=attempts+1, last_error=? WHERE id=?", [(error, i) for i in ids])

    def failed(self, ids: Sequence[int], reason: str, versions: Sequence[int] | None = None) -> None:
        """Give up on messages the receiver refused for good; they move to ``failed`` with the reason.  With
        ``versions`` (those sent), one updated while in flight stays queued: its new content is a new delivery,
        not yet refused.  The alert's state is forgotten as queued for that receiver unless a newer message of
        it is pending, so the same state announced again (a restart after the receiver was fixed) is sent, not
        deduplicated."""
        with self._tx() as db:
            sent: Iterable[tuple[int, int | None]] = zip(ids, versions) if versions is not None else \
                ((i, None) for i in ids)
            for i, v in sent:
                key = db.execute("SELECT receiver, fingerprint FROM outbox WHERE id=? AND (? IS NULL OR version=?)",
                                 (i, v, v)).fetchone()
                if key is None:  # updated while in flight (or gone): the refusal shows as its last error
                    db.execute("UPDATE outbox SET attempts=attempts+1, last_error=? WHERE id=?", (reason, i))
                    continue
                db.execute("INSERT OR REPLACE INTO failed SELECT id, receiver, fingerprint, status, alert, ?, ? "
                           "FROM outbox WHERE id=?", (reason, time.time(), i))
                db.execute("DELETE FROM outbox WHERE id=?", (i,))
                if not db.execute("SELECT 1 FROM outbox WHERE receiver=? AND fingerprint=?", key).fetchone():
                    db.execute("DELETE FROM last_queued WHERE receiver=? AND fingerprint=?", key)
            # the FAILED_KEPT refused last; ids are the outbox's, the order messages were queued in (a message queued
            # for a receiver down for hours is refused after 1,000 others queued later), so the refusal time decides
            db.execute("DELETE FROM failed WHERE id IN (SELECT id FROM failed ORDER BY at DESC, id DESC "
                       "LIMIT -1 OFFSET ?)", (FAILED_KEPT,))

    def depth(self) -> dict[str, int]:
        return dict(self._read("SELECT receiver, COUNT(*) FROM outbox GROUP BY receiver"))

    def last_errors(self) -> dict[str, str]:
        """Per receiver, the error of its oldest pending message (why the queue is stuck), if any."""
        return dict(self._read("SELECT receiver, last_error FROM outbox WHERE id IN "
                               "(SELECT MIN(id) FROM outbox GROUP BY receiver) AND last_error IS NOT NULL"))

    def recent_failures(self, limit: int = 20) -> list[dict[str, object]]:
        rows = self._read("SELECT id, receiver, fingerprint, status, reason, at FROM failed "
                          "ORDER BY at DESC, id DESC LIMIT ?", (limit,))
        keys = ("id", "receiver", "fingerprint", "status", "reason", "at")
        return [dict(zip(keys, r)) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
