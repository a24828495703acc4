"""Prometheus exposition of host, workload and subsystem metrics, read at scrape time.

Subsystem metrics come as neutral :class:`~sits_observe.frame.Sample` records; a provider that raises
is counted in ``sits_source_errors_total{source}`` and the scrape goes on.  The two large families
(stage histograms and per-GPU fields) are rendered by :mod:`.fasttext`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..frame import HOST_FIELDS, WORKLOAD_COUNTERS, WORKLOAD_GAUGES, Sample
from ..store import SeriesStore

__all__ = ["StoreCollector", "samples_to_families"]

log = logging.getLogger(__name__)

_HELP = {f.name: f.help for f in (*WORKLOAD_GAUGES, *WORKLOAD_COUNTERS)}


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
        yield from self._host_and_workloads()
        yield from samples_to_families([*self.store.latest_samples(), *self._provided()])

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

