"""The collector sources a config asks for (for the daemon's wiring)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..errors import CollectorError
from ..frame import BucketLayout
from .dcgm import DcgmSource
from .host import HostSource
from .nvml import NvmlSource
from .nvml_driver import started
from .replicas import ReplicaBoard
from .servers import ServerSource

__all__ = ["build_sources"]

log = logging.getLogger(__name__)


def build_sources(config: Config, layout: BucketLayout, *, resolve_workload: Callable[[int], str | None] | None = None,
                  nvml: Any = None, clock: Callable[[], float] = time.monotonic) -> list[Any]:
    """The host source (CPU, memory, per NUMA node; not with the simulator, which has its own host), the GPU
    source of ``gpu.backend`` (nvml or dcgm; sim and none add none here) and one per ``servers`` entry.

    NVML that cannot start (no driver, or no answer within :data:`~.nvml_driver.START_TIMEOUT`) is logged as one
    line and left out, so everything else still runs.
    The servers come before the GPU source: each tick they tell the shared :class:`ReplicaBoard` their
    backlog, which the NVML source joins to the GPUs their processes use.
    """
    gpu = config.gpu
    sources: list[Any] = [] if gpu.backend == "sim" else [HostSource()]
    replicas = ReplicaBoard()
    servers = [ServerSource(s, layout, clock=clock, replicas=replicas) for s in config.servers]
    names = [s.name for s in servers]
    for k, src in enumerate(servers):  # replicas of one workload: each its own health and error count
        if names.count(src.name) > 1:
            src.name = f"{src.name}#{k}"
    sources += servers
    if gpu.backend == "nvml":
        try:
            sources.append(started("nvml", lambda: NvmlSource(
                nvml, sample_interval=gpu.sample_interval, timeout=gpu.nvml_timeout, clock=clock,
                resolve_workload=resolve_workload, replicas=replicas)))
        except CollectorError as exc:
            log.warning("%s", exc)
    elif gpu.backend == "dcgm" and gpu.dcgm_url:
        sources.append(DcgmSource(gpu.dcgm_url, sample_interval=gpu.sample_interval, timeout=gpu.dcgm_timeout,
                                  clock=clock))
    return sources
