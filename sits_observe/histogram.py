"""Log-linear (HDR-style) latency buckets shared by the BPF programs, the simulator and the exporter.

Kernel side (``bpf/hist.h``) and this module compute the same bucket index for a latency ``v`` in
integer nanoseconds.  Buckets are left-open, right-closed: bucket ``b`` holds ``lower(b) < v <= upper(b)``,
so a Prometheus bucket ``le=upper(b)`` is an exact cumulative sum of kernel buckets.

With ``u = v - 1`` (``v = 0`` goes to bucket 0):

* ``u < SUB``: bucket ``u`` (exact, 1 ns wide);
* otherwise ``e = floor(log2(u))``, ``sub = (u >> (e - SUB_BITS)) & (SUB - 1)`` and the bucket is
  ``(e - SUB_BITS + 1) * SUB + sub``: ``SUB`` sub-buckets per power of two (relative width <= 1/SUB);
* ``u >= 2**(MAX_EXP + 1)``: the overflow bucket ``NUM_BUCKETS - 1`` (upper edge +Inf).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import BucketEdgeError

__all__ = [
    "SUB_BITS",
    "SUB",
    "MAX_EXP",
    "NUM_BUCKETS",
    "kernel_bucket",
    "kernel_upper_ns",
    "snap_edges",
    "kernel_to_layout",
    "EDGE_RANGE_S",
]

SUB_BITS = 4
SUB = 1 << SUB_BITS
MAX_EXP = 39  # last finite edge is 2**40 ns (about 1100 s)
NUM_BUCKETS = (MAX_EXP - SUB_BITS + 2) * SUB + 1  # finite buckets + one overflow bucket


def kernel_bucket(v_ns: np.ndarray | int) -> np.ndarray:
    """Bucket index of latencies in integer nanoseconds (vectorised, same maths as ``bpf/hist.h``)."""
    v = np.asarray(v_ns, dtype=np.uint64)
    u = np.where(v == 0, 0, v - np.uint64(1)).astype(np.uint64)
    out = np.empty(u.shape, dtype=np.int64)
    small = u < SUB
    out[small] = u[small].astype(np.int64)
    big = ~small
    if big.any():
        ub = u[big]
        # floor(log2) without float rounding: bit_length - 1
        e = np.array([int(x).bit_length() - 1 for x in ub.ravel()], dtype=np.int64).reshape(ub.shape)
        sub = (ub >> (e - SUB_BITS).astype(np.uint64)) & np.uint64(SUB - 1)
        idx = (e - SUB_BITS + 1) * SUB + sub.astype(np.int64)
        idx[e > MAX_EXP] = NUM_BUCKETS - 1
        out[big] = idx
    return out


def kernel_upper_ns(bucket: int) -> float:
    """Inclusive upper edge (ns) of a kernel bucket; +Inf for the overflow bucket."""
    if bucket >= NUM_BUCKETS - 1:
        return float("inf")
    if bucket < SUB:
        return float(bucket + 1)
    e = bucket // SUB + SUB_BITS - 1
    sub = bucket % SUB
    return float((SUB + sub + 1) << (e - SUB_BITS))


_UPPERS = np.array([kernel_upper_ns(b) for b in range(NUM_BUCKETS - 1)])
EDGE_RANGE_S = (1e-9, float(_UPPERS[-1]) / 1e9)  # the bucket edges store.buckets may have, seconds


def snap_edges(edges_s: Sequence[float], *, field: str = "store.buckets") -> tuple[float, ...]:
    """Snap configured ``le`` edges (seconds) to the nearest kernel bucket edges.

    Raises :class:`BucketEdgeError` naming the field when an edge is out of range or two edges snap to
    the same kernel edge.
    """
    out: list[float] = []
    for i, edge in enumerate(edges_s):
        ns = float(edge) * 1e9
        if not (1.0 <= ns <= _UPPERS[-1]):
            raise BucketEdgeError(field, i, f"bucket edge must be between {EDGE_RANGE_S[0]:g} and "
                                  f"{EDGE_RANGE_S[1]:g} s", edge)
        j = int(np.searchsorted(_UPPERS, ns))
        cands = [k for k in (j - 1, j) if 0 <= k < len(_UPPERS)]
        best = min(cands, key=lambda k: abs(_UPPERS[k] - ns))
        snapped = float(_UPPERS[best]) / 1e9
        if out and snapped <= out[-1]:
            raise BucketEdgeError(field, i, f"snaps to {snapped:.9g} s, not above the previous edge {out[-1]:.9g} s; "
                                  "list edges ascending and at least 7% apart", edge)
        out.append(snapped)
    return tuple(out)


def kernel_to_layout(edges_s: Sequence[float]) -> np.ndarray:
    """Map every kernel bucket to the index of the exported bucket that holds it.

    ``edges_s`` must already be snapped; the result has ``NUM_BUCKETS`` entries with values in
    ``0..len(edges_s)`` (the last one is +Inf).  Each exported bucket is an exact sum of kernel buckets.
    """
    edges_ns = np.rint(np.asarray(edges_s, dtype=np.float64) * 1e9)
    uppers = np.append(_UPPERS, np.inf)
    return np.searchsorted(edges_ns, uppers, side="left").astype(np.int64)
