"""The Frame: one tick of everything every source saw, in one shape whatever the source.

Sources (eBPF probes, NVML/DCGM, inference-server scrapes, the simulator) each fill their part of a
Frame; nothing downstream knows which source a number came from.  Histograms are *deltas* on the
shared exported bucket layout (:class:`BucketLayout`); GPU values are a dense ``(gpus, GPU_FIELDS)``
array with NaN where a field is unsupported; counters are deltas.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = [
    "REQUEST_STAGES",
    "DEVICE_STAGES",
    "HOST_STAGES",
    "STAGES",
    "STAGE_TIER",
    "FieldSpec",
    "GPU_FIELDS",
    "GPU_FIELD_INDEX",
    "THROTTLE_REASONS",
    "HOST_FIELDS",
    "WORKLOAD_GAUGES",
    "WORKLOAD_COUNTERS",
    "BucketLayout",
    "HistDelta",
    "GpuInfo",
    "GpuFrame",
    "Sample",
    "NUMA_CPU",
    "numa_cpu_sample",
    "numa_cpu_by_node",
    "Frame",
]

REQUEST_STAGES = ("ingress", "queue", "prefill", "decode", "egress", "e2e")
DEVICE_STAGES = ("launch", "h2d", "d2h", "sync", "alloc", "collective")
HOST_STAGES = ("runq", "block_io")
STAGES = REQUEST_STAGES + DEVICE_STAGES + HOST_STAGES
STAGE_TIER = {
    **{s: "request" for s in REQUEST_STAGES},
    **{s: "device" for s in DEVICE_STAGES},
    **{s: "host" for s in HOST_STAGES},
}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One numeric field: exported as ``<prefix><name>``; ``counter`` fields are cumulative."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str


GPU_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("utilization_ratio", "gauge", "Fraction of time a kernel ran on the GPU (0-1)."),
    FieldSpec("serving_utilization_ratio", "gauge",
              "Fraction of time a kernel ran on a GPU that a process of a configured workload uses (0-1); "
              "absent on GPUs no workload uses."),
    FieldSpec("backlog_utilization_ratio", "gauge",
              "Fraction of time a kernel ran on a GPU whose serving replica has requests waiting or running "
              "(0-1); absent on other GPUs and where no replica is joined to its GPUs."),
    FieldSpec("foreign_utilization_ratio", "gauge",
              "Fraction of time kernels of processes of no configured workload ran on the GPU (0-1, NVML "
              "per-process samples)."),
    FieldSpec("memory_utilization_ratio", "gauge", "Fraction of time device memory was read or written (0-1)."),
    FieldSpec("memory_used_bytes", "gauge", "Device memory in use, bytes."),
    FieldSpec("memory_total_bytes", "gauge", "Device memory installed, bytes."),
    FieldSpec("sm_clock_hertz", "gauge", "SM clock, hertz."),
    FieldSpec("memory_clock_hertz", "gauge", "Memory clock, hertz."),
    FieldSpec("power_watts", "gauge", "Power draw, watts."),
    FieldSpec("temperature_celsius", "gauge", "GPU die temperature, degrees Celsius."),
    FieldSpec("throttle_reasons", "gauge", "Active clock throttle reasons, NVML bit mask."),
    FieldSpec("pcie_rx_bytes_per_second", "gauge", "PCIe receive throughput, bytes per second."),
    FieldSpec("pcie_tx_bytes_per_second", "gauge", "PCIe transmit throughput, bytes per second."),
    FieldSpec("nvlink_rx_bytes_per_second", "gauge", "NVLink receive throughput over all links, bytes per second."),
    FieldSpec("nvlink_tx_bytes_per_second", "gauge", "NVLink transmit throughput over all links, bytes per second."),
    FieldSpec("nvlink_rx_bytes_total", "counter", "NVLink bytes received over all links."),
    FieldSpec("nvlink_tx_bytes_total", "counter", "NVLink bytes transmitted over all links."),
    FieldSpec("xid_errors_total", "counter", "XID error events seen."),
    FieldSpec("ecc_corrected_errors_total", "counter", "Corrected (single-bit) ECC errors, volatile."),
    FieldSpec("ecc_uncorrected_errors_total", "counter", "Uncorrected (double-bit) ECC errors, volatile."),
    FieldSpec("retired_pages", "gauge", "Device memory pages retired or pending retirement."),
)
GPU_FIELD_INDEX = {f.name: i for i, f in enumerate(GPU_FIELDS)}

# NVML clocks-event (throttle) reason bits -> stable label value (nvml.h nvmlClocksThrottleReason*).
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

HOST_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("cpu_utilization_ratio", "gauge", "Host CPU busy fraction over all cores (0-1)."),
    FieldSpec("memory_used_ratio", "gauge", "Host memory in use, fraction of total (0-1)."),
    FieldSpec("memory_used_bytes", "gauge", "Host memory in use, bytes."),
    FieldSpec("memory_total_bytes", "gauge", "Host memory installed, bytes."),
)

WORKLOAD_GAUGES: tuple[FieldSpec, ...] = (
    FieldSpec("queue_depth", "gauge", "Requests waiting to be scheduled."),
    FieldSpec("running_requests", "gauge", "Requests in the running batch."),
    FieldSpec("kv_cache_usage_ratio", "gauge", "KV-cache blocks in use, fraction (0-1)."),
)
WORKLOAD_COUNTERS: tuple[FieldSpec, ...] = (
    FieldSpec("requests_total", "counter", "Requests finished."),
    FieldSpec("request_errors_total", "counter", "Requests finished with an error."),
    FieldSpec("preemptions_total", "counter", "Requests preempted (KV-cache recompute or swap)."),
    FieldSpec("tokens_generated_total", "counter", "Output tokens generated."),
)


@dataclass(frozen=True)
class BucketLayout:
    """Exported histogram buckets: finite ``le`` edges in seconds (ascending) plus +Inf."""

    edges: tuple[float, ...]

    @property
    def n(self) -> int:
        """Number of buckets, +Inf included."""
        return len(self.edges) + 1

    def counts_of(self, values_s: np.ndarray | Sequence[float]) -> np.ndarray:
        """Per-bucket counts of latencies in seconds: a value equal to an edge lands in that bucket."""
        idx = np.searchsorted(np.asarray(self.edges), np.asarray(values_s, dtype=np.float64), side="left")
        return np.bincount(idx, minlength=self.n).astype(np.uint64)

    def uppers(self) -> np.ndarray:
        """Upper edges including +Inf, seconds."""
        return np.append(np.asarray(self.edges, dtype=np.float64), np.inf)


@dataclass(slots=True)
class HistDelta:
    """Per-bucket (non-cumulative) counts and the exact sum (seconds) seen in one tick."""

    counts: np.ndarray
    sum: float

    @property
    def count(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static identity of a GPU (labels ``gpu``, ``uuid``, ``model``, ``pci_bus_id``)."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str


@dataclass(slots=True)
class GpuFrame:
    """Per-GPU values for one tick: ``values[i, GPU_FIELD_INDEX[name]]``, NaN = not available."""

    info: tuple[GpuInfo, ...]
    values: np.ndarray
    healthy: np.ndarray

    @classmethod
    def empty(cls, info: Sequence[GpuInfo]) -> GpuFrame:
        n = len(info)
        return cls(tuple(info), np.full((n, len(GPU_FIELDS)), np.nan), np.ones(n, dtype=bool))

    def set(self, gpu: int, name: str, value: float) -> None:
        self.values[gpu, GPU_FIELD_INDEX[name]] = value


@dataclass(frozen=True, slots=True)
class Sample:
    """A latest-only sample exported as is (per-link or per-process detail not kept in history)."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float


NUMA_CPU = "sits_host_numa_cpu_utilization_ratio"


def numa_cpu_sample(node: int, busy: float) -> Sample:
    """The busy fraction of one NUMA node's CPUs (what the scheduler reads to find contended host cores)."""
    return Sample(NUMA_CPU, "gauge", "CPU busy fraction of one NUMA node's cores (0-1).",
                  (("numa_node", str(node)),), float(busy))


def numa_cpu_by_node(samples: Iterable[Sample]) -> dict[int, float]:
    """NUMA node -> CPU busy fraction from a tick's samples (empty when no source reports it)."""
    return {int(dict(s.labels)["numa_node"]): s.value for s in samples if s.name == NUMA_CPU}


@dataclass(slots=True)
class Frame:
    """One tick.  ``ts`` is the source clock (simulated time in the demo), ``interval`` its length."""

    ts: float
    interval: float
    hists: dict[tuple[str, str], HistDelta] = field(default_factory=dict)
    gpu: GpuFrame | None = None
    host: dict[str, float] = field(default_factory=dict)
    workload_gauges: dict[tuple[str, str], float] = field(default_factory=dict)
    counters: dict[tuple[str, str], float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def add_hist(self, stage: str, workload: str, counts: np.ndarray, total_s: float) -> None:
        """Add bucket-count deltas (on the exported layout) for one (stage, workload)."""
        key = (stage, workload)
        cur = self.hists.get(key)
        if cur is None:
            self.hists[key] = HistDelta(np.asarray(counts, dtype=np.uint64).copy(), float(total_s))
        else:
            cur.counts += np.asarray(counts, dtype=np.uint64)
            cur.sum += float(total_s)

    def add_values(self, stage: str, workload: str, values_s: np.ndarray, layout: BucketLayout) -> None:
        """Add individual latencies (seconds); used by the simulator and tests."""
        values = np.asarray(values_s, dtype=np.float64)
        if values.size:
            self.add_hist(stage, workload, layout.counts_of(values), float(values.sum()))

    def add_counter(self, name: str, workload: str, delta: float) -> None:
        key = (name, workload)
        self.counters[key] = self.counters.get(key, 0.0) + float(delta)

    def add_gauge(self, key: tuple[str, str], value: float) -> None:
        """A workload gauge from one more replica: counts add up, a ``*_ratio`` keeps the highest."""
        prev = self.workload_gauges.get(key)
        self.workload_gauges[key] = (value if prev is None
                                     else max(prev, value) if key[0].endswith("_ratio") else prev + value)

    def merge(self, part: Frame) -> None:
        """Add another source's part of this tick (taking its objects, not copies): histograms and
        counters add up, a workload gauge from several replicas adds up (a ``*_ratio`` keeps the
        highest), GPU data and host values replace, samples and errors are added."""
        if not self.hists:
            self.hists = part.hists
        else:
            for key, delta in part.hists.items():
                cur = self.hists.get(key)
                if cur is None:
                    self.hists[key] = delta
                else:
                    cur.counts += delta.counts
                    cur.sum += delta.sum
        if part.gpu is not None:
            self.gpu = part.gpu
        self.host.update(part.host)
        for key, value in part.workload_gauges.items():
            self.add_gauge(key, value)
        if not self.counters:
            self.counters = part.counters
        else:
            for key, value in part.counters.items():
                self.counters[key] = self.counters.get(key, 0.0) + value
        self.samples += part.samples
        self.errors.update(part.errors)
