"""Draining the kernel's cumulative per-CPU stage map into per-tick deltas on the exported buckets.

``stage_latency`` holds, per (stage, workload, bucket block) and CPU, the counts of the block's ``SUB``
kernel buckets and the exact sum of their latencies (see ``bpf/stage.h``). Counters only grow: each
drain reads the map with batch look-ups, sums the CPUs, subtracts the previous reading and folds kernel
buckets into the exported layout with :func:`sits_observe.histogram.kernel_to_layout`, so every exported
bucket is an exact sum of kernel buckets, and counts and sums are exact.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from typing import Any, NamedTuple

import numpy as np

from ..errors import ProbeError
from ..frame import BucketLayout
from ..histogram import SUB, kernel_to_layout

__all__ = ["SeriesDelta", "BatchReader", "StageDrain"]


class SeriesDelta(NamedTuple):
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


class StageDrain:
    """Deltas of one program's ``stage_latency`` map since the last drain.

    Keys only ever get added, and a hash map lists unchanged keys in the same order, so the previous
    reading and the series index are kept per key order and rebuilt only when the key set changes.
    """

    def __init__(self, table: Any, layout: BucketLayout) -> None:
        self._reader = BatchReader(table)
        to_layout = kernel_to_layout(layout.edges)
        blocks = -(-len(to_layout) // SUB)
        self._to_layout = np.pad(to_layout, (0, blocks * SUB - len(to_layout)), mode="edge").reshape(blocks, SUB)
        self._n_out = layout.n
        self._keys = np.empty(0, np.uint64)
        self._prev = np.empty((0, SUB + 1), np.uint64)
        self._series = np.empty(0, np.uint64)
        self._inv = np.empty(0, np.int64)
        self._out = np.empty((0, SUB), np.int64)

    def _reindex(self, keys: np.ndarray) -> None:
        """New key order: carry the previous readings over, rebuild key -> series and bucket maps."""
        prev = np.zeros((len(keys), SUB + 1), np.uint64)
        if len(self._keys):
            order = np.argsort(self._keys)
            pos = np.minimum(np.searchsorted(self._keys, keys, sorter=order), len(order) - 1)
            found = self._keys[order[pos]] == keys
            prev[found] = self._prev[order[pos[found]]]
        self._keys, self._prev = keys, prev
        # key: u16 stage, u16 workload, u32 block (little-endian), so the series is the low 32 bits
        self._series, self._inv = np.unique(keys & np.uint64(0xFFFFFFFF), return_inverse=True)
        self._out = self._to_layout[(keys >> np.uint64(32)).astype(np.int64)]

    def drain(self) -> list[SeriesDelta]:
        raw_keys, raw_vals = self._reader.read()
        keys = np.ascontiguousarray(raw_keys).view("<u8").ravel()
        if not np.array_equal(keys, self._keys):
            self._reindex(keys)
        # value per CPU: SUB bucket counts, then the sum of their latencies (u64 each)
        cpus = raw_vals.shape[1] // (8 * (SUB + 1))
        vals = np.ascontiguousarray(raw_vals).view("<u8").reshape(len(keys), cpus, SUB + 1).sum(axis=1, dtype=np.uint64)
        delta, self._prev = vals - self._prev, vals
        # a count or a sum moved: a read between the program's count++ and its sum += (not atomic together) sees
        # the count first, and the sum's delta came alone at the next drain, then was lost
        rows = np.flatnonzero(delta.any(axis=1))
        if not len(rows):
            return []
        n_series, n_out = len(self._series), self._n_out
        inv = self._inv[rows]
        flat = np.bincount((inv[:, None] * n_out + self._out[rows]).ravel(),
                           weights=delta[rows, :SUB].ravel().astype(np.float64), minlength=n_series * n_out)
        counts = flat.reshape(n_series, n_out).astype(np.uint64)
        sums = np.zeros(n_series, np.uint64)
        np.add.at(sums, inv, delta[rows, SUB])
        live = np.flatnonzero(np.bincount(inv, minlength=n_series))
        rows_out = counts[live]
        return [SeriesDelta(s & 0xFFFF, s >> 16, row, total, n)
                for s, row, total, n in zip(self._series[live].tolist(), rows_out, sums[live].tolist(),
                                            rows_out.sum(axis=1).tolist(), strict=True)]
