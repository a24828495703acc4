"""Device-call and run-queue histograms from mechanism-derived event counts and mean durations.

Sampling every kernel launch (10^5 per second) one by one would cost more than the whole tick budget,
so each (stage, workload) histogram is drawn as one multinomial over the exported buckets: the event
count and the mean of every component come from the mechanism (iterations, launches per iteration,
bytes over bandwidth, run-queue waits); only the spread around each mean is a lognormal shape.
"""

from __future__ import annotations

import math

import numpy as np

from ..frame import BucketLayout, Frame
from .engine import TickStats
from .mechanics import (H2D_PER_ITER, LAUNCHES_DECODE, LAUNCHES_PREFILL, RUNQ_BASE, WAKEUPS_PER_ITER,
                        DeviceTiming)

__all__ = ["StageSampler", "add_shard_stages"]

SYNC_FLOOR = 20e-6  # s, a stream sync that finds the work already done


def _ndtr(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF (Abramowitz & Stegun 7.1.26 erf, |error| < 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


class StageSampler:
    """Collects lognormal components per (stage, workload) and emits them as histogram deltas."""

    def __init__(self, layout: BucketLayout, rng: np.random.Generator) -> None:
        self.layout = layout
        self.rng = rng
        self._log_edges = np.log(np.asarray(layout.edges, dtype=np.float64))
        self._rows: dict[tuple[str, str], int] = {}
        self._comp: list[tuple[int, float, float, float]] = []

    def add(self, stage: str, workload: str, n: float, mean: float, sigma: float) -> None:
        """``n`` events with the given mean duration (s) and lognormal shape ``sigma``."""
        if n <= 0:
            return
        row = self._rows.setdefault((stage, workload), len(self._rows))
        self._comp.append((row, n, max(mean, 1e-9), sigma))

    def emit(self, frame: Frame) -> None:
        """Draw every row's bucket counts and add them to ``frame``; then start empty."""
        if not self._comp:
            return
        comp = np.array(self._comp)
        row, n, mean, sigma = comp[:, 0].astype(np.int64), comp[:, 1], comp[:, 2], comp[:, 3]
        mu = np.log(mean) - sigma * sigma / 2
        cdf = _ndtr((self._log_edges[None, :] - mu[:, None]) / sigma[:, None])
        p = np.diff(cdf, prepend=0.0, append=1.0, axis=1)
        rows = len(self._rows)
        onehot = np.zeros((rows, len(row)))
        onehot[row, np.arange(len(row))] = 1.0
        weights = onehot @ (p * n[:, None])
        totals = np.bincount(row, weights=n, minlength=rows)
        sums = np.bincount(row, weights=n * mean, minlength=rows)
        counts = np.rint(totals).astype(np.int64)
        probs = weights / np.maximum(weights.sum(axis=1, keepdims=True), 1e-300)
        drawn = self.rng.multinomial(counts, probs)
        for (stage, workload), r in self._rows.items():
            if counts[r]:
                frame.add_hist(stage, workload, drawn[r], sums[r] * counts[r] / totals[r])
        self._rows.clear()
        self._comp.clear()


def add_shard_stages(sampler: StageSampler, workload: str, tp: int, layers: int, st: TickStats,
                     tm: DeviceTiming, alloc_calls: int) -> None:
    """The device and run-queue events one shard caused during a tick."""
    iters = st.prefill_iters + st.decode_iters
    launches = tp * layers * (st.decode_iters * LAUNCHES_DECODE + st.prefill_iters * LAUNCHES_PREFILL)
    sampler.add("launch", workload, launches * (1 - tm.launch_slow_share), tm.launch, 0.35)
    sampler.add("launch", workload, launches * tm.launch_slow_share, tm.launch + tm.runq_wait, 0.9)
    wakeups = iters * tp * WAKEUPS_PER_ITER + 4 * len(st.finished_at)
    sampler.add("runq", workload, wakeups * (1 - tm.runq_wait_share), RUNQ_BASE, 0.7)
    sampler.add("runq", workload, wakeups * tm.runq_wait_share, tm.runq_wait, 1.0)
    sampler.add("h2d", workload, iters * tp * H2D_PER_ITER, tm.h2d, 0.45)
    sampler.add("d2h", workload, iters, tm.d2h, 0.45)
    if st.decode_iters:
        gpu_iter = st.decode_gpu_s / st.decode_iters
        sampler.add("sync", workload, st.decode_iters * tp, max(gpu_iter - tm.host_decode, SYNC_FLOOR), 0.25)
    if st.prefill_iters:
        gpu_iter = st.prefill_gpu_s / st.prefill_iters
        sampler.add("sync", workload, st.prefill_iters * tp, max(gpu_iter - tm.host_prefill, SYNC_FLOOR), 0.4)
    if tp > 1 and iters:
        per_iter = 2 * layers * tp
        for n, tokens in ((st.decode_iters, st.decode_tokens), (st.prefill_iters, st.prefill_tokens)):
            if n:
                sampler.add("collective", workload, n * per_iter, tm.coll_fixed + tokens / n * tm.coll_per_token, 0.3)
    sampler.add("alloc", workload, alloc_calls, tm.alloc, 0.6)
