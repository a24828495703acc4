"""One row that cannot be read back: slo.db's is skipped with a warning (monitoring goes on); scheduler.sqlite's stops
the start with exit 2 and the way out (a placement not seen would be placed anew, moving GPUs).  Never a traceback
and exit 1, which systemd would restart for ever."""

import logging
import os
import sqlite3
import subprocess
import sys

import pytest

from sits_observe.errors import DamagedStateError
from sits_observe.scheduler.config import ShardSpec
from sits_observe.scheduler.store import DB_NAME, PlacementStore
from sits_observe.slo.state import SloState


def _sql(path, *statements):
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()


def test_unreadable_slo_rows_are_skipped_each_with_one_warning(tmp_path, caplog):
    path = tmp_path / "slo.db"
    SloState(path, ["a", "b"], ["k", "k"], [10.0]).close()
    _sql(path, "INSERT INTO announced VALUES ('abc', 'not json')",
         "INSERT INTO tiers VALUES ('a', 'page', 'soon', NULL)", "INSERT INTO tiers VALUES ('b', 'page', 5.0, NULL)",
         "INSERT INTO notes VALUES ('a', '[1')", "INSERT INTO notes VALUES ('b', '{\"cause\": \"x\"}')",
         "INSERT INTO held VALUES ('a', '{\"page\": \"never\"}')", "INSERT INTO held VALUES ('b', '[\"page\"]')")
    state = SloState(path, ["a", "b"], ["k", "k"], [10.0])
    try:
        with caplog.at_level(logging.WARNING, "sits_observe.slo"):
            assert state.announced() == []
            assert state.tiers() == {"b": {"page": (5.0, None)}}
            assert state.notes() == {"b": {"cause": "x"}}
            assert state.held() == {"b": {"page": float("inf")}}
    finally:
        state.close()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 4, warned
    for table, key in (("announced", "abc"), ("tiers", "a/page"), ("notes", "a"), ("held", "a")):
        (line,) = [w for w in warned if f"table {table}: row {key} " in w]
        assert str(path) in line and "skipped" in line, line
    assert "never told it resolved" in warned[0]


@pytest.mark.parametrize("damage", ["UPDATE placements SET state='bogus'", "UPDATE placements SET gpus='[0,'",
                                    "UPDATE shards SET spec='{}'"])
def test_an_unreadable_scheduler_row_is_damage_naming_the_row_and_the_way_out(tmp_path, damage):
    store = PlacementStore(tmp_path)
    store.add_shard(ShardSpec(id="s0", gpus=2), 1.0)
    store.create("s0", "initial", 1.0)
    store.close()
    _sql(tmp_path / DB_NAME, damage)
    store = PlacementStore(tmp_path)
    try:
        with pytest.raises(DamagedStateError) as err:
            store.shards() if "shards" in damage else store.placements(live=True)
    finally:
        store.close()
    msg = str(err.value)
    table = "shards: shard s0" if "shards" in damage else "placements: placement 1 of shard s0"
    assert f"{tmp_path / DB_NAME}: damaged (table {table} cannot be read" in msg, msg
    assert f"mv {tmp_path / DB_NAME}* {tmp_path / 'damaged'}/" in msg and "\n" not in msg, msg
    assert err.value.exit_code == 2


def _demo(state, port):
    return subprocess.run([sys.executable, "-m", "sits_observe", "demo", "--scenario", "quiet", "--duration", "2",
                           "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "SITS_STATE_DIR": str(state)})


def test_the_daemon_starts_past_a_bad_slo_row_and_stops_with_exit_2_on_a_bad_placement(tmp_path, free_port):
    assert _demo(tmp_path, free_port()).returncode == 0  # the state files, with the simulator's placements
    _sql(tmp_path / "slo.db", "INSERT INTO announced VALUES ('abc', 'not json')")
    res = _demo(tmp_path, free_port())
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert f"SLO state {tmp_path / 'slo.db'}: table announced: row abc cannot be read back" in res.stderr, res.stderr

    _sql(tmp_path / DB_NAME, "UPDATE placements SET state='bogus'")
    res = _demo(tmp_path, free_port())
    errors = [line for line in res.stderr.splitlines() if line.startswith("sits-observe: error:")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(errors) == 1 and f"{tmp_path / DB_NAME}: damaged (table placements: placement 1 of shard" in errors[0]
    assert "aside" in errors[0], errors
