"""Kernel log-linear buckets: right-closed edges, exact exported sums, snapping."""

import numpy as np
import pytest

from sits_observe.errors import ConfigError
from sits_observe.frame import BucketLayout
from sits_observe.histogram import NUM_BUCKETS, SUB, kernel_bucket, kernel_to_layout, kernel_upper_ns, snap_edges


@pytest.mark.parametrize(
    ("v", "bucket"),
    [(0, 0), (1, 0), (2, 1), (SUB, SUB - 1), (SUB + 1, SUB), (1000, 111), (2**40, NUM_BUCKETS - 2),
     (2**40 + 1, NUM_BUCKETS - 1)],
)
def test_kernel_bucket_table(v, bucket):
    assert int(kernel_bucket(v)) == bucket


def test_every_value_is_inside_its_bucket():
    rng = np.random.default_rng(3)
    values = np.unique(np.concatenate([np.arange(0, 5000), rng.integers(1, 2**40, 20000)]))
    buckets = kernel_bucket(values)
    for v, b in zip(values.tolist(), buckets.tolist()):
        lower = kernel_upper_ns(b - 1) if b > 0 else -1
        assert lower < v <= kernel_upper_ns(b)


def test_at_least_four_sub_buckets_per_power_of_two():
    edges = [kernel_upper_ns(b) for b in range(SUB * 10, SUB * 11 + 1)]
    ratio = np.diff(edges) / np.array(edges[:-1])
    assert SUB >= 4 and ratio.max() <= 1 / SUB + 1e-12


def test_exported_buckets_are_exact_sums_of_kernel_buckets():
    edges = snap_edges([0.00001, 0.0001, 0.001, 0.01, 0.1, 1.0])
    mapping = kernel_to_layout(edges)
    layout = BucketLayout(edges)
    rng = np.random.default_rng(7)
    ns = np.concatenate([rng.integers(1, 3 * 10**9, 50000), np.rint(np.array(edges) * 1e9).astype(np.int64),
                         np.rint(np.array(edges) * 1e9).astype(np.int64) + 1])
    kernel_counts = np.bincount(kernel_bucket(ns), minlength=NUM_BUCKETS)
    exported = np.bincount(mapping, weights=kernel_counts, minlength=layout.n)
    # the same values bucketed directly on the exported edges, value <= le: no sample one bucket off
    direct = layout.counts_of(ns / 1e9)
    assert exported.tolist() == direct.tolist()


def test_snap_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"store.buckets\[1\]"):
        snap_edges([0.001, 0.00101])
    with pytest.raises(ConfigError, match=r"store.buckets\[0\]: bucket edge must be between"):
        snap_edges([0])
