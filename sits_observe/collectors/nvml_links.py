"""NVLink data counters of one GPU, link by link: a total that never goes down, and a rate that a link
failing to read for a while does not inflate.

NVML gives each link's cumulative RX and TX data counter (KiB) as field values, and each field can fail
on its own.  The GPU's total starts at the sum of the links read at its first read and then adds each
link's increase since its last good read, so one failing link does not make it drop (which Prometheus
would take for a counter reset: the other links' lifetime bytes in one rate), nor a link read for the
first time later (it failed at start) add its lifetime bytes to it.  The rate adds, over the links read
now and at some earlier sample, each link's increase since its last good read divided by the time since
then; a link whose counter went down (a driver reload) counts its new value, as Prometheus' ``rate()``
does, in the total too.  No link ever read: NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..frame import Sample
from .gpu_samples import detail

__all__ = ["LinkCounters", "link_bytes"]

_LINK_BYTES = ("sits_gpu_nvlink_link_rx_bytes_total", "sits_gpu_nvlink_link_tx_bytes_total")


def link_bytes(values: Sequence[Any], success: int, labels: Sequence[tuple[tuple[str, str], ...]],
               samples: list[Sample]) -> np.ndarray:
    """``(links, 2)`` RX/TX bytes from NVML field values (RX, TX, RX, TX ... link by link, in KiB; NaN where one
    failed), each read one added to ``samples`` with its link's ``labels``."""
    read = np.full((len(labels), 2), np.nan)
    for k, v in enumerate(values):
        if v.nvmlReturn == success:
            nbytes = read[k >> 1, k & 1] = float(v.value.ullVal) * 1024.0
            samples.append(detail(_LINK_BYTES[k & 1], labels[k >> 1], nbytes))
    return read


class LinkCounters:
    """The last good value of each link's (RX, TX) counter, in bytes, when it was read, and the GPU's totals."""

    def __init__(self, links: int) -> None:
        self._last = np.full((links, 2), np.nan)
        self._at = np.full((links, 2), np.nan)
        self._total = np.full(2, np.nan)

    def update(self, now: float, read: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Take one sample's ``read`` bytes (``(links, 2)``: RX, TX; NaN where the field failed);
        returns the (RX, TX) totals and rates in bytes per second."""
        ok = ~np.isnan(read)
        again = ok & (now > self._at)  # False where never read before (NaN)
        with np.errstate(divide="ignore", invalid="ignore"):
            increase = np.where(again, np.where(read >= self._last, read - self._last, read), 0.0)
            rates = np.where(again, increase / (now - self._at), 0.0).sum(axis=0)
        rates[~again.any(axis=0)] = np.nan
        first = np.isnan(self._total) & ok.any(axis=0)  # the baseline: what the links read at the first read
        self._total = np.where(first, np.where(ok, read, 0.0).sum(axis=0), self._total + increase.sum(axis=0))
        self._last = np.where(ok, read, self._last)
        self._at = np.where(ok, now, self._at)
        return self._total.copy(), rates
