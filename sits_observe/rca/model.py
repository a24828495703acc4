"""The root-cause model: a stacked LSTM (plus window statistics) over normalized features, softmax over causes.

Input encoding (:func:`encode`): each feature is compressed with ``asinh(x / scale)`` (log-like for large
values, so a 10x latency spike and a 10x throughput change weigh alike), standardised with the training
mean and deviation, clipped to +-8; NaN is carried forward inside the window.  Per step the network sees
three groups of ``F`` inputs: that level, the same compressed value minus the host's own baseline
(:func:`sits_observe.rca.steps.rolling_baseline`; "high for this host"), and a missing indicator.  The model file is a
``torch.save`` dict of plain values and tensors, loaded with ``weights_only=True``; it records feature
names, normalization, window, classes, the temperature fitted on validation data and the metrics reached.

A model may carry a *fallback*: a second network with the same features, trained with the optional
features (:data:`~sits_observe.rca.features.OPTIONAL_GROUPS`) hidden at random.  A window in which a whole
optional group is missing (a host without NVML's per-process fields or without configured servers, or
none of its replicas with a backlog) is scored by the fallback; every other window by the main network,
which was trained with all features present and leans on them fully.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ModelError
from ..files import replace_whole
from .encoding import Normalizer, encode
from .features import OPTIONAL_FEATURES, optional_columns
from .floors import Floors
from .modelfile import archive_damage, check_sizes, check_types
from .steps import DEFAULT_BASELINE, Baseline
from .verdict import UNKNOWN

__all__ = ["FORMAT", "Normalizer", "RcaModel", "RcaNet", "encode"]

FORMAT = "sits-rca-lstm/2"


class RcaNet(nn.Module):
    """Two stacked LSTMs (hidden sizes ``hidden``), dropout between and before the linear head.

    With ``summary`` > 0 the head also sees a ``summary``-wide ReLU layer over window statistics (last,
    mean, std, min, max over the window) of the level and host-relative inputs: what the tree baseline
    reads, next to the sequence the LSTMs read.
    """

    def __init__(self, inputs: int, hidden: Sequence[int], classes: int, dropout: float, summary: int = 0) -> None:
        super().__init__()
        h1, h2 = hidden
        self.values = 2 * inputs // 3  # level and host-relative inputs; the rest are missing indicators
        self.lstm1 = nn.LSTM(inputs, h1, batch_first=True)
        self.lstm2 = nn.LSTM(h1, h2, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.summary = nn.Sequential(nn.Linear(5 * self.values, summary), nn.ReLU()) if summary else None
        self.head = nn.Linear(h2 + summary, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm1(x)
        out, _ = self.lstm2(self.drop(out))
        z = out[:, -1, :]
        if self.summary is not None:
            v = x[..., :self.values]
            stats = torch.cat([v[:, -1], v.mean(1), v.std(1), v.amin(1), v.amax(1)], dim=1)
            z = torch.cat([z, self.summary(self.drop(stats))], dim=1)
        return self.head(self.drop(z))


@dataclass
class RcaModel:
    """A trained network with everything needed to apply it to new data."""

    features: tuple[str, ...]
    classes: tuple[str, ...]
    window: int
    hidden: tuple[int, int]
    dropout: float
    norm: Normalizer
    net: RcaNet
    summary: int = 0
    baseline: Baseline = DEFAULT_BASELINE
    temperature: float = 1.0
    metrics: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    fallback: RcaModel | None = None
    relative_only: tuple[str, ...] = ()  # features whose level the network never sees (:func:`encode`)

    @classmethod
    def new(cls, features: Sequence[str], classes: Sequence[str], window: int, hidden: Sequence[int],
            dropout: float, norm: Normalizer, baseline: Baseline = DEFAULT_BASELINE, summary: int = 0,
            relative_only: Sequence[str] = ()) -> RcaModel:
        net = RcaNet(3 * len(features), hidden, len(classes), dropout, summary)
        return cls(tuple(features), tuple(classes), int(window), (int(hidden[0]), int(hidden[1])),
                   float(dropout), norm, net, int(summary), baseline,
                   relative_only=tuple(f for f in relative_only if f in features))

    def level_free(self) -> np.ndarray | None:
        """``(F,)`` bool mask of :attr:`relative_only` for :func:`encode`; None when there are none."""
        return np.isin(self.features, self.relative_only) if self.relative_only else None

    def columns(self, available: Sequence[str], source: str = "dataset") -> np.ndarray:
        """Indices of the model's features in ``available``; ModelError listing any that are missing."""
        pos = {name: i for i, name in enumerate(available)}
        missing = [f for f in self.features if f not in pos]
        if missing:
            fix = ("add them as empty columns (a host without NVML's per-process fields or servers' backlogs; the "
                   "model was trained to do without them)" if set(missing) <= OPTIONAL_FEATURES
                   else "use data with these columns or retrain on it")
            raise ModelError(f"{source} lacks {len(missing)} of the model's {len(self.features)} features: "
                             f"{', '.join(missing)}; {fix}")
        return np.array([pos[f] for f in self.features], dtype=np.int64)

    def logits(self, raw: np.ndarray, base: np.ndarray, batch: int = 1024) -> np.ndarray:
        """Uncalibrated logits for ``(B, W, F)`` raw windows and ``(B, F)`` baselines in model feature order."""
        self.net.eval()
        out = []
        free = self.level_free()
        with torch.inference_mode():
            for i in range(0, len(raw), batch):
                x = encode(raw[i:i + batch], base[i:i + batch], self.norm, relative_only=free)
                out.append(self.net(torch.from_numpy(x)).numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.classes)), np.float32)

    def proba(self, raw: np.ndarray, base: np.ndarray, lacking: np.ndarray | None = None) -> np.ndarray:
        """Calibrated class probabilities ``(B, C)``; windows lacking an optional group go to the fallback
        (``lacking``, ``(B,)``, says which instead: an explanation scores its variants of one window with the
        network that window went to)."""
        out = self._own_proba(raw, base)
        if lacking is None:
            lacking = self.lacking(raw)
        if self.fallback is not None and lacking.any():
            out[lacking] = self.fallback._own_proba(raw[lacking], base[lacking])
        return out

    def _own_proba(self, raw: np.ndarray, base: np.ndarray) -> np.ndarray:
        lg = self.logits(raw, base) / self.temperature
        lg = lg - lg.max(axis=1, keepdims=True)
        e = np.exp(lg)
        return e / e.sum(axis=1, keepdims=True)

    def lacking(self, raw: np.ndarray) -> np.ndarray:
        """``(B,)``: windows (model feature order) in which every feature of some optional group is missing
        at every step."""
        out = np.zeros(len(raw), dtype=bool)
        for cols in optional_columns(self.features):
            out |= np.isnan(raw[..., cols]).all(axis=(1, 2))
        return out

    def decide(self, proba: np.ndarray, min_confidence: float | Floors,
               healthy_min_confidence: float | None = None) -> np.ndarray:
        """Class name per row: ``unknown`` where the top class is a fault cause below its floor (one for all, or
        per cause: :class:`~sits_observe.rca.floors.Floors`), or ``healthy`` below ``healthy_min_confidence``
        (default: the default floor too; never above it, as calling a host healthy never needs more
        confidence than naming a cause)."""
        floors = Floors.of(min_confidence).per_class(self.classes, healthy_min_confidence)
        top = proba.argmax(axis=1)
        return np.where(proba.max(axis=1) >= floors[top], np.asarray(self.classes, dtype=object)[top], UNKNOWN)

    # ---- file ----------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        blob = self._blob()
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        replace_whole(p, lambda tmp: torch.save(blob, tmp))  # a full disk, an interrupt: no half-written file

    def _blob(self) -> dict[str, Any]:
        meta = {
            "format": FORMAT,
            "features": list(self.features),
            "classes": list(self.classes),
            "window": self.window,
            "hidden": list(self.hidden),
            "dropout": self.dropout,
            "summary": self.summary,
            "relative_only": list(self.relative_only),
            "norm": self.norm.to_dict(),
            "baseline": {"horizon": self.baseline.horizon, "every": self.baseline.every},
            "temperature": float(self.temperature),
            "metrics": self.metrics,
            "training": self.training,
        }
        blob: dict[str, Any] = {"meta": meta, "state": self.net.state_dict()}
        if self.fallback is not None:
            blob["fallback"] = self.fallback._blob()
        return blob

    @classmethod
    def load(cls, path: str | Path) -> RcaModel:
        """Load a model file; a missing, truncated, corrupt or foreign file raises ModelError."""
        p = Path(path)
        hint = "retrain with `sits-observe rca train` or restore models/rca-lstm.pt"
        if p.is_dir():
            raise ModelError(f"{p}: is a directory, not a model file; {hint}")
        if p.exists() and not p.is_file():  # a FIFO would hang the read, a device give its bytes
            raise ModelError(f"{p}: not a regular file (a device, FIFO or socket); name the model file; {hint}")
        if not p.is_file():
            raise ModelError(f"{p}: no such model file; {hint}")
        try:
            blob = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for bad files
            raise ModelError(f"{p}: not a readable model file: truncated, corrupt or not made by "
                             f"`sits-observe rca train` (torch said {type(exc).__name__}); {hint}") from exc
        if (bad := archive_damage(p)) is not None:  # torch reads the archive without checking its checksums
            raise ModelError(f"{p}: damaged (a disk or copy error): {bad}; {hint}")
        model = cls._from_blob(blob, p, hint)
        if "fallback" in blob:
            model.fallback = cls._from_blob(blob["fallback"], p, hint)
            fb = model.fallback
            if (fb.features, fb.classes, fb.window, fb.baseline) != (model.features, model.classes, model.window,
                                                                      model.baseline):
                raise ModelError(f"{p}: the fallback network's features, classes, window or baseline differ from "
                                 f"the main network's; {hint}")
        return model

    @classmethod
    def _from_blob(cls, blob: Any, p: Path, hint: str) -> RcaModel:
        try:
            if not isinstance(blob, dict) or not isinstance(blob.get("meta"), dict):
                raise TypeError("not a model file's mapping")
            meta = blob["meta"]
            if meta.get("format") != FORMAT:
                raise ModelError(f"{p}: model format {meta.get('format')!r} is not {FORMAT!r}; {hint}")
            check_sizes(meta)  # before any tensor is allocated from them
            check_types(meta)
            model = cls.new(meta["features"], meta["classes"], meta["window"], meta["hidden"],
                            meta["dropout"], Normalizer.from_dict(meta["norm"]),
                            Baseline(int(meta["baseline"]["horizon"]), int(meta["baseline"]["every"])),
                            int(meta.get("summary", 0)),  # files from before the summary branch have none
                            [str(f) for f in meta.get("relative_only", ())])
            n = len(model.features)
            if any(len(getattr(model.norm, k)) != n for k in ("scale", "mean", "std")):  # the window: check_sizes
                raise ValueError(f"normalisation sizes do not fit {n} features")
            model.net.load_state_dict(blob["state"])
            if bad := [k for k, t in model.net.state_dict().items() if not torch.isfinite(t).all()]:
                raise ValueError(f"weights {bad[0]} hold NaN or infinite values")
            if not all(np.isfinite(getattr(model.norm, k)).all() for k in ("scale", "mean", "std")):
                raise ValueError("normalisation holds NaN or infinite values")
            model.temperature = float(meta["temperature"])
            if not (math.isfinite(model.temperature) and model.temperature > 0):
                raise ValueError(f"temperature {model.temperature} is not a positive number")
            model.metrics = dict(meta.get("metrics", {}))
            model.training = dict(meta.get("training", {}))
        except ModelError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged or hostile file raises anything (OverflowError...)
            raise ModelError(f"{p}: model file is incomplete or inconsistent ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); {hint}") from exc
        model.net.eval()
        return model
