"""Series ring store and pure histogram maths."""

from .quantiles import mean_rows, quantile_rows
from .series import SeriesStore

__all__ = ["SeriesStore", "quantile_rows", "mean_rows"]
