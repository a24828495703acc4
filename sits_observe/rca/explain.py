"""Occlusion: which features, stages and GPUs a verdict rests on.

A feature's contribution is the drop in the verdict cause's probability when that feature is replaced,
over the whole window, by its normal value for this host (its baseline; the training data's typical
value where the host has none).  A GPU's contribution is the larger of two, with readings replaced by each
GPU's own normal (its median over the store's recent history) before the GPU aggregates are computed: the
drop when that GPU alone is put back, and the rise when it alone is left as it is and every other GPU is put
back (a fault on a pair of GPUs: putting one back leaves the other driving the aggregates, so only the second
names them).  GPUs at less than half the largest GPU contribution are not implicated: a verdict whose cause
the GPUs barely drive (every GPU put back, it stands) would otherwise name GPUs that merely move it a little.
A stage's contribution is the sum of its features' positive contributions.  Everything is scored in one
batched forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..store.series import SeriesStore
from .features import gpu_occluded, stage_of
from .model import RcaModel

__all__ = ["MIN_CONTRIBUTION", "Explanation", "explain"]

MIN_CONTRIBUTION = 0.01  # a GPU or stage is implicated when occluding it lowers the probability this much
GPU_SHARE = 0.5  # ... and a GPU only when its contribution is at least this share of the largest GPU's


@dataclass(frozen=True, slots=True)
class Explanation:
    top_features: tuple[tuple[str, float], ...]
    stages: tuple[str, ...]
    gpus: tuple[int, ...]


def explain(model: RcaModel, raw: np.ndarray, base: np.ndarray, cause: int, store: SeriesStore | None,
            top: int) -> Explanation:
    """Rank features, stages and GPUs of ``raw`` (``(n, F)`` in model order, baseline ``base``) for
    class index ``cause``."""
    nf = len(model.features)
    normal = np.where(np.isfinite(base), base, model.norm.typical()).astype(np.float32)
    occl = np.repeat(raw[None].astype(np.float32), nf + 1, axis=0)
    occl[np.arange(1, nf + 1), :, np.arange(nf)] = normal[:, None]
    parts = [occl]
    if store is not None and len(store.gpu_info()):
        parts.append(gpu_occluded(store, model.features, raw, raw.shape[0]).astype(np.float32))
    batch = np.concatenate(parts)
    # every variant through the network the window itself went to: an occluded optional feature would
    # otherwise send a window lacking it to the main network, and its "contribution" be the networks' difference
    route = np.full(len(batch), bool(model.lacking(raw[None].astype(np.float32))[0]))
    p = model.proba(batch, np.repeat(base[None].astype(np.float32), len(batch), axis=0), route)[:, cause]
    feat = p[0] - p[1:nf + 1]
    occluded = p[nf + 1:]  # GPU g put back, every GPU but g put back, every GPU put back (gpu_occluded)
    g = (len(occluded) - 1) // 2
    gpu = np.maximum(p[0] - occluded[:g], occluded[g:2 * g] - occluded[2 * g:]) if g else occluded[:0]
    order = np.argsort(-feat, kind="stable")
    tops = tuple((model.features[j], c) for j in order[:top] if (c := round(float(feat[j]), 4)) > 0)
    by_stage: dict[str, float] = {}
    for j, name in enumerate(model.features):
        st = stage_of(name)
        if st is not None and feat[j] > 0:
            by_stage[st] = by_stage.get(st, 0.0) + float(feat[j])
    stages = tuple(s for s, c in sorted(by_stage.items(), key=lambda kv: -kv[1]) if c >= MIN_CONTRIBUTION)
    index = [g.index for g in store.gpu_info()] if store is not None else []  # a position's GPU index (DCGM may skip)
    floor = max(MIN_CONTRIBUTION, GPU_SHARE * float(gpu.max(initial=0.0)))  # not GPUs that merely move it a little
    gpus = tuple(int(index[g]) for g in np.argsort(-gpu, kind="stable") if gpu[g] >= floor)
    return Explanation(tops, stages, gpus)
