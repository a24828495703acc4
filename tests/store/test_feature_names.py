"""The derived-series grammar the classifier and the UI read (``store.window``): GPU aggregates against
hand-computed values (GPUs that do not report a field left out), and bad names refused with the fix."""

from __future__ import annotations

import numpy as np
import pytest

from sits_observe.errors import StoreError
from sits_observe.frame import BucketLayout, Frame, GpuFrame, GpuInfo
from sits_observe.store.series import SeriesStore

# per tick, per GPU: (utilization, temperature or None when the GPU does not report it)
TICKS = [
    [(0.2, 40.0), (0.4, 50.0), (0.6, 60.0), (0.8, 90.0)],
    [(0.5, 45.0), (0.5, None), (0.5, 75.0), (0.5, 45.0)],
]


@pytest.fixture
def store() -> SeriesStore:
    st = SeriesStore(BucketLayout((0.1, 1.0)), history=8)
    for t, gpus in enumerate(TICKS):
        f = Frame(float(t + 1), 1.0)
        f.gpu = GpuFrame.empty([GpuInfo(i, f"GPU-{i}", "H100", f"0:{i}") for i in range(len(gpus))])
        for i, (util, temp) in enumerate(gpus):
            f.gpu.set(i, "utilization_ratio", util)
            if temp is not None:
                f.gpu.set(i, "temperature_celsius", temp)
        st.ingest(f)
    return st


@pytest.mark.parametrize(("name", "expected"), [
    ("gpu.utilization_ratio.mean", [0.5, 0.5]),
    ("gpu.utilization_ratio.max", [0.8, 0.5]),
    ("gpu.utilization_ratio.spread", [0.6, 0.0]),
    ("gpu.utilization_ratio.2", [0.6, 0.5]),
    ("gpu.temperature_celsius.mean", [60.0, 55.0]),       # GPU 1 not reporting in tick 2 is left out
    ("gpu.temperature_celsius.min", [40.0, 45.0]),
    ("gpu.temperature_celsius.std", [np.std([40, 50, 60, 90]), np.std([45, 75, 45])]),
    ("gpu.temperature_celsius.1", [50.0, np.nan]),
])
def test_gpu_features(store: SeriesStore, name: str, expected: list[float]) -> None:
    np.testing.assert_allclose(store.window((name,), 2)[:, 0], expected)


@pytest.mark.parametrize(("name", "says"), [
    ("gpu.utilization_ratio.median", "use mean|max|min|spread|std|<gpu index>"),
    ("gpu.no_such_field.mean", "unknown GPU field"),
])
def test_bad_feature_names_say_what_to_use(store: SeriesStore, name: str, says: str) -> None:
    with pytest.raises(StoreError, match=f"feature {name}") as err:
        store.window((name,), 2)
    assert says in str(err.value)


def test_a_bad_gpu_aggregate_is_refused_on_a_host_without_gpus() -> None:
    """It read as missing there, so a model naming it ran; once GPUs appeared RCA turned itself off mid-run."""
    st = SeriesStore(BucketLayout((0.1, 1.0)), history=8)
    st.ingest(Frame(1.0, 1.0))
    np.testing.assert_array_equal(st.window(("gpu.utilization_ratio.max",), 1)[:, 0], [np.nan])
    with pytest.raises(StoreError, match="gpu.utilization_ratio.median: unknown aggregate"):
        st.window(("gpu.utilization_ratio.median",), 1)


def test_a_gpu_index_names_that_gpu_not_a_row_position():
    """GPUs 4 and 5 only (a dcgm-exporter page of two GPUs): `.4` read NaN and `.0` read GPU 4."""
    st = SeriesStore(BucketLayout((0.1, 1.0)), history=8)
    f = Frame(1.0, 1.0)
    f.gpu = GpuFrame.empty([GpuInfo(i, f"GPU-{i}", "H100", f"0:{i}") for i in (4, 5)])
    f.gpu.set(0, "utilization_ratio", 0.25)
    f.gpu.set(1, "utilization_ratio", 0.75)
    st.ingest(f)
    assert st.window(["gpu.utilization_ratio.4", "gpu.utilization_ratio.5"], 1).tolist() == [[0.25, 0.75]]
    assert np.isnan(st.window(["gpu.utilization_ratio.0"], 1)).all()
