"""The SQLite state files' transactions (`sits_observe.statedb`) on a disk that fills mid-transaction."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest

from sits_observe.errors import SloError
from sits_observe.statedb import StateFile, transaction


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_transaction_the_full_disk_stopped_says_the_disk_is_full(tmp_path: Path) -> None:
    """SQLite rolls a transaction back itself when a statement fails for a full disk; the ROLLBACK after it then
    failed, and its "cannot rollback - no transaction is active" was the error shown, the full disk hidden."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        f = StateFile(disk / "slo.db", "SLO state", SloError)
        db = f.connect()
        _fill_and_go_on(f, db)
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _fill_and_go_on(f: StateFile, db: sqlite3.Connection) -> None:
    try:
        db.execute("CREATE TABLE t (v BLOB)")
        db.execute("PRAGMA cache_size=5")  # a small cache: the transaction spills to the WAL before its COMMIT
        with pytest.raises(SloError, match="database or disk is full") as raised:
            with transaction(db, threading.Lock(), f.error_of) as c:
                for _ in range(200):
                    c.execute("INSERT INTO t VALUES (?)", (os.urandom(4000),))
        assert "cannot rollback" not in str(raised.value) and not db.in_transaction
        with transaction(db, threading.Lock(), f.error_of) as c:  # and the connection goes on
            c.execute("INSERT INTO t VALUES (?)", (b"x",))
        assert db.execute("SELECT COUNT(*) FROM t").fetchone() == (1,)
    finally:
        db.close()  # else the tmpfs stays busy
