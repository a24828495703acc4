#!/usr/bin/env bash
# Device check (CI does not run it): on a host with a real NVIDIA GPU, run the NVML collector and
# `sits-observe topo` for SECONDS (default 30) and print what they read, next to nvidia-smi's own view.
#   tests/device/check_nvml.sh [SECONDS]
# Needs the package's Python deps (numpy, pydantic, pyyaml, prometheus-client, nvidia-ml-py); PY picks
# the interpreter (default .venv/bin/python, else python3).  Exit 0 when every GPU answered every sample.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-30}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

echo "== nvidia-smi"
nvidia-smi -L || echo "nvidia-smi not found"
nvidia-smi topo -m || true

exec "$PY" - "$secs" <<'EOF'
import os
import sys
import time

import numpy as np

from sits_observe.collectors.commands import format_topology
from sits_observe.collectors.nvml import NvmlSource, nvml_status
from sits_observe.frame import GPU_FIELDS, Frame
from sits_observe.topology import Topology

secs = float(sys.argv[1])
ok, status = nvml_status()
print("== doctor:", status)
if not ok:
    sys.exit(1)
print("== sits-observe topo")
print(format_topology(Topology.from_nvml()))

# this script's own pid as the one "workload", so the per-process attribution runs (serving/foreign fields
# appear only where some compute process is on a GPU)
src = NvmlSource(sample_interval=5.0, resolve_workload=lambda pid: "self" if pid == os.getpid() else None)
print(f"== collector: {len(src.gpus)} GPU(s), NVLink links per GPU {[len(g.links) for g in src.gpus]}, "
      f"XID events {'on' if src._events is not None else 'off'}")
end, ticks, sample_ms, bad = time.monotonic() + secs, 0, [], 0
while time.monotonic() < end:
    t0 = time.perf_counter()
    before = src._snap
    frame = Frame(ts=time.time(), interval=1.0)
    src.collect(frame)
    ticks += 1
    if src._snap is not before:  # a new NVML sample was taken this tick
        sample_ms.append((time.perf_counter() - t0) * 1e3)
        bad += int((~frame.gpu.healthy).sum())
        print(f"-- sample {len(sample_ms)} ({sample_ms[-1]:.1f} ms, {sample_ms[-1] / len(src.gpus):.2f} ms per GPU), "
              f"{len(frame.samples)} detail samples, errors: {frame.errors or 'none'}")
        for i, info in enumerate(frame.gpu.info):
            vals = ", ".join(f"{f.name}={v:.4g}" for f, v in zip(GPU_FIELDS, frame.gpu.values[i]) if not np.isnan(v))
            missing = [f.name for f, v in zip(GPU_FIELDS, frame.gpu.values[i]) if np.isnan(v)]
            print(f"   GPU {info.index} {info.model} {info.pci_bus_id} healthy={bool(frame.gpu.healthy[i])}: {vals}")
            print(f"     unsupported here: {missing or 'none'}")
        names = sorted({s.name for s in frame.samples})
        print("   detail:", {n: sum(s.name == n for s in frame.samples) for n in names})
    time.sleep(1.0)
print("== raw per-process samples (nvmlDeviceGetProcessUtilization since 0): layout check for the foreign field")
for g in src.gpus:
    try:
        raw = src.nvml.nvmlDeviceGetProcessUtilization(g.handle, 0)
        print(f"   GPU {g.info.index}: {len(raw)} samples:",
              [(s.pid, s.timeStamp, s.smUtil) for s in raw[:8]])
    except src.nvml.NVMLError as exc:
        print(f"   GPU {g.info.index}: {exc}")
src.close()
print(f"== {ticks} ticks, {len(sample_ms)} NVML samples, median {np.median(sample_ms):.1f} ms per sample "
      f"(driver included), unhealthy GPU-samples: {bad}")
sys.exit(1 if bad else 0)
EOF
