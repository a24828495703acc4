"""What the store can take: the first malformed thing in a source's part of a Frame, named.

The daemon collects each source into a Frame of its own and checks it here before adding it to the
tick's, so a source writing a wrong-shaped GPU array, a value that is not a finite number, a counter
increase below 0, a key of the wrong kind or a sample the exposition cannot render fails that source for
the tick (``sits_source_errors_total{source}``), never the store's ingest, the other sources or a
scrape.  NaN is allowed only in GPU arrays (a field not available) and in samples (exported as is).

This runs every tick, so each field is first tested in bulk: keys the store already holds (one set
test), value types as a set and one sum for finiteness, the bucket counts' dtype and length (one cheap
loop), one vectorised test of the GPU array.  Only a field failing that is walked entry by entry, to
name what is wrong (or to find it fine after all, e.g. a sum that overflowed).  About 0.1 us per
histogram series.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from ..frame import GPU_FIELDS, Frame, GpuFrame, GpuInfo, Sample
from .keys import KeyTable

__all__ = ["malformed", "malformed_samples"]

_REAL = (float, int, np.floating, np.integer)
_REAL_TYPES = {float, int, np.float64, np.float32, np.int64, np.int32, np.uint64, np.uint32}
_U64 = np.dtype(np.uint64)
TICK_COUNT_MAX = 2**32 - 1  # observations in one bucket in one tick: the history rings keep uint32
_KINDS = {"gauge", "counter"}  # a Sample's kinds
_value = attrgetter("value")
_sum = attrgetter("sum")
_name, _kind, _help, _labels = attrgetter("name"), attrgetter("kind"), attrgetter("help"), attrgetter("labels")


def _real(v: object) -> bool:
    return isinstance(v, _REAL) and not isinstance(v, bool)


def _finite(v: object) -> bool:
    return _real(v) and math.isfinite(v)  # type: ignore[arg-type]


def _pair(key: object) -> bool:
    return type(key) is tuple and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], str)


def _what(v: object) -> str:
    if isinstance(v, np.ndarray):
        return f"a {v.dtype} array of shape {v.shape}"
    return f"{v!r} ({type(v).__name__})"


def _all_finite(values: Iterable[object]) -> bool:
    """Fast, and only ever True when every value is a finite real number (False: look closer)."""
    values = list(values)
    try:
        return set(map(type, values)) <= _REAL_TYPES and math.isfinite(sum(values))  # type: ignore[arg-type]
    except OverflowError:
        return False


def _scalars(field: str, items: Mapping[object, object], pairs: bool, table: KeyTable | None,
             increases: bool = False) -> str | None:
    """``increases``: the values are a counter's increases in the tick, never below 0 (the exported total went
    down, which Prometheus' rate() reads as a reset: the whole total counted again as new)."""
    known = table.has_all(items.keys()) if table is not None else not pairs and set(map(type, items)) <= {str}
    fine = known and _all_finite(items.values())
    if fine and increases:
        fine = min(items.values(), default=0.0) >= 0  # type: ignore[type-var, operator]
    if fine:
        return None
    for key, value in items.items():
        if not (_pair(key) if pairs else isinstance(key, str)):
            return f"{field} key {key!r} is not {'a (name, workload) pair of strings' if pairs else 'a string'}"
        if not _finite(value):
            return f"{field}[{key!r}] is {_what(value)}, not a finite number"
        if increases and value < 0:  # type: ignore[operator]
            return f"{field}[{key!r}] is {value!r}: a counter's increase in one tick cannot be below 0"
    return None


def _hists(frame: Frame, buckets: int, table: KeyTable | None) -> str | None:
    hists = frame.hists
    try:
        if table is not None and table.has_all(hists.keys()):
            for d in hists.values():
                c = d.counts
                if c.dtype is not _U64 or c.ndim != 1 or len(c) != buckets or c.max(initial=0) > TICK_COUNT_MAX:
                    break
            else:
                if math.isfinite(sum(map(_sum, hists.values()))):
                    return None
    except (AttributeError, TypeError, ValueError, OverflowError):  # not a HistDelta, counts not an array: named below
        pass
    shape = (buckets,)
    for key, d in hists.items():
        if not _pair(key):
            return f"hists key {key!r} is not a (stage, workload) pair of strings"
        c, total = getattr(d, "counts", None), getattr(d, "sum", None)
        if c is None or total is None:
            return f"hists[{key!r}] is {_what(d)}, not a HistDelta"
        if type(c) is not np.ndarray or c.shape != shape or c.dtype != _U64:
            return f"hists[{key!r}].counts is {_what(c)}, not {buckets} uint64 bucket counts"
        if not _finite(total):
            return f"hists[{key!r}].sum is {_what(total)}, not a finite number of seconds"
        if c.max(initial=0) > TICK_COUNT_MAX:
            return (f"hists[{key!r}].counts has {int(c.max())} observations in one bucket in one tick, past "
                    f"{TICK_COUNT_MAX} (the history keeps 32-bit counts per tick)")
    return None


def _gpu(gpu: object, known: tuple[GpuInfo, ...]) -> str | None:
    if gpu is None:
        return None
    if not isinstance(gpu, GpuFrame):
        return f"gpu is {_what(gpu)}, not a GpuFrame"
    info = gpu.info
    if info is not known and (why := _gpu_info(info)) is not None:
        return why
    n = len(info)
    v, h = gpu.values, gpu.healthy
    if type(v) is not np.ndarray or v.shape != (n, len(GPU_FIELDS)) or v.dtype.kind not in "fiu":
        return f"gpu.values is {_what(v)}, not real numbers of shape ({n}, {len(GPU_FIELDS)})"
    if v.dtype.kind == "f" and np.isinf(v).any():
        return "gpu.values holds an infinity (NaN marks a field that is not available)"
    if type(h) is not np.ndarray or h.shape != (n,) or h.dtype != np.bool_:
        return f"gpu.healthy is {_what(h)}, not {n} booleans"
    return None


def _gpu_info(info: object) -> str | None:
    """What is wrong with a frame's GPU identities: the store keeps a GPU's history by index and UUID (a string
    index failed the whole tick's write; two GPUs of one index wrote one row, the other reading as missing)."""
    if type(info) is not tuple or not all(isinstance(i, GpuInfo) for i in info):
        return f"gpu.info is {_what(info)}, not a tuple of GpuInfo"
    for g in info:
        if type(g.index) is not int or g.index < 0 or not all(type(x) is str for x in (g.uuid, g.model, g.pci_bus_id)):
            return f"gpu.info has {g!r}: the index must be an int >= 0, uuid, model and bus id strings"
    if twice := _twice(g.index for g in info):
        return f"gpu.info gives GPU index {twice[0]} twice"
    if twice := _twice(g.uuid for g in info if g.uuid):
        return f"gpu.info gives UUID {twice[0]!r} to two GPUs"
    return None


def _twice(items: Iterable[Any]) -> list[Any]:
    """The items given more than once."""
    return [x for x, n in Counter(items).items() if n > 1]


def _sample(s: object) -> str | None:
    """What is wrong with one sample: the exposition renders its name, kind, help and label pairs as given (a
    label set of None or a help of None failed every scrape while the sample was the latest)."""
    if not isinstance(s, Sample) or not _real(s.value):
        return f"sample {s!r} is not a Sample with a number"
    if type(s.name) is not str or not s.name or s.kind not in _KINDS or type(s.help) is not str:
        return f"sample {s!r} needs a name, a kind of gauge or counter and a help string"
    if type(s.labels) is not tuple or not all(_pair(p) for p in s.labels):
        return f"sample {s.name!r} has labels {s.labels!r}, not a tuple of (name, value) pairs of strings"
    return None


def _samples_fine(samples: list[object]) -> bool:
    """Fast, and only ever True when every sample is fine (False: look closer): one pass over the types, then a
    look at each distinct label pair."""
    try:
        labels = list(map(_labels, samples)) if set(map(type, samples)) <= {Sample} else None
        return (labels is not None and set(map(type, labels)) <= {tuple}
                and set(map(type, map(_value, samples))) <= _REAL_TYPES
                and set(map(type, map(_name, samples))) <= {str} and set(map(type, map(_help, samples))) <= {str}
                and set(map(_kind, samples)) <= _KINDS and "" not in set(map(_name, samples))
                and all(map(_pair, set(chain.from_iterable(labels)))))
    except TypeError:  # something unhashable where a string belongs
        return False


def malformed_samples(samples: object) -> str | None:
    """The first sample of ``samples`` (a list) that the exposition could not render as given, named; None when
    all can be."""
    if type(samples) is not list:
        return f"samples is {_what(samples)}, not a list"
    if _samples_fine(samples):
        return None
    for s in samples:
        if (why := _sample(s)) is not None:
            return why
    return None


def malformed(frame: Frame, buckets: int, tables: tuple[KeyTable, KeyTable, KeyTable] | None = None,
              gpu_info: tuple[GpuInfo, ...] = ()) -> str | None:
    """What in ``frame`` a store with ``buckets`` buckets could not take (the first thing found, named), or
    None.  ``tables`` (the store's histogram, gauge and counter keys) and ``gpu_info`` (its GPUs) are what
    it already holds: keys and GPUs found there need no closer look."""
    hists, gauges, counters = tables or (None, None, None)
    try:
        return (_hists(frame, buckets, hists) or _gpu(frame.gpu, gpu_info)
                or _scalars("host", frame.host, False, None)
                or _scalars("workload_gauges", frame.workload_gauges, True, gauges)
                or _scalars("counters", frame.counters, True, counters, increases=True)
                or malformed_samples(frame.samples))
    except Exception as exc:  # noqa: BLE001 - e.g. a dict replaced by something else, a value whose test raises
        return f"cannot be checked: {type(exc).__name__}: {exc}"
