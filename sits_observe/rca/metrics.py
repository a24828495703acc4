"""Classification scores shared by training (validation), evaluation and the bench (pure functions).

``unknown`` predictions (abstentions) count against recall of the true class; the healthy
false-positive rate is the share of healthy windows given a fault cause, so an abstention on a healthy
window is not a false positive (it never triggers a re-shard) but is reported as ``unknown_rate``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .verdict import HEALTHY, UNKNOWN

__all__ = ["expected_calibration_error", "scores"]


def scores(y_true: Sequence[str], y_pred: Sequence[str], classes: Sequence[str]) -> dict[str, Any]:
    """Per-class precision/recall/F1/support, macro-F1, accuracy, confusion matrix, healthy FP rate.

    The confusion matrix has one row per class in ``classes`` (truth) and one column per class plus
    ``unknown`` (prediction).  Macro-F1 averages over classes with support in ``y_true``.
    """
    t = np.asarray(y_true, dtype=object)
    p = np.asarray(y_pred, dtype=object)
    cols = list(classes) + [UNKNOWN]
    idx = {c: i for i, c in enumerate(cols)}
    conf = np.zeros((len(classes), len(cols)), dtype=np.int64)
    for a, b in zip(t, p):
        if a in idx and idx[a] < len(classes):
            conf[idx[a], idx.get(b, idx[UNKNOWN])] += 1
    per_class = {}
    f1s = []
    for i, c in enumerate(classes):
        tp = conf[i, i]
        support = int(conf[i].sum())
        predicted = int(conf[:, i].sum())
        prec = tp / predicted if predicted else 0.0
        rec = tp / support if support else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per_class[c] = {"precision": round(float(prec), 4), "recall": round(float(rec), 4),
                        "f1": round(float(f1), 4), "support": support}
        if support:
            f1s.append(f1)
    healthy = conf[idx[HEALTHY]] if HEALTHY in idx and idx[HEALTHY] < len(classes) else np.zeros(len(cols))
    n_healthy = int(healthy.sum())
    faults = n_healthy - int(healthy[idx.get(HEALTHY, 0)]) - int(healthy[idx[UNKNOWN]])
    total = int(conf.sum())
    return {
        "macro_f1": round(float(np.mean(f1s)) if f1s else 0.0, 4),
        "accuracy": round(float(np.trace(conf[:, :len(classes)]) / total) if total else 0.0, 4),
        "healthy_fp_rate": round(faults / n_healthy, 4) if n_healthy else 0.0,
        "unknown_rate": round(float(conf[:, -1].sum() / total) if total else 0.0, 4),
        "windows": total,
        "per_class": per_class,
        "confusion": {"labels": cols, "matrix": conf.tolist()},
    }


def expected_calibration_error(proba: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """ECE of the top-class confidence over equal-width bins (``y`` holds class indices)."""
    conf = proba.max(axis=1)
    hit = proba.argmax(axis=1) == y
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in itertools.pairwise(edges):
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            ece += sel.mean() * abs(hit[sel].mean() - conf[sel].mean())
    return round(float(ece), 4)
