"""`sits-observe bench collectors`: our cost per NVML GPU-sample, per 64-GPU dcgm-exporter page and per
host-source tick.

NVML: the collector reads the stand-in for pynvml (:mod:`.nvml_fake`, so the driver's own cost is left out); the
baseline is the same sequence of fake NVML calls replayed bare, so ``ours - baseline`` is what our code adds. DCGM:
reading a synthetic 64-GPU page into GPU fields against the baseline of prometheus_client's full text parser
walking the same page. Host: one tick of the host source on a written ``/proc`` and ``/sys`` of a large machine
(``--host-cpus`` CPUs in 8 NUMA nodes, two ``/proc/stat`` snapshots read in turn) and on this machine's own,
against the baseline of reading the same two files bare (what any reader pays). Replicas: real serving processes
(each listening on a port, with two children standing for its GPU workers) put on the fake host's GPUs; a tick that
joins their backlogs to the GPUs against the same tick without the join, and a refresh round (every process looked
up again).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ..argtypes import int_at_least
from ..errors import ConfigError
from ..frame import GPU_FIELD_INDEX, Frame
from ..topology import preset
from .dcgm import DCGM_MAP, DCGM_SAMPLES, DcgmSource
from .host import HostSource
from .nvml import NvmlSource
from .nvml_fake import FakeNvml
from .replicas import ReplicaBoard

__all__ = ["SERVING_PROCESS", "add_arguments", "run", "dcgm_page"]

# fields dcgm-exporter's default list adds that we do not map (parsed and skipped)
_UNMAPPED = ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
             "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
             "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int_at_least(1, 100_000), default=200,
                   help="NVML samples of the 8-GPU fake host to time, 1-100000")
    p.add_argument("--processes", type=int_at_least(1, 64), default=4,
                   help="compute processes per GPU on the fake host, 1-64")
    p.add_argument("--dcgm-gpus", type=int_at_least(1, 1024), default=64, help="GPUs on the dcgm-exporter page, 1-1024")
    p.add_argument("--pages", type=int_at_least(1, 10_000), default=30, help="dcgm-exporter pages to time, 1-10000")
    p.add_argument("--host-cpus", type=int_at_least(1, 4096), default=256,
                   help="CPUs of the written large host (8 NUMA nodes), 1-4096")
    p.add_argument("--host-ticks", type=int_at_least(1, 100_000), default=500,
                   help="host-source ticks to time, 1-100000")


def _times(call: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def _ms(samples: list[float], per: int = 1) -> float:
    return round(statistics.median(samples) * 1e3 / per, 4)


def _nvml(args: argparse.Namespace) -> dict[str, Any]:
    fake = FakeNvml(preset("nvswitch-8"))
    for g in fake.gpus:
        g.processes = [(1001 + 10 * g.index + k, (k + 1) << 30) for k in range(args.processes)]  # k even: "chat"
        g.util_periods = 30  # 30 per-process SM samples per process: more than the driver gives, to load attribute()
    src = NvmlSource(fake, sample_interval=3600.0, clock=lambda: 0.0,
                     resolve_workload=lambda pid: "chat" if pid % 2 else None)
    n = len(src.gpus)
    src.sample(0.0)  # warm-up; also sets the NVLink baseline
    fake.log = []
    src.sample(1.0)
    calls, fake.log = fake.log, None
    clock = iter(range(2, 2 + args.samples))
    ours = _times(lambda: src.sample(float(next(clock))), args.samples)

    def replay() -> None:
        for name, call_args in calls:
            try:
                getattr(fake, name)(*call_args)
            except fake.NVMLError:
                pass

    base = _times(replay, args.samples)
    reuse = _times(lambda: src.collect(Frame(0.0, 1.0)), args.samples)  # a tick between samples
    src.close()
    per_ours, per_base = _ms(ours, n), _ms(base, n)
    return {"gpus": n, "nvml_calls_per_gpu_sample": round(len(calls) / n, 1),
            "ours_ms_per_gpu_sample": per_ours, "baseline_fake_calls_ms_per_gpu_sample": per_base,
            "overhead_ms_per_gpu_sample": round(per_ours - per_base, 4),
            "tick_reuse_ms": _ms(reuse)}


# a serving process: listens on a port and starts two children, as vLLM starts its GPU workers
SERVING_PROCESS = """
import socket, subprocess, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
print(s.getsockname()[1], *[w.pid for w in workers], flush=True)
time.sleep(600)
"""


def _replicas(args: argparse.Namespace) -> dict[str, Any]:
    fake = FakeNvml(preset("nvswitch-8"))
    servers = [subprocess.Popen([sys.executable, "-c", SERVING_PROCESS], stdout=subprocess.PIPE, text=True)
               for _ in range(3)]
    clock = [0.0]
    try:
        board = ReplicaBoard(clock=lambda: clock[0])
        for k, proc in enumerate(servers):  # replica k on GPUs 2k, 2k+1; GPUs 6, 7 spare
            assert proc.stdout is not None
            port, *workers = map(int, proc.stdout.readline().split())
            board.register(f"replica-{k}", f"http://127.0.0.1:{port}/metrics")
            board.publish(f"replica-{k}", float(k % 2))
            for g, pid in zip(fake.gpus[2 * k:2 * k + 2], workers):
                g.processes = [(pid, 10 << 30), (1, 1 << 30)]  # the worker and a process outside any replica
        joined = NvmlSource(fake, sample_interval=3600.0, clock=lambda: 0.0, replicas=board)
        plain = NvmlSource(fake, sample_interval=3600.0, clock=lambda: 0.0)
        for src in (joined, plain):
            src.collect(Frame(0.0, 1.0))  # the sample every tick reuses
        frame = Frame(0.0, 1.0)
        joined.collect(frame)
        assert frame.gpu is not None
        with_work = int((~np.isnan(frame.gpu.values[:, GPU_FIELD_INDEX["backlog_utilization_ratio"]])).sum())
        ours = _times(lambda: joined.collect(Frame(0.0, 1.0)), args.samples)
        base = _times(lambda: plain.collect(Frame(0.0, 1.0)), args.samples)

        def refresh() -> None:  # what a sample asks once the cache has expired: every GPU's processes again
            clock[0] += board.refresh
            for g in fake.gpus:
                board.has_work([pid for pid, _ in g.processes])

        rounds = _times(refresh, 20)
    finally:
        for proc in servers:
            subprocess.run(["pkill", "-P", str(proc.pid)], check=False)
            proc.kill()
            proc.wait()
    return {"replicas": len(servers), "gpus_of_replicas": 6, "gpus_with_work": with_work,
            "tick_ms_with_join": _ms(ours), "baseline_tick_ms_without_join": _ms(base),
            "overhead_ms_per_tick": round(_ms(ours) - _ms(base), 4),
            "refresh_round_ms": _ms(rounds), "refresh_every_s": board.refresh}


def dcgm_page(gpus: int) -> str:
    """A dcgm-exporter page for ``gpus`` H100s with every mapped field and the usual unmapped ones."""
    names = dict.fromkeys([m for m, _, _ in DCGM_MAP if "THROTTLE" not in m] + list(DCGM_SAMPLES) + list(_UNMAPPED))
    lines = []
    for name in names:
        lines += [f"# HELP {name} {name.removeprefix('DCGM_FI_').lower().replace('_', ' ')}.", f"# TYPE {name} gauge"]
        for g in range(gpus):
            lines.append(f'{name}{{gpu="{g}",UUID="GPU-5d1e9c7a-0b2c-4d3e-8f40-{g:012x}",'
                         f'pci_bus_id="00000000:{g + 16:02X}:00.0",'
                         f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-host-01",'
                         f'DCGM_FI_DRIVER_VERSION="550.90.07"}} {(g * 37 + len(name)) % 100}')
    return "\n".join(lines) + "\n"


def _dcgm(args: argparse.Namespace) -> dict[str, Any]:
    page = dcgm_page(args.dcgm_gpus)
    src = DcgmSource("http://127.0.0.1:9400/metrics")
    t0 = time.perf_counter()
    src.read(page)
    cold = time.perf_counter() - t0
    ours = _times(lambda: src.read(page), args.pages)
    base = _times(lambda: [s for f in text_string_to_metric_families(page) for s in f.samples], args.pages)
    return {"gpus": args.dcgm_gpus, "page_bytes": len(page), "page_lines": page.count("\n"),
            "ours_ms_per_page": _ms(ours), "ours_first_page_ms": round(cold * 1e3, 4),
            "baseline_full_parser_ms_per_page": _ms(base), "speedup": round(_ms(base) / _ms(ours), 1)}


def _write_host(root: Path, cpus: int, tick: int) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    rows = [f"cpu{c} {1000 * tick + c} 3 {500 * tick} {90000 + 400 * tick} 12 0 7 0 0 0" for c in range(cpus)]
    (root / "proc" / "stat").write_text("\n".join(["cpu  1 2 3 4 5 6 7 8 0 0", *rows, "intr 1 2", "ctxt 3", ""]))
    (root / "proc" / "meminfo").write_text("MemTotal: 2113929216 kB\nMemFree: 1000 kB\nMemAvailable: 1500000000 kB\n")
    per = cpus // 8
    for n in range(8):
        d = root / "sys" / "devices/system/node" / f"node{n}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(f"{n * per}-{(n + 1) * per - 1}\n")


def _host_case(proc: list[Path], sys_root: Path, ticks: int) -> dict[str, float]:
    src = HostSource(proc[0], sys_root)
    src.collect(Frame(0.0, 1.0))
    turn = iter(range(1, ticks + 1))

    def tick() -> None:
        src.proc = proc[next(turn) % len(proc)]
        src.collect(Frame(0.0, 1.0))

    ours = _times(tick, ticks)
    base = _times(lambda: [(p / name).read_text() for p in proc[:1] for name in ("stat", "meminfo")], ticks)
    return {"ours_ms_per_tick": _ms(ours), "baseline_read_files_ms_per_tick": _ms(base),
            "overhead_ms_per_tick": round(_ms(ours) - _ms(base), 4)}


def _host(args: argparse.Namespace) -> dict[str, Any]:
    if args.host_cpus < 8 or args.host_cpus % 8:
        raise ConfigError(f"bench collectors: --host-cpus {args.host_cpus}: use a multiple of 8 (8 NUMA nodes)")
    with tempfile.TemporaryDirectory(prefix="sits-bench-host-") as tmp:
        roots = [Path(tmp) / f"t{k}" for k in range(2)]
        for k, root in enumerate(roots):
            _write_host(root, args.host_cpus, k + 1)
        written = _host_case([r / "proc" for r in roots], roots[0] / "sys", args.host_ticks)
    return {"written": {"cpus": args.host_cpus, "numa_nodes": 8, **written},
            "this_machine": _host_case([Path("/proc")], Path("/sys"), args.host_ticks)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    return {"bench": "collectors", "nvml": _nvml(args), "replicas": _replicas(args), "dcgm": _dcgm(args),
            "host": _host(args),
            "targets": {"nvml_overhead_ms_per_gpu_sample": 2.0, "dcgm_ms_per_64_gpu_page": 20.0}}
