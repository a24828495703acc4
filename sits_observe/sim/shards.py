"""Shards of the simulated deployment: what runs where, and what a shard needs to be placed.

The default deployment on an ``n``-GPU box is workload ``chat``: ``n/2 - 1`` replicas of Llama 2 70B,
each a tensor-parallel pair on GPUs ``(2k, 2k+1)`` (one PCIe switch and NVLink bridge on ``pcie-8``, one
NUMA node on both presets); the last pair stays free so a migration has somewhere to go.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..topology import Topology
from .perf import MODELS

__all__ = ["GIB", "GPU_MEMORY_UTILIZATION", "RUNTIME_RESERVE", "KV_MIN", "Placement", "ShardInfo",
           "default_placement", "static_bytes_per_gpu", "kv_bytes_per_gpu_token"]

GIB = 1024**3
GPU_MEMORY_UTILIZATION = 0.95  # share of device memory the serving engine may use (vLLM-style knob)
RUNTIME_RESERVE = 3 * GIB  # CUDA context, activations and CUDA graphs per GPU
KV_MIN = 4 * GIB  # smallest KV cache per GPU worth placing a shard for


@dataclass(frozen=True, slots=True)
class Placement:
    """One shard of the default deployment."""

    id: str
    workload: str
    model: str
    tp: int
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """A shard as the scheduler sees it (``memory_per_gpu`` in bytes; ``comm_intensity`` in 0-1)."""

    id: str
    workload: str
    model: str
    gpus: tuple[int, ...]
    tp: int
    memory_per_gpu: int
    comm_intensity: float
    numa_node: int


def static_bytes_per_gpu(model: str, tp: int) -> float:
    """Weights and runtime reserve on each GPU of a ``tp``-way shard."""
    return MODELS[model].weight_bytes / tp + RUNTIME_RESERVE


def kv_bytes_per_gpu_token(model: str, tp: int) -> float:
    return MODELS[model].kv_bytes_per_token / tp


def default_placement(topology: Topology, workload: str = "chat", model: str = "llama2-70b") -> list[Placement]:
    """Tensor-parallel pairs on ``(0,1), (2,3), ...`` leaving the last pair free."""
    pairs = topology.n // 2
    if pairs < 2:
        raise ConfigError(f"sim.topology: {topology.name} has {topology.n} GPUs; the simulator needs at least 4")
    return [Placement(f"{workload}-{k}", workload, model, 2, (2 * k, 2 * k + 1)) for k in range(pairs - 1)]
