"""Inference-server sources: read vLLM and Triton /metrics pages into request-stage deltas per workload.

Each configured server is one Source (``name = "<kind>:<workload>"``) read every tick, its page fetched in the
background together with the other sources' (:mod:`.pagefetch`).  Cumulative series
become per-tick deltas; the first page only sets the baseline.  A series lower than on the previous page
restarted (the server, or its model reloaded): its delta is then the new value (what accumulated since
the restart), never negative.  vLLM histograms are re-bucketed onto the exported layout conservatively
(each source bucket goes to the first exported bucket whose edge is at or above the source bucket's
upper edge, so no observation lands in a bucket below its true one).  Triton publishes only cumulative
durations and counts: each tick's requests are put in the bucket of that tick's mean latency, with the
exact sum.
After a failed read (the fetch, or a page that does not read) the source waits 1, 2, 4 ... 60 s before the
next try.  Several servers may report one workload (its replicas): counters and histograms add up, count gauges
too, ratio gauges take the highest replica's.  Each read also tells the :class:`~.replicas.ReplicaBoard` the
server's backlog (requests waiting plus running; Triton: pending), so the NVML source can tell a replica's GPUs
that should be busy from idle ones.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np

from ..errors import CollectorError, StillDown
from ..frame import BucketLayout, Frame
from .config import ServerConfig, shown_url
from .cumulative import COUNT_MAX, CUMULATIVE_SUFFIXES, Cumulative, rebucket
from .pagefetch import PageFetch
from .promtext import PageParser, Series, fetch_page
from .replicas import ReplicaBoard

__all__ = ["ServerSource", "VLLM_STAGES", "TRITON_STAGES"]

# vLLM histogram -> stage; time_to_first_token stands in for prefill on versions without prefill time.
VLLM_STAGES = (
    ("vllm:e2e_request_latency_seconds", "e2e"),
    ("vllm:request_queue_time_seconds", "queue"),
    ("vllm:request_prefill_time_seconds", "prefill"),
    ("vllm:request_decode_time_seconds", "decode"),
)
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_GAUGES = (("vllm:num_requests_running", "running_requests", False),
               ("vllm:num_requests_waiting", "queue_depth", False),
               ("vllm:kv_cache_usage_perc", "kv_cache_usage_ratio", True),
               ("vllm:gpu_cache_usage_perc", "kv_cache_usage_ratio", True))  # name before vLLM V1
VLLM_COUNTERS = (("vllm:request_success_total", "requests_total"),
                 ("vllm:num_preemptions_total", "preemptions_total"),
                 ("vllm:generation_tokens_total", "tokens_generated_total"))
# Triton cumulative duration (microseconds) -> stage; divided by the successful request count.
TRITON_STAGES = (
    ("nv_inference_request_duration_us", "e2e"),
    ("nv_inference_queue_duration_us", "queue"),
    ("nv_inference_compute_input_duration_us", "ingress"),
    ("nv_inference_compute_infer_duration_us", "decode"),
    ("nv_inference_compute_output_duration_us", "egress"),
)
TRITON_SUCCESS, TRITON_FAILURE = "nv_inference_request_success", "nv_inference_request_failure"
TRITON_PENDING = "nv_inference_pending_request_count"  # a gauge, whatever its suffix says
TRITON_COUNTERS = (("nv_inference_count", "inferences_total"), ("nv_inference_exec_count", "executions_total"))
# a replica's requests waiting or running (Triton exports only those waiting)
BACKLOG = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
           "triton": (TRITON_PENDING,)}
# every series a source reads (the rest of a page is only split into lines, not counted or checked: an idle Triton
# model's NaN latency summary, vLLM's per-LoRA info series)
_VLLM_HISTS = [name for name, _ in VLLM_STAGES] + [VLLM_TTFT]
READ = {"vllm": frozenset([f"{h}{s}" for h in _VLLM_HISTS for s in ("_bucket", "_sum", "_count")]
                          + [g[0] for g in VLLM_GAUGES] + [c[0] for c in VLLM_COUNTERS]),
        "triton": frozenset([TRITON_SUCCESS, TRITON_FAILURE, TRITON_PENDING] + [c[0] for c in TRITON_COUNTERS]
                            + [st[0] for st in TRITON_STAGES])}
_MAX_BACKOFF = 60.0


def _label_key(labels: dict[str, str]) -> str:
    """One series' identity within a metric: its labels but ``le``, in order."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "le")


class ServerSource:
    """One vLLM or Triton server (``servers[i]`` in the config)."""

    def __init__(self, config: ServerConfig, layout: BucketLayout, *,
                 clock: Callable[[], float] = time.monotonic, replicas: ReplicaBoard | None = None) -> None:
        self.config = config
        self.layout = layout
        self.clock = clock
        self.name = f"{config.kind}:{config.workload}"
        self.parser = PageParser()
        self.counters = Cumulative()
        self._retry_at = -np.inf
        self._backoff = 0.0
        self._read = READ[config.kind]
        self._model_label = "model_name" if config.kind == "vllm" else "model"
        self._shown = shown_url(config.url)  # for messages, once: the URL does not change
        self._key = f"{self._shown} model={config.model}" if config.model else self._shown
        self.replicas = replicas if replicas is not None and replicas.register(self._key, config.url) else None
        self._fetch = PageFetch(fetch_page, config.url, config.timeout, clock=clock,
                                due=lambda now: now >= self._retry_at)

    def prefetch(self, stop: threading.Event | None = None) -> None:
        """Start this tick's page fetch unless backing off (see :mod:`.pagefetch`)."""
        self._fetch.prefetch(stop)

    def collect(self, frame: Frame) -> None:
        now = self._fetch.tick_time()
        if self.replicas is not None:
            self.replicas.publish(self._key, None)  # until this tick's page says otherwise
        if now < self._retry_at:
            raise StillDown(f"{self.name}: not asked again for {self._retry_at - now:.0f} s (back-off)")
        try:
            self.read(self._fetch.page(), frame)
        except StillDown:  # not waited for (a stop): no failure of the server's
            raise
        except CollectorError:  # a page that does not read too: read each tick, a changing one logged each tick
            self._backoff = min(_MAX_BACKOFF, max(1.0, 2 * self._backoff))
            self._retry_at = now + self._backoff
            raise
        self._backoff = 0.0

    def read(self, text: str, frame: Frame) -> None:
        """Add one page's part to ``frame`` (deltas against the previous page).  A page with a value that cannot
        be is skipped whole before any counter moves (its counts go to the next good page)."""
        series = self.parser.parse(text, self._read.__contains__, source=self._shown)
        for name, samples in series.items():  # NaN fails both comparisons too
            if self._cumulative(name) and not all(0 <= v < COUNT_MAX for _, v in samples):
                raise CollectorError(f"{self._shown}: {name}: a value that is no count (negative, "
                                     "not finite or past 2**53); page skipped, the counters keep the last good one")
            if not all(math.isfinite(v) for _, v in samples):  # the store would refuse the part after the counters
                raise CollectorError(f"{self._shown}: {name}: a value that is not finite; page skipped, the "
                                     "counters keep the last good one")
        kept, part = self.counters.state(), Frame(frame.ts, frame.interval)
        try:
            if self.config.kind == "vllm":
                self._vllm(series, part)
            else:
                self._triton(series, part)
        except Exception:  # nothing of this page is kept, and its counts go to the next good page
            self.counters.restore(kept)
            raise
        frame.merge(part)
        if self.replicas is not None:
            parts = [self._total(series, n) for n in BACKLOG[self.config.kind]]
            known = [v for v in parts if v is not None]
            self.replicas.publish(self._key, sum(known) if known else None)

    # ---- helpers -------------------------------------------------------------------------------

    def _cumulative(self, name: str) -> bool:
        """Whether a series read only counts up: by its suffix, and every Triton one but its queue
        (``nv_inference_request_success``, ``..._duration_us``: counters without a counter's suffix)."""
        return name.endswith(CUMULATIVE_SUFFIXES) or (self.config.kind == "triton" and name != TRITON_PENDING)

    def _entries(self, series: Series, name: str) -> list[tuple[dict[str, str], float]]:
        model = self.config.model
        return [(lab, v) for lab, v in series.get(name, ()) if model is None or lab.get(self._model_label) == model]

    def _total(self, series: Series, name: str) -> float | None:
        entries = self._entries(series, name)
        return sum(v for _, v in entries) if entries else None

    def _increase(self, series: Series, name: str) -> float | None:
        """The increase of a cumulative series since the last page, over all its label sets."""
        parts: dict[str, float] = {}
        for labels, value in self._entries(series, name):
            key = _label_key(labels)
            parts[key] = parts.get(key, 0.0) + value
        return self.counters.summed(name, parts)

    def _counter(self, series: Series, name: str, frame: Frame, counter: str) -> float | None:
        """Add the increase of a cumulative series to ``frame.counters``; returns it."""
        d = self._increase(series, name)
        if d is not None:
            frame.add_counter(counter, self.config.workload, d)
        return d

    # ---- vLLM ----------------------------------------------------------------------------------

    def _vllm(self, series: Series, frame: Frame) -> None:
        wl = self.config.workload
        stages = list(VLLM_STAGES)
        if f"{VLLM_STAGES[2][0]}_count" not in series:
            stages[2] = (VLLM_TTFT, "prefill")
        for name, stage in stages:
            self._histogram(series, name, stage, frame)
        for name, gauge, mean in VLLM_GAUGES:
            entries = self._entries(series, name)
            if entries:
                values = [v for _, v in entries]
                frame.add_gauge((gauge, wl), float(np.mean(values) if mean else np.sum(values)))
        for name, counter in VLLM_COUNTERS:
            self._counter(series, name, frame, counter)

    def _histogram(self, series: Series, name: str, stage: str, frame: Frame) -> None:
        """Each label set's histogram on its own (as ``rate`` takes them), rebucketed and added up."""
        groups: dict[str, dict[float, float]] = {}
        for labels, value in self._entries(series, f"{name}_bucket"):
            if "le" in labels:
                buckets = groups.setdefault(_label_key(labels), {})
                le = self._edge(name, labels["le"])
                buckets[le] = buckets.get(le, 0.0) + value
        sums: dict[str, float] = {}
        for labels, value in self._entries(series, f"{name}_sum"):
            key = _label_key(labels)
            sums[key] = sums.get(key, 0.0) + value
        counts, seconds, keys = np.zeros(self.layout.n, dtype=np.uint64), 0.0, set()
        for key, buckets in groups.items():
            if key not in sums or np.inf not in buckets:  # not a histogram: read as none, its stage had no data
                raise CollectorError(f"{self._shown}: {name}: a histogram without a +Inf bucket or a _sum; page "
                                     "skipped, the counters keep the last good one")
            keys.add(key)
            edges = np.array(sorted(buckets))
            d = self.counters.delta(f"{name}{{{key}}}", np.append([buckets[e] for e in edges], sums[key]))
            if d is None:
                continue
            per_bucket = np.diff(np.concatenate([[0.0], d[:-1]])).clip(min=0)
            counts += rebucket(edges[:-1], np.rint(per_bucket).astype(np.uint64), self.layout)
            seconds += float(d[-1])
        self.counters.keep_only(name, keys)
        if counts.sum() > 0:
            frame.add_hist(stage, self.config.workload, counts, seconds)

    def _edge(self, name: str, le: str) -> float:
        """A bucket's upper edge from its ``le`` label (``+Inf`` included)."""
        try:
            edge = float(le)
        except ValueError:
            edge = math.nan
        if math.isnan(edge):
            raise CollectorError(f"{self._shown}: {name}_bucket: le={le[:40]!r} is not a bucket edge; page skipped, "
                                 "the counters keep the last good one")
        return edge

    # ---- Triton --------------------------------------------------------------------------------

    def _triton(self, series: Series, frame: Frame) -> None:
        wl = self.config.workload
        ok = self._counter(series, TRITON_SUCCESS, frame, "requests_total")
        failed = self._counter(series, TRITON_FAILURE, frame, "requests_total")
        if failed is not None:
            frame.add_counter("request_errors_total", wl, failed)
        for name, counter in TRITON_COUNTERS:
            self._counter(series, name, frame, counter)
        pending = self._total(series, TRITON_PENDING)
        if pending is not None:
            frame.add_gauge(("queue_depth", wl), pending)
        n = round(ok or 0)  # requests, from a counter that should be whole; 0: no request to put a mean on
        for name, stage in TRITON_STAGES:
            d = self._increase(series, name)
            if d is None or n < 1 or d <= 0:
                continue
            seconds = d / 1e6
            counts = self.layout.counts_of([seconds / n]) * np.uint64(n)
            frame.add_hist(stage, wl, counts, seconds)
