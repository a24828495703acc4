"""Per-GPU detail samples shared by the NVML and DCGM sources (latest-only, labels of the GPU plus one more)."""

from __future__ import annotations

from typing import Literal

from ..frame import GpuInfo, Sample

__all__ = ["SAMPLE_SPECS", "gpu_labels", "gpu_sample", "detail"]

# name -> (kind, help); every name carries gpu, uuid, model, pci_bus_id and the extra label shown.
SAMPLE_SPECS: dict[str, tuple[Literal["gauge", "counter"], str]] = {
    "sits_gpu_nvlink_link_up": ("gauge", "1 when the NVLink link (label link) is active, 0 when it is down."),
    "sits_gpu_nvlink_link_rx_bytes_total": ("counter", "Data bytes received on one NVLink link (label link)."),
    "sits_gpu_nvlink_link_tx_bytes_total": ("counter", "Data bytes transmitted on one NVLink link (label link)."),
    "sits_gpu_process_memory_used_bytes": (
        "gauge", "Device memory used by the processes of a workload; 'other' sums processes of no configured workload."),
    "sits_gpu_last_xid": ("gauge", "Code of the most recent XID error reported for the GPU."),
    "sits_gpu_remapped_rows": ("gauge", "Device memory rows remapped, by kind (correctable, uncorrectable)."),
}


def gpu_labels(info: GpuInfo, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("gpu", str(info.index)), ("uuid", info.uuid), ("model", info.model), ("pci_bus_id", info.pci_bus_id),
            *extra)


def detail(name: str, labels: tuple[tuple[str, str], ...], value: float) -> Sample:
    """One sample named in :data:`SAMPLE_SPECS` with ready-made labels (see :func:`gpu_labels`)."""
    kind, help_ = SAMPLE_SPECS[name]
    return Sample(name, kind, help_, labels, float(value))


def gpu_sample(name: str, info: GpuInfo, value: float, **extra: str) -> Sample:
    """One sample named in :data:`SAMPLE_SPECS` for ``info``'s GPU, plus ``extra`` labels."""
    return detail(name, gpu_labels(info, *extra.items()), value)
