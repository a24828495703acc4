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
    """Deltas of one program's ``stage_latency`` map since the last drain."""

    def __init__(self, table: Any, layout: BucketLayout) -> None:
        self._reader = BatchReader(table)
        to_layout = kernel_to_layout(layout.edges)
        blocks = -(-len(to_layout) // SUB)
        self._to_layout = np.pad(to_layout, (0, blocks * SUB - len(to_layout)), mode="edge").reshape(blocks, SUB)
        self._n_out = layout.n
        self._prev = _Cumulative(SUB + 1)

    def drain(self) -> list[SeriesDelta]:
        raw_keys, raw_vals = self._reader.read()
        # key: u16 stage, u16 workload, u32 block (little-endian), so series = low 32 bits;
        # value per CPU: SUB counts then the sum (u64 each)
        keys = np.ascontiguousarray(raw_keys).view("<u8").ravel()
        cpus = raw_vals.shape[1] // (8 * (SUB + 1))
        vals = np.ascontiguousarray(raw_vals).view("<u8").reshape(len(keys), cpus, SUB + 1)
        keys, delta = self._prev.delta(keys, vals.sum(axis=1, dtype=np.uint64))
        live = delta[:, :SUB].any(axis=1)
        if not live.any():
            return []
        keys, delta = keys[live], delta[live]
        series, inv = np.unique(keys & np.uint64(0xFFFFFFFF), return_inverse=True)
        out = self._to_layout[(keys >> np.uint64(32)).astype(np.int64)]  # (rows, SUB) exported buckets
        flat = np.bincount((inv[:, None] * self._n_out + out).ravel(),
                           weights=delta[:, :SUB].ravel().astype(np.float64), minlength=len(series) * self._n_out)
        counts = flat.reshape(len(series), self._n_out).astype(np.uint64)
        sums = np.zeros(len(series), np.uint64)
        np.add.at(sums, inv, delta[:, SUB])
        return [SeriesDelta(s & 0xFFFF, s >> 16, row, total, int(row.sum()))
                for s, row, total in zip(series.tolist(), counts, sums.tolist())]
