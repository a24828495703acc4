"""Timing tools of ``sits-observe bench probes``: traced C loops, program switches, BPF run time per event."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..histogram import NUM_BUCKETS, kernel_bucket
from .features import enable_bpf_stats, prog_run_stats

__all__ = ["Traced", "perf_variant", "tracepoints_switch", "uprobes_switch", "variant"]


class _BenchEvent(ctypes.Structure):
    """``struct bench_event`` of bpf/bench.h."""

    _fields_ = [("delta_ns", ctypes.c_uint64), ("stage", ctypes.c_uint32), ("tgid", ctypes.c_uint32)]


class Traced:
    """``n`` traced calls in a C loop, timed with a program switched off and on in turns."""

    def __init__(self, loop: Callable[[], int], n: int, rounds: int) -> None:
        self.loop, self.n, self.rounds = loop, n, rounds

    def best(self) -> float:
        return min(self.loop() for _ in range(self.rounds)) / self.n

    def added(self, on: Callable[[], None], off: Callable[[], None]) -> tuple[float, float]:
        """(baseline ns, ns added) per call: best of ``rounds`` interleaved runs each; leaves it on."""
        base, with_ = [], []
        for _ in range(self.rounds):
            off()
            base.append(self.loop())
            on()
            with_.append(self.loop())
        return min(base) / self.n, (min(with_) - min(base)) / self.n


def tracepoints_switch(bpf: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    """(on, off) for a program's auto-attached tracepoints and raw tracepoints."""
    tps, raws = list(bpf.tracepoint_fds), list(bpf.raw_tracepoint_fds)

    def on() -> None:
        for tp in tps:
            bpf.attach_tracepoint(tp=tp, fn_name=b"tracepoint__" + tp.replace(b":", b"__"))
        for raw in raws:
            bpf.attach_raw_tracepoint(tp=raw, fn_name=b"raw_tracepoint__" + raw)

    def off() -> None:
        for tp in tps:
            bpf.detach_tracepoint(tp)
        for raw in raws:
            bpf.detach_raw_tracepoint(raw)

    return on, off


def uprobes_switch(bpf: Any, lib_path: str, enter: bytes, ret: bytes
                    ) -> tuple[Callable[[], None], Callable[[], None]]:
    """(on, off) for an uprobe/uretprobe pair on sits_bench_call, attached now (like tracepoints at load)."""
    name, sym = lib_path.encode(), b"sits_bench_call"

    def on() -> None:
        bpf.attach_uprobe(name=name, sym=sym, fn_name=enter)
        bpf.attach_uretprobe(name=name, sym=sym, fn_name=ret)

    def off() -> None:
        bpf.detach_uprobe(name=name, sym=sym)
        bpf.detach_uretprobe(name=name, sym=sym)

    on()
    return on, off


def _bpf_run_ns(bpf: Any, traced: Traced) -> float:
    """BPF program run time per traced call, from the kernel's own counters (one run with stats on)."""
    fd = enable_bpf_stats()
    try:
        before = sum((prog_run_stats(f.fd) or (0, 0))[0] for f in bpf.funcs.values())
        traced.loop()
        after = sum((prog_run_stats(f.fd) or (0, 0))[0] for f in bpf.funcs.values())
    finally:
        os.close(fd)
    return (after - before) / traced.n


def perf_variant(bpf: Any, traced: Traced, base: float) -> dict[str, float]:
    """Run the traced loop once with the naive program, then drain its perf buffer and aggregate in
    Python as a user-space exporter would; each cost per event."""
    deltas: list[int] = []
    lost = [0]
    event = ctypes.POINTER(_BenchEvent)
    # the callbacks must not hold the table: bcc frees its perf readers when it drops the table
    bpf[b"bench_events"].open_perf_buffer(
        lambda cpu, data, size: deltas.append(ctypes.cast(data, event).contents.delta_ns),
        page_cnt=4096, lost_cb=lambda count: lost.__setitem__(0, lost[0] + count))
    kernel = traced.loop() / traced.n - base
    cpu0 = time.process_time()
    while len(deltas) + lost[0] < traced.n:
        before = len(deltas)
        bpf.perf_buffer_poll(timeout=200)
        if len(deltas) == before:
            break
    np.bincount(kernel_bucket(np.array(deltas, dtype=np.uint64)), minlength=NUM_BUCKETS)
    python = (time.process_time() - cpu0) * 1e9 / max(len(deltas), 1)
    bpf_ns = _bpf_run_ns(bpf, traced)
    return {"kernel_added_ns": round(kernel, 1), "bpf_run_ns_per_event": round(bpf_ns, 1),
            "python_ns_per_event": round(python, 1), "total_ns_per_event": round(kernel + python, 1),
            "received": len(deltas), "lost": lost[0]}


def variant(bpf: Any, traced: Traced, on: Callable[[], None], off: Callable[[], None]) -> tuple[float, float]:
    """(loop ns added, BPF run ns) per call with ``bpf``, which stays attached."""
    _, added = traced.added(on, off)
    return added, _bpf_run_ns(bpf, traced)
