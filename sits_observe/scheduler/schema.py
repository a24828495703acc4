"""The schema of ``scheduler.sqlite``: the migrations that take a file from one ``PRAGMA user_version`` to the next."""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

# migration n (1-based) takes a file from user_version n - 1 to n; files made before versioning are at 0
# and have the tables of migration 1 already (hence IF NOT EXISTS there)
MIGRATIONS: tuple[tuple[str, ...], ...] = ((
    """CREATE TABLE IF NOT EXISTS shards (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, created_ts REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS placements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shard_id TEXT NOT NULL REFERENCES shards(id),
    kind TEXT NOT NULL,                 -- assign | reshard | adopt
    source_id INTEGER,                  -- the placement a re-shard replaces
    gpus TEXT NOT NULL DEFAULT '[]',
    node TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    step TEXT,                          -- actuator step sent and not acked yet
    step_ts REAL,
    decision_id TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    created_ts REAL NOT NULL,
    updated_ts REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS placements_shard ON placements(shard_id, state)",
), (
    """CREATE TABLE spans (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- export order, oldest first
    decision_id TEXT NOT NULL,
    body TEXT NOT NULL,                     -- JSON: ids, times, attributes, events, links, status, resource
    created_ts REAL NOT NULL,               -- wall clock
    exported_ts REAL)                       -- NULL until the collector accepted it""",
    "CREATE INDEX spans_exported ON spans(exported_ts, seq)",
), (  # exported spans are deleted, not kept: the table without exported_ts (no DROP COLUMN before SQLite 3.35)
    """CREATE TABLE spans_unsent (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- export order, oldest first
    decision_id TEXT NOT NULL,
    body TEXT NOT NULL,                     -- JSON: ids, times, attributes, events, links, status, resource
    created_ts REAL NOT NULL)               -- wall clock""",
    "INSERT INTO spans_unsent SELECT seq, decision_id, body, created_ts FROM spans WHERE exported_ts IS NULL",
    "DROP TABLE spans",
    "ALTER TABLE spans_unsent RENAME TO spans",
), (  # who declared a shard: config, api or simulator (a shard the config no longer lists is removed); one stored
    # before is the API's, as a shard the config had dropped was then, until the next start finds the config's
    "ALTER TABLE shards ADD COLUMN origin TEXT NOT NULL DEFAULT 'api'",
))
SCHEMA_VERSION = len(MIGRATIONS)
