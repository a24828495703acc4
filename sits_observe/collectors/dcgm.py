"""DCGM source: read an existing dcgm-exporter page and map its ``DCGM_FI_*`` fields to the GPU fields.

Hosts that already run dcgm-exporter need no NVML access here.  GPU identity comes from the exporter's
labels (``gpu``, ``UUID``, ``modelName``, ``pci_bus_id``); series of MIG instances (``GPU_I_ID`` set) give
only the fields they repeat from their GPU (clocks, power, temperature, errors: dcgm-exporter lists only the
instances of a GPU in MIG mode), since the GPU fields are per device.  The page is read every
``sample_interval`` seconds and the ticks in between reuse it; it is fetched in the background together with
the other sources' pages (:mod:`.pagefetch`).  The mapping table is :data:`DCGM_MAP` (and docs/collectors.md).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import CollectorError, StillDown
from ..frame import GPU_FIELD_INDEX, GPU_FIELDS, Frame, GpuFrame, GpuInfo, Sample
from .gpu_samples import gpu_sample
from .config import shown_url
from .pagefetch import PageFetch
from .promtext import PageParser, Series, fetch_page

__all__ = ["DCGM_MAP", "DCGM_SAMPLES", "DcgmSource", "frame_part"]

log = logging.getLogger(__name__)

MIB = 1024.0**2
# dcgm-exporter field -> (GPU field, scale to base units); fields listed twice for one GPU field are summed.
DCGM_MAP: tuple[tuple[str, str, float], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "utilization_ratio", 0.01),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "memory_utilization_ratio", 0.01),
    ("DCGM_FI_DEV_FB_USED", "memory_used_bytes", MIB),
    ("DCGM_FI_DEV_FB_USED", "memory_total_bytes", MIB),
    ("DCGM_FI_DEV_FB_FREE", "memory_total_bytes", MIB),
    ("DCGM_FI_DEV_FB_RESERVED", "memory_total_bytes", MIB),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_hertz", 1e6),
    ("DCGM_FI_DEV_MEM_CLOCK", "memory_clock_hertz", 1e6),
    ("DCGM_FI_DEV_POWER_USAGE", "power_watts", 1.0),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_celsius", 1.0),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "throttle_reasons", 1.0),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_reasons", 1.0),  # name before DCGM 3.3
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_second", 1.0),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_second", 1.0),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_second", 1.0),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_second", 1.0),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected_errors_total", 1.0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected_errors_total", 1.0),
    ("DCGM_FI_DEV_RETIRED_SBE", "retired_pages", 1.0),
    ("DCGM_FI_DEV_RETIRED_DBE", "retired_pages", 1.0),
)
# dcgm-exporter field -> (sample name, extra label) for the per-GPU detail samples
DCGM_SAMPLES: dict[str, tuple[str, dict[str, str]]] = {
    "DCGM_FI_DEV_XID_ERRORS": ("sits_gpu_last_xid", {}),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("sits_gpu_remapped_rows", {"kind": "correctable"}),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("sits_gpu_remapped_rows", {"kind": "uncorrectable"}),
}
# fields a MIG instance's series (label GPU_I_ID) repeats from its GPU: read from them where the GPU has no series
# of its own (dcgm-exporter lists only the instances of a GPU in MIG mode); its memory and utilization are not
_DEVICE_WIDE = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"})
_SUMMED = {"memory_total_bytes", "retired_pages"}
_BY_METRIC: dict[str, list[tuple[int, float, bool]]] = {
    metric: [(GPU_FIELD_INDEX[f], scale, f in _SUMMED) for m, f, scale in DCGM_MAP if m == metric]
    for metric, _, _ in DCGM_MAP
}
_WANTED = frozenset(_BY_METRIC) | frozenset(DCGM_SAMPLES)
# a summed field only where the page has these parts of it for the GPU: FB_USED alone (a trimmed counters file)
# made the total the used memory, every GPU 100 % full; FB_RESERVED is missing before DCGM 3.x and may be
_PARTS_NEEDED = {GPU_FIELD_INDEX["memory_total_bytes"]: frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"})}


def frame_part(series: Series) -> tuple[GpuFrame, list[Sample], list[str]]:
    """The GPU fields and detail samples of one parsed dcgm-exporter page (GPUs ordered by index), and the
    fields left out for a GPU because their value is infinite (``+Inf``, ``1e400``: the store refuses a GPU frame
    holding one, which would lose every GPU's fields), each as ``"GPU <index> <field>"``.

    Only a GPU's first series of each metric counts: with Kubernetes GPU sharing (time-slicing, MPS)
    dcgm-exporter repeats it once per pod using the GPU, differing only in ``pod``, ``namespace``,
    ``container`` (and vGPU) labels.  The device's own series come before its MIG instances' (which count
    only for the fields of :data:`_DEVICE_WIDE`)."""
    infos: dict[str, GpuInfo] = {}
    cells: dict[tuple[str, int], float] = {}  # (gpu label, field column) -> value
    parts: dict[tuple[str, int], set[str]] = {}  # (gpu label, summed field column) -> the metrics summed in it
    samples = []
    for metric, entries in series.items():
        targets = _BY_METRIC.get(metric, ())
        detail = DCGM_SAMPLES.get(metric)
        seen: set[str] = set()
        mig_too = metric in _DEVICE_WIDE
        for labels, value in sorted(entries, key=lambda e: bool(e[0].get("GPU_I_ID"))):  # stable: page order kept
            gpu = labels.get("gpu")
            if gpu is None or (labels.get("GPU_I_ID") and not mig_too) or not gpu.isdigit() or gpu in seen:
                continue
            seen.add(gpu)
            info = infos.get(gpu)
            if info is None:
                info = infos[gpu] = GpuInfo(int(gpu), labels.get("UUID", ""), labels.get("modelName", ""),
                                            labels.get("pci_bus_id", ""))
            for col, scale, add in targets:
                key = (gpu, col)
                cells[key] = cells.get(key, 0.0) + value * scale if add else value * scale
                if add:
                    parts.setdefault(key, set()).add(metric)
            if detail is not None:
                samples.append(gpu_sample(detail[0], info, value, **detail[1]))
    order = sorted(infos, key=lambda gpu: infos[gpu].index)
    pos = {gpu: i for i, gpu in enumerate(order)}
    frame = GpuFrame.empty([infos[gpu] for gpu in order])
    infinite = []
    for (gpu, col), value in cells.items():
        if col in _PARTS_NEEDED and not _PARTS_NEEDED[col] <= parts[(gpu, col)]:
            continue
        if math.isfinite(value):
            frame.values[pos[gpu], col] = value
        elif not math.isnan(value):  # NaN is how the frame marks a field not available anyway
            infinite.append(f"GPU {gpu} {GPU_FIELDS[col].name}")
    return frame, samples, infinite


@dataclass
class _Page:
    gpu: GpuFrame
    samples: list[Sample] = field(default_factory=list)


class DcgmSource:
    """A Source (``name = "dcgm"``) filling ``frame.gpu`` from a dcgm-exporter URL."""

    name = "dcgm"

    def __init__(self, url: str, *, sample_interval: float = 5.0, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._shown = shown_url(url)  # for messages, once
        self.sample_interval = sample_interval
        self.parser = PageParser()
        self._page: _Page | None = None
        self._said: set[str] = set()  # fields logged as infinite: once each, a page is read every few seconds
        self._next_at = -np.inf
        self._fetch = PageFetch(fetch_page, url, timeout, clock=clock, due=lambda now: now >= self._next_at)

    def read(self, text: str) -> _Page:
        """Parse one page (what :meth:`collect` does every ``sample_interval``)."""
        series = self.parser.parse(text, _WANTED.__contains__, source=self._shown)
        gpu, samples, infinite = frame_part(series)
        if not gpu.info:
            raise CollectorError(f"{self._shown}: no DCGM_FI_* GPU series on the page; "
                                 "is this a dcgm-exporter /metrics URL (gpu.dcgm_url)?")
        if new := [f for f in infinite if f not in self._said]:
            self._said.update(new)
            log.warning("dcgm: %s: an infinite value for %s; left out (said once per field)",
                        self._shown, ", ".join(new))
        return _Page(gpu, samples)

    def prefetch(self, stop: threading.Event | None = None) -> None:
        """Start the page fetch when a sample is due (see :mod:`.pagefetch`)."""
        self._fetch.prefetch(stop)

    def collect(self, frame: Frame) -> None:
        now = self._fetch.tick_time()
        if now >= self._next_at:
            self._next_at = now + self.sample_interval
            self._page = None  # a failed read leaves no GPU data rather than an old page
            self._page = self.read(self._fetch.page())
        elif self._page is None:  # the last read failed; asked again at the next sample
            raise StillDown(f"dcgm: next read in {self._next_at - now:.0f} s")
        if self._page is not None:
            page = self._page
            frame.gpu = GpuFrame(page.gpu.info, page.gpu.values.copy(), page.gpu.healthy.copy())
            frame.samples.extend(page.samples)
