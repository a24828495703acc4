"""A damaged state database stops the start with exit 2 and the way out; the file itself is left as it was."""

import os
import sqlite3
import subprocess
import sys

import pytest

from sits_observe.alerting.outbox import Outbox
from sits_observe.errors import AlertingError, DamagedStateError, SchedulerError, SloError, StoreError
from sits_observe.rca.log import VerdictLog
from sits_observe.scheduler.store import DB_NAME, PlacementStore
from sits_observe.slo.state import SloState

GARBAGE = b"not a database" * 400
# each state database, how it is opened on its own, and the class its other sqlite errors keep
OPENERS = {
    "slo.db": (lambda d: SloState(d / "slo.db", ["a"], ["k"], [10.0]), SloError),
    "outbox.db": (lambda d: Outbox(d / "outbox.db"), AlertingError),
    "rca.sqlite": (lambda d: VerdictLog(d / "rca.sqlite"), StoreError),
    DB_NAME: (lambda d: PlacementStore(d), SchedulerError),
}


def _damaged_pages(path):
    """A real database whose table pages are overwritten: it opens, then fails as malformed."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE IF NOT EXISTS junk (x TEXT)")
    db.executemany("INSERT INTO junk VALUES (?)", [("x" * 500,)] * 200)
    db.commit()
    db.close()
    raw = bytearray(path.read_bytes())
    raw[4096:] = b"\xa5" * (len(raw) - 4096)  # every page but the first (the schema) is garbage
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("name", sorted(OPENERS))
@pytest.mark.parametrize("damage", ["not a database", "damaged pages"])
def test_each_state_file_damaged_raises_the_way_out_and_keeps_the_file(tmp_path, name, damage):
    open_it, _ = OPENERS[name]
    path = tmp_path / name
    if damage == "not a database":
        path.write_bytes(GARBAGE)
    else:
        open_it(tmp_path).close()  # the real schema first
        _damaged_pages(path)
    before = path.read_bytes()
    with pytest.raises(DamagedStateError) as err:
        open_it(tmp_path).close()
    msg = str(err.value)
    assert str(path) in msg and f"mv {path}* {tmp_path / 'damaged'}/" in msg and "\n" not in msg, msg
    assert err.value.exit_code == 2
    assert path.read_bytes() == before


@pytest.mark.parametrize("name", sorted(OPENERS))
def test_a_state_file_that_cannot_be_opened_keeps_its_own_error(tmp_path, name):
    open_it, error = OPENERS[name]
    (tmp_path / name).mkdir()  # a directory where the file should be: not damage, a fault to fix
    with pytest.raises(error) as err:
        open_it(tmp_path).close()
    assert not isinstance(err.value, DamagedStateError) and err.value.exit_code == 1


@pytest.mark.parametrize("name", ["slo.db", "outbox.db", "rca.sqlite", DB_NAME])
def test_the_daemon_refuses_to_start_on_a_damaged_state_file_with_exit_2(tmp_path, free_port, name):
    path = tmp_path / name
    path.write_bytes(GARBAGE)
    cfg = tmp_path / "c.yaml"  # a receiver, so that the outbox is opened (nothing is sent in 1 s)
    cfg.write_text("alerting:\n  receivers:\n    - {name: r, type: webhook, url: 'http://127.0.0.1:9/'}\n")
    res = subprocess.run([sys.executable, "-m", "sits_observe", "demo", "--duration", "1", "--config", str(cfg),
                          "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "SITS_STATE_DIR": str(tmp_path)})
    errors = [line for line in res.stderr.splitlines() if line.startswith("sits-observe: error:")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(errors) == 1 and str(path) in errors[0] and "aside" in errors[0], res.stderr
    assert path.read_bytes() == GARBAGE


def test_scheduler_damage_that_quick_check_misses_is_found_by_its_migration_as_damage(tmp_path):
    """An index with entries for rows its table lacks passes quick_check (integrity_check would see it); the
    migration to schema 3 reads the spans through that index and meets the damage: exit 2, not 1."""
    from sits_observe.scheduler import schema

    path = tmp_path / DB_NAME
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")  # as the daemon made it
    for migration in schema.MIGRATIONS[:2]:  # a file of schema 2, with 3 spans not yet exported
        for statement in migration:
            db.execute(statement)
    db.execute("PRAGMA user_version=2")
    db.executemany("INSERT INTO spans(seq, decision_id, body, created_ts) VALUES (?, 'd', '{}', 1.0)",
                   [(1,), (2,), (3,)])
    db.execute("CREATE TABLE spans_one AS SELECT * FROM spans WHERE seq = 1")
    roots = dict(db.execute("SELECT name, rootpage FROM sqlite_master WHERE name IN ('spans', 'spans_one')"))
    db.execute("PRAGMA writable_schema=ON")  # the table now holds one row, its index still three
    db.execute("UPDATE sqlite_master SET rootpage=? WHERE name='spans'", (roots["spans_one"],))
    db.execute("UPDATE sqlite_master SET rootpage=? WHERE name='spans_one'", (roots["spans"],))
    db.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    db.close()
    before = path.read_bytes()
    with pytest.raises(DamagedStateError, match=r"scheduler\.sqlite: damaged \(database disk image is malformed\); "
                                                r"move it and its -wal/-shm files aside"):
        PlacementStore(tmp_path)
    assert path.read_bytes() == before  # the failed migration was rolled back
