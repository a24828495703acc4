"""An NVML call that hangs (a GPU off the bus, a wedged driver) holds the sample's thread, never the tick."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from in_thread import in_thread

from sits_observe.clock import WallClock
from sits_observe.collectors.background import Background
from sits_observe.collectors.host import HostSource
from sits_observe.collectors.nvml import NvmlSource
from sits_observe.collectors.nvml_fake import FakeNvml
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.errors import CollectorError, StillDown
from sits_observe.frame import GPU_FIELD_INDEX, Frame

POWER = GPU_FIELD_INDEX["power_watts"]
XID = GPU_FIELD_INDEX["xid_errors_total"]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def held(fake: FakeNvml) -> Iterator[threading.Event]:
    """GPU 3's power reading hangs until the event is set (set at the end, so no thread is left waiting)."""
    release = threading.Event()
    power = fake.nvmlDeviceGetPowerUsage

    def hanging(handle: object) -> int:
        if getattr(handle, "index", None) == 3:
            release.wait(30)
        return power(handle)

    fake.nvmlDeviceGetPowerUsage = hanging  # type: ignore[method-assign]
    yield release
    release.set()


def _collect(src: NvmlSource) -> tuple[Frame, object, float]:
    frame = Frame(ts=0.0, interval=1.0)
    raised, took = in_thread(lambda: src.collect(frame), 5)
    return frame, raised, took


def test_a_hung_call_fails_the_source_at_the_timeout_and_names_the_gpu(fake: FakeNvml, held: threading.Event) -> None:
    clock = Clock()
    fake.push_xid(3, 79)  # fell off the bus: read at the sample's start, before the call that hangs
    src = NvmlSource(fake, clock=clock, timeout=0.3, wall_clock=lambda: 1_764_600_000.0)
    frame, raised, took = _collect(src)  # before: held until the driver answered
    assert took < 2.0
    assert isinstance(raised, CollectorError)
    assert str(raised) == ("nvml: a call (GPU 3, power) has not returned since 14:40:00 UTC; GPU readings are "
                           "missing until it does (a GPU off the bus or a hung driver: check `nvidia-smi` and the "
                           "kernel log for Xid errors)")
    assert frame.gpu is not None and np.isnan(np.delete(frame.gpu.values, XID, axis=1)).all()
    assert list(frame.gpu.values[:, XID]) == [0, 0, 0, 1, 0, 0, 0, 0]  # the XID that explains it is kept
    assert [(s.labels[0], s.value) for s in frame.samples if s.name == "sits_gpu_last_xid"] == [(("gpu", "3"), 79)]
    assert list(frame.gpu.healthy) == [i != 3 for i in range(8)]
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 4  # GPUs 0-3, then the power call hung
    for _ in range(3):  # later ticks: no wait, the same message (logged once), and no second sample started
        clock.t += 10.0
        frame, again, took = _collect(src)
        assert str(again) == str(raised) and not frame.gpu.healthy[3]
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 4
    held.set()  # the driver answers: that sample is handed on, and the next one starts on time
    for _ in range(100):
        frame, ok, _took = _collect(src)
        if ok is None:
            break
    assert ok is None and frame.gpu.healthy.all()
    assert frame.gpu.values[3, POWER] == pytest.approx(512.345)
    clock.t += 10.0
    _collect(src)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 16  # the hung sample's 8, and the next one's


def test_a_slow_sample_of_quick_calls_blames_no_gpu(fake: FakeNvml) -> None:
    """8 GPUs whose process lists take 0.1 s each: the sample outlives a 0.3 s timeout with no call hung."""
    processes = fake.nvmlDeviceGetComputeRunningProcesses

    def slow(handle: object) -> list:
        time.sleep(0.1)
        return processes(handle)

    fake.nvmlDeviceGetComputeRunningProcesses = slow  # type: ignore[method-assign]
    src = NvmlSource(fake, clock=Clock(), timeout=0.3, wall_clock=lambda: 1_764_600_000.0)
    frame, raised, _took = _collect(src)
    assert isinstance(raised, CollectorError) and frame.gpu.healthy.all()
    assert re.fullmatch(r"nvml: the sample started at 14:40:00 UTC has not ended within gpu.nvml_timeout \(0.3 s\), "
                        r"no call hung so far \(now: GPU \d, processes\); GPU readings are missing until it ends",
                        str(raised)), str(raised)


def test_work_after_the_last_call_blames_no_gpu(fake: FakeNvml) -> None:
    """A slow workload lookup (reading /proc) after GPU 5's process call had returned was taken for that call
    still out: GPU 5 read unhealthy."""
    fake.gpus[5].processes = [(4242, 1 << 30)]

    def slow_lookup(pid: int) -> str:
        time.sleep(0.4)
        return "chat"

    src = NvmlSource(fake, clock=Clock(), timeout=0.3, resolve_workload=slow_lookup, wall_clock=lambda: 1_764_600_000.0)
    frame, raised, _took = _collect(src)
    assert str(raised).startswith("nvml: the sample started at 14:40:00 UTC has not ended within gpu.nvml_timeout "
                                  "(0.3 s), no call hung so far (now: between NVML calls)"), str(raised)
    assert frame.gpu.healthy.all()


def test_close_does_not_shut_nvml_down_under_a_hung_call(fake: FakeNvml, held: threading.Event) -> None:
    src = NvmlSource(fake, clock=Clock(), timeout=0.3)
    _collect(src)
    _none, took = in_thread(src.close, 5)  # waits its timeout for the call, then leaves NVML as it is
    assert took < 3.0 and fake.initialised == 1  # nvmlShutdown was not called under the call
    held.set()


def test_close_waits_for_a_sample_that_is_only_slow(fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    """A stop ends the tick's wait; the sample it leaves running is slow, not hung: close waited 1 s, said a call
    had not returned, and skipped nvmlShutdown."""
    power = fake.nvmlDeviceGetPowerUsage

    def slow(handle: object) -> int:
        time.sleep(0.2)  # 1.6 s for the 8 GPUs
        return power(handle)

    fake.nvmlDeviceGetPowerUsage = slow  # type: ignore[method-assign]
    src = NvmlSource(fake, clock=Clock(), timeout=4.0)
    src.prefetch()  # the tick started the sample; the stop came before it ended
    in_thread(src.close, 8)
    assert fake.initialised == 0 and not [r for r in caplog.records if "left without" in r.getMessage()]


def test_the_tick_goes_on_without_nvml_while_a_call_hangs(tmp_path: Path, fake: FakeNvml,
                                                         held: threading.Event) -> None:
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [NvmlSource(fake, timeout=0.3), HostSource()]
    try:
        for _ in range(3):
            frame, took = in_thread(daemon.tick, 5)
            assert isinstance(frame, Frame) and took < 2.0
            assert "GPU 3, power" in frame.errors["nvml"]
            assert frame.host["memory_total_bytes"] > 0  # the source after it was read
        assert daemon.health["nvml"].errors == 3
    finally:
        held.set()
        daemon.close()


def test_a_stop_ends_the_wait_for_a_hung_sample(tmp_path: Path, fake: FakeNvml, held: threading.Event) -> None:
    """SIGTERM in the first tick of a hang waited out gpu.nvml_timeout before the daemon could drain."""
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources += [NvmlSource(fake, timeout=5.0), HostSource()]
    threading.Timer(0.3, daemon.stop_event.set).start()
    try:
        _none, took = in_thread(daemon.run, 10)
        assert took < 1.5 and daemon.store.ticks == 1
        assert daemon.health["nvml"].errors == 0  # not counted as a failure: not waited for
    finally:
        held.set()
        daemon.close()


def test_a_sample_that_raises_fails_that_tick_and_the_next_samples_again(fake: FakeNvml) -> None:
    clock = Clock()
    src = NvmlSource(fake, clock=clock, timeout=1.0)
    fake.nvmlDeviceGetMemoryInfo = lambda handle: 1 / 0  # type: ignore[method-assign]
    frame, raised, _took = _collect(src)
    assert isinstance(raised, ZeroDivisionError)  # raised in the tick's thread, counted as the source's error
    del fake.nvmlDeviceGetMemoryInfo
    frame, raised, _took = _collect(src)
    assert raised is None and frame.gpu.values[0, GPU_FIELD_INDEX["memory_used_bytes"]] > 0


def test_one_call_at_a_time() -> None:
    calls = Background[int]("test")
    release = threading.Event()
    calls.start(lambda: int(release.wait(5)))
    with pytest.raises(RuntimeError, match="a call is still out"):
        calls.start(lambda: 2)
    assert not calls.wait(0.05)
    with pytest.raises(RuntimeError, match="no ended call to take"):
        calls.take()
    release.set()
    assert calls.wait(5) and calls.take() == 1 and not calls.busy
    release.clear()
    stop = threading.Event()
    calls.start(lambda: int(release.wait(5)))
    threading.Timer(0.1, stop.set).start()
    with pytest.raises(StillDown, match="test: not waited for: the daemon is stopping"):
        calls.wait(5, stop)
    release.set()
    assert calls.wait(5, stop) and calls.take() == 1  # ended: no stop to report


def test_a_driver_that_hangs_at_start_leaves_nvml_and_its_topology_out(
        fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU off the bus can hang NVML's start (init, listing the GPUs, the topology): the daemon's start hung with
    it, past systemd's start timeout, again at every restart."""
    from sits_observe import wiring
    from sits_observe.collectors import nvml_driver
    from sits_observe.collectors.sources import build_sources
    from sits_observe.frame import BucketLayout

    monkeypatch.setattr(nvml_driver, "START_TIMEOUT", 0.3)
    release = threading.Event()
    count, numa = fake.nvmlDeviceGetCount, fake.nvmlDeviceGetNumaNodeId
    fake.nvmlDeviceGetCount = lambda: (release.wait(30), count())[1]  # type: ignore[method-assign]
    cfg = parse({"gpu": {"backend": "nvml"}}, env={})
    try:
        sources, took = in_thread(lambda: build_sources(cfg, BucketLayout(cfg.store.snapped()), nvml=fake), 5)
        assert took < 2.0 and [s.name for s in sources] == ["host"]
        assert ("nvml: no answer from the NVIDIA driver within 0.3 s at start (a GPU off the bus or a hung driver: "
                "check `nvidia-smi` and the kernel log for Xid errors); off until a restart") in caplog.text
    finally:
        release.set()
    release.clear()
    fake.nvmlDeviceGetCount = count  # type: ignore[method-assign]
    src = NvmlSource(fake)
    fake.nvmlDeviceGetNumaNodeId = lambda h: (release.wait(30), numa(h))[1]  # type: ignore[method-assign]
    try:
        topology, took = in_thread(lambda: wiring._nvml_topology(src), 5)
        assert topology is None and took < 2.0
        assert "GPU topology unavailable: nvml topology: no answer from the NVIDIA driver" in caplog.text
    finally:
        release.set()
        src.close()
