"""syscalls probe: a loopback TCP server's ingress and egress counts equal the requests sent."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from probe_helpers import OFF, Workload, drain, fallback, make_source
from sits_observe.probes.source import ProbeSource

REQUESTS = 20


PATHS = {"raw_tracepoint": ("USE_RAW_TP", "HAVE_TASK_STORAGE"), "tracepoint": ("HAVE_TASK_STORAGE",),
         "tracepoint_lru_hash": ()}


@pytest.fixture(scope="module", params=sorted(PATHS))
def source(request: pytest.FixtureRequest) -> Iterator[ProbeSource]:
    """The syscalls probe on the syscalls:* tracepoints (the default), on raw_syscalls raw tracepoints
    (probes.syscalls.attach: raw_tracepoint), and with the pre-5.11 LRU hash for per-thread call state."""
    attach = "raw_tracepoint" if request.param == "raw_tracepoint" else "tracepoint"
    with fallback("syscalls", optional=PATHS[request.param]):
        src, _ = make_source({
            "workloads": [{"name": "server", "comm": "sits-t-server"}],
            "probes": {"runq": OFF, "block_io": OFF, "cuda": OFF, "nccl": OFF, "scan_interval": 3600,
                       "syscalls": {"attach": attach}},
        })
    assert src.states["syscalls"].attach == request.param.removesuffix("_lru_hash")
    yield src
    src.close()


def _request(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"ping\n")
        return c.recv(64)


def test_ingress_and_egress_count_each_request(source: ProbeSource) -> None:
    with Workload("sits-t-server") as server:
        source.rescan()
        drain(source)
        server.send("serve", REQUESTS)
        port = int(server.proc.stdout.readline())
        replies = [_request(port) for _ in range(REQUESTS)]
        server.expect("ok")
        frame = drain(source)
    assert replies == [b"pong\n"] * REQUESTS
    ingress, egress = frame.hists[("ingress", "server")], frame.hists[("egress", "server")]
    # half the requests use recv/send, half read/write on the fd: both paths count
    assert ingress.count == REQUESTS and egress.count == REQUESTS
    assert 0 < ingress.sum < 10 and 0 < egress.sum < 10
    assert set(frame.hists) == {("ingress", "server"), ("egress", "server")}


def test_untracked_server_and_client_are_not_counted(source: ProbeSource) -> None:
    with Workload("sits-t-other") as server:
        source.rescan()
        drain(source)
        server.send("serve", 3)
        port = int(server.proc.stdout.readline())
        for _ in range(3):
            _request(port)
        server.expect("ok")
        frame = drain(source)
    assert frame.hists == {}


def test_the_connections_of_a_process_that_exits_without_closing_them_are_forgotten(source: ProbeSource) -> None:
    """A killed server closes no fd through close(): its (tgid, fd) entries stayed, for a process that later
    reuses the tgid to find."""
    import time

    conns = source.states["syscalls"].program.bpf[b"conns"]
    with Workload("sits-t-server") as server:
        source.rescan()
        server.send("serve", 1)
        port = int(server.proc.stdout.readline())
        pid = server.pid
        with socket.create_connection(("127.0.0.1", port)):  # accepted, then nothing sent: the fd stays open
            deadline = time.monotonic() + 10
            while not any(k.tgid == pid for k in conns.keys()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert any(k.tgid == pid for k in conns.keys())
            server.proc.kill()
            server.proc.wait()
    source.rescan()  # the process is gone: so are its connections
    assert not any(k.tgid == pid for k in conns.keys())


def test_by_default_only_the_timed_syscalls_run_a_program() -> None:
    """On the raw tracepoints (the default before) every syscall of every process on the host ran two programs:
    a getppid(2) paid 173-187 ns there against 67-74 ns on the syscalls:* tracepoints (bench probes,
    other_syscall_added_ns), far more than the raw path saves on the few socket calls it times."""
    src, _ = make_source({"workloads": [{"name": "server", "comm": "sits-t-server"}],
                          "probes": {"runq": OFF, "block_io": OFF, "cuda": OFF, "nccl": OFF}})
    try:
        state = src.states["syscalls"]
        bpf = state.program.bpf
        assert state.attach == "tracepoint" and not bpf.raw_tracepoint_fds
        timed = {"accept", "accept4", "read", "recvfrom", "recvmsg", "write", "sendto", "sendmsg", "close"}
        assert {tp.decode().split(":")[1].split("_", 2)[2] for tp in bpf.tracepoint_fds} == timed
    finally:
        src.close()
