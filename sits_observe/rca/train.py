"""Training: windows from a generic dataset -> a calibrated :class:`RcaModel`.

Validation data are whole time blocks (every ``val_every``-th block of ``8 * window`` steps); windows
that straddle a train/validation boundary are dropped, so no training window overlaps a validation one.

Four regularizers aim at hosts unlike the training hosts.  *Level dropout*: each training window's level
inputs are replaced, with probability ``level_dropout``, by the typical level (0 after normalization), so
the network must also name a cause from the host-relative inputs alone and leans less on levels that
differ between healthy hosts; the ``relative_only`` features' levels are always replaced.  *Weight
averaging* (stochastic weight averaging, Izmailov et al. 2018):
with ``average_from`` > 0 the model is the mean of the weights at the end of epochs ``average_from`` to
``epochs``; one epoch's weights vary a lot in how they carry over to another kind of host, their mean
much less.  With ``average_from`` = 0, early stopping keeps the epoch with the lowest (class-weighted)
validation loss instead.  *Optional-feature dropout*: the features not every host has
(:data:`~sits_observe.rca.features.OPTIONAL_GROUPS`: NVML's per-process fields, absent with the DCGM
backend or without configured workloads; servers' backlogs joined to their GPUs, absent without
configured local servers) are, group by group and each in a share of the training windows, marked
missing for the whole window.  The main network is trained with ``optional_dropout`` (default 0: it
sees every feature, and leans on the backlogs that name a stalled loop); a second network, the
fallback for windows lacking an optional group, with ``fallback_dropout`` (default 0.25), so it also
names causes without them.  A single network trained with 0.25 learns to name a stall from other
signs as well, and those carried over worse to other hosts.  Each network's softmax temperature is then
fitted on the validation windows (minimum negative log-likelihood), so confidences are calibrated.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from .dataset import LABELS, Dataset, Windows
from .features import optional_columns
from .metrics import expected_calibration_error, scores
from .model import Normalizer, RcaModel, encode
from .steps import DEFAULT_BASELINE, Baseline

__all__ = ["TrainOptions", "fit_temperature", "networks", "split", "train"]


@dataclass(frozen=True)
class TrainOptions:
    window: int = 64
    epochs: int = 12
    hidden: tuple[int, int] = (96, 48)
    dropout: float = 0.3
    summary: int = 64
    lr: float = 3e-3
    batch: int = 256
    patience: int = 5
    stride: int = 8
    margin: int = 10
    val_every: int = 5
    seed: int = 0
    threads: int = 2
    min_confidence: float = 0.6
    level_dropout: float = 0.5
    optional_dropout: float = 0.0
    fallback_dropout: float = 0.25
    average_from: int = 4
    baseline: Baseline = DEFAULT_BASELINE
    # causes that act on requests: a window of one with no request in flight at any step shows nothing of
    # it, and would teach the network that an idle host may be faulty (left out of training, not scoring)
    request_causes: tuple[str, ...] = ("network_ingress", "scheduler_stall", "gpu_memory_pressure")
    # features seen only against the host's own baseline: the SM clock a busy, healthy GPU runs at depends
    # on its model and clock settings (training boxes 1571 MHz, the PCIe box 1402), and read as throttled
    relative_only: tuple[str, ...] = ("gpu.sm_clock_hertz.mean",)


class Progress(Protocol):
    def __call__(self, epoch: int, done: int, total: int, info: dict[str, float]) -> None: ...


def split(win: Windows, val_every: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, validation) of whole time blocks; straddling windows are in neither."""
    block = 8 * win.window
    end_blk = win.ends // block
    start_blk = (win.ends - win.window + 1) // block
    is_val = end_blk % val_every == val_every - 1
    same = (start_blk % val_every == val_every - 1) == is_val
    return same & ~is_val, same & is_val


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """The temperature in [0.25, 10] minimising validation NLL (log-spaced grid search)."""
    lg = torch.from_numpy(logits.astype(np.float64))
    yt = torch.from_numpy(y.astype(np.int64))
    grid = np.exp(np.linspace(np.log(0.25), np.log(10.0), 241))
    nll = [float(nn.functional.cross_entropy(lg / t, yt)) for t in grid]
    return float(grid[int(np.argmin(nll))])


ACTIVITY = ("workload.running_requests.sum", "stage.e2e.rate")  # requests in flight, requests finished


def idle(win: Windows, features: Sequence[str]) -> np.ndarray:
    """Windows in which no request was in flight or finished at any step, as far as observed (none
    where the dataset has neither :data:`ACTIVITY` feature or they were never observed in the window)."""
    cols = [features.index(f) for f in ACTIVITY if f in features]
    if not cols:
        return np.zeros(len(win), dtype=bool)
    vals = win.data[:, cols]
    active = win.steps_where((np.nan_to_num(vals) > 0).any(axis=1))
    observed = win.steps_where(~np.isnan(vals).all(axis=1))
    return (active == 0) & (observed > 0)


def _hide(raw: np.ndarray, base: np.ndarray, cols: np.ndarray, p: float, rng: np.random.Generator) -> None:
    """Mark columns ``cols`` missing (NaN, in place) for the whole window in a share ``p`` of the windows."""
    rows = np.flatnonzero(rng.random(len(raw)) < p)
    raw[np.ix_(rows, np.arange(raw.shape[1]), cols)] = np.nan
    base[np.ix_(rows, cols)] = np.nan


def _class_weights(y: np.ndarray, n: int) -> torch.Tensor:
    counts = np.bincount(y, minlength=n).astype(np.float64)
    w = np.where(counts > 0, (counts.sum() / np.maximum(counts, 1) / n) ** 0.5, 0.0)
    return torch.tensor(w / w[counts > 0].mean(), dtype=torch.float32)


def _accumulate(average: dict[str, torch.Tensor], state: dict[str, torch.Tensor], n: int) -> None:
    """Fold the ``n``-th set of weights into the running mean ``average`` (n = 1 starts it)."""
    for k, v in state.items():
        average[k] = v.detach().clone() if n == 1 else average[k] + (v.detach() - average[k]) / n


def networks(features: Sequence[str], opts: TrainOptions) -> int:
    """How many networks :func:`train` trains: 2 (a fallback too) with ``fallback_dropout`` > 0 and an optional
    feature among ``features``, else 1."""
    return 2 if opts.fallback_dropout and optional_columns(features) else 1


def train(ds: Dataset, opts: TrainOptions = TrainOptions(), progress: Progress | None = None) -> RcaModel:
    """Train, early-stop and calibrate on ``ds``; metrics and options are recorded in the model.

    With ``fallback_dropout`` > 0 and optional features in ``ds``, a second network (the fallback, for
    windows lacking an optional group) is trained the same way with those groups hidden at that rate."""
    t0 = time.perf_counter()
    torch.set_num_threads(opts.threads)
    win = ds.windows(opts.window, opts.stride, opts.margin, opts.baseline)
    classes = ds.classes()
    tr, va = split(win, opts.val_every)
    if opts.request_causes:
        tr &= ~(idle(win, ds.features) & np.isin(win.y, opts.request_causes))
    if tr.sum() < 10 or va.sum() < 2:
        raise ConfigError(f"{ds.path or 'dataset'}: too little data for window {opts.window}: "
                          f"{int(tr.sum())} training and {int(va.sum())} validation windows; "
                          "use a longer dataset or a shorter --window")
    seen = sorted(set(win.y[tr]))
    if len(seen) < 2:
        where = Path(ds.path or "dataset") / LABELS
        what = f"every training window is {seen[0]!r}" if ds.labels else "no labels: every training window is 'healthy'"
        raise ConfigError(f"{where}: {what}; a classifier needs at least two classes: label the faulty stretches "
                          "(entity,start,end,cause) and leave healthy time unlabeled")
    train_w, val_w = win.subset(tr), win.subset(va)
    rows = np.unique((train_w.ends[:, None] - np.arange(opts.window)[None, :]).ravel())
    norm = Normalizer.fit(win.data[rows])
    optional = optional_columns(ds.features)
    model, run = _fit(ds, classes, norm, train_w, val_w, opts, opts.optional_dropout, optional, progress, 0)
    if networks(ds.features, opts) == 2:
        model.fallback, _ = _fit(ds, classes, norm, train_w, val_w, opts, opts.fallback_dropout, optional, progress,
                                 opts.epochs)
    y_va = np.array([classes.index(c) for c in val_w.y])
    proba = model.proba(val_w.batch(), val_w.bases())
    val = scores(val_w.y, model.decide(proba, opts.min_confidence), classes)
    val["ece"] = expected_calibration_error(proba, y_va)
    val["argmax_macro_f1"] = scores(val_w.y, model.decide(proba, 0.0), classes)["macro_f1"]
    model.metrics = {"validation": val}
    model.training = {
        "dataset": ds.path, "options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(opts).items()},
        "tick_seconds": float(ds.step),  # what a window of ticks spans: the daemon checks its tick_interval against it
        "train_windows": len(train_w), "val_windows": len(val_w), **run,
        "fallback": model.fallback is not None, "seconds": round(time.perf_counter() - t0, 1),
        "torch": str(torch.__version__),
    }
    return model


def _fit(ds: Dataset, classes: list[str], norm: Normalizer, train_w: Windows, val_w: Windows, opts: TrainOptions,
         optional_dropout: float, optional: list[np.ndarray], progress: Progress | None, shown: int
         ) -> tuple[RcaModel, dict[str, Any]]:
    """One network, trained and calibrated (epochs reported from ``shown`` + 1)."""
    torch.manual_seed(opts.seed)
    rng = np.random.default_rng(opts.seed)
    cidx = {c: i for i, c in enumerate(classes)}
    y_tr = np.array([cidx[c] for c in train_w.y])
    y_va = np.array([cidx[c] for c in val_w.y])
    model = RcaModel.new(ds.features, classes, opts.window, opts.hidden, opts.dropout, norm, opts.baseline,
                         opts.summary, opts.relative_only)
    optim = torch.optim.AdamW(model.net.parameters(), lr=opts.lr, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss(weight=_class_weights(y_tr, len(classes)))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=max(opts.epochs, 1))
    best: dict[str, Any] = {"loss": float("inf"), "state": None, "epoch": 0}
    average: dict[str, torch.Tensor] = {}
    drop_rng = np.random.default_rng(opts.seed + 1)
    batches = (len(train_w) + opts.batch - 1) // opts.batch
    free = model.level_free()
    epoch = 0
    for epoch in range(1, opts.epochs + 1):
        model.net.train()
        order = rng.permutation(len(train_w))
        total = 0.0
        for b in range(batches):
            idx = order[b * opts.batch:(b + 1) * opts.batch]
            hide = drop_rng.random(len(idx)) < opts.level_dropout if opts.level_dropout else None
            raw, base = train_w.batch(idx), train_w.bases(idx)
            for cols in optional if optional_dropout else ():
                _hide(raw, base, cols, optional_dropout, drop_rng)
            x = torch.from_numpy(encode(raw, base, model.norm, hide, free))
            loss = loss_fn(model.net(x), torch.from_numpy(y_tr[idx]))
            optim.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.net.parameters(), 1.0)
            optim.step()
            total += loss.item() * len(idx)
            if progress:
                progress(shown + epoch, b + 1, batches, {})
        sched.step()
        val_logits = torch.from_numpy(model.logits(val_w.batch(), val_w.bases()))
        val_loss = float(loss_fn(val_logits, torch.from_numpy(y_va)))
        f1 = scores(val_w.y, np.asarray(classes, dtype=object)[val_logits.argmax(1).numpy()], classes)["macro_f1"]
        if val_loss < best["loss"]:
            best = {"loss": val_loss, "state": {k: v.clone() for k, v in model.net.state_dict().items()},
                    "epoch": epoch}
        if opts.average_from and epoch >= opts.average_from:
            _accumulate(average, model.net.state_dict(), epoch - opts.average_from + 1)
        if progress:
            progress(shown + epoch, batches, batches, {"loss": total / len(train_w), "val_loss": val_loss,
                                                       "val_macro_f1": f1})
        if not opts.average_from and epoch - best["epoch"] >= opts.patience:
            break
    model.net.load_state_dict(average or best["state"])
    model.temperature = fit_temperature(model.logits(val_w.batch(), val_w.bases()), y_va)
    run = {"epochs_run": epoch, "best_epoch": best["epoch"],
           "averaged_epochs": [opts.average_from, epoch] if average else None}
    return model, run
