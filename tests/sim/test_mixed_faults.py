"""Done-when: under ``--scenario mixed`` every injected fault visibly moves what its mechanism touches.

The ``mixed`` run and a ``quiet`` run with the same seed replay the same arrivals in lockstep; each fault's
window (its last eight minutes, after the GPUs have had time to heat up or queues to build) is read from
each run's SeriesStore and compared: direction and rough size, never the injector's own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from sits_observe.config import SimConfig
from sits_observe.frame import REQUEST_STAGES
from sits_observe.sim.faults import CAUSES
from sits_observe.sim.host import SimulatedHost
from sits_observe.store.series import SeriesStore

from sim_helpers import T0, run_until

SETTLE = 120  # seconds after onset left out of the window
GIB = 2**30
DEVICE = ("launch", "h2d", "d2h", "sync", "collective", "alloc", "runq")


@dataclass
class Window:
    """One run's view of a fault's window, read from its store."""

    store: SeriesStore
    last: int

    def q(self, p: float, stage: str) -> float:
        return self.store.quantile(p, stage, "chat", last=self.last)

    def mean(self, stage: str) -> float:
        counts = self.store.hist_window(stage, "chat", last=self.last).sum()
        return float(self.store.hist_sum_window(stage, "chat", last=self.last).sum() / counts)

    def gpu(self, field: str) -> np.ndarray:
        return self.store.gpu_window(field, self.last).mean(axis=0)

    def host(self, field: str) -> float:
        return float(np.nanmean(self.store.host_window(field, self.last)))

    def gauge(self, name: str) -> float:
        return float(self.store.workload_gauge_window(name, "chat", last=self.last).mean())

    def count(self, name: str) -> float:
        return float(self.store.counter_window(name, "chat", last=self.last).sum())


@pytest.fixture(scope="module")
def windows(layout) -> dict[str, tuple[Window, Window]]:
    """Per fault kind: (mixed run, quiet run) windows; each run ticks into a fresh store per fault."""
    fault = SimulatedHost(SimConfig(scenario="mixed"), layout)
    quiet = SimulatedHost(SimConfig(scenario="quiet"), layout)
    out = {}
    for spec in fault.scenario.faults:
        pair = []
        for sim in (fault, quiet):
            store = SeriesStore(layout, history=700)  # the 900 s since the previous fault ended, last 700 kept
            run_until(sim, store, spec.end)
            pair.append(Window(store, int(spec.duration - SETTLE)))
        out[spec.kind] = (pair[0], pair[1])
    assert [(r.kind, r.start - T0) for r in fault.fault_log()] == [(f.kind, f.onset) for f in fault.scenario.faults]
    assert quiet.fault_log() == [] and [r.kind for r in fault.active_faults()] == ["scheduler_stall"]
    return out


def test_every_class_is_in_mixed(windows):
    assert set(windows) == set(CAUSES)


def _unchanged(f: Window, q: Window, stages: tuple[str, ...], tol: float = 0.1) -> None:
    for stage in stages:
        assert f.mean(stage) == pytest.approx(q.mean(stage), rel=tol), stage


def test_gpu_compute_saturation(windows):
    f, q = windows["gpu_compute_saturation"]  # a co-tenant holds SMs on GPUs 0-1 (shard chat-0)
    assert (f.gpu("utilization_ratio")[:2] >= 0.99).all()
    foreign = f.gpu("foreign_utilization_ratio")  # NVML's per-process samples name the co-tenant
    assert (foreign[:2] > 0.5).all() and (foreign[2:] == 0).all() and (q.gpu("foreign_utilization_ratio") == 0).all()
    assert f.gpu("temperature_celsius")[0] > q.gpu("temperature_celsius")[0] + 3  # more power drawn
    for stage in ("prefill", "decode", "sync"):
        assert f.mean(stage) > 1.2 * q.mean(stage), stage  # slower iterations, longer syncs
    assert f.q(0.9, "e2e") > 1.3 * q.q(0.9, "e2e")
    _unchanged(f, q, ("launch", "h2d", "runq"))


def test_gpu_memory_pressure(windows):
    f, q = windows["gpu_memory_pressure"]  # a foreign allocation on GPUs 2-3 (chat-1) shrinks its KV cache
    used, total = f.gpu("memory_used_bytes"), f.gpu("memory_total_bytes")
    assert (used[2:4] > q.gpu("memory_used_bytes")[2:4] + 3 * GIB).all()
    assert (used[2:4] > 0.94 * total[2:4]).all()
    assert f.count("preemptions_total") >= 10 and q.count("preemptions_total") == 0
    assert f.q(0.9, "queue") > 5 * q.q(0.9, "queue")
    assert f.gauge("queue_depth") > q.gauge("queue_depth") + 5
    assert f.mean("alloc") > 4 * q.mean("alloc")  # allocator retries, each slower
    _unchanged(f, q, ("launch", "h2d", "runq"))


def test_interconnect_contention(windows):
    f, q = windows["interconnect_contention"]  # foreign traffic takes 85 % of GPU 4-5's links (chat-2)
    assert f.q(0.9, "collective") > 3 * q.q(0.9, "collective")
    assert f.mean("h2d") > 10 * q.mean("h2d") and f.mean("d2h") > 10 * q.mean("d2h")
    assert (f.gpu("nvlink_tx_bytes_per_second")[4:6] > 300e9).all()  # saturated, against a few GB/s
    assert (q.gpu("nvlink_tx_bytes_per_second")[4:6] < 20e9).all()
    assert (f.gpu("pcie_rx_bytes_per_second")[4:6] > 30e9).all()
    assert f.mean("decode") > 1.1 * q.mean("decode")  # the TP pair's all-reduces sit on the decode path
    _unchanged(f, q, ("launch", "runq"))


def test_cpu_contention(windows):
    f, q = windows["cpu_contention"]  # NUMA node 0's cores busy: chat-0 and chat-1 lose their CPUs
    assert f.q(0.99, "runq") > 50 * q.q(0.99, "runq")
    assert f.q(0.99, "launch") > 10 * q.q(0.99, "launch")
    assert f.host("cpu_utilization_ratio") > q.host("cpu_utilization_ratio") + 0.25
    assert (f.gpu("utilization_ratio")[:4] < q.gpu("utilization_ratio")[:4] - 0.1).all()  # GPUs starve
    assert f.mean("decode") > 1.15 * q.mean("decode")
    assert f.mean("sync") < q.mean("sync")  # the GPU finishes before the host has issued the next step
    _unchanged(f, q, ("h2d", "collective"))


def test_network_ingress(windows):
    f, q = windows["network_ingress"]  # NIC queueing and losses; the GPUs are fine
    assert f.q(0.5, "ingress") > 4 * q.q(0.5, "ingress")
    assert f.q(0.5, "egress") > 4 * q.q(0.5, "egress")
    added = (f.mean("ingress") - q.mean("ingress")) + (f.mean("egress") - q.mean("egress"))
    assert added > 0.05
    assert f.mean("e2e") - q.mean("e2e") > 0.5 * added  # the requests' end-to-end time carries it
    assert np.abs(f.gpu("utilization_ratio") - q.gpu("utilization_ratio")).max() < 0.03
    _unchanged(f, q, ("prefill", "decode") + DEVICE)


def test_thermal_throttling(windows):
    f, q = windows["thermal_throttling"]  # failed cooling on GPUs 0-1 (chat-0)
    assert (f.gpu("temperature_celsius")[:2] > 85).all() and (q.gpu("temperature_celsius")[:2] < 75).all()
    reasons = f.store.gpu_window("throttle_reasons", f.last).astype(np.int64)
    hw_thermal = (reasons & 0x40) != 0
    assert hw_thermal[:, :2].mean() > 0.9 and not hw_thermal[:, 2:].any()
    assert (f.gpu("sm_clock_hertz")[:2] < 0.8 * q.gpu("sm_clock_hertz")[:2]).all()
    assert (f.gpu("power_watts")[:2] < 0.7 * q.gpu("power_watts")[:2]).all()
    assert f.mean("prefill") > 1.08 * q.mean("prefill") and f.mean("decode") > 1.1 * q.mean("decode")
    _unchanged(f, q, ("launch", "h2d", "runq"))


def test_scheduler_stall(windows):
    f, q = windows["scheduler_stall"]  # chat-2's serving loop freezes for 2 s of every 4
    assert f.q(0.9, "queue") > 3 * q.q(0.9, "queue")
    assert f.gauge("queue_depth") > q.gauge("queue_depth")
    assert (f.gpu("utilization_ratio")[4:6] < q.gpu("utilization_ratio")[4:6] - 0.3).all()
    # the frozen shard's GPUs sit idle with its serving process on them and requests waiting
    idle = f.store.gpu_window("serving_utilization_ratio", f.last)[:, 4:6] < 0.05
    assert idle.mean() > 0.25 and f.store.gpu_window("serving_utilization_ratio", f.last)[:, :4].min() > 0.5
    # ... which the backlog field tells from a replica with nothing to do: its replica has work
    backlog = f.store.gpu_window("backlog_utilization_ratio", f.last)
    assert (np.nan_to_num(backlog[:, 4:6], nan=1.0) < 0.05).mean() > 0.25 and np.nanmin(backlog[:, :4]) > 0.5
    healthy = q.store.gpu_window("backlog_utilization_ratio", q.last)[:, :6]
    assert np.nanmin(healthy) > 0.5 and (~np.isnan(healthy)).mean() > 0.9  # busy wherever there is work
    assert f.mean("decode") > 1.2 * q.mean("decode")
    _unchanged(f, q, ("launch", "h2d", "runq"))


def test_only_a_co_tenant_shows_as_foreign_gpu_use(windows):
    for kind, (f, _) in windows.items():
        if kind != "gpu_compute_saturation":
            assert (f.gpu("foreign_utilization_ratio") == 0).all(), kind


def test_request_stages_all_present(windows):
    f, _ = windows["network_ingress"]
    for stage in REQUEST_STAGES:
        assert f.store.hist_window(stage, "chat", last=f.last).sum() > 100, stage
