"""NvmlSource against the fake NVML: every field, per-link and per-process samples, every error path."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pynvml
import pytest
from topologies import fixture

import sits_observe.collectors as collectors_pkg
from sits_observe.collectors.nvml import NvmlSource, nvml_status
from sits_observe.collectors.nvml_fake import FAKE_CALLS, FakeNvml
from sits_observe.collectors.sources import build_sources
from sits_observe.config import parse
from sits_observe.errors import CollectorError
from sits_observe.frame import GPU_FIELD_INDEX, GPU_FIELDS, BucketLayout, Frame


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _frame(src: NvmlSource) -> Frame:
    frame = Frame(ts=0.0, interval=1.0)
    src.collect(frame)
    return frame


def _value(frame: Frame, gpu: int, name: str) -> float:
    return float(frame.gpu.values[gpu, GPU_FIELD_INDEX[name]])


def _samples(frame: Frame, name: str, gpu: int) -> dict[tuple[tuple[str, str], ...], float]:
    """Extra labels (beyond the GPU's) -> value for one sample name and GPU."""
    return {s.labels[4:]: s.value for s in frame.samples if s.name == name and s.labels[0] == ("gpu", str(gpu))}


NEED_WORKLOADS = ("serving_utilization_ratio", "foreign_utilization_ratio")
NEED_SERVERS = ("backlog_utilization_ratio",)  # a configured server joined to the GPU's processes
# field -> expected value for the fake's default script (FakeGpu defaults), in base units
EXPECTED = {
    "utilization_ratio": 0.73,
    "memory_utilization_ratio": 0.41,
    "memory_used_bytes": 20 * 1024**3,
    "memory_total_bytes": 85520809984,
    "sm_clock_hertz": 1980e6,
    "memory_clock_hertz": 2619e6,
    "power_watts": 512.345,
    "temperature_celsius": 61.0,
    "throttle_reasons": 0x4 | 0x20,
    "pcie_rx_bytes_per_second": 2000 * 1024.0,
    "pcie_tx_bytes_per_second": 3000 * 1024.0,
    "nvlink_rx_bytes_total": 0.0,
    "nvlink_tx_bytes_total": 0.0,
    "xid_errors_total": 0.0,
    "ecc_corrected_errors_total": 5.0,
    "ecc_uncorrected_errors_total": 1.0,
    "retired_pages": 3.0,
}


def test_every_field_on_first_sample(fake: FakeNvml) -> None:
    src = NvmlSource(fake, clock=Clock())
    frame = _frame(src)
    assert [g.uuid for g in frame.gpu.info] == [g.uuid for g in fixture("h100-sxm8").gpus]
    assert frame.gpu.info[3].pci_bus_id == "00000000:5D:00.0"
    assert frame.gpu.info[0].model == "NVIDIA H100 80GB HBM3"
    assert frame.gpu.healthy.all() and not frame.errors
    for gpu in range(8):
        for name, want in EXPECTED.items():
            assert _value(frame, gpu, name) == pytest.approx(want), name
    # rates need two samples: NaN (unknown), not zero, on the first
    assert np.isnan(_value(frame, 0, "nvlink_rx_bytes_per_second"))
    assert set(EXPECTED) | {"nvlink_rx_bytes_per_second", "nvlink_tx_bytes_per_second"} | set(NEED_WORKLOADS) | set(
        NEED_SERVERS) == {f.name for f in GPU_FIELDS}
    # without configured workloads no process is ours, so neither field can be told; without servers no backlog
    assert all(np.isnan(_value(frame, 0, name)) for name in NEED_WORKLOADS + NEED_SERVERS)
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 0


def test_nvlink_links_counters_and_rates(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock, sample_interval=5.0)
    _frame(src)
    g0 = fake.gpus[0]
    for k, link in enumerate(g0.links):
        link.rx_kib += 1000 * (k + 1)
        link.tx_kib += 500
    g0.links[3].up = False
    clock.t += 5.0
    frame = _frame(src)
    up = _samples(frame, "sits_gpu_nvlink_link_up", 0)
    assert len(up) == 18 and up[(("link", "3"),)] == 0.0 and up[(("link", "0"),)] == 1.0
    rx = _samples(frame, "sits_gpu_nvlink_link_rx_bytes_total", 0)
    assert rx[(("link", "17"),)] == 18000 * 1024.0
    total_rx = 1000 * 1024.0 * sum(range(1, 19))
    assert _value(frame, 0, "nvlink_rx_bytes_total") == total_rx
    assert _value(frame, 0, "nvlink_tx_bytes_total") == 18 * 500 * 1024.0
    assert _value(frame, 0, "nvlink_rx_bytes_per_second") == pytest.approx(total_rx / 5.0)
    assert _value(frame, 1, "nvlink_rx_bytes_per_second") == 0.0
    # a link whose counter went back (driver reload) counts its new value, as rate() does: never negative
    g0.links[0].rx_kib = 100
    clock.t += 5.0
    assert _value(_frame(src), 0, "nvlink_rx_bytes_per_second") == pytest.approx(100 * 1024.0 / 5.0)


def test_a_link_whose_counters_fail_keeps_its_last_value(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock, sample_interval=5.0)
    g0, gib = fake.gpus[0], 1024.0**3
    for link in fake.gpus[1].links:  # GPU 1: no link ever read
        link.counter_error = pynvml.NVML_ERROR_UNKNOWN
    totals, rates = [], []
    for failing in ((), (), (0,), (), tuple(range(18))):
        for k, link in enumerate(g0.links):  # 1 GiB per link per sample, from a large base
            link.rx_kib = 10**9 + len(totals) * 1024**2
            link.counter_error = pynvml.NVML_ERROR_UNKNOWN if k in failing else None
        frame = _frame(src)
        totals.append(_value(frame, 0, "nvlink_rx_bytes_total"))
        rates.append(_value(frame, 0, "nvlink_rx_bytes_per_second"))
        clock.t += 5.0
    assert totals == sorted(totals)  # never down: no counter reset for Prometheus
    base = 18 * 10**9 * 1024.0
    assert totals[2] == base + 17 * 2 * gib + 1 * gib  # link 0 at its last good value
    assert totals[3] == totals[4] == base + 18 * 3 * gib
    assert np.isnan(rates[0]) and rates[1] == pytest.approx(18 * gib / 5)
    assert rates[2] == pytest.approx(17 * gib / 5)  # the links read in both samples
    assert rates[3] == pytest.approx(17 * gib / 5 + 2 * gib / 10)  # link 0: 2 GiB since its read 10 s ago
    assert np.isnan(rates[4])  # no link read: unknown, not 0
    assert np.isnan(_value(frame, 1, "nvlink_rx_bytes_total"))
    assert np.isnan(_value(frame, 1, "nvlink_rx_bytes_per_second"))


def test_nvlink_total_grows_by_traffic_only(fake: FakeNvml) -> None:
    """A link first read late (it failed at start) added its lifetime bytes to the GPU's total, and a link whose
    counter went down made the total drop, which Prometheus takes for a reset of the whole counter: both showed
    as terabytes per second in rate()."""
    clock = Clock()
    src = NvmlSource(fake, clock=clock, sample_interval=5.0)
    links, gib = fake.gpus[0].links, 1024.0**3
    for link in links:
        link.rx_kib = 10**10  # about 9.3 TiB each since the driver loaded
    links[3].counter_error = pynvml.NVML_ERROR_UNKNOWN
    totals = [_value(_frame(src), 0, "nvlink_rx_bytes_total")]
    links[3].counter_error = None
    for step in range(2):
        for k, link in enumerate(links):
            link.rx_kib = 100 if (k, step) == (5, 1) else link.rx_kib + 1024**2  # link 5's counter reset at step 1
        clock.t += 5.0
        frame = _frame(src)
        totals.append(_value(frame, 0, "nvlink_rx_bytes_total"))
    assert totals[1] - totals[0] == 17 * gib  # link 3's first read adds nothing: no traffic seen
    assert totals[2] - totals[1] == 17 * gib + 100 * 1024.0  # link 5 counts its new value, as rate() does
    assert _value(frame, 0, "nvlink_rx_bytes_per_second") == pytest.approx((17 * gib + 100 * 1024.0) / 5)


def test_no_nvlink_on_pcie_boards_leaves_fields_empty() -> None:
    fake = FakeNvml(fixture("pcie-8"))
    for g in fake.gpus[2:4]:
        g.links = []
    frame = _frame(NvmlSource(fake, clock=Clock()))
    assert len(_samples(frame, "sits_gpu_nvlink_link_up", 0)) == 12
    assert _samples(frame, "sits_gpu_nvlink_link_up", 2) == {}
    assert np.isnan(_value(frame, 2, "nvlink_rx_bytes_total")) and not frame.errors


def _but_xid(row: np.ndarray) -> np.ndarray:
    """A lost GPU's row without its XID count, which is kept: it says why the GPU was lost."""
    return np.delete(row, GPU_FIELD_INDEX["xid_errors_total"])


def test_an_xid_of_a_gpu_that_fell_off_the_bus_is_kept_and_shown(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    _frame(src)
    fake.gpus[2].lost = True  # XID 79: the GPU fell off the bus; every call on it answers GPU_IS_LOST
    fake.push_xid(2, 79)
    fake.push_xid(5, 31)  # and another GPU's event behind it is drained too
    clock.t += 5
    frame = _frame(src)
    assert not frame.gpu.healthy[2] and _value(frame, 2, "xid_errors_total") == 1
    assert _samples(frame, "sits_gpu_last_xid", 2) == {(): 79.0}
    assert _value(frame, 5, "xid_errors_total") == 1 and "XID events" not in frame.errors.get("nvml", "")


def test_xid_events_are_counted_without_blocking(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    fake.push_xid(2, 79)
    fake.push_xid(2, 48)
    fake.push_xid(5, 31)
    frame = _frame(src)
    assert _value(frame, 2, "xid_errors_total") == 2 and _value(frame, 5, "xid_errors_total") == 1
    assert _value(frame, 0, "xid_errors_total") == 0
    assert _samples(frame, "sits_gpu_last_xid", 2) == {(): 48.0}
    assert _samples(frame, "sits_gpu_last_xid", 0) == {}
    clock.t += 5
    assert _value(_frame(src), 2, "xid_errors_total") == 2  # cumulative


def test_xid_wait_is_called_with_zero_timeout(fake: FakeNvml) -> None:
    src = NvmlSource(fake, clock=Clock())
    fake.log = []
    src.sample(1.0)
    timeouts = {args[1] for name, args in fake.log if name == "nvmlEventSetWait_v2"}
    assert timeouts == {0}


def test_gpu_without_xid_events_has_no_xid_field(fake: FakeNvml) -> None:
    fake.gpus[4].fail["nvmlDeviceRegisterEvents"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    frame = _frame(NvmlSource(fake, clock=Clock()))
    assert np.isnan(_value(frame, 4, "xid_errors_total")) and _value(frame, 3, "xid_errors_total") == 0


def test_process_memory_by_workload_never_by_pid(fake: FakeNvml) -> None:
    fake.gpus[0].processes = [(4242, 10 << 30), (4243, 2 << 30), (999, 1 << 30), (1000, 3 << 30), (77, None)]
    fake.gpus[1].processes = [(999, 5 << 30)]
    names = {4242: "chat", 4243: "chat", 1000: "batch"}
    frame = _frame(NvmlSource(fake, clock=Clock(), resolve_workload=names.get))
    assert _samples(frame, "sits_gpu_process_memory_used_bytes", 0) == {
        (("workload", "batch"),): float(3 << 30), (("workload", "chat"),): float(12 << 30),
        (("workload", "other"),): float(1 << 30)}
    assert _samples(frame, "sits_gpu_process_memory_used_bytes", 1) == {(("workload", "other"),): float(5 << 30)}
    assert not any(k == "pid" for s in frame.samples for k, _ in s.labels)


NOW = 1_700_000_000.0  # the wall clock the source reads; NVML stamps per-process samples with it (us)
T = int(NOW * 1e6)


def test_serving_and_foreign_utilization_from_per_process_samples(fake: FakeNvml) -> None:
    names = {4242: "chat", 4243: "chat"}
    fake.gpus[0].processes = [(4242, 10 << 30), (77, 1 << 30)]  # ours and a co-tenant
    # one sample per process and read, each stamped on its own; pid 99 has exited; 250 % is a driver glitch
    fake.gpus[0].process_util = [(4242, T - 1_200, 60), (77, T - 1_000, 30), (99, T - 900, 100), (77, T - 800, 250)]
    fake.gpus[1].processes = [(4243, None)]  # ours, memory not reported: still serving
    fake.gpus[1].process_util = [(4243, T - 500, 50), (77, T - 400, 90)]  # pid 77 is not on this GPU
    fake.gpus[2].processes = [(77, 1 << 30)]  # only a foreign process, no samples in the interval
    fake.gpus[2].process_util = [(77, T - 6_000_000, 100)]  # older than the 5 s read interval
    fake.gpus[3].processes = [(5, 1 << 30), (6, 1 << 30)]  # two busy foreign processes: capped by utilization
    fake.gpus[3].process_util = [(5, T - 300, 50), (5, T - 200, 40), (6, T - 100, 80)]
    fake.gpus[5].processes = [(4242, 1 << 30), (77, 1 << 30)]
    fake.gpus[5].process_util = [(77, T + 2_000_000, 100)]  # stamped in the future: the clock stepped back
    wall = [NOW]
    src = NvmlSource(fake, clock=Clock(), resolve_workload=names.get, wall_clock=lambda: wall[0])
    frame = _frame(src)
    assert _value(frame, 0, "foreign_utilization_ratio") == pytest.approx(0.30)
    assert _value(frame, 0, "serving_utilization_ratio") == pytest.approx(0.73)
    assert _value(frame, 1, "serving_utilization_ratio") == pytest.approx(0.73)
    assert _value(frame, 1, "foreign_utilization_ratio") == 0.0
    assert np.isnan(_value(frame, 2, "serving_utilization_ratio"))  # a spare GPU: nobody serves there
    assert _value(frame, 2, "foreign_utilization_ratio") == 0.0  # NVML: no sample in the interval
    assert _value(frame, 3, "foreign_utilization_ratio") == pytest.approx(0.73)  # (45 + 80) % capped at 73 %
    assert _value(frame, 5, "foreign_utilization_ratio") == 0.0
    assert not frame.errors


def test_each_read_asks_for_the_last_interval_only(fake: FakeNvml) -> None:
    fake.gpus[0].processes = [(4242, 1 << 30), (77, 1 << 30)]
    fake.gpus[0].process_util = [(77, T - 1_000, 40)]
    clock, wall = Clock(), [NOW]
    src = NvmlSource(fake, clock=clock, resolve_workload={4242: "chat"}.get, wall_clock=lambda: wall[0])
    fake.log = []
    assert _value(_frame(src), 0, "foreign_utilization_ratio") == pytest.approx(0.40)
    assert ("nvmlDeviceGetProcessUtilization", (SimpleNamespace(index=0), T - 5_000_000)) in fake.log
    clock.t += 5
    wall[0] += 5  # the co-tenant stopped: its last sample is now older than the interval
    assert _value(_frame(src), 0, "foreign_utilization_ratio") == 0.0


@pytest.mark.parametrize("code,reported", [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, False),  # e.g. MIG: omitted quietly, not asked again for a while
    (pynvml.NVML_ERROR_UNKNOWN, True),  # a failure: reported in frame.errors
])
def test_no_per_process_samples_means_neither_field(fake: FakeNvml, code: int, reported: bool) -> None:
    fake.gpus[4].processes = [(4242, 1 << 30)]
    fake.gpus[5].processes = [(4242, 1 << 30)]
    fake.gpus[4].fail["nvmlDeviceGetProcessUtilization"] = code
    clock = Clock()
    src = NvmlSource(fake, clock=clock, resolve_workload={4242: "chat"}.get)
    frame = _frame(src)
    # both or neither, as the classifier was trained: serving alone would be an input it never saw
    assert np.isnan(_value(frame, 4, "serving_utilization_ratio"))
    assert np.isnan(_value(frame, 4, "foreign_utilization_ratio"))
    assert _value(frame, 5, "serving_utilization_ratio") == pytest.approx(0.73)
    assert _samples(frame, "sits_gpu_process_memory_used_bytes", 4) == {(("workload", "chat"),): float(1 << 30)}
    assert bool(frame.errors) == reported and frame.gpu.healthy.all()
    fake.log = []
    clock.t += 5
    _frame(src)
    asked = {args[0].index for name, args in fake.log if name == "nvmlDeviceGetProcessUtilization"}
    assert (4 in asked) == reported  # unsupported: not asked again; a failure: asked again


def test_a_process_starting_between_pynvmls_two_calls_is_retried(fake: FakeNvml) -> None:
    fake.gpus[0].processes = [(4242, 1 << 30), (77, 1 << 30)]
    fake.gpus[0].process_util = [(77, T - 1_000, 40)]
    fake.gpus[0].fail_once["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    frame = _frame(NvmlSource(fake, clock=Clock(), resolve_workload={4242: "chat"}.get, wall_clock=lambda: NOW))
    assert _value(frame, 0, "foreign_utilization_ratio") == pytest.approx(0.40) and not frame.errors


def test_zero_samples_answer_of_pynvml_is_no_kernel_ran(fake: FakeNvml) -> None:
    fake.gpus[0].processes = [(4242, 1 << 30)]
    fake.gpus[0].fail["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_SUCCESS  # what pynvml raises for none
    frame = _frame(NvmlSource(fake, clock=Clock(), resolve_workload={4242: "chat"}.get))
    assert _value(frame, 0, "foreign_utilization_ratio") == 0.0 and not frame.errors


def test_gpu_lost_while_reading_process_samples_leaves_the_others(fake: FakeNvml) -> None:
    for g in fake.gpus:
        g.processes = [(4242, 1 << 30)]
    fake.gpus[2].fail["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_ERROR_GPU_IS_LOST
    frame = _frame(NvmlSource(fake, clock=Clock(), resolve_workload={4242: "chat"}.get))
    assert not frame.gpu.healthy[2] and np.isnan(_but_xid(frame.gpu.values[2])).all()
    assert frame.gpu.healthy[[0, 1, 3]].all() and _value(frame, 3, "serving_utilization_ratio") == pytest.approx(0.73)
    assert "GPU 2" in frame.errors["nvml"]


def test_no_gpu_process_of_any_workload_omits_both_fields_and_says_why(fake: FakeNvml,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    for g in fake.gpus:  # e.g. the daemon in another PID namespace: NVML's pids resolve to nothing
        g.processes = [(31337, 1 << 30)]
        g.process_util = [(31337, T - 1_000, 70)]
    clock = Clock()
    src = NvmlSource(fake, clock=clock, resolve_workload={4242: "chat"}.get, wall_clock=lambda: NOW)

    def sample() -> Frame:
        clock.t += 5
        return _frame(src)

    with caplog.at_level(logging.INFO):
        frames = [sample() for _ in range(4)]
        for f in frames:
            assert np.isnan(f.gpu.values[:, GPU_FIELD_INDEX["foreign_utilization_ratio"]]).all()
            assert np.isnan(f.gpu.values[:, GPU_FIELD_INDEX["serving_utilization_ratio"]]).all()
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "PID namespace" in warnings[0].message  # after 3 samples, once
        fake.gpus[0].processes.append((4242, 1 << 30))  # the serving engine is seen: both fields come back
        back = sample()
        assert _value(back, 0, "serving_utilization_ratio") == pytest.approx(0.73)
        assert _value(back, 1, "foreign_utilization_ratio") == pytest.approx(0.70)
        assert any("found again" in r.message for r in caplog.records)
        fake.gpus[0].processes.pop()
        for _ in range(3):
            sample()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2  # warned again after a gap
    # the memory metric still reports them, as "other"
    assert _samples(frames[0], "sits_gpu_process_memory_used_bytes", 0) == {(("workload", "other"),): float(1 << 30)}


def test_remapped_rows_samples(fake: FakeNvml) -> None:
    frame = _frame(NvmlSource(fake, clock=Clock()))
    assert _samples(frame, "sits_gpu_remapped_rows", 6) == {(("kind", "correctable"),): 2.0,
                                                            (("kind", "uncorrectable"),): 1.0}


@pytest.mark.parametrize("call,fields", [
    ("nvmlDeviceGetPowerUsage", ["power_watts"]),
    ("nvmlDeviceGetUtilizationRates", ["utilization_ratio", "memory_utilization_ratio"]),
    ("nvmlDeviceGetMemoryInfo", ["memory_used_bytes", "memory_total_bytes"]),
    ("nvmlDeviceGetClockInfo", ["sm_clock_hertz", "memory_clock_hertz"]),
    ("nvmlDeviceGetTemperature", ["temperature_celsius"]),
    ("nvmlDeviceGetPcieThroughput", ["pcie_rx_bytes_per_second", "pcie_tx_bytes_per_second"]),
    ("nvmlDeviceGetTotalEccErrors", ["ecc_corrected_errors_total", "ecc_uncorrected_errors_total"]),
    ("nvmlDeviceGetRetiredPages", ["retired_pages"]),
    ("nvmlDeviceGetFieldValues", ["nvlink_rx_bytes_total", "nvlink_tx_bytes_total"]),
    ("nvmlDeviceGetCurrentClocksEventReasons", ["throttle_reasons"]),
])
def test_unsupported_field_is_omitted_for_that_gpu_only(fake: FakeNvml, call: str, fields: list[str]) -> None:
    fake.gpus[1].fail[call] = pynvml.NVML_ERROR_NOT_SUPPORTED
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    frame = _frame(src)
    for name in fields:
        assert np.isnan(_value(frame, 1, name)), name
        assert not np.isnan(_value(frame, 0, name)), name
    assert frame.gpu.healthy.all() and not frame.errors
    fake.log = []
    clock.t += 5
    _frame(src)
    asked = {args[0].index for name, args in fake.log if name == call}
    assert asked == {0, 2, 3, 4, 5, 6, 7}  # GPU 1 is not asked again (for SKIP_RECHECK_S)


def test_an_unsupported_field_is_asked_again_after_a_while(fake: FakeNvml) -> None:
    from sits_observe.collectors.nvml import SKIP_RECHECK_S

    fake.gpus[1].fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED  # MIG on
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    assert np.isnan(_value(_frame(src), 1, "utilization_ratio"))
    del fake.gpus[1].fail["nvmlDeviceGetUtilizationRates"]  # MIG turned off, the GPU reset
    clock.t += 5
    assert np.isnan(_value(_frame(src), 1, "utilization_ratio"))  # not asked yet
    clock.t += SKIP_RECHECK_S
    assert not np.isnan(_value(_frame(src), 1, "utilization_ratio"))  # asked again: it is back


def test_a_gpu_that_needs_a_reset_is_unhealthy(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    _frame(src)
    fake.gpus[2].fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_RESET_REQUIRED
    clock.t += 5
    frame = _frame(src)
    assert list(frame.gpu.healthy) == [True, True, False, True, True, True, True, True]
    assert "GPU 2" in frame.errors["nvml"] and "GPU needs a reset" in frame.errors["nvml"]


def test_old_driver_without_clock_event_reasons_uses_throttle_reasons(fake: FakeNvml) -> None:
    for g in fake.gpus:
        g.fail["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    frame = _frame(NvmlSource(fake, clock=Clock()))
    assert _value(frame, 0, "throttle_reasons") == 0x24 and fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 8


def test_failing_call_is_reported_and_logged_once(fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    fake.gpus[2].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    with caplog.at_level(logging.WARNING, logger="sits_observe.collectors.nvml"):
        frame = _frame(src)
        clock.t += 5
        again = _frame(src)
    assert np.isnan(_value(frame, 2, "temperature_celsius")) and _value(frame, 2, "power_watts") > 0
    assert "GPU 2: temperature: Unknown Error" in frame.errors["nvml"]
    assert "GPU 2: temperature" in again.errors["nvml"]
    assert len([r for r in caplog.records if "temperature" in r.getMessage()]) == 1
    assert frame.gpu.healthy.all()


def test_lost_gpu_is_unhealthy_and_reported_while_others_go_on(fake: FakeNvml,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock)
    _frame(src)
    fake.gpus[3].lost = True
    clock.t += 5
    with caplog.at_level(logging.WARNING, logger="sits_observe.collectors.nvml"):
        frame = _frame(src)
        clock.t += 5
        _frame(src)
    assert list(frame.gpu.healthy) == [True, True, True, False, True, True, True, True]
    assert np.isnan(_but_xid(frame.gpu.values[3])).all() and _value(frame, 3, "xid_errors_total") == 0
    assert _value(frame, 4, "power_watts") == pytest.approx(512.345)
    assert fake.gpus[3].uuid in frame.errors["nvml"] and "lost" in frame.errors["nvml"]
    assert _samples(frame, "sits_gpu_nvlink_link_up", 3) == {} and len(_samples(frame, "sits_gpu_nvlink_link_up", 4)) == 18
    assert len([r for r in caplog.records if "lost" in r.getMessage()]) == 1
    fake.gpus[3].lost = False  # reset by the operator
    clock.t += 5
    back = _frame(src)
    assert back.gpu.healthy.all() and "nvml" not in back.errors


def test_gpu_lost_before_start_is_reported_and_others_run(fake: FakeNvml) -> None:
    fake.gpus[6].lost = True
    frame = _frame(NvmlSource(fake, clock=Clock()))
    assert not frame.gpu.healthy[6] and frame.gpu.healthy[:6].all() and frame.gpu.healthy[7]
    assert "GPU 6" in frame.errors["nvml"]
    assert _value(frame, 7, "utilization_ratio") == pytest.approx(0.73)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_INSUFFICIENT_POWER, pynvml.NVML_ERROR_IRQ_ISSUE,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_a_gpu_that_cannot_be_opened_at_start_leaves_the_others_running(fake: FakeNvml, code: int) -> None:
    fake.gpus[5].fail["nvmlDeviceGetUUID"] = code
    fake.gpus[2].fail["nvmlDeviceGetNvLinkState"] = pynvml.NVML_ERROR_UNKNOWN
    frame = _frame(NvmlSource(fake, clock=Clock()))  # the whole source used to be dropped
    assert not frame.gpu.healthy[5] and frame.gpu.healthy[:5].all() and frame.gpu.healthy[6:].all()
    assert frame.errors["nvml"] == "GPU 5 could not be opened at start; unhealthy until a restart"
    assert _value(frame, 2, "utilization_ratio") == pytest.approx(0.73)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_means_source_off_with_one_line(code: int) -> None:
    fake = FakeNvml(fixture("nvswitch-8"), init_error=code)
    with pytest.raises(CollectorError) as err:
        NvmlSource(fake)
    msg = str(err.value)
    assert "\n" not in msg and "NVML GPU metrics are off" in msg and "gpu.backend" in msg
    ok, reason = nvml_status(fake)
    assert not ok and reason == msg


def test_real_pynvml_on_this_gpu_less_machine() -> None:
    ok, reason = nvml_status()
    assert not ok and "NVIDIA driver not available" in reason


def test_nvml_status_names_the_gpus(fake: FakeNvml) -> None:
    assert nvml_status(fake) == (True, "NVML driver 550.90.07: 8 GPU(s): 8 x NVIDIA H100 80GB HBM3")
    assert fake.initialised == 0


def test_nvml_status_names_a_lost_gpu_and_lists_the_others(fake: FakeNvml) -> None:
    """One GPU off the bus made `doctor` say the driver's GPUs 'cannot be listed' (and advise installing the
    driver), naming none of the seven that work and not which one failed."""
    fake.gpus[5].lost = True
    assert nvml_status(fake) == (True, "NVML driver 550.90.07: 8 GPU(s): 7 x NVIDIA H100 80GB HBM3; "
                                       "GPU 5 cannot be opened: GPU is lost")
    assert fake.initialised == 0


def test_sample_interval_reuses_the_last_sample(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock, sample_interval=5.0)
    first = _frame(src)
    asked = fake.calls["nvmlDeviceGetPowerUsage"]
    fake.gpus[0].power_mw = 100_000
    for dt in (1.0, 2.0, 4.9):
        clock.t = 100.0 + dt
        frame = _frame(src)
        assert _value(frame, 0, "power_watts") == pytest.approx(512.345)
        assert len(frame.samples) == len(first.samples)
    assert fake.calls["nvmlDeviceGetPowerUsage"] == asked
    clock.t = 105.0
    assert _value(_frame(src), 0, "power_watts") == pytest.approx(100.0)
    frame.gpu.values[:] = 0  # a consumer writing into its frame does not change the kept sample
    clock.t = 106.0
    assert _value(_frame(src), 0, "power_watts") == pytest.approx(100.0)


def test_close_shuts_nvml_down(fake: FakeNvml) -> None:
    src = NvmlSource(fake)
    src.close()
    assert fake.initialised == 0 and fake.calls["nvmlEventSetFree"] == 1


def test_backend_nvml_without_driver_leaves_nvml_out_and_runs_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse({"gpu": {"backend": "nvml"},
                 "servers": [{"kind": "vllm", "url": "http://127.0.0.1:1/metrics", "workload": "chat"}]}, env={})
    with caplog.at_level(logging.WARNING):
        sources = build_sources(cfg, BucketLayout(cfg.store.snapped()))  # the real pynvml: no driver here
    assert [s.name for s in sources] == ["host", "vllm:chat"]
    lines = [r.getMessage() for r in caplog.records if "nvml" in r.getMessage()]
    assert len(lines) == 1 and "NVIDIA driver not available" in lines[0]


def test_backend_nvml_with_a_driver_and_dcgm(fake: FakeNvml) -> None:
    cfg = parse({"gpu": {"backend": "nvml", "sample_interval": 2}}, env={})
    host, src = build_sources(cfg, BucketLayout(cfg.store.snapped()), nvml=fake)
    assert host.name == "host" and src.name == "nvml" and src.sample_interval == 2
    cfg = parse({"gpu": {"backend": "dcgm", "dcgm_url": "http://127.0.0.1:9400/metrics"}}, env={})
    host, src = build_sources(cfg, BucketLayout(cfg.store.snapped()))
    assert host.name == "host" and src.name == "dcgm" and src.url == "http://127.0.0.1:9400/metrics"


def _nvml_calls_in_package() -> set[str]:
    """``nv.nvmlX`` / ``nvml.nvmlX`` attributes and "nvmlX" names in tables, over sits_observe/collectors (the
    stand-in itself left out: it names every call it implements)."""
    names = set()
    for path in Path(collectors_pkg.__file__).parent.glob("*.py"):
        if path.name == "nvml_fake.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("nv", "nvml"):
                names.add(node.attr)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "nvml":
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"nvml[A-Z]\w+", node.value):
                names.add(node.value)
    return {n for n in names if n.startswith("nvml") and not n.startswith("nvmlEventType")}


def test_fake_implements_exactly_the_calls_the_collectors_make() -> None:
    used = _nvml_calls_in_package()
    assert used == set(FAKE_CALLS)
    assert all(callable(getattr(pynvml, name)) for name in used)


def test_only_the_bench_imports_the_stand_in(tmp_path: Path) -> None:
    """It ships in the package for ``bench collectors``; the daemon reads the real pynvml: building one with the nvml
    backend (no driver here: NVML down, the daemon runs on) loads no stand-in, nor does the command line."""
    pkg = Path(collectors_pkg.__file__).parents[1]
    importers = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py") if "nvml_fake" in p.read_text()}
    assert importers == {"collectors/bench.py"}
    code = ("import sys; from sits_observe.cli import main; from sits_observe.config import parse; "
            f"from sits_observe.wiring import build_daemon; d = build_daemon(parse({{'state_dir': {str(tmp_path)!r}, "
            "'gpu': {'backend': 'nvml'}, 'rca': {'enabled': False}}, env={})); d.tick(); d.close(); "
            "import json; print(json.dumps(sorted(m for m in sys.modules if 'nvml' in m)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert "pynvml" in loaded and "sits_observe.collectors.nvml" in loaded, loaded  # the real path was taken
    assert "sits_observe.collectors.nvml_fake" not in loaded, loaded
