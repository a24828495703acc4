"""Table-driven checks of bucket quantiles against exact answers."""

import numpy as np
import pytest

from sits_observe.store.quantiles import mean_rows, quantile_rows

UPPERS = np.array([1.0, 2.0, 4.0, 8.0, np.inf])


@pytest.mark.parametrize(
    ("counts", "q", "expected"),
    [
        # all events in the first bucket [0, 1]: linear inside it
        ([10, 0, 0, 0, 0], 0.5, 0.5),
        ([10, 0, 0, 0, 0], 1.0, 1.0),
        # 10 in (1, 2], 10 in (2, 4]: median at the edge 2, p75 halfway through (2, 4]
        ([0, 10, 10, 0, 0], 0.5, 2.0),
        ([0, 10, 10, 0, 0], 0.75, 3.0),
        # p99 of 100 events: 98 in (0,1], 2 in (4,8] -> rank 99 is the first of the two -> 4 + 4 * 1/2
        ([98, 0, 0, 2, 0], 0.99, 6.0),
        # quantile in the +Inf bucket reports the last finite edge (as histogram_quantile does)
        ([0, 0, 0, 0, 5], 0.5, 8.0),
        ([1, 0, 0, 0, 0], 0.0, 0.0),
    ],
)
def test_quantile_rows_exact(counts, q, expected):
    assert quantile_rows(np.array([counts]), UPPERS, q)[0] == pytest.approx(expected)


def test_quantile_rows_empty_row_is_nan_and_rows_independent():
    out = quantile_rows(np.array([[0, 0, 0, 0, 0], [0, 4, 0, 0, 0]]), UPPERS, 0.5)
    assert np.isnan(out[0])
    assert out[1] == pytest.approx(1.5)


def test_mean_rows_exact():
    out = mean_rows(np.array([3.0, 0.0]), np.array([[1, 2, 0, 0, 0], [0, 0, 0, 0, 0]]))
    assert out[0] == pytest.approx(1.0)
    assert np.isnan(out[1])
