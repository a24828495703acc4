"""Placement scoring and search: which GPUs a shard needing k of them should run on.

Every candidate GPU set gets five terms in [0, 1] (higher is better) and a weighted mean of them:

* ``comm``    slowest link inside the set relative to the fastest link of the topology (75 %) plus the
              mean link (25 %); its weight is scaled by the shard's communication intensity;
* ``memory``  snug fit: 1 - mean fraction of memory left free on the chosen GPUs after the move;
* ``load``    headroom: 1 - mean over the chosen GPUs of max(utilization, memory fraction) after the move;
* ``balance`` 1 - stddev of utilization across all GPUs after the move / 0.5;
* ``numa``    fraction of the set on the shard's NUMA node (or on the set's most common one).

GPUs where the shard's memory does not fit while its old placement still holds memory (make before
break), unhealthy GPUs and GPUs in an in-flight migration are never candidates; the terms describe the
state after the old placement has drained.  Search is exhaustive when the number of k-subsets is at
most ``exact_limit``; otherwise greedy growth from each of ``seeds`` seed GPUs (the best single GPU of
each NUMA node first), adding at each step the GPU that scores best, then local improvement by
single-GPU swaps on the best few sets until no swap helps.  One vectorized scoring function serves both.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..topology import Topology
from .config import ScoreWeights

__all__ = ["TERMS", "GpuLoad", "Request", "Candidate", "Result", "Planner"]

TERMS = ("comm", "memory", "load", "balance", "numa")
_REFINE = 4         # greedy results polished by local improvement
_REPORTED = 16      # candidates kept for the decision record (one span event each)
_CHUNK = 65536      # sets scored per numpy batch


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """Per-GPU state the scorer needs (arrays indexed like ``Topology.gpus``)."""

    util: np.ndarray           # 0-1, latest utilization
    reserved: np.ndarray       # bytes held by placements of the scheduler
    foreign: np.ndarray        # bytes used by anything else (observed - reserved, >= 0)
    eligible: np.ndarray       # healthy and not part of an in-flight migration

    @classmethod
    def idle(cls, topo: Topology) -> GpuLoad:
        n = topo.n
        return cls(np.zeros(n), np.zeros(n), np.zeros(n), np.ones(n, dtype=bool))


@dataclass(frozen=True, slots=True)
class Request:
    """A shard to place: ``load`` is the utilization it adds per GPU, removed from ``source`` GPUs."""

    k: int
    memory: float
    comm: float = 0.0
    numa: int | None = None
    load: float = 0.25
    source: tuple[int, ...] = ()
    exclude: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Candidate:
    gpus: tuple[int, ...]
    score: float
    terms: dict[str, float]


@dataclass(frozen=True, slots=True)
class Result:
    best: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    method: str = "exact"
    evaluated: int = 0
    reason: str = ""


class Planner:
    """Scores GPU sets on one topology with one set of weights."""

    def __init__(self, topo: Topology, weights: ScoreWeights, exact_limit: int = 20000, seeds: int = 32) -> None:
        self.topo = topo
        self.weights = np.array([getattr(weights, t) for t in TERMS], dtype=np.float64)
        self.exact_limit = exact_limit
        self.seeds = seeds
        top = float(topo.bandwidth.max(initial=0.0)) or 1.0  # a host of no GPUs (all on vfio): no links
        self._bw = topo.bandwidth / top
        nodes = {name: i for i, name in enumerate(dict.fromkeys(g.node for g in topo.gpus))}
        self._node = np.array([nodes[g.node] for g in topo.gpus])
        self._numa = np.array([g.numa_node for g in topo.gpus])
        self._group = self._node * (int(self._numa.max(initial=0)) + 1) + self._numa  # (host, NUMA) id
        self._total = np.array([g.memory_total_bytes for g in topo.gpus], dtype=np.float64)

    def place(self, req: Request, load: GpuLoad, method: str = "auto") -> Result:
        """Best set for ``req``; ``method`` is ``auto``, ``exact`` or ``greedy``."""
        ctx = _Context(self, req, load)
        cand = np.flatnonzero(ctx.fits)
        if len(cand) < req.k:
            return Result(None, method="none", reason=(
                f"needs {req.k} GPUs with {req.memory / 2**30:.1f} GiB free each; {len(cand)} of {self.topo.n} "
                "qualify (healthy, not migrating, not excluded, memory fits)"))
        combos = math.comb(len(cand), req.k)
        if method == "exact" or (method == "auto" and combos <= self.exact_limit):
            sets = np.fromiter(itertools.chain.from_iterable(itertools.combinations(cand, req.k)),
                               dtype=np.int64, count=combos * req.k).reshape(combos, req.k)
            scores, terms = ctx.score(sets)
            return _result(sets, scores, terms, "exact", combos)
        return self._greedy(ctx, cand, req.k)

    def _greedy(self, ctx: _Context, cand: np.ndarray, k: int) -> Result:
        single = ctx.extend(np.empty((1, 0), dtype=np.int64), cand)[0]
        order = cand[np.argsort(-single, kind="stable")]
        _, first = np.unique(self._group[order], return_index=True)
        leaders = order[np.sort(first)]
        sets = np.concatenate([leaders, order[~np.isin(order, leaders)]])[: self.seeds, None]
        evaluated = len(cand)
        while sets.shape[1] < k:  # grow every seed by the GPU that scores best with it
            scores = ctx.extend(sets, cand)
            scores[(sets[:, :, None] == cand[None, None, :]).any(axis=1)] = -np.inf
            sets = np.concatenate([sets, cand[scores.argmax(axis=1)][:, None]], axis=1)
            evaluated += scores.size
        sets = np.unique(np.sort(sets, axis=1), axis=0)
        scores, _ = ctx.score(sets)
        polished, n = _improve(ctx, sets[np.argsort(-scores)[:_REFINE]], cand)
        evaluated += n
        sets = np.unique(np.sort(np.concatenate([sets, polished]), axis=1), axis=0)
        scores, terms = ctx.score(sets)
        return _result(sets, scores, terms, "greedy", evaluated + len(sets))

    def score(self, req: Request, load: GpuLoad, gpus: tuple[int, ...]) -> Candidate:
        """Score one given set (e.g. a shard's current GPUs), fit or not."""
        scores, terms = _Context(self, req, load).score(np.array([gpus], dtype=np.int64))
        return Candidate(tuple(int(g) for g in gpus), float(scores[0]), dict(zip(TERMS, map(float, terms[0]))))


class _Context:
    """One request against one load snapshot.

    Every term is a function of additive per-set statistics (sums of per-GPU values, the minimum and sum
    of pair bandwidths, NUMA counts), so a set grown by one GPU is scored from its parent's statistics
    in O(k) instead of O(k^2); full and incremental scoring share :meth:`_combine`.
    """

    def __init__(self, p: Planner, req: Request, load: GpuLoad) -> None:
        self.p = p
        self.req = req
        util = np.nan_to_num(np.asarray(load.util, dtype=np.float64), nan=0.0).copy()
        if req.source:
            util[list(req.source)] = np.maximum(util[list(req.source)] - req.load, 0.0)
        used = np.asarray(load.reserved, dtype=np.float64) + np.asarray(load.foreign, dtype=np.float64)
        # fit is checked while the old placement still holds its memory (make before break) ...
        self.fits = np.asarray(load.eligible, dtype=bool) & (used + req.memory <= p._total)
        if req.exclude:
            self.fits[list(req.exclude)] = False
        # ... the terms describe the state after the old placement has drained
        if req.source:
            used[list(req.source)] = np.maximum(used[list(req.source)] - req.memory, 0.0)
        # a GPU of no memory (one NVML could not open at start: never a candidate) reads as full
        frac = np.divide(used + req.memory, p._total, out=np.ones_like(used), where=p._total > 0)
        # per-GPU additive values: free fraction left, busy fraction, balance delta, NUMA match
        self.free = 1.0 - frac
        self.busy = np.maximum(util + req.load, frac)
        self.dsq = 2 * util * req.load + req.load**2
        self.match = (p._numa == req.numa).astype(np.float64) if req.numa is not None else None
        self.s1, self.s2, self.n = util.sum(), (util**2).sum(), len(util)
        w = p.weights.copy()
        w[0] *= req.comm if req.k > 1 else 0.0
        self.w = w / w.sum() if w.sum() > 0 else w

    def score(self, sets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scores (m,) and terms (m, 5) of sets given as an (m, k) index array."""
        if len(sets) > _CHUNK:
            parts = [self.score(sets[i:i + _CHUNK]) for i in range(0, len(sets), _CHUNK)]
            return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
        k = sets.shape[1]
        if k > 1:
            pairs = self.p._bw[sets[:, :, None], sets[:, None, :]][:, ~np.eye(k, dtype=bool)]
            pmin, psum = pairs.min(axis=1), pairs.sum(axis=1)
        else:
            pmin = psum = np.zeros(len(sets))
        groups = self.p._group[sets]
        mode = (groups[:, :, None] == groups[:, None, :]).sum(axis=2).max(axis=1)
        return self._combine(k, pmin, psum, *(v[sets].sum(axis=1) for v in self._additive()), mode)

    def extend(self, sets: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """Scores (s, c) of each of ``sets`` (s, m) grown by each GPU of ``cand``."""
        m = sets.shape[1]
        if m:
            bw = self.p._bw[sets[:, :, None], cand[None, None, :]]  # (s, m, c): new pairs, both directions
            pmin = bw.min(axis=1)
            psum = 2 * bw.sum(axis=1)
            if m > 1:
                old = self.p._bw[sets[:, :, None], sets[:, None, :]][:, ~np.eye(m, dtype=bool)]
                pmin = np.minimum(pmin, old.min(axis=1)[:, None])
                psum = psum + old.sum(axis=1)[:, None]
            groups = self.p._group[sets]
            own = (groups[:, :, None] == groups[:, None, :]).sum(axis=2).max(axis=1)
            mode = np.maximum(own[:, None], (groups[:, :, None] == self.p._group[cand][None, None, :]).sum(axis=1) + 1)
        else:
            pmin = psum = np.zeros((len(sets), len(cand)))
            mode = np.ones((len(sets), len(cand)))
        sums = [v[sets].sum(axis=1)[:, None] + v[cand][None, :] for v in self._additive()]
        scores, _ = self._combine(m + 1, pmin, psum, *sums, mode)
        return scores

    def _additive(self) -> list[np.ndarray]:
        return [self.free, self.busy, self.dsq, self.match if self.match is not None else np.zeros(self.n)]

    def _combine(self, k: int, pmin: np.ndarray, psum: np.ndarray, free: np.ndarray, busy: np.ndarray,
                 dsq: np.ndarray, match: np.ndarray, mode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        comm = 0.75 * pmin + 0.25 * psum / (k * (k - 1)) if k > 1 else np.ones_like(free)
        s1 = self.s1 + k * self.req.load
        std = np.sqrt(np.maximum((self.s2 + dsq) / self.n - (s1 / self.n) ** 2, 0.0))
        numa = match / k if self.match is not None else mode / k
        terms = np.stack([comm, 1.0 - free / k, 1.0 - busy / k, 1.0 - std / 0.5, numa], axis=-1)
        np.clip(terms, 0.0, 1.0, out=terms)
        return terms @ self.w, terms


def _improve(ctx: _Context, sets: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, int]:
    """Swap one GPU of each set for an outside one while that raises its score (all sets at once)."""
    sets = sets.copy()
    cur, _ = ctx.score(sets)
    r, k = sets.shape
    keep = ~np.eye(k, dtype=bool)
    evaluated = 0
    for _ in range(2 * k):
        rest = np.broadcast_to(sets[:, None, :], (r, k, k))[:, keep].reshape(r, k, k - 1)  # set minus member i
        scores = ctx.extend(rest.reshape(r * k, k - 1), cand).reshape(r, k, len(cand))
        inside = (sets[:, :, None] == cand[None, None, :]).any(axis=1)
        scores[np.broadcast_to(inside[:, None, :], scores.shape)] = -np.inf
        evaluated += scores.size
        flat = scores.reshape(r, -1).argmax(axis=1)
        best = scores.reshape(r, -1)[np.arange(r), flat]
        better = np.flatnonzero(best > cur + 1e-12)
        if not len(better):
            break
        i, j = np.divmod(flat[better], len(cand))
        sets[better] = np.concatenate([rest[better, i], cand[j][:, None]], axis=1)
        cur[better] = best[better]
    return sets, evaluated


def _result(sets: np.ndarray, scores: np.ndarray, terms: np.ndarray, method: str, evaluated: int) -> Result:
    order = np.lexsort((np.arange(len(scores)), -scores))[:_REPORTED]
    cands = [Candidate(tuple(int(g) for g in sets[i]), float(scores[i]), dict(zip(TERMS, map(float, terms[i]))))
             for i in order]
    return Result(cands[0], cands, method, evaluated)
