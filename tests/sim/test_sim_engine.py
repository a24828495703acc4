"""Continuous batching on one shard: timings, admission, preemption, stalls, timeouts."""

from __future__ import annotations

import numpy as np
import pytest

from sits_observe.sim.engine import Conditions, ShardEngine
from sits_observe.sim.perf import PerfModel

PERF = PerfModel("llama2-70b", "h100-80gb", 2)


def _engine(*requests: tuple[float, int, int]) -> ShardEngine:
    e = ShardEngine(PERF, 0.0)
    arr = np.array([r[0] for r in requests])
    e.enqueue(arr, np.zeros(len(arr)), np.array([r[1] for r in requests]), np.array([r[2] for r in requests]))
    return e


def _run(e: ShardEngine, cond: Conditions, seconds: int) -> dict[str, list[float] | int]:
    out: dict[str, list[float] | int] = {"queue": [], "prefill": [], "decode": [], "preemptions": 0, "errors": 0,
                                         "finished": 0}
    for t in range(1, seconds + 1):
        st = e.step(float(t), cond)
        for k in ("queue", "prefill", "decode"):
            out[k] += getattr(st, k)
        out["preemptions"] += st.preemptions
        out["errors"] += st.errors
        out["finished"] += len(st.finished_at)
        assert e.kv_used <= cond.kv_capacity
    return out


def test_one_request_takes_the_measured_prefill_and_decode_times():
    out = _run(_engine((0.5, 512, 101)), Conditions(kv_capacity=50_000), 10)
    assert out["queue"] == [0.0] and out["finished"] == 1
    assert out["prefill"][0] == pytest.approx(PERF.prefill_s(1, 512))
    assert out["decode"][0] == pytest.approx(100 * PERF.decode_s(1))


def test_arrivals_join_the_running_batch_and_slow_it():
    alone = _run(_engine((0.0, 256, 200)), Conditions(kv_capacity=50_000), 20)
    shared = _run(_engine(*[(0.0 + 0.01 * i, 256, 200) for i in range(16)]), Conditions(kv_capacity=50_000), 20)
    assert shared["finished"] == 16
    assert max(shared["queue"]) < 0.5  # admitted at the next iteration boundary, not after the others finish
    assert np.mean(shared["decode"]) > alone["decode"][0] * 1.05  # a batch of 16 decodes slower per token


def test_kv_pressure_preempts_and_recomputes_until_everyone_finishes():
    reqs = [(0.0, 1000, 400)] * 4
    roomy = _run(_engine(*reqs), Conditions(kv_capacity=10_000), 60)
    tight = _run(_engine(*reqs), Conditions(kv_capacity=3_300), 60)  # three prompts fit, not their growth
    assert roomy["preemptions"] == 0 and roomy["finished"] == 4
    assert tight["preemptions"] > 0 and tight["finished"] == 4 and tight["errors"] == 0
    assert len(tight["prefill"]) > 4  # recomputed prompts count as prefills again
    assert max(tight["queue"]) > max(roomy["queue"])


def test_prompt_larger_than_the_cache_is_an_error_and_old_waiters_time_out():
    out = _run(_engine((0.0, 5_000, 10)), Conditions(kv_capacity=4_000), 3)
    assert out["errors"] == 1 and out["finished"] == 0
    e = _engine(*[(0.0, 3_000, 1_000)] * 3)
    out = _run(e, Conditions(kv_capacity=4_000), 70)
    assert out["errors"] >= 1  # the third waited past the 60 s timeout behind the running ones


def test_scheduler_freezes_stop_iterations():
    reqs = [(0.0, 128, 2_000)] * 4
    free = _engine(*reqs)
    frozen = _engine(*reqs)
    a = free.step(20.0, Conditions(kv_capacity=50_000))
    b = frozen.step(20.0, Conditions(kv_capacity=50_000, stall=(0.0, 4.0, 2.0)))
    assert b.decode_iters == pytest.approx(a.decode_iters / 2, rel=0.1)


def test_slower_compute_and_host_bound_iterations():
    base = _engine((0.0, 128, 2_000)).step(10.0, Conditions(kv_capacity=50_000))
    slow = _engine((0.0, 128, 2_000)).step(10.0, Conditions(kv_capacity=50_000, decode_mult=2.0))
    host = _engine((0.0, 128, 2_000)).step(10.0, Conditions(kv_capacity=50_000, host_decode=0.1))
    assert slow.decode_iters == pytest.approx(base.decode_iters / 2, rel=0.05)
    assert host.decode_iters == pytest.approx(10 / 0.1, rel=0.05)
    assert host.decode_gpu_s < 0.5 * 10  # the GPU idles while the host issues work


def test_requests_on_the_network_are_not_waiting_at_the_server():
    e = ShardEngine(PERF, 0.0)
    # sent first (an earlier tick), the first request is still crossing the network when the second has arrived
    e.enqueue(np.array([0.0]), np.array([5.0]), np.array([128]), np.array([4_000]))
    e.enqueue(np.array([0.1]), np.array([0.4]), np.array([128]), np.array([4_000]))
    st = e.step(2.0, Conditions(kv_capacity=50_000))
    assert st.queue == [pytest.approx(0.0)]  # admitted on arrival: no head-of-line wait behind the slow one
    assert (len(e.inbound), len(e.waiting), len(e.running)) == (1, 0, 1)
    assert (e.backlog, e.outstanding) == (1, 2)
    e.step(6.0, Conditions(kv_capacity=50_000))
    assert (len(e.inbound), e.backlog) == (0, 2)


def test_queue_limit_counts_only_requests_that_reached_the_server():
    e = ShardEngine(PERF, 0.0, max_waiting=2)
    at = np.array([1.5, 1.6, 1.7, 9.0])  # the last one is still on the network when the queue fills
    e.enqueue(at - 0.1, np.full(4, 0.1), np.full(4, 128), np.full(4, 100))
    frozen = Conditions(kv_capacity=50_000, stall=(0.0, 100.0, 50.0))  # nothing is admitted
    st = e.step(2.0, frozen)
    assert st.errors == 1 and len(e.waiting) == 2 and len(e.inbound) == 1
