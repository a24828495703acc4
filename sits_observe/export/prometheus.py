"""Prometheus exposition of host, workload and subsystem metrics, read at scrape time.

Subsystem metrics come as neutral :class:`~sits_observe.frame.Sample` records; a provider that raises, or
gives a sample the exposition cannot render (see :func:`~sits_observe.store.check.malformed_samples`), is
counted in ``sits_source_errors_total{source}`` and the scrape goes on without its samples.  The two large
families (stage histograms and per-GPU fields) are rendered by :mod:`.fasttext`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..errors import StoreError
from ..frame import HOST_FIELDS, WORKLOAD_COUNTERS, WORKLOAD_GAUGES, Sample
from ..store import SeriesStore
from ..store.check import malformed_samples

__all__ = ["StoreCollector", "samples_to_families"]

log = logging.getLogger(__name__)

_HELP = {f.name: f.help for f in (*WORKLOAD_GAUGES, *WORKLOAD_COUNTERS)}
_first, _second = itemgetter(0), itemgetter(1)
_WARNED_MAX = 1000  # family names warned of once each (past it, no more warnings)


def _exposed_name(name: str, kind: str) -> str:
    """The name a sample's lines carry: prometheus_client writes a counter ``x`` as ``x_total``."""
    return name if kind != "counter" or name.endswith("_total") else f"{name}_total"


def _family(name: str, kind: str, help_: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_, labels=labels)
    return GaugeMetricFamily(name, help_, labels=labels)


def samples_to_families(samples: Iterable[Sample], taken: frozenset[str] = frozenset(),
                        on_conflict: Callable[[str, str], None] | None = None) -> list[Metric]:
    """Group neutral samples by name into metric families; the first sample of a name sets its kind and label
    names.  A later sample of another kind or other label names, one repeating a series already given, one giving
    a label twice and one whose name is in ``taken`` (rendered elsewhere) is left out and passed to
    ``on_conflict(name, why)``: one of them had its labels renamed (a missing one exported as "", an extra one
    dropped, two series made one) or wrote a second HELP and TYPE of one family, which promtool refuses."""
    families: dict[str, tuple[Metric, str, tuple[str, ...], set[tuple[str, ...]]]] = {}
    for s in samples:
        exposed = _exposed_name(s.name, s.kind)
        names = tuple(map(_first, s.labels))
        entry = families.get(exposed)
        if entry is None and exposed not in taken and len(set(names)) == len(names):
            entry = families[exposed] = (_family(s.name, s.kind, s.help, list(names)), s.kind, names, set())
        if entry is None:
            why = "is rendered by another part of /metrics" if exposed in taken else f"gives a label twice: {names}"
        elif entry[1] != s.kind:
            why = f"is a {entry[1]} and a {s.kind}"
        elif names != entry[2] and sorted(names) != sorted(entry[2]):
            why = f"has labels {list(entry[2])} and {list(names)}"
        else:
            fam, _, order, seen = entry
            key = tuple(map(_second, s.labels)) if names == order else tuple(map(dict(s.labels).get, order))
            if key not in seen:
                seen.add(key)
                fam.add_metric(key, s.value)
                continue
            why = f"gives the series {dict(zip(order, key))} twice"
        if on_conflict is not None:
            on_conflict(s.name, why)
    return [f for f, _, _, _ in families.values()]


class StoreCollector(Collector):
    """Everything the daemon exports, rendered on demand; ``taken``: the names rendered by :mod:`.fasttext`."""

    def __init__(self, store: SeriesStore, providers: Callable[[], Iterable[tuple[str, Any]]],
                 on_error: Callable[[str, BaseException], None] | None = None,
                 taken: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.providers = providers
        self.on_error = on_error
        self.taken = taken
        self._warned: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        yield from samples_to_families([*self._host_and_workloads(), *self.store.latest_samples(), *self._provided()],
                                       self.taken, self._conflict)

    def _host_and_workloads(self) -> list[Sample]:
        host = self.store.host_latest()
        samples = [Sample(f"sits_host_{spec.name}", "gauge", spec.help, (), host[spec.name])
                   for spec in HOST_FIELDS if spec.name in host]
        samples += [Sample(f"sits_workload_{n}", "gauge", _HELP.get(n, n.replace("_", " ")), (("workload", w),), v)
                    for n, w, v in self.store.gauge_latest()]
        samples += [Sample(f"sits_workload_{n}", "counter", _HELP.get(n, n.replace("_", " ")), (("workload", w),), v)
                    for n, w, v in self.store.counter_totals()]
        return samples

    def _provided(self) -> Iterator[Sample]:
        for name, provider in self.providers():
            try:
                samples = list(provider.metrics())
                if (why := malformed_samples(samples)) is not None:
                    raise StoreError(f"metrics of {name}: {why}; none of its samples exported")
                yield from samples
            except Exception as exc:  # one bad provider never fails the scrape
                log.debug("metrics of %s failed: %s", name, exc)
                if self.on_error:
                    self.on_error(name, exc)

    def _conflict(self, name: str, why: str) -> None:
        if name not in self._warned and len(self._warned) < _WARNED_MAX:
            self._warned.add(name)
            log.warning("/metrics: a sample named %s left out: the family %s (warned once per name)", name, why)
