"""The two baselines the LSTM is measured against, fitted on the training data in the same run.

* :class:`ThresholdBaseline`: one static threshold per cause on one raw feature (the last value in the
  window), the feature/direction/threshold that best separates that cause from healthy windows
  (Youden's J over quantile candidates); the cause whose rule is exceeded by the most (in healthy
  interquartile ranges) wins, no rule firing means healthy.  This is what a hand-written alert table does.
* :class:`TreeBaseline`: scikit-learn ``HistGradientBoostingClassifier`` on per-window summary
  statistics of every feature (last, mean, std, min, max, last - first, and last and mean over the
  host's baseline: the same information the LSTM gets).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from threadpoolctl import threadpool_limits

from .dataset import Windows
from .steps import fill_forward
from .verdict import HEALTHY

__all__ = ["ThresholdBaseline", "TreeBaseline", "summaries"]

STATS = ("last", "mean", "std", "min", "max", "delta", "last_over_base", "mean_over_base")


def summaries(win: Windows, cols: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """``(M, len(STATS) * F)`` summary statistics of each window (NaN carried forward first)."""
    out = []
    for i in range(0, len(win), chunk):
        x = fill_forward(win.batch(slice(i, i + chunk))[..., cols])[0]
        base = win.bases(slice(i, i + chunk))[:, cols]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(x, 1)
            out.append(np.concatenate([x[:, -1], mean, np.nanstd(x, 1), np.nanmin(x, 1), np.nanmax(x, 1),
                                       x[:, -1] - x[:, 0], _ratio(x[:, -1], base), _ratio(mean, base)], axis=1))
    return np.concatenate(out) if out else np.zeros((0, len(STATS) * len(cols)))


def _ratio(x: np.ndarray, base: np.ndarray) -> np.ndarray:
    """``x / base``; 1 where both are 0 (no change), NaN where only the baseline is 0."""
    with np.errstate(all="ignore"):
        return np.where(base != 0, x / base, np.where(x == 0, 1.0, np.nan))


class ThresholdBaseline:
    """One ``feature > t`` or ``feature < t`` rule per cause on the window's last raw values."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, int, float, float, float]] = []  # cause, feature, threshold, sign, scale

    def fit(self, last: np.ndarray, y: np.ndarray) -> ThresholdBaseline:
        healthy = last[y == HEALTHY]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            q1, q3 = np.nanpercentile(healthy, [25, 75], axis=0)
        scale = np.where(q3 - q1 > 0, q3 - q1, np.nanstd(healthy, axis=0) + 1e-9)
        qs = np.linspace(1, 99, 99)
        for cause in sorted(set(y) - {HEALTHY}):
            xc = last[y == cause]
            best = (-1.0, 0, 0.0, 1.0)
            for f in range(last.shape[1]):
                cand = np.unique(np.nanpercentile(np.concatenate([xc[:, f], healthy[:, f]]), qs))
                cand = cand[np.isfinite(cand)]
                if not cand.size:
                    continue
                above = (xc[:, f, None] > cand).mean(0) - (healthy[:, f, None] > cand).mean(0)
                below = (xc[:, f, None] < cand).mean(0) - (healthy[:, f, None] < cand).mean(0)
                for sign, j in ((1.0, above), (-1.0, below)):  # as predict fires: strictly, never on NaN
                    k = int(np.argmax(j))
                    if j[k] > best[0]:
                        best = (float(j[k]), f, float(cand[k]), sign)
            _, f, thr, sign = best
            self.rules.append((cause, f, thr, sign, float(scale[f])))
        return self

    def predict(self, last: np.ndarray) -> np.ndarray:
        margins = np.full((len(last), len(self.rules)), -np.inf)
        for r, (_, f, thr, sign, scale) in enumerate(self.rules):
            m = sign * (last[:, f] - thr) / scale
            margins[:, r] = np.where(np.isnan(m), -np.inf, m)
        causes = np.asarray([HEALTHY] + [r[0] for r in self.rules], dtype=object)
        best = margins.argmax(axis=1) if self.rules else np.zeros(len(last), dtype=np.int64)
        fired = margins[np.arange(len(last)), best] > 0 if self.rules else np.zeros(len(last), bool)
        return np.where(fired, causes[best + 1], HEALTHY)


class TreeBaseline:
    """Gradient-boosted trees on :func:`summaries` (NaN handled natively by the trees)."""

    def __init__(self, seed: int = 0, threads: int = 2) -> None:
        self.threads = threads
        self.keep: np.ndarray = np.zeros(0, dtype=bool)
        self.clf = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.1, early_stopping=True,
                                                  validation_fraction=0.15, random_state=seed)

    def fit(self, x: np.ndarray, y: np.ndarray) -> TreeBaseline:
        self.keep = ~np.isnan(x).all(axis=0)  # the trees cannot bin a column with no value at all
        with threadpool_limits(self.threads):
            self.clf.fit(x[:, self.keep], y.astype(str))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        with threadpool_limits(self.threads):
            return self.clf.predict(x[:, self.keep]).astype(object)
