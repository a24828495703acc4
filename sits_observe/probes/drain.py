"""Draining the kernel's cumulative per-CPU stage maps into per-tick deltas on the exported buckets.

``stage_latency`` holds a count per (stage, workload, kernel bucket) and CPU, ``stage_latency_sum`` the
exact sum and count per (stage, workload) and CPU (see ``bpf/stage.h``). Both only grow; each drain
reads them with batch look-ups, sums the CPUs, subtracts the previous reading and folds kernel buckets
into the exported layout with :func:`sits_observe.histogram.kernel_to_layout`, so every exported bucket
is an exact sum of kernel buckets.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ProbeError
from ..frame import BucketLayout
from ..histogram import kernel_to_layout

__all__ = ["SeriesDelta", "BatchReader", "StageDrain"]


@dataclass(frozen=True, slots=True)
class SeriesDelta:
    """One (stage, workload) series for one tick: exported-bucket counts and the exact sum/count."""

    stage: int
    workload: int
    counts: np.ndarray
    sum_ns: int
    count: int


class BatchReader:
    """Reads every entry of a bcc hash map as raw rows with BPF_MAP_LOOKUP_BATCH (kernel 5.6+).

    Falls back to per-key iteration where the kernel has no batch operations for the map.
    """

    def __init__(self, table: Any) -> None:
        from bcc.libbcc import lib

        self._lib = lib
        self._table = table
        self._ksz = ct.sizeof(table.Key)
        self._vsz = ct.sizeof(table.Leaf)
        cap = int(table.max_entries)
        self._keys = np.empty((cap, self._ksz), np.uint8)
        self._vals = np.empty((cap, self._vsz), np.uint8)
        self._batch = True

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values): uint8 rows of key and (all-CPU) value bytes, one per entry."""
        if self._batch:
            got = self._read_batch()
            if got is not None:
                return got
            self._batch = False
        rows = [(bytes(k), bytes(v)) for k, v in self._table.items()]
        keys = np.frombuffer(b"".join(k for k, _ in rows), np.uint8).reshape(-1, self._ksz)
        vals = np.frombuffer(b"".join(v for _, v in rows), np.uint8).reshape(-1, self._vsz)
        return keys, vals

    def _read_batch(self) -> tuple[np.ndarray, np.ndarray] | None:
        cap = len(self._keys)
        in_b, out_b, cnt = ct.c_uint32(0), ct.c_uint32(0), ct.c_uint32(0)
        total = 0
        while total < cap:
            cnt.value = cap - total
            res = self._lib.bpf_lookup_batch(
                self._table.map_fd, ct.byref(in_b) if total else None, ct.byref(out_b),
                self._keys[total:].ctypes.data, self._vals[total:].ctypes.data, ct.byref(cnt))
            err = ct.get_errno()
            total += cnt.value
            if res != 0:
                if err == errno.ENOENT:
                    break
                if err in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP) and total == 0:
                    return None
                raise ProbeError(f"map {self._table.name!r}: batch look-up failed: {os.strerror(err)}")
            if cnt.value == 0:
                break
            in_b.value = out_b.value
        return self._keys[:total].copy(), self._vals[:total].copy()


class _Cumulative:
    """The previous reading of a cumulative map, to turn new readings into deltas."""

    def __init__(self, width: int) -> None:
        self.keys = np.empty(0, np.uint64)
        self.vals = np.empty((0, width), np.uint64)

    def delta(self, keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(keys, kind="stable")
        keys, vals = keys[order], vals[order]
        prev = np.zeros_like(vals)
        if len(self.keys):
            pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            found = self.keys[pos] == keys
            prev[found] = self.vals[pos[found]]
        self.keys, self.vals = keys, vals
        return keys, vals - prev


class StageDrain:
    """Deltas of one program's ``stage_latency`` / ``stage_latency_sum`` maps since the last drain."""

    def __init__(self, hist_table: Any, sum_table: Any, layout: BucketLayout) -> None:
        self._hist = BatchReader(hist_table)
        self._sum = BatchReader(sum_table)
        self._to_layout = kernel_to_layout(layout.edges)
        self._n_out = layout.n
        self._prev_hist = _Cumulative(1)
        self._prev_sum = _Cumulative(2)

    def drain(self) -> list[SeriesDelta]:
        hkeys, hvals = self._hist.read()
        skeys, svals = self._sum.read()
        # key bytes: u16 stage, u16 workload, u32 bucket (little-endian) -> series = low 32 bits
        hk = np.ascontiguousarray(hkeys).view("<u8").ravel()
        hv = np.ascontiguousarray(hvals).view("<u8").sum(axis=1, dtype=np.uint64)[:, None]
        hk, hd = self._prev_hist.delta(hk, hv)
        sk = np.ascontiguousarray(skeys).view("<u4").ravel().astype(np.uint64)
        sv = np.ascontiguousarray(svals).view("<u8").reshape(len(skeys), svals.shape[1] // 16, 2)
        sv = sv.sum(axis=1, dtype=np.uint64)
        sk, sd = self._prev_sum.delta(sk, sv)

        live = hd[:, 0] > 0
        hk, hd = hk[live], hd[live, 0]
        if not len(hk):
            return []
        series, inv = np.unique(hk & np.uint64(0xFFFFFFFF), return_inverse=True)
        out = self._to_layout[(hk >> np.uint64(32)).astype(np.int64)]
        flat = np.bincount(inv * self._n_out + out, weights=hd.astype(np.float64),
                           minlength=len(series) * self._n_out)
        counts = flat.reshape(len(series), self._n_out).astype(np.uint64)
        pos = np.minimum(np.searchsorted(sk, series), max(len(sk) - 1, 0))
        has_sum = (sk[pos] == series) if len(sk) else np.zeros(len(series), bool)
        result = []
        for i, s in enumerate(series.tolist()):
            total, count = (int(sd[pos[i], 0]), int(sd[pos[i], 1])) if has_sum[i] else (0, 0)
            result.append(SeriesDelta(s & 0xFFFF, s >> 16, counts[i], total, count))
        return result
