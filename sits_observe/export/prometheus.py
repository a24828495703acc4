"""Prometheus exposition: a custom collector that reads the store and the subsystems at scrape time.

Histograms are built from the store's cumulative totals (no ``observe()`` per event); gauges from the
latest tick; subsystem metrics from their neutral :class:`~sits_observe.frame.Sample` records.  A
provider that raises is counted in ``sits_source_errors_total{source}`` and the scrape goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..frame import GPU_FIELDS, HOST_FIELDS, THROTTLE_REASONS, WORKLOAD_COUNTERS, WORKLOAD_GAUGES, Sample
from ..store import SeriesStore

__all__ = ["StoreCollector", "HistogramText", "samples_to_families", "STAGE_HELP"]

log = logging.getLogger(__name__)

STAGE_HELP = (
    "Per-stage latency in seconds by workload. Request stages are per request; device stages (launch, "
    "h2d, d2h, sync, alloc, collective) are host-side CUDA driver / NCCL call durations measured by "
    "uprobes (enqueue time for async calls); host stages are run-queue and block IO latency."
)
_GPU_LABELS = ["gpu", "uuid", "model", "pci_bus_id"]
_HELP = {f.name: f.help for f in (*WORKLOAD_GAUGES, *WORKLOAD_COUNTERS)}


def _le(edge: float) -> str:
    return "+Inf" if np.isinf(edge) else f"{edge:.9g}"


def _family(name: str, kind: str, help_: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_, labels=labels)
    return GaugeMetricFamily(name, help_, labels=labels)


def samples_to_families(samples: Iterable[Sample]) -> list[Metric]:
    """Group neutral samples by name into metric families (label names from the first sample)."""
    families: dict[str, tuple[Metric, list[str]]] = {}
    for s in samples:
        entry = families.get(s.name)
        if entry is None:
            names = [k for k, _ in s.labels]
            entry = (_family(s.name, s.kind, s.help, names), names)
            families[s.name] = entry
        fam, names = entry
        values = dict(s.labels)
        fam.add_metric([str(values.get(n, "")) for n in names], s.value)
    return [f for f, _ in families.values()]


class StoreCollector(Collector):
    """Everything the daemon exports, rendered on demand."""

    def __init__(self, store: SeriesStore, providers: Callable[[], Iterable[tuple[str, Any]]],
                 stale_after: float = 600.0, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.store = store
        self.providers = providers
        self.stale_after = stale_after
        self.on_error = on_error

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        yield from self._host_and_workloads()
        yield from samples_to_families([*self.store.latest_samples(), *self._provided()])

    def _gpus(self) -> Iterator[Metric]:
        latest = self.store.gpu_latest()
        if latest is None:
            return
        labels = [[str(g.index), g.uuid, g.model, g.pci_bus_id] for g in latest.info]
        healthy = GaugeMetricFamily("sits_gpu_healthy", "1 when the GPU answered its last sample, 0 when lost.",
                                    labels=_GPU_LABELS)
        for lab, ok in zip(labels, latest.healthy):
            healthy.add_metric(lab, 1.0 if ok else 0.0)
        yield healthy
        for j, spec in enumerate(GPU_FIELDS):
            col = latest.values[:, j]
            if np.isnan(col).all():
                continue
            if spec.name == "throttle_reasons":
                yield self._throttle(labels, col, spec.help)
                continue
            fam = _family(f"sits_gpu_{spec.name}", spec.kind, spec.help, _GPU_LABELS)
            for lab, v in zip(labels, col):
                if not np.isnan(v):
                    fam.add_metric(lab, float(v))
            yield fam

    @staticmethod
    def _throttle(labels: list[list[str]], masks: np.ndarray, help_: str) -> Metric:
        fam = GaugeMetricFamily("sits_gpu_throttle_reasons", help_ + " One series per active reason.",
                                labels=[*_GPU_LABELS, "reason"])
        for lab, mask in zip(labels, masks):
            if np.isnan(mask):
                continue
            for bit, reason in THROTTLE_REASONS:
                if int(mask) & bit:
                    fam.add_metric([*lab, reason], 1.0)
        return fam

    def _host_and_workloads(self) -> Iterator[Metric]:
        host = self.store.host_latest()
        for spec in HOST_FIELDS:
            if spec.name in host:
                fam = GaugeMetricFamily(f"sits_host_{spec.name}", spec.help)
                fam.add_metric([], host[spec.name])
                yield fam
        samples = [Sample(f"sits_workload_{n}", "gauge", _HELP.get(n, n.replace("_", " ")), (("workload", w),), v)
                   for n, w, v in self.store.gauge_latest()]
        samples += [Sample(f"sits_workload_{n}", "counter", _HELP.get(n, n.replace("_", " ")), (("workload", w),), v)
                    for n, w, v in self.store.counter_totals()]
        yield from samples_to_families(samples)

    def _provided(self) -> Iterator[Sample]:
        for name, provider in self.providers():
            try:
                yield from list(provider.metrics())
            except Exception as exc:  # one bad provider never fails the scrape
                log.debug("metrics of %s failed: %s", name, exc)
                if self.on_error:
                    self.on_error(name, exc)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class HistogramText:
    """Renders ``sits_stage_latency_seconds`` straight from the store's cumulative totals.

    prometheus_client's generic renderer costs a few microseconds per bucket line; at 136 series x 23
    buckets that alone exceeds a 20 ms scrape budget, so the label prefixes of each series are built
    once and each scrape only formats the counts.
    """

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
