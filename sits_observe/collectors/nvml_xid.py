"""XID critical-error events of NVML's GPUs: registered once, drained without blocking at each sample, counted
per GPU (``xid_errors_total``, ``sits_gpu_last_xid``).  A GPU that fell off the bus keeps both: its event is
matched by handle, since asking NVML for a lost GPU's index fails."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..frame import GPU_FIELD_INDEX, GpuInfo, Sample
from .gpu_samples import gpu_sample

__all__ = ["XidEvents", "MAX_XID_EVENTS"]

log = logging.getLogger("sits_observe.collectors.nvml")

MAX_XID_EVENTS = 256  # drained per sample; the rest wait for the next one


class XidEvents:
    """One NVML event set for the GPUs of ``handles`` (None: a GPU that could not be opened)."""

    def __init__(self, nvml: Any, handles: Sequence[Any]) -> None:
        self.nvml, self.handles = nvml, list(handles)
        self.registered = [False] * len(self.handles)
        self.count = np.zeros(len(self.handles))
        self.last: dict[int, int] = {}
        self._set = self._register()

    def _register(self) -> Any:
        nv = self.nvml
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("nvml: XID events unavailable (%s); sits_gpu_xid_errors_total is omitted", exc)
            return None
        for i, h in enumerate(self.handles):
            if h is None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
                self.registered[i] = True
            except nv.NVMLError as exc:
                log.info("nvml: GPU %d gives no XID events (%s)", i, exc)
        return events

    def drain(self, errors: list[str]) -> None:
        """Count the events waiting (0 ms wait: never blocks); a failure other than "none waiting" goes to
        ``errors``."""
        if self._set is None:
            return
        nv = self.nvml
        for _ in range(MAX_XID_EVENTS):
            try:
                event = nv.nvmlEventSetWait_v2(self._set, 0)
            except nv.NVMLError as exc:
                if exc.value != nv.NVML_ERROR_TIMEOUT:  # timeout = no event waiting
                    errors.append(f"XID events: {exc}")
                return
            if not event.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            i = self._position(event.device)
            if i is None:
                errors.append(f"XID {int(event.eventData)} of a GPU not known here; not counted")
                continue
            self.count[i] += 1
            self.last[i] = int(event.eventData)

    def fields(self, i: int, info: GpuInfo, row: np.ndarray, samples: list[Sample]) -> None:
        """GPU ``i``'s XID count into its ``row``, its last XID as a sample (where it registered)."""
        if self.registered[i]:
            row[GPU_FIELD_INDEX["xid_errors_total"]] = self.count[i]
            if i in self.last:
                samples.append(gpu_sample("sits_gpu_last_xid", info, self.last[i]))

    def close(self) -> None:
        if self._set is not None:
            self.nvml.nvmlEventSetFree(self._set)

    def _position(self, device: Any) -> int | None:
        """Which GPU an event's device is: by its handle (no NVML call), else by its NVML index."""
        for i, h in enumerate(self.handles):
            if h is not None and _same_handle(h, device):
                return i
        try:
            i = self.nvml.nvmlDeviceGetIndex(device)
        except self.nvml.NVMLError:
            return None
        return i if 0 <= i < len(self.handles) else None


def _same_handle(a: Any, b: Any) -> bool:
    """NVML device handles are pointers: equal when they point at the same device (two ctypes pointer objects
    to one address are not ``==``)."""
    try:
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return bool(a == b)
