"""Direct text rendering of the two large families: stage histograms and per-GPU fields.

prometheus_client's generic renderer costs microseconds per sample line (label validation and
escaping each time); at 136 histogram series x 23 buckets, or 64 GPUs x 19 fields, that alone exceeds
a 20 ms scrape budget.  Label strings are built once per series here and each scrape only formats
numbers.  Output is Prometheus text format 0.0.4, checked by ``promtool check metrics`` in tests.
"""

from __future__ import annotations

import numpy as np

from ..frame import GPU_FIELDS, THROTTLE_REASONS, GpuInfo
from ..store import SeriesStore

__all__ = ["HistogramText", "GpuText", "STAGE_HELP", "TAKEN"]

STAGE_HELP = (
    "Per-stage latency in seconds by workload. Request stages are per request; device stages (launch, "
    "h2d, d2h, sync, alloc, collective) are host-side CUDA driver / NCCL call durations measured by "
    "uprobes (enqueue time for async calls); host stages are run-queue and block IO latency."
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _le(edge: float) -> str:
    """Exact (the shortest text that reads back as ``edge``): ``.9g`` wrote 2.550136832 s as 2.55013683, below an
    observation of 2.550136831 s that the bucket holds."""
    return "+Inf" if np.isinf(edge) else repr(float(edge))


def _num(v: float) -> str:
    return repr(float(v))


class HistogramText:
    """``sits_stage_latency_seconds`` from the store's cumulative totals."""

    NAME = "sits_stage_latency_seconds"

    def __init__(self, store: SeriesStore, stale_after: float) -> None:
        self.store = store
        self.stale_after = stale_after
        self._les = [_le(e) for e in store.layout.uppers()]
        self._prefixes: dict[tuple[str, str], tuple[list[str], str]] = {}

    def _prefix(self, stage: str, workload: str) -> tuple[list[str], str]:
        key = (stage, workload)
        cached = self._prefixes.get(key)
        if cached is None:
            labels = f'stage="{_escape(stage)}",workload="{_escape(workload)}"'
            cached = ([f'{self.NAME}_bucket{{{labels},le="{le}"}} ' for le in self._les], labels)
            self._prefixes[key] = cached
        return cached

    def render(self) -> str:
        out = [f"# HELP {self.NAME} {STAGE_HELP}\n# TYPE {self.NAME} histogram\n"]
        for stage, workload, cum, total, _ in self.store.hist_totals(self.stale_after):
            prefixes, labels = self._prefix(stage, workload)
            running = np.cumsum(cum).tolist()
            out.extend(f"{p}{c}.0\n" for p, c in zip(prefixes, running))
            out.append(f"{self.NAME}_count{{{labels}}} {running[-1]}.0\n{self.NAME}_sum{{{labels}}} {total!r}\n")
        return "".join(out)


class GpuText:
    """``sits_gpu_*`` per-GPU fields, ``sits_gpu_healthy`` and one throttle series per active reason."""

    def __init__(self, store: SeriesStore) -> None:
        self.store = store
        # the GPU set and its label strings, replaced as one: scrapes run in several threads at once
        self._cached: tuple[tuple[GpuInfo, ...], list[str]] = ((), [])

    def _gpu_labels(self, info: tuple[GpuInfo, ...]) -> list[str]:
        known, labels = self._cached
        if info != known:
            labels = [f'gpu="{g.index}",uuid="{_escape(g.uuid)}",model="{_escape(g.model)}",'
                      f'pci_bus_id="{_escape(g.pci_bus_id)}"' for g in info]
            self._cached = (info, labels)
        return labels

    def render(self) -> str:
        latest = self.store.gpu_latest()
        if latest is None:
            return ""
        labels = self._gpu_labels(latest.info)
        out = ["# HELP sits_gpu_healthy 1 when the GPU answered its last sample, 0 when lost; "
               "absent while the GPU source is down.\n# TYPE sits_gpu_healthy gauge\n"]
        out.extend(f"sits_gpu_healthy{{{lab}}} {1.0 if ok else 0.0}\n" for lab, ok in zip(labels, latest.healthy))
        for j, spec in enumerate(GPU_FIELDS):
            col = latest.values[:, j]
            present = ~np.isnan(col)
            if not present.any():
                continue
            if spec.name == "throttle_reasons":
                out.append(self._throttle(labels, col, spec.help))
                continue
            name = f"sits_gpu_{spec.name}"
            out.append(f"# HELP {name} {spec.help}\n# TYPE {name} {spec.kind}\n")
            out.extend(f"{name}{{{lab}}} {_num(v)}\n" for lab, v, ok in zip(labels, col.tolist(), present) if ok)
        return "".join(out)

    @staticmethod
    def _throttle(labels: list[str], masks: np.ndarray, help_: str) -> str:
        out = [f"# HELP sits_gpu_throttle_reasons {help_} One series per active reason.\n"
               "# TYPE sits_gpu_throttle_reasons gauge\n"]
        for lab, mask in zip(labels, masks.tolist()):
            if mask == mask:  # not NaN
                out.extend(f'sits_gpu_throttle_reasons{{{lab},reason="{reason}"}} 1.0\n'
                           for bit, reason in THROTTLE_REASONS if int(mask) & bit)
        return "".join(out)


# every name these render (a GPU family only while some GPU reports it): no other sample may use one
TAKEN = frozenset({HistogramText.NAME, *(f"{HistogramText.NAME}_{part}" for part in ("bucket", "count", "sum")),
                   "sits_gpu_healthy", *(f"sits_gpu_{f.name}" for f in GPU_FIELDS)})
