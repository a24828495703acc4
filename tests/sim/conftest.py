"""Fixtures for the simulator tests."""

from __future__ import annotations

import pytest

from sits_observe.store.config import DEFAULT_BUCKETS
from sits_observe.frame import BucketLayout
from sits_observe.histogram import snap_edges


@pytest.fixture(scope="session")
def layout() -> BucketLayout:
    return BucketLayout(snap_edges(DEFAULT_BUCKETS))
