"""Shard migrations: validation, and how long loading the weights onto the new GPUs takes.

A migration copies the shard's weights from local storage to each new GPU (in parallel, sharing the
storage bandwidth; each copy also limited by that GPU's PCIe link and any foreign traffic on it), then
starts the engine (KV-cache allocation, CUDA-graph capture, warm-up).  Until then the old placement
keeps serving; the switch is atomic at ``ready_at``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SimError
from .mechanics import H2D_BANDWIDTH
from .shards import GIB

__all__ = ["STORAGE_BANDWIDTH", "ENGINE_INIT", "LOAD_CHUNK", "Migration", "check_migration", "load_seconds"]

STORAGE_BANDWIDTH = 7e9  # bytes/s, one NVMe array shared by every GPU loading at once
ENGINE_INIT = 15.0  # s, engine start after the weights are in place
LOAD_CHUNK = 256 * 2**20  # bytes per weight-loading cuMemcpy


@dataclass(frozen=True, slots=True)
class Migration:
    """Shard ``shard`` moving ``source`` -> ``target``; times on the source clock."""

    shard: str
    source: tuple[int, ...]
    target: tuple[int, ...]
    started: float
    ready_at: float

    def loaded(self, now: float) -> float:
        """Share of the weights already on the new GPUs."""
        span = max(self.ready_at - self.started - ENGINE_INIT, 1e-9)
        return float(np.clip((now - self.started) / span, 0.0, 1.0))


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


def load_seconds(bytes_per_gpu: float, new_gpus: Sequence[int], link_load: np.ndarray) -> float:
    """Seconds until a migration onto ``new_gpus`` (the GPUs without the weights yet) can serve."""
    if not new_gpus:
        return ENGINE_INIT
    load = float(link_load[list(new_gpus)].max())
    rate = min(STORAGE_BANDWIDTH / len(new_gpus), H2D_BANDWIDTH * (1 - load))
    return bytes_per_gpu / rate + ENGINE_INIT
