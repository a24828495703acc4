"""The RCA model's input encoding: per-feature normalisation (:class:`Normalizer`), network input (:func:`encode`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .steps import fill_forward

__all__ = ["Normalizer", "encode"]

CLIP = 8.0


@dataclass(slots=True)
class Normalizer:
    """Per-feature ``z = (asinh(x / scale) - mean) / std``."""

    scale: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, data: np.ndarray) -> Normalizer:
        """Fit on ``(N, F)`` raw rows (NaN ignored); a never-seen feature maps to 0."""
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: defaults below
            absd = np.where(np.abs(data) > 0, np.abs(data), np.nan)
            scale = np.nan_to_num(np.nanmedian(absd, axis=0), nan=1.0)
            scale = np.where(scale > 0, scale, 1.0)
            a = np.arcsinh(data / scale)
            mean = np.nan_to_num(np.nanmean(a, axis=0))
            std = np.nan_to_num(np.nanstd(a, axis=0), nan=1.0)
        return cls(scale.astype(np.float32), mean.astype(np.float32), np.where(std > 1e-6, std, 1.0).astype(np.float32))

    def compress(self, x: np.ndarray) -> np.ndarray:
        """``asinh(x / scale) / std``: the standardised scale without the offset (NaN kept)."""
        return np.arcsinh(x / self.scale) / self.std

    def apply(self, x: np.ndarray) -> np.ndarray:
        z = self.compress(x) - self.mean / self.std
        return np.clip(np.nan_to_num(z, nan=0.0), -CLIP, CLIP)

    def typical(self) -> np.ndarray:
        """The raw value of each feature that maps to 0."""
        return (self.scale * np.sinh(self.mean)).astype(np.float32)

    def to_dict(self) -> dict[str, list[float]]:
        return {k: getattr(self, k).astype(float).tolist() for k in ("scale", "mean", "std")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Normalizer:
        return cls(*(np.asarray(d[k], dtype=np.float32) for k in ("scale", "mean", "std")))


def encode(raw: np.ndarray, base: np.ndarray, norm: Normalizer, hide_level: np.ndarray | None = None,
           relative_only: np.ndarray | None = None) -> np.ndarray:
    """``(B, W, F)`` raw windows (NaN = missing) and ``(B, F)`` baselines -> ``(B, W, 3F)`` network input.

    ``hide_level`` (``(B,)`` bool, training only): those windows get the typical level (0) as level inputs.
    ``relative_only`` (``(F,)`` bool): those features always do, and are seen only against the baseline.
    """
    filled, missing = fill_forward(np.asarray(raw, dtype=np.float32))
    with np.errstate(all="ignore"):
        level = norm.apply(filled)
        rel = norm.compress(filled) - norm.compress(np.asarray(base, dtype=np.float32))[:, None, :]
    if hide_level is not None:
        level[hide_level] = 0.0
    if relative_only is not None:
        level[..., relative_only] = 0.0
    rel = np.clip(np.nan_to_num(rel, nan=0.0), -CLIP, CLIP)
    return np.concatenate([level, rel, missing.astype(np.float32)], axis=-1).astype(np.float32)
