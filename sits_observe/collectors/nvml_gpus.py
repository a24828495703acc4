"""The GPUs the NVML source reads: each one's identity, handle and NVLinks, opened once at start."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..frame import GpuInfo
from .gpu_samples import gpu_labels
from .nvml_driver import is_unsupported
from .nvml_links import LinkCounters

__all__ = ["NvmlGpu", "open_gpu"]

log = logging.getLogger("sits_observe.collectors.nvml")


@dataclass
class NvmlGpu:
    """One GPU; ``handle`` None: it could not be opened (reported unhealthy every sample)."""

    info: GpuInfo
    handle: Any
    links: tuple[int, ...] = ()
    link_labels: tuple[tuple[tuple[str, str], ...], ...] = ()
    field_ids: list[tuple[int, int]] = field(default_factory=list)  # (RX, link), (TX, link) per link
    nvlink: LinkCounters = field(default_factory=lambda: LinkCounters(0))


def open_gpu(nv: Any, index: int) -> NvmlGpu:
    """GPU ``index`` with its handle and active NVLinks; one that cannot be opened (lost, unpowered, IRQ trouble)
    keeps its index without an identity, and only it: not the whole source."""
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        info = GpuInfo(index, nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetName(h), nv.nvmlDeviceGetPciInfo(h).busId)
        links = tuple(link for link in range(nv.NVML_NVLINK_MAX_LINKS) if _has_link(nv, h, link))
    except nv.NVMLError as exc:
        if exc.value != nv.NVML_ERROR_GPU_IS_LOST:
            log.warning("nvml: GPU %d cannot be opened (%s); reported unhealthy until a restart", index, exc)
        return NvmlGpu(GpuInfo(index, "", "", ""), None)
    ids = [(fid, link) for link in links
           for fid in (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)]
    return NvmlGpu(info, h, links, tuple(gpu_labels(info, ("link", str(k))) for k in links), ids,
                   nvlink=LinkCounters(len(links)))


def _has_link(nv: Any, handle: Any, link: int) -> bool:
    try:
        nv.nvmlDeviceGetNvLinkState(handle, link)
    except nv.NVMLError as exc:
        if not is_unsupported(nv, exc):
            log.warning("nvml: NVLink %d state unreadable (%s); its throughput is not read", link, exc)
        return False
    return True
