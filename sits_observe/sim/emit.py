"""Turn what the shards did during a tick into a Frame: request stages, device stages, gauges, counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..frame import BucketLayout, Frame, numa_cpu_sample
from ..topology import LinkKind, Topology
from .device import StageSampler, add_shard_stages
from .engine import TickStats
from .gpu import GpuInputs, GpuModel
from .mechanics import D2H_BYTES, H2D_BANDWIDTH, H2D_BYTES, H2D_PER_ITER, DeviceTiming, Effects, bytes_per_token
from .migration import LOAD_CHUNK, Migration
from .shards import GIB, kv_bytes_per_gpu_token, static_bytes_per_gpu

if TYPE_CHECKING:
    from .host import _Shard

__all__ = ["TickOutput"]

HOST_MEMORY = 2048 * GIB
HOST_MEMORY_BASE = 96 * GIB  # OS, daemons, page cache not counted below
HOST_MEMORY_PER_SHARD = 24 * GIB  # serving process, pinned staging buffers, tokenizer
OS_CPU_SHARE = 0.02


@dataclass
class _Workload:
    stages: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in ("ingress", "queue", "prefill",
                                                                                    "decode", "egress", "e2e")})
    done_at: list[float] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    errors: int = 0
    preemptions: int = 0
    tokens: int = 0
    waiting: int = 0
    running: int = 0
    kv_ratio: float = 0.0  # the fullest replica's KV cache, as the vLLM collector keeps it

    def set_egress(self, egress: np.ndarray) -> None:
        """Response delivery times of the requests finished this tick, in ``done_at`` order."""
        self.stages["egress"] = egress.tolist()
        self.stages["e2e"] = (np.asarray(self.done_at) + egress - np.asarray(self.arrival)).tolist()


class TickOutput:
    """Accumulates one tick over all shards, then fills the Frame."""

    def __init__(self, topology: Topology, numa_nodes: int) -> None:
        self.topology = topology
        self.gpu = GpuInputs(topology.n)
        self.work: dict[str, _Workload] = {}
        self.cores_busy = np.zeros(numa_nodes)

    def add_shard(self, s: _Shard, st: TickStats, tm: DeviceTiming, alloc_calls: int, dt: float, numa: int,
                  sampler: StageSampler) -> None:
        p = s.placement
        w = self.work.setdefault(p.workload, _Workload())
        w.stages["ingress"] += st.ingress
        w.stages["queue"] += st.queue
        w.stages["prefill"] += st.prefill
        w.stages["decode"] += st.decode
        w.done_at += st.finished_at
        w.arrival += st.finished_arrival
        w.errors += st.errors
        w.preemptions += st.preemptions
        w.tokens += st.tokens
        w.waiting += len(s.engine.waiting)
        w.running += len(s.engine.running)
        w.kv_ratio = max(w.kv_ratio, min(1.0, s.engine.kv_used / max(s.engine.kv_capacity, 1.0)))
        add_shard_stages(sampler, p.workload, p.tp, s.perf.spec.layers, st, tm, alloc_calls)
        prefill, decode = st.prefill_gpu_s, st.decode_gpu_s
        gpu_s = max(prefill + decode + st.busy_shift, 0.0)  # the GPU time that fell inside this tick
        if prefill + decode > 0:
            prefill, decode = (prefill * gpu_s / (prefill + decode), decode * gpu_s / (prefill + decode))
        else:
            decode = gpu_s
        busy = min(1.0, gpu_s / dt)
        batch = st.decode_tokens / st.decode_iters if st.decode_iters else 0.0
        iters = st.prefill_iters + st.decode_iters
        spec = s.perf.spec
        coll = 2 * spec.layers * (st.decode_tokens + st.prefill_tokens) * bytes_per_token(spec, p.tp) / dt
        self.gpu.add(list(s.gpus), np.array([
            busy,
            min(1.0, (prefill * s.perf.prefill_power_fraction + decode * s.perf.power_fraction(batch)) / dt),
            min(1.0, (0.8 * decode + 0.4 * prefill) / dt),
            static_bytes_per_gpu(p.model, p.tp) + s.engine.kv_used * kv_bytes_per_gpu_token(p.model, p.tp),
            iters * H2D_PER_ITER * H2D_BYTES / dt,
            iters * D2H_BYTES / dt,
            0.0,
            0.0,
        ]))
        self._ring(s.gpus, coll)
        self.cores_busy[numa] += (p.tp + 1) * max(busy, 0.2)  # one busy-polling worker per GPU plus the server

    def _ring(self, gpus: tuple[int, ...], rate: float) -> None:
        """All-reduce traffic (bytes/s each way) of a ring over ``gpus``: each GPU sends to the next and receives
        from the one before, on NVLink where that pair has it, else over its PCIe link."""
        if len(gpus) < 2:
            return
        for k, g in enumerate(gpus):
            for peer, direction in ((gpus[(k + 1) % len(gpus)], "tx"), (gpus[k - 1], "rx")):
                fast = self.topology.kinds[g][peer] in (LinkKind.NVLINK, LinkKind.NVSWITCH)
                self.gpu.row(f"{'nvlink' if fast else 'pcie'}_{direction}")[g] += rate

    def add_loading(self, m: Migration, moved: float, seconds: float, dt: float, s: _Shard,
                    sampler: StageSampler) -> None:
        """Weights streaming onto the GPUs a shard is moving to: ``moved`` bytes per GPU in ``seconds`` of
        this tick (:meth:`.migration.Migration.advance`)."""
        new = m.new
        self.gpu.serving[new] = True
        self.gpu.row("memory_used")[new] += m.loaded() * m.bytes_per_gpu
        self.gpu.row("pcie_rx")[new] += moved / dt
        self.gpu.row("busy")[new] += 0.02 if m.loaded() > 0 else 0.0
        if moved > 0:  # one cuMemcpy per chunk, each taking a chunk's share of the loading time
            sampler.add("h2d", s.placement.workload, moved * len(new) / LOAD_CHUNK, LOAD_CHUNK * seconds / moved, 0.2)

    def fill(self, frame: Frame, layout: BucketLayout, gpus: GpuModel, sampler: StageSampler, eff: Effects,
             rho: np.ndarray, cores: np.ndarray, shards: int, dt: float) -> None:
        for name, w in self.work.items():
            for stage, values in w.stages.items():
                frame.add_values(stage, name, np.asarray(values), layout)
            frame.add_counter("requests_total", name, len(w.done_at) + w.errors)
            frame.add_counter("request_errors_total", name, w.errors)
            frame.add_counter("preemptions_total", name, w.preemptions)
            frame.add_counter("tokens_generated_total", name, w.tokens)
            frame.workload_gauges[("queue_depth", name)] = float(w.waiting)
            frame.workload_gauges[("running_requests", name)] = float(w.running)
            frame.workload_gauges[("kv_cache_usage_ratio", name)] = w.kv_ratio
        sampler.emit(frame)
        g = self.gpu
        g.row("memory_used")[:] += eff.mem_foreign
        for link, bw in (("pcie_rx", H2D_BANDWIDTH), ("pcie_tx", H2D_BANDWIDTH), ("nvlink_rx", gpus.nvlink_bw),
                         ("nvlink_tx", gpus.nvlink_bw)):
            g.row(link)[:] += eff.link_load * bw  # the foreign traffic shows in the GPU's link counters
        frame.gpu = gpus.step(dt, g, eff.steal, eff.cooling)
        used = HOST_MEMORY_BASE + shards * HOST_MEMORY_PER_SHARD
        busy = np.maximum(rho, OS_CPU_SHARE)
        frame.samples += [numa_cpu_sample(node, float(b)) for node, b in enumerate(busy)]
        frame.host.update({
            "cpu_utilization_ratio": float((busy * cores).sum() / cores.sum()),
            "memory_used_ratio": used / HOST_MEMORY,
            "memory_used_bytes": float(used),
            "memory_total_bytes": float(HOST_MEMORY),
        })
