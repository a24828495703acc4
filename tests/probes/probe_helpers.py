"""Helpers for the probe tests: build stubs, drive workload processes, drain a source into a Frame."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sits_observe.config import parse
from sits_observe.frame import BucketLayout, Frame
from sits_observe.probes import specs
from sits_observe.probes.source import ProbeSource

HERE = Path(__file__).resolve().parent
STUB_C = HERE / "stub_libs.c"
WORKLOAD = HERE / "probe_workload.py"
OFF = {"enabled": False}
DEFAULT_LAYOUT = BucketLayout(parse({}).store.snapped())


def build_stub(src: Path, out: Path, define: str) -> Path:
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-D{define}", "-o", str(out), str(src)], check=True)
    return out


def make_source(data: dict[str, Any]) -> tuple[ProbeSource, BucketLayout]:
    cfg = parse(data)
    layout = BucketLayout(cfg.store.snapped())
    return ProbeSource(cfg, layout), layout


@contextmanager
def fallback(*names: str, optional: tuple[str, ...] = ()) -> Iterator[None]:
    """Load the named probes with only ``optional`` of their optional kernel features (none: as on
    kernels before 5.11)."""
    saved = {n: specs.SPECS[n] for n in names}
    try:
        for n in names:
            specs.SPECS[n] = dataclasses.replace(saved[n], optional=optional)
        yield
    finally:
        specs.SPECS.update(saved)


def drain(source: ProbeSource) -> Frame:
    frame = Frame(ts=0.0, interval=1.0)
    source.collect(frame)
    return frame


class Workload:
    """A probe_workload.py process; always use as a context manager.

    ``cpu`` pins it to one CPU; ``realtime`` makes it SCHED_FIFO so that no other task on a busy machine
    delays its wake-ups (its sleeps then last what they ask for, give or take timer slack).
    """

    def __init__(self, comm: str, libs: Sequence[Path] = (), cpu: int | None = None,
                 realtime: bool = False) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WORKLOAD), comm, *map(str, libs)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if cpu is not None:
            os.sched_setaffinity(self.proc.pid, {cpu})
        if realtime:
            os.sched_setscheduler(self.proc.pid, os.SCHED_FIFO, os.sched_param(1))
        self.expect("ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, want: str) -> str:
        line = self.proc.stdout.readline().strip()
        assert line == want, f"workload said {line!r}, wanted {want!r}"
        return line

    def send(self, *cmd: Any) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def run(self, *cmd: Any) -> None:
        self.send(*cmd)
        self.expect("ok")

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def hist_counts(frame: Frame, stage: str, workload: str, n: int) -> np.ndarray:
    h = frame.hists.get((stage, workload))
    return np.zeros(n, np.uint64) if h is None else h.counts


class KernelUprobe(NamedTuple):
    fd: int
    kind: str  # "uprobe" or "uretprobe"
    file: str  # the path it was attached through
    offset: int


_FD_TYPES = {4: "uprobe", 5: "uretprobe"}  # enum bpf_task_fd_type


def kernel_uprobes(file: str | Path) -> list[KernelUprobe]:
    """The uprobes this process holds open on a file attached through a path ending in ``file``, as the kernel
    reports them: its perf event fds (/proc/self/fd) asked with BPF_TASK_FD_QUERY, as ``bpftool perf`` does."""
    libbpf = ctypes.CDLL("libbpf.so.1")  # bcc's own dependency
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") != "anon_inode:[perf_event]":
                continue
        except OSError:
            continue
        buf = ctypes.create_string_buffer(4096)
        buf_len, prog_id, fd_type = ctypes.c_uint32(len(buf)), ctypes.c_uint32(), ctypes.c_uint32()
        offset, addr = ctypes.c_uint64(), ctypes.c_uint64()
        if libbpf.bpf_task_fd_query(os.getpid(), int(name), 0, buf, ctypes.byref(buf_len), ctypes.byref(prog_id),
                                    ctypes.byref(fd_type), ctypes.byref(offset), ctypes.byref(addr)):
            continue
        path = buf.value.decode()
        if fd_type.value in _FD_TYPES and path.endswith(str(file)):
            out.append(KernelUprobe(int(name), _FD_TYPES[fd_type.value], path, offset.value))
    return sorted(out)
