"""GPU processes attributed to workloads through the real /proc: a co-tenant's name cannot blind the NVML source."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from sits_observe.collectors.nvml import NvmlSource
from sits_observe.collectors.nvml_fake import FakeNvml
from sits_observe.frame import GPU_FIELD_INDEX, Frame
from sits_observe.probes.config import WorkloadConfig
from sits_observe.probes.workloads import WorkloadTracker

NAMED = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, bytes.fromhex(sys.argv[1]), 0, 0, 0); "
         "print(1, flush=True); time.sleep(600)")
ODD = b"\xffbad"  # a co-tenant's name that is not UTF-8


@pytest.fixture
def named() -> Iterator[dict[bytes, int]]:
    """Processes named (``/proc/PID/comm``, set with prctl PR_SET_NAME) a serving engine and a co-tenant whose name
    is not UTF-8, as any unprivileged process may name itself: name -> pid."""
    procs = {name: subprocess.Popen([sys.executable, "-c", NAMED, name.hex()], stdout=subprocess.PIPE)
             for name in (b"engine", ODD)}
    for proc in procs.values():
        assert proc.stdout is not None and proc.stdout.readline()
    yield {name: proc.pid for name, proc in procs.items()}
    for proc in procs.values():
        proc.kill()
        proc.wait()


def test_a_co_tenant_whose_name_is_not_utf8_blinds_no_gpu(named: dict[bytes, int], fake: FakeNvml) -> None:
    """Its comm read as text raised UnicodeDecodeError through the attribution: the NVML sample failed, and every
    GPU lost its values."""
    with open(f"/proc/{named[ODD]}/comm", "rb") as f:
        assert f.read() == ODD + b"\n"
    fake.gpus[0].processes = [(named[b"engine"], 1 << 30)]
    fake.gpus[3].processes = [(named[ODD], 1 << 30)]
    tracker = WorkloadTracker([WorkloadConfig(name="chat", comm="engine"), WorkloadConfig(name="odd", comm="bad")])
    src = NvmlSource(fake, resolve_workload=tracker.workload_of, timeout=5.0)
    frame = Frame(0.0, 1.0)
    src.collect(frame)
    values = frame.gpu.values
    assert list(values[:, GPU_FIELD_INDEX["utilization_ratio"]]) == pytest.approx([0.73] * 8)
    assert values[0, GPU_FIELD_INDEX["serving_utilization_ratio"]] == pytest.approx(0.73)
    assert np.isnan(values[3, GPU_FIELD_INDEX["serving_utilization_ratio"]])  # "\ufffdbad" is not "bad": no workload
    memory = {(s.labels[0][1], s.labels[4][1]): s.value for s in frame.samples
              if s.name == "sits_gpu_process_memory_used_bytes"}
    assert memory == {("0", "chat"): float(1 << 30), ("3", "other"): float(1 << 30)}
    assert set(tracker.scan().items()) >= {(named[b"engine"], 1)}
