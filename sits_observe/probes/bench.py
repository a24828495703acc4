"""``sits-observe bench probes``: the cost the probes add per event, against baselines from the same run.

* tracepoint: zero-byte write(2)s on an accepted TCP socket (the ``syscalls`` probe times each as egress),
  on /dev/null (the look-up every other write on the host pays) and getppid(2)s (what any other syscall on
  the host pays), without and with the probe;
* uprobe: calls of an empty library function, without a probe, with an empty uprobe/uretprobe pair
  (the cost of the trap alone) and with the ``calls`` program the cuda/nccl probes load;
* naive variant of both: every event to user space through a perf buffer, aggregated in Python;
* drain: reading 16 stages x 64 workloads of kernel histograms into exported-layout deltas.
Each figure is the best of ``--rounds`` runs (interference from other tasks only ever adds time).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..argtypes import int_at_least
from ..config import parse
from ..errors import ProbeError
from ..frame import STAGES, BucketLayout, Frame
from ..histogram import SUB
from . import specs
from .bench_timing import Traced, perf_variant, tracepoints_switch, uprobes_switch, variant
from .features import environment_problem, tracepoint_exists
from .program import Program, attach_path, close_bpf, compile_bpf, compile_probe

__all__ = ["add_arguments", "run"]

TARGETS = {"tracepoint_added_ns_max": 100, "uprobe_to_empty_max": 1.3, "perf_to_inkernel_min": 5.0,
           "drain_ms_max": 5.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--writes", type=int_at_least(1, 10_000_000), default=100_000,
                        help="write(2)s per tracepoint round, 1-10000000")
    parser.add_argument("--calls", type=int_at_least(1, 10_000_000), default=20_000,
                        help="library calls per uprobe round, 1-10000000")
    parser.add_argument("--rounds", type=int_at_least(1, 100), default=9,
                        help="rounds per figure (the best one counts), 1-100")
    parser.add_argument("--octaves", type=int_at_least(1, 32), default=4,
                        help="full powers of two (16 kernel buckets each) per series in the drain bench, 1-32")
    parser.add_argument("--syscalls-attach", choices=("tracepoint", "raw_tracepoint"), default="tracepoint",
                        help="probes.syscalls.attach for the tracepoint figures (default: the config's default)")


def _build_target(tmp: Path) -> tuple[ctypes.CDLL, str]:
    out = tmp / "libsits_bench.so"
    src = Path(__file__).with_name("bench_target.c")
    try:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ProbeError(f"bench probes: cannot build {src.name} with gcc: {exc}") from exc
    lib = ctypes.CDLL(str(out))
    lib.sits_bench_loop_call.restype = ctypes.c_uint64
    lib.sits_bench_loop_call.argtypes = [ctypes.c_uint64]
    lib.sits_bench_loop_write.restype = ctypes.c_uint64
    lib.sits_bench_loop_write.argtypes = [ctypes.c_int, ctypes.c_uint64]
    lib.sits_bench_loop_getppid.restype = ctypes.c_uint64
    lib.sits_bench_loop_getppid.argtypes = [ctypes.c_uint64]
    return lib, str(out)


def _program(name: str, n_workloads: int = 1, extra: dict[str, str] | None = None,
             probes: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The probe's program as the daemon loads it with the ``probes:`` section ``probes``, and its attach path."""
    spec = specs.SPECS[name]
    plan = specs.plan_tracepoints(spec, tracepoint_exists)
    cfg = parse({"probes": probes or {}}).probes
    bpf, kept = compile_probe(spec, specs.wanted(spec, cfg),
                              lambda opt: specs.cflags(spec, cfg, n_workloads, plan.macros + opt, extra))
    return bpf, attach_path(spec, kept)


def _bench_bpf(*modes: str) -> Any:
    flags = [f"-I{specs.BPF_DIR}", *(f"-D{m}" for m in modes), f"-DBENCH_TGID={os.getpid()}",
             f"-DBENCH_STAGE={STAGES.index('sync')}"]
    return compile_bpf(specs.BPF_DIR / "bench.bpf.c", flags)


def _costs(base: float, empty: tuple[float, float], ours: tuple[float, float], timed: int, traced: Traced,
           perf: dict[str, float]) -> dict[str, Any]:
    """Figures of one program type; ``empty``/``ours``: (loop ns added, BPF run ns) per event."""
    return {"baseline_ns": round(base, 1),
            "empty_program_added_ns": round(empty[0], 1), "empty_program_bpf_run_ns": round(empty[1], 1),
            "added_ns_per_event": round(ours[0], 1), "bpf_run_ns_per_event": round(ours[1], 1),
            "to_empty": round(ours[0] / max(empty[0], 1.0), 3),
            "events_timed": timed, "events_expected": (traced.rounds + 1) * traced.n, "perf_buffer": perf,
            "perf_to_inkernel": round(perf["total_ns_per_event"] / max(ours[0], 1.0), 2),
            "perf_to_inkernel_beyond_dispatch": round(
                (perf["bpf_run_ns_per_event"] + perf["python_ns_per_event"]) / max(ours[1], 1.0), 2)}


def _tracepoint(lib: ctypes.CDLL, n: int, rounds: int, attach_as: str) -> dict[str, Any]:
    with socket.socket() as srv, open(os.devnull, "wb") as null:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        socks: list[socket.socket] = []

        def accepted() -> int:
            socks.append(socket.create_connection(srv.getsockname()))
            socks.append(srv.accept()[0])
            return socks[-1].fileno()

        fd = accepted()
        traced = Traced(lambda: lib.sits_bench_loop_write(fd, n), n, rounds)
        base = traced.best()
        bpf, attach = _program("syscalls", probes={"syscalls": {"attach": attach_as}})
        prog = Program(bpf, BucketLayout((1e-6,)))
        try:
            # empty programs on the attach path the probe got: what dispatch alone costs
            on, off = tracepoints_switch(prog.bpf)
            off()
            bpf = _bench_bpf("BENCH_EMPTY_WRITE", *(["USE_RAW_TP"] if attach == "raw_tracepoint" else []))
            try:
                empty = variant(bpf, traced, *tracepoints_switch(bpf))
            finally:
                close_bpf(bpf)
            on()
            prog.set_workloads({os.getpid(): 1})
            timed_fd = accepted()  # accepted while the probe runs: its writes are timed as egress
            ours_traced = Traced(lambda: lib.sits_bench_loop_write(timed_fd, n), n, rounds)
            prog.drain()
            ours = variant(prog.bpf, ours_traced, on, off)
            timed = sum(s.count for s in prog.drain())
            _, other = Traced(lambda: lib.sits_bench_loop_write(null.fileno(), n), n, rounds).added(on, off)
            # every syscall of every process pays this on the raw tracepoints, none of the untimed ones on syscalls:*
            _, syscall = Traced(lambda: lib.sits_bench_loop_getppid(n), n, rounds).added(on, off)
        finally:
            prog.close()
        bpf = _bench_bpf("BENCH_PERF_WRITE")
        try:
            perf = perf_variant(bpf, traced, base)
        finally:
            close_bpf(bpf)
        for sock in socks:
            sock.close()
    return {"program": "syscalls.bpf.c: egress, zero-byte write(2) on an accepted socket", "attach": attach,
            **_costs(base, empty, ours, timed, ours_traced, perf), "other_fd_added_ns": round(other, 1),
            "other_syscall_added_ns": round(syscall, 1)}


def _uprobe(lib: ctypes.CDLL, lib_path: str, n: int, rounds: int) -> dict[str, Any]:
    traced = Traced(lambda: lib.sits_bench_loop_call(n), n, rounds)
    base = traced.best()
    bpf = _bench_bpf("BENCH_EMPTY_CALLS")
    try:
        empty = variant(bpf, traced, *uprobes_switch(bpf, lib_path, b"empty_enter", b"empty_return"))
    finally:
        close_bpf(bpf)
    prog = Program(_program("cuda")[0], BucketLayout((1e-6,)))
    try:
        prog.set_workloads({os.getpid(): 1})
        ours = variant(prog.bpf, traced, *uprobes_switch(prog.bpf, lib_path, b"enter_sync", b"call_return"))
        timed = sum(s.count for s in prog.drain())
    finally:
        prog.close()
    bpf = _bench_bpf("BENCH_PERF_CALLS")
    try:
        uprobes_switch(bpf, lib_path, b"perf_enter", b"perf_return")
        perf = perf_variant(bpf, traced, base)
    finally:
        close_bpf(bpf)
    return {"program": "calls.bpf.c (as the cuda/nccl probes load it): empty library function",
            **_costs(base, empty, ours, timed, traced, perf)}


def _drain(stages: int, workloads: int, octaves: int, rounds: int) -> dict[str, Any]:
    """Time draining ``stages x workloads`` series, each with ``octaves`` full kernel bucket blocks."""
    layout = BucketLayout(parse({}).store.snapped())
    n = stages * workloads * octaves
    bpf, _ = _program("cuda", workloads, {"HIST_ENTRIES": str(n)})
    prog = Program(bpf, layout)
    try:
        hist = bpf[b"stage_latency"]
        s, w, b = np.meshgrid(np.arange(stages), np.arange(1, workloads + 1), np.arange(octaves) + 12,
                              indexing="ij")
        keys_np = np.zeros(n, [("stage", "<u2"), ("workload", "<u2"), ("block", "<u4")])
        keys_np["stage"], keys_np["workload"], keys_np["block"] = s.ravel(), w.ravel(), b.ravel()
        keys = (hist.Key * n).from_buffer_copy(keys_np.tobytes())
        words = ctypes.sizeof(hist.Leaf) // 8
        drain_s, frame_s = [], []
        for r in range(1, 4 * rounds + 1):
            hist.items_update_batch(keys, (hist.Leaf * n).from_buffer_copy(np.full((n, words), r, np.uint64).tobytes()))
            t0 = time.perf_counter()
            series = prog.drain()
            t1 = time.perf_counter()
            frame = Frame(ts=0.0, interval=1.0)
            for d in series:
                frame.add_hist(f"s{d.stage}", f"w{d.workload}", d.counts, d.sum_ns / 1e9)
            drain_s.append(t1 - t0)
            frame_s.append(time.perf_counter() - t0)
        if len(series) != stages * workloads:
            raise ProbeError(f"bench probes: drained {len(series)} series, expected {stages * workloads}")
    finally:
        prog.close()
    return {"series": stages * workloads, "octaves_per_series": octaves, "kernel_buckets": n * SUB,
            "map_entries": n, "drain_ms": round(1e3 * min(drain_s), 3),
            "drain_ms_median": round(1e3 * float(np.median(drain_s)), 3),
            "drain_and_frame_ms": round(1e3 * min(frame_s), 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    problem = environment_problem()
    if problem:
        raise ProbeError(f"bench probes needs the probes to load: {problem}")
    load_before = os.getloadavg()[0]
    cpus, policy, param = os.sched_getaffinity(0), os.sched_getscheduler(0), os.sched_getparam(0)
    # one CPU, so the loop and its per-CPU buffers stay put; SCHED_FIFO, so other tasks on a shared
    # machine do not land inside the timed loops (each lasts well under the kernel's RT throttle)
    os.sched_setaffinity(0, {min(cpus)})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    try:
        with tempfile.TemporaryDirectory(prefix="sits-bench-") as tmp:
            lib, lib_path = _build_target(Path(tmp))
            tp = _tracepoint(lib, args.writes, args.rounds, args.syscalls_attach)
            up = _uprobe(lib, lib_path, args.calls, args.rounds)
        dr = _drain(16, 64, args.octaves, args.rounds)
    finally:
        os.sched_setscheduler(0, policy, param)
        os.sched_setaffinity(0, cpus)
    return {
        "bench": "probes", "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}",
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "tracepoint": tp, "uprobe": up, "drain": dr, "targets": TARGETS,
        "met": {"tracepoint_added_ns": tp["added_ns_per_event"] <= TARGETS["tracepoint_added_ns_max"],
                "uprobe_to_empty": up["to_empty"] <= TARGETS["uprobe_to_empty_max"],
                "perf_to_inkernel_tracepoint": tp["perf_to_inkernel"] >= TARGETS["perf_to_inkernel_min"],
                "perf_to_inkernel_uprobe": up["perf_to_inkernel_beyond_dispatch"] >= TARGETS["perf_to_inkernel_min"],
                "drain_ms": dr["drain_ms"] <= TARGETS["drain_ms_max"]},
    }
