"""The ``store:`` section: how much history the series store keeps, its series cap and its bucket edges."""

from __future__ import annotations

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..errors import BucketEdgeError
from ..histogram import snap_edges
from ..section import Section

__all__ = ["DEFAULT_BUCKETS", "MAX_STORE_BYTES", "StoreConfig"]

# Prometheus `le` edges (seconds) before snapping to kernel bucket edges; SLO thresholds must be one of these.
DEFAULT_BUCKETS = (
    0.000004, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


MAX_STORE_BYTES = 1 << 30  # the series store's rings at full cardinality, at most


class StoreConfig(Section):
    history: int = Field(3600, ge=60, le=86400, description="ticks kept in the ring (1 h at 1 s)")
    max_series: int = Field(1024, ge=16, le=65536, description="cap on (stage, workload) histogram series")
    stale_after: float = Field(600.0, gt=0, description="seconds without data before a series is not exported")
    buckets: list[float] = Field(default_factory=lambda: list(DEFAULT_BUCKETS))

    @field_validator("buckets")
    @classmethod
    def _ascending(cls, v: list[float]) -> list[float]:
        if len(v) < 2 or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError("must be at least two ascending edges in seconds")
        try:
            snap_edges(v)
        except BucketEdgeError as exc:  # located at the edge itself: store.buckets[i]
            raise ValidationError.from_exception_data("buckets", [InitErrorDetails(
                type=PydanticCustomError("bucket_edge", exc.reason), loc=(exc.index,), input=exc.edge)]) from None
        return v

    def snapped(self) -> tuple[float, ...]:
        """The exported edges, snapped to kernel bucket edges."""
        return snap_edges(self.buckets)

    @model_validator(mode="after")
    def _fits_in_memory(self) -> StoreConfig:
        # the rings at full cardinality: bucket counts (uint32) and sums per histogram series, gauges, counters
        need = self.history * self.max_series * ((len(self.buckets) + 1) * 4 + 8 + 8 + 8)
        if need > MAX_STORE_BYTES:
            raise ValueError(f"history {self.history} x max_series {self.max_series} could need "
                             f"{need / 2**30:.1f} GiB of rings at full cardinality, over {MAX_STORE_BYTES >> 30} GiB "
                             "(the shipped unit caps the daemon at 2 GiB); lower one of them")
        return self
