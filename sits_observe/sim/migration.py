"""Shard migrations: validation, and how long loading the weights onto the new GPUs takes.

A migration copies the shard's weights from local storage to each new GPU, then starts the engine
(KV-cache allocation, CUDA-graph capture, warm-up).  Every GPU loading at the same time, of this
migration or another, gets an equal share of the storage bandwidth, each copy also limited by that
GPU's PCIe link and any foreign traffic on it (:func:`load_rate`, re-evaluated every tick); the
progress is advanced tick by tick (:meth:`Migration.advance`).  Until the engine has started the old
placement keeps serving; the switch is atomic at ``ready_at``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SimError
from .mechanics import H2D_BANDWIDTH
from .shards import GIB

__all__ = ["STORAGE_BANDWIDTH", "ENGINE_INIT", "LOAD_CHUNK", "Migration", "check_migration", "load_rate"]

STORAGE_BANDWIDTH = 7e9  # bytes/s, one NVMe array shared by every GPU loading at once
ENGINE_INIT = 15.0  # s, engine start after the weights are in place
LOAD_CHUNK = 256 * 2**20  # bytes per weight-loading cuMemcpy


@dataclass(slots=True)
class Migration:
    """Shard ``shard`` moving ``source`` -> ``target``; times on the source clock.

    ``ready_at`` is infinite while weights are loading, then the time the last byte landed plus
    :data:`ENGINE_INIT`.  :func:`check_migration` guarantees at least one new GPU.
    """

    shard: str
    source: tuple[int, ...]
    target: tuple[int, ...]
    started: float
    bytes_per_gpu: float
    loaded_bytes: float = 0.0
    ready_at: float = math.inf

    @property
    def new(self) -> list[int]:
        """The target GPUs that do not hold the weights yet."""
        return [g for g in self.target if g not in self.source]

    @property
    def loading(self) -> bool:
        return math.isinf(self.ready_at)

    def loaded(self) -> float:
        """Share of the weights already on the new GPUs."""
        return self.loaded_bytes / self.bytes_per_gpu

    def advance(self, t0: float, t1: float, rate: float) -> tuple[float, float]:
        """Load at ``rate`` bytes/s per new GPU during ``[t0, t1)``; returns (bytes per GPU moved, seconds
        spent loading), which is less than the tick where the last byte lands in it."""
        if not self.loading:
            return 0.0, 0.0
        start = max(t0, self.started)
        left = self.bytes_per_gpu - self.loaded_bytes
        if left > rate * (t1 - start):
            self.loaded_bytes += rate * (t1 - start)
            return rate * (t1 - start), t1 - start
        self.loaded_bytes = self.bytes_per_gpu
        self.ready_at = start + left / rate + ENGINE_INIT
        return left, left / rate


def check_migration(shard: str, current: tuple[int, ...], gpus: Sequence[int], tp: int,
                    occupied: Mapping[int, str], free_bytes: np.ndarray, need_bytes: float, n_gpus: int,
                    pending: Mapping[str, Migration]) -> tuple[int, ...]:
    """The target as a tuple, or :class:`SimError` saying why the move is impossible."""
    if shard in pending:
        raise SimError(f"shard {shard} is already migrating to GPUs {list(pending[shard].target)}")
    try:
        target = tuple(int(g) for g in gpus)
    except (TypeError, ValueError):
        raise SimError(f"shard {shard}: target GPUs must be integers, got {gpus!r}") from None
    if len(target) != tp or len(set(target)) != tp:
        raise SimError(f"shard {shard} is tensor-parallel over {tp} GPUs; give {tp} distinct GPUs, got {list(target)}")
    bad = [g for g in target if not 0 <= g < n_gpus]
    if bad:
        raise SimError(f"shard {shard}: GPUs {bad} do not exist; this host has GPUs 0-{n_gpus - 1}")
    if set(target) == set(current):
        raise SimError(f"shard {shard} already runs on GPUs {list(current)}")
    for g in target:
        if g in occupied:
            raise SimError(f"shard {shard}: GPU {g} is taken by shard {occupied[g]}")
    for g in target:
        if g not in current and free_bytes[g] < need_bytes:
            raise SimError(f"shard {shard}: GPU {g} has {free_bytes[g] / GIB:.1f} GiB free, the shard needs "
                           f"{need_bytes / GIB:.1f} GiB per GPU")
    return target


def load_rate(migrations: Sequence[Migration], link_load: np.ndarray) -> dict[str, float]:
    """Bytes/s per new GPU of each migration still loading: an equal share of the storage bandwidth for
    every GPU loading now, at most what that migration's busiest PCIe link leaves."""
    loading = [m for m in migrations if m.loading]
    gpus = sum(len(m.new) for m in loading)
    return {m.shard: min(STORAGE_BANDWIDTH / gpus, H2D_BANDWIDTH * (1 - float(link_load[m.new].max())))
            for m in loading}
