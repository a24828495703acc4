"""ReplicaBoard: a server's backlog joined to GPU processes through a real listening process tree."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from sits_observe.collectors.bench import SERVING_PROCESS
from sits_observe.collectors.nvml import NvmlSource
from sits_observe.collectors.nvml_fake import FakeNvml
from sits_observe.collectors.replicas import ReplicaBoard, listening_ports, namespace_listeners, parent_pid
from sits_observe.collectors.servers import ServerSource
from sits_observe.collectors.sources import build_sources
from sits_observe.config import parse
from sits_observe.frame import GPU_FIELD_INDEX, BucketLayout, Frame


@pytest.fixture
def server() -> Iterator[SimpleNamespace]:
    """A process listening on a port with two children, as vLLM's API server starts its GPU workers."""
    proc = subprocess.Popen([sys.executable, "-c", SERVING_PROCESS], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port, *workers = map(int, proc.stdout.readline().split())
    yield SimpleNamespace(proc=proc, pid=proc.pid, port=port, worker=workers[0], url=f"http://127.0.0.1:{port}/metrics")
    subprocess.run(["kill", *map(str, workers)], check=False)
    proc.kill()
    proc.wait()


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_procfs_reads_the_listening_port_and_the_parent(server: SimpleNamespace) -> None:
    listeners = namespace_listeners(server.worker, {server.port, 1})  # the namespace's: the worker's too
    assert set(listeners.values()) == {server.port} and namespace_listeners(server.pid, {1}) == {}
    assert listening_ports(server.pid, listeners) == {server.port}
    assert listening_ports(server.worker, listeners) == set()  # the worker holds no listening socket
    assert parent_pid(server.worker) == server.pid


def test_a_worker_under_the_server_is_joined_to_its_backlog(server: SimpleNamespace) -> None:
    board = ReplicaBoard()
    assert board.register("vllm-0", server.url) and board
    assert board.has_work([server.worker]) is None  # no page read yet: the backlog is unknown
    board.publish("vllm-0", 3.0)
    assert board.servers_of(server.worker) == {"vllm-0"} == board.servers_of(server.pid)
    assert board.has_work([server.worker]) is True
    board.publish("vllm-0", 0.0)
    assert board.has_work([server.worker]) is False
    board.publish("vllm-0", None)  # the page could not be read this tick
    assert board.has_work([server.worker]) is None
    assert board.has_work([]) is None
    assert board.register("vllm-0 model=b", server.url)  # a second model on the same server (Triton)
    board.publish("vllm-0", 0.0)
    board.publish("vllm-0 model=b", 2.0)
    assert board.servers_of(server.worker) == {"vllm-0", "vllm-0 model=b"} and board.has_work([server.worker])


def test_processes_outside_the_server_and_other_hosts_join_nothing(server: SimpleNamespace) -> None:
    board = ReplicaBoard()
    assert not board.register("remote", f"http://10.1.2.3:{server.port}/metrics")  # same port, another host
    assert not board.register("bad", "http://127.0.0.1:99999/metrics")  # no such port: not joined, no error
    assert not board
    board.publish("remote", 5.0)
    assert board.has_work([server.worker]) is None
    assert board.register("vllm-0", server.url)
    board.publish("vllm-0", 5.0)
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a co-tenant
    try:
        assert board.servers_of(outsider.pid) == frozenset() and board.has_work([outsider.pid]) is None
        assert board.has_work([outsider.pid, server.worker]) is True  # a GPU shared with the replica
    finally:
        outsider.kill()
        outsider.wait()
    assert board.servers_of(2**22 + 7) == frozenset()  # no such process


def test_lookups_are_cached_until_refresh_and_a_worker_whose_server_died_leaves(server: SimpleNamespace) -> None:
    clock = Clock()
    board = ReplicaBoard(refresh=60.0, clock=clock)
    board.register("vllm-0", server.url)
    board.publish("vllm-0", 1.0)
    assert board.has_work([server.worker]) is True
    server.proc.kill()  # the API server is gone; its worker lives on, orphaned
    server.proc.wait()
    clock.t = 30.0
    assert board.servers_of(server.worker) == {"vllm-0"}  # cached
    clock.t = 61.0
    assert board.servers_of(server.worker) == frozenset()  # looked up again: no listener above it


PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
"""


def test_nvml_source_reports_utilization_of_gpus_whose_replica_has_work(server: SimpleNamespace,
                                                                         fake: FakeNvml) -> None:
    cfg = parse({"gpu": {"backend": "nvml"}, "servers": [
        {"kind": "vllm", "url": server.url, "workload": "chat"},
        {"kind": "vllm", "url": "http://127.0.0.1:1/metrics", "workload": "chat"}]}, env={})
    clock = Clock()
    sources = build_sources(cfg, BucketLayout(cfg.store.snapped()), nvml=fake, clock=clock)
    # servers first; two replicas of one workload: each its own health and error count
    assert [s.name for s in sources] == ["host", "vllm:chat#0", "vllm:chat#1", "nvml"]
    replica, other, nvml = sources[1], sources[2], sources[3]
    assert isinstance(replica, ServerSource) and isinstance(nvml, NvmlSource)
    fake.gpus[0].processes = [(server.worker, 10 << 30)]
    fake.gpus[1].processes = [(server.worker, 10 << 30)]
    fake.gpus[2].processes = [(1, 1 << 30)]  # not under any configured server

    def tick(running: int, waiting: int) -> np.ndarray:
        frame = Frame(ts=0.0, interval=1.0)
        replica.read(PAGE.format(running=running, waiting=waiting), frame)
        other.read(PAGE.format(running=2, waiting=0), frame)
        nvml.collect(frame)
        return frame.gpu.values[:, GPU_FIELD_INDEX["backlog_utilization_ratio"]]

    assert np.isnan(tick(0, 0)).all()  # nothing to do: the GPUs' idleness says nothing
    assert np.isnan(tick(0, 1)).all()  # work now, but the utilization was sampled while there was none
    clock.t = 5.0
    first = tick(0, 1)  # a new sample
    assert first[:2] == pytest.approx([0.73, 0.73]) and np.isnan(first[2:]).all()
    assert np.isnan(tick(0, 0)).all()
    assert tick(4, 0)[:2] == pytest.approx([0.73, 0.73])  # the same NVML sample, this tick's page
    frame = Frame(ts=0.0, interval=1.0)
    replica.read(PAGE.format(running=3, waiting=1), frame)
    other.read(PAGE.format(running=2, waiting=5), frame)
    assert frame.workload_gauges[("running_requests", "chat")] == 5.0  # replicas of one workload add up
    assert frame.workload_gauges[("queue_depth", "chat")] == 6.0


LATE_SERVER = """
import socket, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import ctypes, sys, time; "
                           "ctypes.CDLL(None).prctl(15, bytes.fromhex(sys.argv[1]), 0, 0, 0); "
                           "print(1, flush=True); time.sleep(600)", sys.argv[1]], stdout=subprocess.PIPE)
worker.stdout.readline()  # named
s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], worker.pid, flush=True)
sys.stdin.readline()  # listen only when told, as vLLM's API server after its workers hold their GPUs
s.listen()
print("listening", flush=True)
time.sleep(600)
"""


@pytest.fixture
def late_server(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    """An API server whose worker, named ``request.param`` (bytes, set with prctl), runs before it listens."""
    proc = subprocess.Popen([sys.executable, "-c", LATE_SERVER, request.param.hex()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    port, worker = map(int, proc.stdout.readline().split())

    def listen() -> None:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "listening"

    yield SimpleNamespace(pid=proc.pid, worker=worker, url=f"http://127.0.0.1:{port}/metrics", listen=listen)
    subprocess.run(["kill", str(worker)], check=False)
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("late_server", [b"worker"], indirect=True)
def test_a_worker_looked_up_before_its_server_listens_is_joined_at_the_retry(late_server: SimpleNamespace) -> None:
    """The namespace's sockets were cached for ``refresh`` (60 s) whatever the 10 s retry of the pid."""
    clock = Clock()
    board = ReplicaBoard(refresh=60.0, clock=clock)
    board.register("vllm-0", late_server.url)
    assert board.servers_of(late_server.worker) == frozenset()
    late_server.listen()
    clock.t = 5.0
    assert board.servers_of(late_server.worker) == frozenset()  # not yet asked again
    clock.t = 10.0
    assert board.servers_of(late_server.worker) == {"vllm-0"}


@pytest.mark.parametrize("late_server", [b"\xff) bad"], indirect=True)
def test_a_worker_whose_name_is_not_utf8_is_joined(late_server: SimpleNamespace) -> None:
    """Reading its /proc/PID/stat as text raised UnicodeDecodeError: the worker joined no server."""
    late_server.listen()
    assert parent_pid(late_server.worker) == late_server.pid
    board = ReplicaBoard()
    board.register("vllm-0", late_server.url)
    assert board.servers_of(late_server.worker) == {"vllm-0"}
