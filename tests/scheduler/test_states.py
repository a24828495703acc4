"""Placement state machine on the SQLite store: compare-and-swap, illegal transitions, lost races; schema
migrations of existing files."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from sits_observe.errors import SchedulerError, StateFileError
from sits_observe.scheduler.config import ShardSpec
from sits_observe.scheduler.states import TRANSITIONS, NotFound, State
from sits_observe.scheduler.store import DB_NAME, SCHEMA_VERSION, PlacementStore, SpanRecord

# scheduler.sqlite as written before the schema was versioned (user_version 0)
UNVERSIONED = """
CREATE TABLE shards (id TEXT PRIMARY KEY, spec TEXT NOT NULL, created_ts REAL NOT NULL);
CREATE TABLE placements (
    id INTEGER PRIMARY KEY AUTOINCREMENT, shard_id TEXT NOT NULL REFERENCES shards(id), kind TEXT NOT NULL,
    source_id INTEGER, gpus TEXT NOT NULL DEFAULT '[]', node TEXT NOT NULL DEFAULT '', state TEXT NOT NULL,
    version INTEGER NOT NULL, step TEXT, step_ts REAL, decision_id TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '', created_ts REAL NOT NULL, updated_ts REAL NOT NULL);
CREATE INDEX placements_shard ON placements(shard_id, state);
"""


@pytest.fixture
def store(tmp_path: Path) -> PlacementStore:
    s = PlacementStore(tmp_path)
    s.add_shard(ShardSpec(id="llama-tp2", gpus=2, memory_per_gpu=10), 1.0)
    yield s
    s.close()


def test_full_walk_bumps_version_each_step(store: PlacementStore) -> None:
    p = store.create("llama-tp2", "assign", 1.0)
    assert (p.state, p.version, p.gpus) == (State.PENDING, 1, ())
    p = store.update(p, 2.0, State.PLACED, gpus=(3, 2), node="localhost")
    assert p.gpus == (2, 3)
    for target in (State.STAGED, State.LAUNCHED, State.DRAINING, State.RETIRED):
        p = store.update(p, 3.0, target)
    assert (p.state, p.version) == (State.RETIRED, 6)
    assert store.placements(live=True) == []


@pytest.mark.parametrize("current", list(State))
def test_illegal_transitions_are_refused_and_change_nothing(store: PlacementStore, current: State) -> None:
    path = {State.PENDING: [], State.PLACED: [State.PLACED], State.STAGED: [State.PLACED, State.STAGED],
            State.LAUNCHED: [State.PLACED, State.STAGED, State.LAUNCHED],
            State.DRAINING: [State.PLACED, State.STAGED, State.LAUNCHED, State.DRAINING],
            State.RETIRED: [State.PLACED, State.STAGED, State.LAUNCHED, State.DRAINING, State.RETIRED],
            State.FAILED: [State.FAILED]}[current]
    p = store.create("llama-tp2", "assign", 1.0)
    for s in path:
        p = store.update(p, 1.0, s)
    for target in set(State) - TRANSITIONS[current]:
        with pytest.raises(SchedulerError) as err:
            store.update(p, 2.0, target)
        msg = str(err.value)
        assert f"shard llama-tp2: placement {p.id}: illegal transition {current.value} -> {target.value}" in msg
        assert store.placement(p.id) == p


def test_lost_race_names_shard_expected_and_actual(store: PlacementStore, tmp_path: Path) -> None:
    other = PlacementStore(tmp_path)  # a second connection, as a second process would have
    try:
        p = store.create("llama-tp2", "assign", 1.0)
        p = store.update(p, 1.0, State.PLACED, gpus=(0, 1))
        seen_by_other = other.placement(p.id)
        store.update(p, 2.0, State.STAGED)
        with pytest.raises(SchedulerError) as err:
            other.update(seen_by_other, 2.0, State.STAGED)
        assert str(err.value) == (f"shard llama-tp2: placement {p.id}: lost a race moving to staged: expected placed "
                                  "(version 2), actual staged (version 3)")
        with pytest.raises(SchedulerError, match="expected placed \\(version 2\\), actual staged"):
            other.update(seen_by_other, 2.0, State.FAILED)
        assert store.placement(p.id).state is State.STAGED
    finally:
        other.close()


def test_unknown_ids_and_duplicate_shards(store: PlacementStore) -> None:
    with pytest.raises(NotFound, match="placement 99: no such placement"):
        store.placement(99)
    with pytest.raises(NotFound, match="shard nope: not registered"):
        store.shard("nope")
    with pytest.raises(SchedulerError, match="shard llama-tp2: already registered"):
        store.add_shard(ShardSpec(id="llama-tp2"), 2.0)


def test_prune_keeps_newest_terminal_rows_per_shard(store: PlacementStore) -> None:
    ids = []
    for _ in range(5):
        p = store.create("llama-tp2", "assign", 1.0)
        ids.append(store.update(p, 1.0, State.FAILED).id)
    live = store.create("llama-tp2", "assign", 1.0)
    store.prune(2)
    assert [p.id for p in store.placements("llama-tp2")] == ids[-2:] + [live.id]
    assert store.counts()[State.FAILED] == 2


def user_version(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_a_file_from_before_schema_versions_is_migrated_keeping_its_rows(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / DB_NAME)) as db, db:
        db.executescript(UNVERSIONED)
        db.execute("INSERT INTO shards VALUES ('old', ?, 1.0)", (ShardSpec(id="old", gpus=2).model_dump_json(),))
        db.execute("INSERT INTO placements(shard_id, kind, gpus, node, state, version, decision_id, created_ts, "
                   "updated_ts) VALUES ('old', 'assign', '[0, 1]', 'localhost', 'launched', 4, 'd0', 1.0, 2.0)")
    assert user_version(tmp_path / DB_NAME) == 0
    store = PlacementStore(tmp_path)
    try:
        assert [s.id for s in store.shards()] == ["old"]
        (p,) = store.placements()
        assert (p.shard_id, p.gpus, p.state, p.version, p.decision_id) == ("old", (0, 1), State.LAUNCHED, 4, "d0")
        store.add_span(SpanRecord("d1", {"name": "shard.reshard"}))
        assert store.span_backlog() == 1
    finally:
        store.close()
    assert user_version(tmp_path / DB_NAME) == SCHEMA_VERSION
    again = PlacementStore(tmp_path)  # an up-to-date file opens as it is
    try:
        assert again.span_backlog() == 1 and len(again.placements()) == 1
    finally:
        again.close()


def test_a_file_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / DB_NAME)) as db, db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StateFileError, match=f"scheduler.sqlite: schema version {SCHEMA_VERSION + 1} is newer than "
                                             f"this sits-observe knows \\({SCHEMA_VERSION}\\)") as err:
        PlacementStore(tmp_path)
    assert err.value.exit_code == 2  # a restart cannot fix it: systemd does not loop on it


def test_a_version_2_file_keeps_its_unexported_spans_only(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / DB_NAME)) as db, db:
        db.executescript(UNVERSIONED + """
            CREATE TABLE spans (seq INTEGER PRIMARY KEY AUTOINCREMENT, decision_id TEXT NOT NULL, body TEXT NOT NULL,
                                created_ts REAL NOT NULL, exported_ts REAL);
            CREATE INDEX spans_exported ON spans(exported_ts, seq);
            INSERT INTO spans(decision_id, body, created_ts, exported_ts) VALUES ('sent', '{}', 1.0, 2.0),
                ('waits', '{"name": "shard.reshard"}', 3.0, NULL), ('sent too', '{}', 4.0, 5.0);
            PRAGMA user_version=2;
        """)
    store = PlacementStore(tmp_path)  # version 2 kept exported spans; nothing reads them
    try:
        assert store.pending_spans(10) == [(2, '{"name": "shard.reshard"}')]
        store.add_span(SpanRecord("d1", {"name": "shard.assign"}))
        assert [json.loads(body)["name"] for _, body in store.pending_spans(10)] == ["shard.reshard", "shard.assign"]
    finally:
        store.close()
    assert user_version(tmp_path / DB_NAME) == SCHEMA_VERSION
    with closing(sqlite3.connect(tmp_path / DB_NAME)) as db:
        assert [c[1] for c in db.execute("PRAGMA table_info(spans)")] == ["seq", "decision_id", "body", "created_ts"]
        assert db.execute("SELECT decision_id FROM spans ORDER BY seq").fetchall() == [("waits",), ("d1",)]


def test_close_closes_the_store_and_the_span_sender_even_if_the_actuator_raises(make_scheduler) -> None:
    s = make_scheduler()
    calls: list[str] = []

    def boom() -> None:
        calls.append("actuator")
        raise RuntimeError("actuator close failed")

    s.actuator.close = boom  # type: ignore[method-assign]
    tracer_close = s.tracer.close
    s.tracer.close = lambda: (calls.append("tracer"), tracer_close())[1]  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="actuator close failed"):
        s.close()
    assert sorted(calls) == ["actuator", "tracer"]  # side by side
    with pytest.raises(sqlite3.ProgrammingError):  # the database is closed too
        s.store._db.execute("SELECT 1")
    s.actuator.close = lambda: None  # type: ignore[method-assign]  # the fixture closes it again


def test_close_raises_what_the_span_sender_raised_after_closing_the_rest(make_scheduler) -> None:
    s = make_scheduler()
    calls: list[str] = []
    tracer_close = s.tracer.close

    def boom() -> None:
        tracer_close()
        raise RuntimeError("exporter shutdown failed")

    s.tracer.close = boom  # type: ignore[method-assign]
    s.actuator.close = lambda: calls.append("actuator")  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="exporter shutdown failed"):
        s.close()
    assert calls == ["actuator"]
    with pytest.raises(sqlite3.ProgrammingError):  # the database is closed too
        s.store._db.execute("SELECT 1")
    s.tracer.close = tracer_close  # type: ignore[method-assign]  # the fixture closes it again
