"""Placement state machine on the SQLite store: compare-and-swap, illegal transitions, lost races."""

from __future__ import annotations

from pathlib import Path

import pytest

from sits_observe.errors import SchedulerError
from sits_observe.scheduler.config import ShardSpec
from sits_observe.scheduler.states import TRANSITIONS, NotFound, State
from sits_observe.scheduler.store import PlacementStore


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
