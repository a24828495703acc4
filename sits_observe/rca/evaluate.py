"""Evaluation: the LSTM and both baselines scored on the same test windows in one run.

Baselines are fitted on the training dataset (``--train``, by default the one recorded in the model
file), on the same features and windows the model used, then applied to the test windows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from . import dataset as dsmod
from .baselines import ThresholdBaseline, TreeBaseline, summaries
from .config import HEALTHY_MIN_CONFIDENCE, MIN_CONFIDENCE
from .dataset import Dataset, Windows
from .floors import Floors
from .metrics import expected_calibration_error, scores
from .model import RcaModel
from .train import idle
from .verdict import HEALTHY, UNKNOWN

__all__ = ["evaluate", "fit_windows", "load_train", "model_proba", "render"]


def model_proba(model: RcaModel, win: Windows, cols: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Calibrated probabilities for every window, in chunks to bound memory."""
    parts = [model.proba(win.batch(slice(i, i + chunk))[..., cols], win.bases(slice(i, i + chunk))[:, cols])
             for i in range(0, len(win), chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, len(model.classes)))


def fit_windows(train: Dataset, model: RcaModel, margin: int, cap: int) -> tuple[Windows, np.ndarray]:
    """The baselines' training windows: every window of ``train`` (at most ``cap``, evenly spread) but those
    the model's training left out, the idle windows of request-path causes (``request_causes``), so both
    learn from the same curated data; and the model's columns."""
    cols = model.columns(train.features, source=f"{train.path or 'training dataset'}")
    win = train.windows(model.window, stride=1, margin=margin, baseline=model.baseline)
    causes = list(model.training.get("options", {}).get("request_causes") or ())
    if causes:
        win = win.subset(~(idle(win, train.features) & np.isin(win.y, causes)))
    if len(set(win.y)) < 2:  # the baselines cannot be fitted (a traceback from inside them)
        raise ConfigError(f"{train.path or 'training dataset'}: {len(win)} windows of {model.window} steps, of "
                          f"{len(set(win.y))} class(es); fitting the baselines needs windows of at least two "
                          "classes: give a longer, labelled dataset to --train")
    if len(win) > cap:
        win = win.subset(np.linspace(0, len(win) - 1, cap).astype(np.int64))
    return win, cols


def _scored(y: np.ndarray, pred: np.ndarray, classes: list[str], after: np.ndarray) -> dict[str, Any]:
    """:func:`scores`, plus the healthy false-positive rate split into the healthy windows that still hold
    an ended fault (``after``) and the rest."""
    out = scores(y, pred, classes)
    called = (y == HEALTHY) & ~np.isin(pred, [HEALTHY, UNKNOWN])
    steady = (y == HEALTHY) & ~after
    out["healthy_fp_split"] = {
        "after_fault": round(float(called[after].mean()), 4) if after.any() else 0.0,
        "after_fault_windows": int(after.sum()),
        "steady": round(float(called[steady].mean()), 4) if steady.any() else 0.0,
        "steady_windows": int(steady.sum()),
    }
    return out


def evaluate(model: RcaModel, test: Dataset, train: Dataset, min_confidence: float | Floors = MIN_CONFIDENCE,
             margin: int | None = None, stride: int = 1, threads: int = 2, fit_cap: int = 30000,
             healthy_min_confidence: float = HEALTHY_MIN_CONFIDENCE) -> dict[str, Any]:
    """Score the model (at the operating point ``min_confidence`` / ``healthy_min_confidence``, as
    :meth:`RcaModel.decide`) and the two baselines on ``test``; ``margin`` defaults to the training margin."""
    if margin is None:
        margin = int(model.training.get("options", {}).get("margin", 0))
    cols = model.columns(test.features, source=f"{test.path or 'dataset'}")
    win = test.windows(model.window, stride=stride, margin=margin, baseline=model.baseline)
    if not len(win):
        raise ConfigError(f"{test.path}: no complete window of {model.window} steps to evaluate")
    classes = list(model.classes) + sorted(set(win.y) - set(model.classes))
    t0 = time.perf_counter()
    proba = model_proba(model, win, cols)
    lstm_s = time.perf_counter() - t0
    after = test.after_fault(win)
    lstm = _scored(win.y, model.decide(proba, min_confidence, healthy_min_confidence), classes, after)
    known = np.isin(win.y, model.classes)
    yidx = np.array([model.classes.index(c) if c in model.classes else -1 for c in win.y])
    lstm["ece"] = expected_calibration_error(proba[known], yidx[known])
    lstm["argmax_macro_f1"] = scores(win.y, model.decide(proba, 0.0), classes)["macro_f1"]

    fit_win, fit_cols = fit_windows(train, model, margin, fit_cap)
    t0 = time.perf_counter()
    fit_sum = summaries(fit_win, fit_cols)
    test_sum = summaries(win, cols)
    last_col = slice(0, len(cols))  # the "last" block of the summaries
    thr = ThresholdBaseline().fit(fit_sum[:, last_col], fit_win.y)
    thr_scores = _scored(win.y, thr.predict(test_sum[:, last_col]), classes, after)
    thr_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    gbt = TreeBaseline(threads=threads).fit(fit_sum, fit_win.y)
    gbt_scores = _scored(win.y, gbt.predict(test_sum), classes, after)
    gbt_s = time.perf_counter() - t0
    return {
        "dataset": test.path,
        "train_dataset": train.path,
        "window": model.window,
        "windows": len(win),
        "min_confidence": Floors.of(min_confidence).to_json(),
        "healthy_min_confidence": healthy_min_confidence,
        "margin": margin,
        "classes": classes,
        "lstm": lstm,
        "baselines": {"thresholds": thr_scores, "gbt": gbt_scores},
        "seconds": {"lstm_inference": round(lstm_s, 2), "thresholds_fit_and_predict": round(thr_s, 2),
                    "gbt_fit_and_predict": round(gbt_s, 2)},
        "threshold_rules": [
            {"cause": c, "feature": model.features[f], "op": ">" if s > 0 else "<", "threshold": t}
            for c, f, t, s, _ in thr.rules
        ],
    }


def load_train(model: RcaModel, given: str | None) -> Dataset:
    """The dataset baselines are fitted on: ``given``, else the path recorded in the model file."""
    path = given or model.training.get("dataset")
    if not path or not Path(path).is_dir():
        where = (f"{path!r} is not a dataset directory" if given
                 else f"the model records its training data at {path!r}, which is not a directory here")
        raise ConfigError(f"--train: {where}; the baselines are fitted on the model's training dataset: "
                          "pass --train DIR")
    return dsmod.read(path)


def render(report: dict[str, Any], console: Console) -> None:
    """Human-readable tables: per-class scores, the three-way summary, the LSTM confusion matrix."""
    systems = {"lstm": report["lstm"], **report["baselines"]}
    per = Table(title=f"Per-class precision / recall / F1 on {report['windows']} windows ({report['dataset']})")
    per.add_column("class")
    per.add_column("support", justify="right")
    for name in systems:
        per.add_column(f"{name} P/R/F1", justify="right")
    for c in report["classes"]:
        row = [c, str(report["lstm"]["per_class"][c]["support"])]
        for s in systems.values():
            pc = s["per_class"][c]
            row.append(f"{pc['precision']:.2f}/{pc['recall']:.2f}/{pc['f1']:.2f}")
        per.add_row(*row)
    console.print(per)
    floors = Floors.of(report["min_confidence"])
    summ = Table(title=f"Summary (the LSTM names a fault cause from {floors} and healthy from "
                       f"{report['healthy_min_confidence']:g}, else unknown)")
    for col in ("system", "macro-F1", "accuracy", "healthy FP rate", "  after a fault", "  steady", "unknown rate"):
        summ.add_column(col, justify="right" if col != "system" else "left")
    for name, s in systems.items():
        split = s["healthy_fp_split"]
        summ.add_row(name, f"{s['macro_f1']:.4f}", f"{s['accuracy']:.4f}", f"{s['healthy_fp_rate']:.4f}",
                     f"{split['after_fault']:.4f}", f"{split['steady']:.4f}", f"{s['unknown_rate']:.4f}")
    console.print(summ)
    conf = report["lstm"]["confusion"]
    cm = Table(title="LSTM confusion matrix (rows: truth, columns: prediction)")
    cm.add_column("")
    for lab in conf["labels"]:
        cm.add_column(lab[:10], justify="right")
    for lab, row in zip(report["classes"], conf["matrix"]):
        cm.add_row(lab, *(str(v) for v in row))
    console.print(cm)
