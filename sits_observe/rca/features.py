"""The classifier's features: names the SeriesStore computes (``store.window(FEATURES, last)``).

The dataset generator writes exactly these columns from a SeriesStore fed by the simulator, and the
daemon reads the same names from its own store, so training and inference see one definition.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ..frame import GpuInfo
from ..store.features import feature_series
from ..store.series import SeriesStore

__all__ = ["FEATURES", "OPTIONAL_FEATURES", "OPTIONAL_GROUPS", "gpu_field_of", "gpu_occluded", "optional_columns",
           "stage_of"]

# Per-call latencies (device and host stages) carry most of the signal and do not scale with load or
# hardware the way throughput and power do; GPU aggregates are kept to those that mean the same on any box.
_STAGE_STATS = {
    "e2e": ("p50", "p99", "tail", "rate"),
    "queue": ("p50", "p99"),
    "ingress": ("p50", "p99"),
    "prefill": ("p50", "p99"),
    "decode": ("p50", "p99"),
    "launch": ("p50", "p99"),
    "sync": ("p50", "p99"),
    "h2d": ("p50", "p99"),
    "d2h": ("p99",),
    "alloc": ("mean", "rate"),
    "collective": ("p50", "p99"),
    "runq": ("p50", "p99"),
}
_GPU_STATS = {
    "utilization_ratio": ("mean", "max", "std"),
    "serving_utilization_ratio": ("min", "mean"),  # the idlest GPU a workload uses: a frozen serving loop
    "foreign_utilization_ratio": ("max",),  # a co-tenant's kernels, named by NVML's per-process samples
    "backlog_utilization_ratio": ("min", "mean"),  # GPUs whose replica has work: idle only if its loop is not running
    "memory_utilization_ratio": ("mean", "max"),
    "memory_used_bytes": ("mean", "max"),
    "sm_clock_hertz": ("mean",),
    "power_watts": ("mean", "max"),
    "temperature_celsius": ("max",),
    "throttle_reasons": ("max",),
    "nvlink_rx_bytes_per_second": ("mean", "max"),
    "pcie_rx_bytes_per_second": ("mean", "max"),
}
FEATURES: tuple[str, ...] = (
    *(f"stage.{s}.{stat}" for s, stats in _STAGE_STATS.items() for stat in stats),
    "workload.queue_depth.sum",
    "workload.running_requests.sum",
    "workload.kv_cache_usage_ratio.sum",
    "workload.preemptions_total.rate",
    "workload.request_errors_total.rate",
    *(f"gpu.{f}.{agg}" for f, aggs in _GPU_STATS.items() for agg in aggs),
    "host.cpu_utilization_ratio",
    "host.memory_used_ratio",
)

# Features not every host has, in groups by what they need: NVML's per-process fields (absent with the
# DCGM backend and where no workload is configured) and servers' backlogs joined to their GPUs (absent
# without configured servers on this host).  Training hides each group on its own
# (``rca train --optional-dropout``).
OPTIONAL_GROUPS: tuple[frozenset[str], ...] = tuple(
    frozenset(f for f in FEATURES if f.startswith(prefixes)) for prefixes in (
        ("gpu.serving_utilization_ratio.", "gpu.foreign_utilization_ratio."),
        ("gpu.backlog_utilization_ratio.",)))
OPTIONAL_FEATURES: frozenset[str] = frozenset().union(*OPTIONAL_GROUPS)


def optional_columns(features: tuple[str, ...] | list[str]) -> list[np.ndarray]:
    """Per optional group with a column among ``features``, the indices of its columns."""
    return [cols for group in OPTIONAL_GROUPS
            if len(cols := np.array([j for j, f in enumerate(features) if f in group], dtype=np.int64))]


def stage_of(feature: str) -> str | None:
    """``stage.<stage>[@workload].<stat>`` -> ``<stage>``; None for other kinds."""
    kind, _, rest = feature.partition(".")
    return rest.rpartition(".")[0].partition("@")[0] if kind == "stage" else None


def gpu_field_of(feature: str) -> str | None:
    """``gpu.<field>.<agg>`` -> ``<field>``; None for other kinds."""
    kind, _, rest = feature.partition(".")
    return rest.rpartition(".")[0] if kind == "gpu" else None


# How far back a GPU's own normal reaches: long enough that a fault of a few minutes is a minority of it,
# short enough that a GPU whose role changed (a shard moved off or onto it) has its new normal soon.
NORMAL_TICKS = 600


class _GpuOccluded:
    """Stands in for the store where GPU windows are read: the GPUs of ``normal`` (a mask) replaced by their own
    normal."""

    def __init__(self, store: SeriesStore, normal: np.ndarray, normals: dict[str, np.ndarray]) -> None:
        self._store = store
        self._normal = normal
        self._normals = normals

    def reading(self) -> threading.RLock:
        return self._store.reading()

    def gpu_info(self) -> tuple[GpuInfo, ...]:
        return self._store.gpu_info()

    def gpu_window(self, field: str, last: int | None = None) -> np.ndarray:
        vals = self._store.gpu_window(field, last)
        if field not in self._normals:
            with warnings.catch_warnings():  # a GPU that never reported the field: NaN is the right answer
                warnings.simplefilter("ignore", RuntimeWarning)
                self._normals[field] = np.nanmedian(self._store.gpu_window(field, NORMAL_TICKS), axis=0)
        # only readings are put back: a GPU without any (removed, or its source out) is given none, else its normal
        # moved the aggregates and a GPU that reported nothing was named as a culprit
        put = vals[:, self._normal]
        vals[:, self._normal] = np.where(np.isnan(put), np.nan, self._normals[field][self._normal])
        return vals


def gpu_occluded(store: SeriesStore, features: tuple[str, ...], raw: np.ndarray, last: int) -> np.ndarray:
    """``(2G + 1, n, F)``: ``raw`` with every GPU feature recomputed with GPUs put back to their own normal (their
    median over the last :data:`NORMAL_TICKS` ticks, as a feature's occlusion uses the host baseline): row ``g``
    GPU ``g`` alone, row ``G + g`` every GPU but ``g``, the last row every GPU.

    Both ways, as a fault often hits several GPUs (a tensor-parallel pair): putting one of two hot GPUs back
    leaves the other driving the aggregates (a maximum, a mean), so only keeping one as it is, with the rest
    back to normal, shows what it alone drives.  Its own normal, not the other GPUs': an idle spare GPU is
    normal when idle, and a GPU that became busy because of a co-tenant is not.  The GPU aggregates come from
    the store's own feature code (:func:`feature_series`), so they are computed exactly as in ``raw``.
    """
    gpus = len(store.gpu_info())
    cols = [j for j, f in enumerate(features) if gpu_field_of(f) is not None]
    eye = np.eye(gpus, dtype=bool)
    masks = np.concatenate([eye, ~eye, np.ones((1, gpus), dtype=bool)])
    out = np.repeat(raw[None], len(masks), axis=0)
    normals: dict[str, np.ndarray] = {}
    for v, mask in enumerate(masks):
        shim = _GpuOccluded(store, mask, normals)
        for j in cols:
            out[v, :, j] = feature_series(shim, features[j], last)  # type: ignore[arg-type]
    return out
