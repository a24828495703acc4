"""How topology and active faults turn into one shard's service conditions and device-call timings.

Every fault acts here through a mechanism, never by setting a metric:

* ``gpu_compute_saturation``: a co-tenant holds a share of the SMs, so iterations take longer;
* ``gpu_memory_pressure``: a foreign allocation takes device memory, so the KV cache shrinks
  (computed in :mod:`.host`) and the allocator retries more and slower;
* ``interconnect_contention``: foreign traffic takes a share of the GPU's links, so copies and
  collectives wait behind it and get less bandwidth;
* ``cpu_contention``: a NUMA node's CPUs are busy, so threads wait in the run queue and kernel
  launches take longer; an iteration cannot be shorter than the host time to issue it;
* ``thermal_throttling``: worse cooling raises the temperature until clocks drop (:mod:`.gpu`);
* ``scheduler_stall``: the serving loop freezes periodically (handled by the engine);
* ``network_ingress``: the NIC queue and losses delay requests and responses (:func:`network_delay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..topology import LinkKind, Topology
from .engine import Conditions
from .faults import FaultRecord
from .perf import ModelSpec, PerfModel

__all__ = ["Effects", "DeviceTiming", "cpu_wait", "copy_s", "pair_link", "bytes_per_token", "shard_timing",
           "comm_intensity", "numa_load", "network_delay"]

STEAL_MAX = 0.75  # SM share a co-tenant holds at severity 1
LINK_LOAD_MAX = 0.95  # link share foreign traffic takes at severity 1
NVLINK_ALPHA = 8e-6  # s, small all-reduce over NVLink / NVSwitch (NCCL LL protocol)
PCIE_ALPHA = 20e-6  # s, the same over PCIe or the socket interconnect
REF_BANDWIDTH = 450e9  # Splitwise measured NVSwitch-connected H100s (18 NVLink4 links per GPU)
FOREIGN_CHUNK = 8 * 2**20  # bytes of one foreign transfer a copy or collective queues behind
H2D_BANDWIDTH = 50e9  # PCIe Gen5 x16, effective, per GPU
COPY_ALPHA = 8e-6  # s, fixed cost of a small cuMemcpy
H2D_PER_ITER = 3  # input copies per iteration and GPU: token ids, positions, block tables
H2D_BYTES = 4096  # bytes per input copy
D2H_BYTES = 1024  # bytes of sampled token ids copied back per iteration
LAUNCHES_DECODE = 10  # kernel launches per layer in a decode iteration (eager mode)
LAUNCHES_PREFILL = 12
LAUNCH_BASE = 4.5e-6  # s, host-side cost of cuLaunchKernel on an idle core
WAKEUPS_PER_ITER = 2  # serving-loop thread wake-ups per iteration on the critical path
SCHED_OVERHEAD = 1e-3  # s of scheduler (Python) work per iteration
RUNQ_BASE = 4e-6  # s, run-queue latency of a wake-up that finds an idle core
RUNQ_SLICE = 0.4e-3  # s, scale of the wait for a busy core
CPU_BUSY_MAX = 0.97  # node CPU share busy at cpu_contention severity 1
STALL_PERIOD = 4.0  # s between scheduler freezes
STALL_FROZEN = (0.2, 2.6)  # frozen seconds per period: base + span * severity
SURGE_SPAN = 2.0  # request rate x (1 + SURGE_SPAN * severity)


@dataclass(slots=True)
class Effects:
    """Active fault mechanisms for one tick, per GPU / NUMA node / shard / workload."""

    steal: np.ndarray
    mem_foreign: np.ndarray
    mem_pressure: np.ndarray
    link_load: np.ndarray
    cooling: np.ndarray
    numa_hog: np.ndarray
    nic: dict[str | None, float] = field(default_factory=dict)
    stall: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    surge: dict[str | None, float] = field(default_factory=dict)

    @classmethod
    def none(cls, gpus: int, numa_nodes: int) -> Effects:
        z = np.zeros(gpus)
        return cls(z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(numa_nodes))

    @classmethod
    def from_faults(cls, faults: list[FaultRecord], gpus: int, numa_nodes: int) -> Effects:
        """Combine active faults; overlapping faults of one kind on one place take the worst."""
        e = cls.none(gpus, numa_nodes)
        for f in faults:
            g, s = list(f.gpus), f.severity
            if f.kind == "gpu_compute_saturation":
                e.steal[g] = np.maximum(e.steal[g], STEAL_MAX * s)
            elif f.kind == "gpu_memory_pressure":
                e.mem_foreign[g] = np.maximum(e.mem_foreign[g], np.asarray(f.foreign_bytes))
                e.mem_pressure[g] = np.maximum(e.mem_pressure[g], s)
            elif f.kind == "interconnect_contention":
                e.link_load[g] = np.maximum(e.link_load[g], LINK_LOAD_MAX * s)
            elif f.kind == "thermal_throttling":
                e.cooling[g] = np.maximum(e.cooling[g], s)
            elif f.kind == "cpu_contention":
                nodes = list(f.numa_nodes)
                e.numa_hog[nodes] = np.maximum(e.numa_hog[nodes], s)
            elif f.kind == "network_ingress":
                e.nic[f.workload] = max(e.nic.get(f.workload, 0.0), s)
            elif f.kind == "scheduler_stall":
                frozen = STALL_FROZEN[0] + STALL_FROZEN[1] * s
                for shard in f.shards:
                    if frozen > e.stall.get(shard, (0.0, 0.0, 0.0))[2]:
                        e.stall[shard] = (f.start, STALL_PERIOD, frozen)
            else:
                e.surge[f.workload] = max(e.surge.get(f.workload, 1.0), 1.0 + SURGE_SPAN * s)
        return e


@dataclass(slots=True)
class DeviceTiming:
    """Mean host-side durations (s) of one shard's device calls during a tick, and their causes."""

    launch: float  # a launch that is not descheduled
    launch_slow_share: float
    runq_wait_share: float
    runq_wait: float
    h2d: float
    d2h: float
    coll_fixed: float
    coll_per_token: float
    alloc_rate: float  # cuMemAlloc calls per GPU per second
    alloc: float
    host_decode: float
    host_prefill: float


def cpu_wait(rho: float) -> tuple[float, float]:
    """(share of wake-ups that find every core busy, mean wait for one) on a node ``rho`` busy."""
    return rho**8, RUNQ_SLICE / (1.0 - rho)


def numa_load(base: np.ndarray, hog: np.ndarray) -> np.ndarray:
    """Busy share of each NUMA node's CPUs: the serving processes plus foreign work."""
    return np.minimum(0.99, base + (CPU_BUSY_MAX - base).clip(0) * hog)


def copy_s(nbytes: float, load: float) -> float:
    """Host-side duration of a cuMemcpy over a link with ``load`` share of foreign traffic."""
    return COPY_ALPHA + nbytes / (H2D_BANDWIDTH * (1 - load)) + load / (1 - load) * FOREIGN_CHUNK / H2D_BANDWIDTH


def pair_link(topology: Topology, gpus: tuple[int, ...]) -> tuple[float, float]:
    """Slowest bandwidth among the shard's GPU pairs and its small-message latency (one GPU: none)."""
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    if not pairs:
        return float("inf"), 0.0
    a, b = min(pairs, key=lambda p: topology.bandwidth[p])
    fast = topology.kinds[a][b] in (LinkKind.NVLINK, LinkKind.NVSWITCH)
    return float(topology.bandwidth[a, b]), NVLINK_ALPHA if fast else PCIE_ALPHA


def bytes_per_token(spec: ModelSpec, tp: int) -> float:
    """Bytes each rank moves per token in one ring all-reduce of the hidden state (fp16)."""
    return spec.hidden * 2 * 2 * (tp - 1) / tp


def shard_timing(shard_id: str, perf: PerfModel, gpus: tuple[int, ...], link: tuple[float, float], eff: Effects,
                 clock: float, rho: float, kv_capacity: float) -> tuple[Conditions, DeviceTiming]:
    """Engine conditions and device-call timings of a shard on ``gpus`` under ``eff``.

    ``link`` is :func:`pair_link` of its GPUs, ``clock`` the lowest SM clock ratio among them
    (thermal state), ``rho`` the busiest NUMA node its CPUs are on.
    """
    idx = list(gpus)
    spec, tp = perf.spec, perf.tp
    steal = float(eff.steal[idx].max())
    load = float(eff.link_load[idx].max())
    pf_mult = (0.9 / clock + 0.1) / (1 - steal)
    dec_mult = (0.6 / clock + 0.4) / (1 - 0.8 * steal)
    n_coll = 2 * spec.layers if tp > 1 else 0
    coll_fixed = coll_per_token = extra_fixed = extra_per_token = 0.0
    if n_coll:
        bw, alpha = link
        bpt = bytes_per_token(spec, tp)
        coll_fixed = alpha + load / (1 - load) * FOREIGN_CHUNK / bw
        coll_per_token = bpt / (bw * (1 - load))
        extra_fixed = n_coll * (coll_fixed - NVLINK_ALPHA)
        extra_per_token = n_coll * (coll_per_token - bpt / REF_BANDWIDTH)
    h2d = copy_s(H2D_BYTES, load)
    extra_fixed += H2D_PER_ITER * (h2d - copy_s(H2D_BYTES, 0.0))
    q, wait = cpu_wait(rho)
    slow_share = 0.05 * q
    launch = LAUNCH_BASE * (1 + 2 * rho * rho)  # cache and memory-bandwidth interference
    launch_mean = launch + slow_share * wait  # some launches are descheduled mid-call
    sched = SCHED_OVERHEAD * (1 + 2 * rho * rho) + WAKEUPS_PER_ITER * q * wait
    host_decode = LAUNCHES_DECODE * spec.layers * launch_mean + sched
    host_prefill = LAUNCHES_PREFILL * spec.layers * launch_mean + sched
    pressure = float(eff.mem_pressure[idx].max())
    cond = Conditions(kv_capacity, pf_mult, dec_mult, extra_fixed, extra_per_token, host_decode, host_prefill,
                      eff.stall.get(shard_id))
    timing = DeviceTiming(launch, slow_share, q, wait, h2d, copy_s(D2H_BYTES, load), coll_fixed, coll_per_token,
                          0.05 + 4.0 * pressure, 60e-6 * (1 + 10 * pressure), host_decode, host_prefill)
    return cond, timing


def comm_intensity(perf: PerfModel) -> float:
    """Share of a nominal step mix (one 1024-token prefill, 25 decode steps at batch 16) that its
    collectives would add on a 40 GB/s PCIe path instead of the measured NVSwitch: 0 for one GPU."""
    if perf.tp == 1:
        return 0.0
    n_coll = 2 * perf.spec.layers
    bpt = bytes_per_token(perf.spec, perf.tp)
    per_token = bpt * (1 / 40e9 - 1 / REF_BANDWIDTH)
    extra = n_coll * (26 * (PCIE_ALPHA - NVLINK_ALPHA) + (25 * 16 + 1024) * per_token)
    nominal = 25 * perf.decode_s(16) + perf.prefill_s(1, 1024)
    return min(1.0, round(extra / nominal, 3))



NIC_BASE = 1.5e-3  # s, mean request (or response tail) transfer and HTTP handling on a quiet NIC
NIC_WAIT = 20e-3  # s, scale of the NIC queue wait (bufferbloat: deep switch and NIC queues)
NIC_BASE_LOAD = 0.2  # NIC queue utilisation without congestion
NIC_LOSS = 0.08  # packet-loss probability per transmission at congestion 1
RTO = 0.2  # s, TCP minimum retransmission timeout (doubles per retry)


def network_delay(rng: np.random.Generator, n: int, congestion: float) -> np.ndarray:
    """Per-request network time (s) through a NIC ``congestion`` (0-1) congested: transfer, queue
    wait and retransmission timeouts.  Draws the same random numbers whatever the congestion."""
    base = rng.lognormal(np.log(NIC_BASE) - 0.125, 0.5, n)
    rho = NIC_BASE_LOAD + (0.98 - NIC_BASE_LOAD) * congestion
    wait = rng.exponential(1.0, n) * NIC_WAIT * rho / (1 - rho)
    retries = (rng.random((n, 3)) < NIC_LOSS * congestion).sum(axis=1)
    return base + wait + RTO * (2.0**retries - 1)
