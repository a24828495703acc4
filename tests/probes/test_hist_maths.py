"""bpf/hist.h and sits_observe/histogram.py agree on every bucket, and no sample drained from the kernel
lands one exported bucket low or high."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from probe_helpers import DEFAULT_LAYOUT, HERE
from sits_observe import histogram
from sits_observe.config import parse
from sits_observe.frame import STAGES, BucketLayout
from sits_observe.probes import specs
from sits_observe.probes.program import Program, compile_bpf


def _values() -> np.ndarray:
    """0..4096, every power of two and kernel bucket edge +-1, log-uniform randoms, u64 extremes."""
    rng = np.random.default_rng(7)
    edges = [int(histogram.kernel_upper_ns(b)) for b in range(histogram.NUM_BUCKETS - 1)]
    powers = [1 << k for k in range(64)]
    near = [x + d for x in edges + powers for d in (-1, 0, 1) if 0 <= x + d < 2**64]
    rand = np.exp(rng.uniform(0, np.log(2.0**45), 100_000)).astype(np.uint64)
    return np.concatenate([np.arange(4097, dtype=np.uint64), np.array(near, dtype=np.uint64), rand,
                           np.array([2**64 - 1, 2**63], dtype=np.uint64)])


def test_hist_h_matches_python_on_every_kind_of_value(tmp_path: Path) -> None:
    exe = tmp_path / "hist_check"
    subprocess.run(["gcc", "-O2", f"-I{specs.BPF_DIR}", f"-DHIST_SUB_BITS={histogram.SUB_BITS}",
                    f"-DHIST_MAX_EXP={histogram.MAX_EXP}", "-o", str(exe), str(HERE / "hist_check.c")], check=True)
    values = _values()
    out = subprocess.run([str(exe)], input="\n".join(map(str, values.tolist())), capture_output=True,
                         text=True, check=True).stdout.split()
    assert int(out[0]) == histogram.NUM_BUCKETS
    np.testing.assert_array_equal(np.array(out[1:], dtype=np.int64), histogram.kernel_bucket(values))


@pytest.fixture(scope="module")
def selftest(stubs: dict) -> Iterator[tuple[Program, ctypes.CDLL, BucketLayout]]:
    """calls.bpf.c built with CALLS_SELFTEST: each sits_selftest_record(ns, stage) call is one sample."""
    import os

    cfg = parse({})
    layout = DEFAULT_LAYOUT
    spec = specs.SPECS["cuda"]
    bpf = compile_bpf(spec.path, specs.cflags(spec, cfg.probes, 1, extra={"CALLS_SELFTEST": "1"}))
    lib_path = str(stubs["libselftest.so"])
    bpf.attach_uprobe(name=lib_path.encode(), sym=b"sits_selftest_record", fn_name=b"record_arg")
    program = Program(bpf, layout)
    program.set_workloads({os.getpid(): 1})
    lib = ctypes.CDLL(lib_path)
    lib.sits_selftest_record.argtypes = [ctypes.c_ulonglong, ctypes.c_uint]
    yield program, lib, layout
    program.close()


def _record(lib: ctypes.CDLL, values_ns: np.ndarray, stage: str) -> None:
    for v in values_ns.tolist():
        lib.sits_selftest_record(v, STAGES.index(stage))


def test_no_sample_lands_one_bucket_low_or_high(selftest: tuple) -> None:
    program, lib, layout = selftest
    program.drain()
    edges_ns = np.rint(np.asarray(layout.edges) * 1e9).astype(np.int64)
    # every exported edge, one ns either side, and values inside the finest and widest buckets
    values = np.unique(np.concatenate([edges_ns - 1, edges_ns, edges_ns + 1, [1, 2, 3, 999, 10**11]]))
    values = values[values > 0].astype(np.uint64)
    _record(lib, values, "sync")
    (series,) = program.drain()
    assert (STAGES[series.stage], series.workload) == ("sync", 1)
    assert series.counts.tolist() == layout.counts_of(values / 1e9).tolist()
    assert series.sum_ns == int(values.sum()) and series.count == len(values)


def test_drains_are_deltas_per_stage(selftest: tuple) -> None:
    program, lib, layout = selftest
    program.drain()
    _record(lib, np.full(7, 5000, np.uint64), "h2d")
    _record(lib, np.full(3, 2 * 10**6, np.uint64), "d2h")
    first = {STAGES[s.stage]: s for s in program.drain()}
    _record(lib, np.full(2, 5000, np.uint64), "h2d")
    second = {STAGES[s.stage]: s for s in program.drain()}
    assert first["h2d"].count == 7 and first["d2h"].count == 3 and first["d2h"].sum_ns == 6 * 10**6
    assert set(second) == {"h2d"} and second["h2d"].count == 2 and second["h2d"].sum_ns == 10_000
    assert second["h2d"].counts.tolist() == layout.counts_of([5e-6, 5e-6]).tolist()
    assert program.drain() == []


def test_a_sum_that_moves_after_its_count_was_drained_is_kept(selftest: tuple) -> None:
    """The program adds to a bucket's count, then to the sum: a drain in between saw the count alone, and the
    next dropped the sum's delta (no count moved), so _sum lost the event's latency for good. The two steps are
    written into the real kernel map here, with a drain between them."""
    program, _lib, _layout = selftest
    program.drain()
    table = program.bpf[b"stage_latency"]
    key = table.Key(STAGES.index("alloc"), 1, 10)

    def write(count: int, sum_ns: int) -> None:
        leaf = table.Leaf()
        leaf[0].count[3] = count
        leaf[0].sum_ns = sum_ns
        table[key] = leaf

    write(1, 0)  # count[b]++ ... (a drain here)
    (first,) = program.drain()
    write(1, 40_000_000)  # ... sum_ns += 40 ms
    (second,) = program.drain()
    assert (first.count, first.sum_ns, second.count, second.sum_ns) == (1, 0, 0, 40_000_000)
    assert program.drain() == []
    del table[key]
