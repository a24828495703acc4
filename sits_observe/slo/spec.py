"""SLO specs: the ``slos:`` config section (reference in docs/slo.md).

An SLO is an ``objective`` (a ratio such as 0.999) over a rolling ``window`` (e.g. 28d) for one SLI:

* ``latency``: good events are requests of a ``stage`` (optionally one ``workload``) at or under
  ``threshold`` seconds; the threshold must be one of ``store.buckets`` so the count is exact;
* ``ratio``: a ``total`` event counter and either its ``bad`` or its ``good`` counter.

Its burn-rate alerts are the tiers of :mod:`.tiers` with the SLO's overrides.  A tier whose threshold
``factor * (1 - objective)`` is 1 or more could never fire (an error ratio is at most 1) and is refused,
as is a window over a year.
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationInfo, WrapValidator, field_validator, model_validator

from ..alerting.config import check_label_names, check_unique
from ..section import Section
from ..frame import STAGES
from ..histogram import EDGE_RANGE_S
from .tiers import (ALERT_NAME, Duration, KeepDuration, Tier, TierOverride, TierOverrides, error_budget,
                    format_duration, resolve_tiers)

__all__ = ["LatencySli", "RatioSli", "SloSpec", "SloList"]

NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_.-]{0,62}$"
COUNTER_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]{0,127}$"
MAX_WINDOW = 366 * 86400  # a year: longer is a typo, not an SLO


def _did_you_mean(value: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _nearest_edges(value: float, edges: list[float]) -> str:
    below = [e for e in edges if e < value]
    above = [e for e in edges if e > value]
    near = [f"{x:g}" for x in (below[-1:] + above[:1])]
    return " and ".join(near)


class LatencySli(Section):
    """Good events: requests of ``stage`` at or under ``threshold`` seconds (all workloads when unset)."""

    stage: str
    workload: str | None = Field(None, pattern=NAME_PATTERN)
    threshold: float = Field(gt=0, description="seconds; one of store.buckets")

    @field_validator("stage")
    @classmethod
    def _stage(cls, v: str) -> str:
        if v not in STAGES:
            raise ValueError(f"unknown stage; {_did_you_mean(v, STAGES)}known stages: {', '.join(STAGES)}")
        return v

    @field_validator("threshold")
    @classmethod
    def _on_edge(cls, v: float, info: ValidationInfo) -> float:
        buckets = (info.context or {}).get("buckets")
        low, high = EDGE_RANGE_S
        if not low <= v <= high:  # no bucket edge can be there: "add inf to store.buckets" could not be followed
            raise ValueError(f"must be a latency in seconds between {low:g} and {high:g} (a bucket edge of "
                             "store.buckets)")
        if buckets is not None and not any(math.isclose(v, b, rel_tol=1e-9) for b in buckets):
            raise ValueError(
                f"{v:g} s is not a bucket edge; the nearest edges in store.buckets are {_nearest_edges(v, buckets)}: "
                f"use one of them, or add {v:g} to store.buckets"
            )
        return v


class RatioSli(Section):
    """Event counters of the Frame (``requests_total`` ...): ``total`` and one of ``bad`` or ``good``."""

    total: str = Field(pattern=COUNTER_PATTERN)
    bad: str | None = Field(None, pattern=COUNTER_PATTERN)
    good: str | None = Field(None, pattern=COUNTER_PATTERN, validate_default=True)
    workload: str | None = Field(None, pattern=NAME_PATTERN)

    @field_validator("total", "bad", "good")
    @classmethod
    def _a_counter(cls, v: str | None) -> str | None:
        # the rules would still find sits_workload_<name>_total, while the daemon read nothing: never firing
        if v is not None and not v.endswith("_total"):
            raise ValueError(f"{v!r} is not a counter name: counters end in _total (e.g. requests_total, "
                             "request_errors_total); write the name as the daemon exports it, minus sits_workload_")
        return v

    @field_validator("good")
    @classmethod
    def _one_of(cls, v: str | None, info: ValidationInfo) -> str | None:
        if "bad" in info.data and (v is None) == (info.data["bad"] is None):
            raise ValueError("set exactly one of `bad` (error counter) or `good` (success counter) beside `total`")
        return v


class SloSpec(Section):
    """One SLO.  Field order matters: ``tiers`` is validated before ``window``, which checks against it."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    objective: float
    tiers: TierOverrides = Field(default_factory=dict)
    window: Duration = Field(2419200, validate_default=True,  # the default too is checked against the tiers
                             description="rolling SLO window, e.g. 28d or 30d")
    latency: LatencySli | None = None
    ratio: RatioSli | None = Field(None, validate_default=True)
    min_rate: float = Field(0.0, ge=0, allow_inf_nan=False,
                            description="events/s below which burn alerts are held back")
    keep_firing_for: KeepDuration | None = Field(
        None, description="an alert resolves once its condition stayed false this long (default: tier's short window)")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels on this SLO's alerts")

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: float) -> float:
        if 1 < v < 100:
            raise ValueError(f"must be a ratio between 0 and 1, not a percentage: write {v / 100:g}")
        if not 0 < v < 1:
            raise ValueError("must be a ratio strictly between 0 and 1, e.g. 0.999 for 99.9%")
        return v

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: dict[str, TierOverride]) -> dict[str, TierOverride]:
        for tier in resolve_tiers(v):
            if tier.short >= tier.long:
                raise ValueError(f"{tier.name}: short window {format_duration(tier.short)} must be shorter than "
                                 f"the long window {format_duration(tier.long)}")
        if not resolve_tiers(v, enabled_only=True):
            raise ValueError("every tier is disabled; enable at least one or remove the SLO")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v: int, info: ValidationInfo) -> int:
        if v > MAX_WINDOW:
            raise ValueError(f"must be at most a year ({format_duration(MAX_WINDOW)}); "
                             "SLO windows are usually 7d to 90d")
        if "tiers" not in info.data:
            return v
        longest = max(resolve_tiers(info.data["tiers"], enabled_only=True), key=lambda t: t.long)
        if v < longest.long:
            raise ValueError(
                f"{format_duration(v)} is shorter than the longest alert window {format_duration(longest.long)} "
                f"(tier {longest.name}); use a window of at least {format_duration(longest.long)} or disable "
                f"the tier with `tiers: {{{longest.name}: false}}`"
            )
        return v

    @model_validator(mode="after")
    def _tiers_can_fire(self) -> SloSpec:
        """An error ratio is at most 1: a tier whose threshold is not below 1 would never fire."""
        budget = error_budget(self.objective)
        for tier in self.enabled_tiers():
            threshold = tier.threshold(self.window, self.objective)
            if threshold >= 1:
                factor = tier.factor(self.window)
                raise ValueError(
                    f"SLO {self.name!r}: tier {tier.name} can never fire: it needs an error ratio over "
                    f"{factor:.4g} x (1 - {self.objective:g}) = {threshold:.4g}, and an error ratio is at most 1; "
                    f"give the tier a budget share under {tier.long / (self.window * budget):.4g} "
                    f"(`tiers: {{{tier.name}: {{budget: ...}}}}`), a long window of at least "
                    f"{format_duration(math.floor(tier.budget * self.window * budget) + 1)}, or disable it with "
                    f"`tiers: {{{tier.name}: false}}`")
        return self

    @field_validator("ratio")
    @classmethod
    def _one_sli(cls, v: RatioSli | None, info: ValidationInfo) -> RatioSli | None:
        if "latency" in info.data and (v is None) == (info.data["latency"] is None):
            raise ValueError("set exactly one SLI: `latency` (stage, threshold) or `ratio` (total, bad|good)")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = {"alertname", "slo", "severity", "burn_tier"} & set(v)
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by sits-observe; choose other label names")
        return check_label_names(v)

    def enabled_tiers(self) -> tuple[Tier, ...]:
        """The tiers that alert, fastest first, with overrides and ``keep_firing_for`` applied."""
        return resolve_tiers(self.tiers, enabled_only=True, keep=self.keep_firing_for)

    def alert_windows(self) -> tuple[int, ...]:
        """Every distinct alert window (seconds), ascending."""
        return tuple(sorted({w for t in self.enabled_tiers() for w in (t.short, t.long)}))

    def alert_labels(self, tier: Tier) -> dict[str, str]:
        """Labels of this SLO's alert for ``tier`` (the same in the daemon and in generated rules)."""
        return {**self.labels, "alertname": ALERT_NAME, "slo": self.name, "severity": tier.severity,
                "burn_tier": tier.name}

    def alert_annotations(self, tier: Tier) -> dict[str, str]:
        long, short = format_duration(tier.long), format_duration(tier.short)
        text = (f"Objective {self.objective:g} over {format_duration(self.window)}; at this burn rate "
                f"{tier.budget:.0%} of the error budget is spent in {long}.")
        return {"summary": f"{self.name}: error budget burning over {tier.factor(self.window):.4g}x "
                           f"in the last {long} and {short}",
                "description": f"{self.description.rstrip('. ')}. {text}" if self.description else text}

    def sli_key(self) -> str:
        """What the SLI counts; stored beside persisted budgets so a changed SLI starts afresh."""
        return (self.latency or self.ratio).model_dump_json()  # type: ignore[union-attr]



_SPEC_LIST = TypeAdapter(list[SloSpec])


MAX_SLOS = 1000  # each keeps about 100 KB of windows and is evaluated every tick (100: 0.65 ms a tick)


def _with_buckets(value: Any, _handler: Any, info: ValidationInfo) -> list[SloSpec]:
    """Validate the list with ``store.buckets`` in context (latency thresholds) and unique names; at most
    :data:`MAX_SLOS` (16,000 passed: by `bench slo`, 1.6 GB of windows and a tick of about 100 ms)."""
    if isinstance(value, list) and len(value) > MAX_SLOS:
        raise ValueError(f"{len(value)} SLOs, more than {MAX_SLOS} (each keeps about 100 KB of windows and is "
                         "evaluated every tick); split them over daemons or drop some")
    store = info.data.get("store") if info.data else None
    context = {"buckets": list(store.buckets)} if store is not None else None
    slos = _SPEC_LIST.validate_python(value, context=context)
    check_unique([s.name for s in slos], "SLO")
    return slos


SloList = Annotated[list[SloSpec], WrapValidator(_with_buckets)]
