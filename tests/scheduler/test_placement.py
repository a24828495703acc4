"""Placement scoring on the simulator topologies, table-driven."""

from __future__ import annotations

import numpy as np
import pytest

from sits_observe.scheduler.config import STRATEGIES
from sits_observe.scheduler.placement import GpuLoad, Planner, Request
from sits_observe.topology import LinkKind, preset

GiB = 2**30
FAST = {LinkKind.NVLINK, LinkKind.NVSWITCH}


def load(n: int = 8, util: dict[int, float] | None = None, reserved_gib: dict[int, float] | None = None,
         ineligible: tuple[int, ...] = ()) -> GpuLoad:
    u, r, e = np.zeros(n), np.zeros(n), np.ones(n, dtype=bool)
    for g, v in (util or {}).items():
        u[g] = v
    for g, v in (reserved_gib or {}).items():
        r[g] = v * GiB
    e[list(ineligible)] = False
    return GpuLoad(u, r, np.zeros(n), e)


def nvlink_pair(topo_name: str, gpus: tuple[int, ...]) -> bool:
    t = preset(topo_name)
    return len(gpus) == 2 and t.link(*gpus).kind in FAST


def one_numa(topo_name: str, gpus: tuple[int, ...]) -> bool:
    t = preset(topo_name)
    return len({t.gpus[g].numa_node for g in gpus}) == 1


CASES = [
    # (id, topology, request, load, check on the chosen set)
    ("nvswitch tp2 on a fast pair", "nvswitch-8", Request(2, 20 * GiB, comm=1.0), load(), nvlink_pair),
    ("pcie tp2 on an nvlink bridge", "pcie-8", Request(2, 20 * GiB, comm=1.0), load(), nvlink_pair),
    ("pcie tp2 avoids a busy bridge", "pcie-8", Request(2, 20 * GiB, comm=1.0), load(util={0: 0.9, 1: 0.9}),
     lambda t, g: nvlink_pair(t, g) and not {0, 1} & set(g)),
    ("pcie tp4 within one numa node", "pcie-8", Request(4, 20 * GiB, comm=0.8), load(), one_numa),
    ("pcie tp4 on the free numa node", "pcie-8", Request(4, 20 * GiB, comm=0.8), load(reserved_gib={1: 70}),
     lambda t, g: set(g) == {4, 5, 6, 7}),
    ("pcie tp4 on its own numa node", "pcie-8", Request(4, 20 * GiB, comm=0.8, numa=1), load(),
     lambda t, g: set(g) == {4, 5, 6, 7}),
    ("pcie tp4 spans nodes only when it must", "pcie-8", Request(4, 20 * GiB, comm=0.8),
     load(reserved_gib={0: 70, 1: 70, 4: 70, 5: 70}), lambda t, g: set(g) == {2, 3, 6, 7}),
    ("nvswitch tp4 within one numa node", "nvswitch-8", Request(4, 20 * GiB, comm=0.8), load(), one_numa),
    ("memory: never where it does not fit", "pcie-8", Request(2, 40 * GiB, comm=1.0),
     load(reserved_gib={0: 50, 2: 41, 4: 45, 6: 60}), lambda t, g: not {0, 2, 4, 6} & set(g)),
    ("memory: migrating GPUs are not candidates", "nvswitch-8", Request(1, 10 * GiB), load(ineligible=(0, 1, 2)),
     lambda t, g: g[0] >= 3),
    ("excluded culprit GPUs are not candidates", "pcie-8", Request(2, 10 * GiB, comm=1.0, exclude=frozenset({2})),
     load(), lambda t, g: 2 not in g and nvlink_pair(t, g)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_placement_table(case: tuple) -> None:
    _, topo_name, req, gpu_load, check = case
    res = Planner(preset(topo_name), STRATEGIES["topology-aware"]).place(req, gpu_load)
    assert res.best is not None, res.reason
    assert len(res.best.gpus) == req.k
    assert check(topo_name, res.best.gpus), res.best
    assert res.method == "exact"
    assert res.candidates[0] == res.best and all(set(c.terms) == {"comm", "memory", "load", "balance", "numa"}
                                                 for c in res.candidates)


def test_fits_nowhere_says_why() -> None:
    res = Planner(preset("pcie-8"), STRATEGIES["topology-aware"]).place(
        Request(4, 50 * GiB), load(reserved_gib={g: 40 for g in range(5)}))
    assert res.best is None
    assert res.reason == ("needs 4 GPUs with 50.0 GiB free each; 3 of 8 qualify (healthy, not migrating, "
                          "not excluded, memory fits)")


@pytest.mark.parametrize(("strategy", "expect_gpu0"), [("pack", True), ("spread", False)])
def test_strategies_pack_and_spread(strategy: str, expect_gpu0: bool) -> None:
    res = Planner(preset("nvswitch-8"), STRATEGIES[strategy]).place(
        Request(1, 30 * GiB), load(util={0: 0.3}, reserved_gib={0: 40}))
    assert (res.best.gpus == (0,)) is expect_gpu0


@pytest.mark.parametrize("k", [3, 4, 5])
def test_greedy_matches_exhaustive_on_a_fabric(k: int) -> None:
    topo = preset("fabric-4x8")
    rng = np.random.default_rng(k)
    planner = Planner(topo, STRATEGIES["topology-aware"], exact_limit=1)
    for _ in range(3):
        gl = GpuLoad(rng.random(topo.n) * 0.9, rng.choice([0, 20, 40], topo.n) * GiB, np.zeros(topo.n),
                     rng.random(topo.n) > 0.1)
        req = Request(k, 30 * GiB, comm=0.7, load=0.2)
        greedy, exact = planner.place(req, gl), planner.place(req, gl, method="exact")
        assert greedy.method == "greedy" and exact.method == "exact"
        assert greedy.best.score >= exact.best.score - 0.02, (greedy.best, exact.best)
        assert len({topo.gpus[g].node for g in greedy.best.gpus}) == 1  # never across the network


def test_a_gpu_whose_memory_was_not_read_is_no_candidate() -> None:
    from sits_observe.scheduler.view import gpu_load

    load = gpu_load({}, np.full(4, 0.5), np.array([75.0, 75.0, 75.0, np.nan]) * GiB, np.ones(4, dtype=bool))
    assert load.eligible.tolist() == [True, True, True, False]  # unread memory: not "empty"
    util = np.array([0.9, np.nan, np.nan, np.nan])  # utilization never read (MIG): still candidates
    load = gpu_load({}, util, np.full(4, 10.0) * GiB, np.ones(4, dtype=bool))
    assert load.eligible.tolist() == [True, True, True, True]
