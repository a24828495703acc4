"""Burn-rate alert tiers and the durations SLO settings are written in (``28d``, ``1h30m``).

Burn-rate alerts use four multi-window tiers (Google SRE Workbook); the burn factor of a tier is the
fraction of the error budget it allows to be spent in its long window, scaled to the SLO window
(``budget * window / long``), so a 30d SLO gets 14.4/6/3/1 and a 28d one 13.44/5.6/2.8/0.93.  A
tier's condition is kept through dips of up to ``keep_firing_for`` (per tier, else per SLO, else the
tier's short window; ``0s`` turns the flap guard off).  An SLO's ``tiers:`` overrides the defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from ..section import Section

__all__ = [
    "Duration",
    "KeepDuration",
    "Tier",
    "DEFAULT_TIERS",
    "TIER_NAMES",
    "ALERT_NAME",
    "TierOverride",
    "TierOverrides",
    "error_budget",
    "parse_duration",
    "parse_keep",
    "format_duration",
    "resolve_tiers",
]

_DURATION_RE = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_DURATION_HELP = "must be a duration like 30s, 5m, 1h or 28d (units w, d, h, m, s)"


def parse_duration(value: Any) -> int:
    """Seconds in a Prometheus-style duration (``1h30m``, ``28d``); whole seconds are accepted as is."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        m = _DURATION_RE.match(value.strip())
        if m and any(m.groups()):
            weeks, days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
            total = (((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 + seconds
            if total > 0:
                return total
    raise ValueError(_DURATION_HELP)


def format_duration(seconds: int) -> str:
    """``2419200`` -> ``28d``, ``5400`` -> ``1h30m``: the form Prometheus range selectors take."""
    out, rest = "", int(seconds)
    for unit, size in _UNITS:
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out or "0s"


def parse_keep(value: Any) -> int:
    """A ``keep_firing_for`` duration in seconds: like :func:`parse_duration`, and ``0s`` turns the guard off."""
    if value in (0, "0", "0s") and not isinstance(value, bool):
        return 0
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(f"{_DURATION_HELP}, or 0s to resolve as soon as the condition clears") from None


Duration = Annotated[int, BeforeValidator(parse_duration)]
KeepDuration = Annotated[int, BeforeValidator(parse_keep)]


@dataclass(frozen=True, slots=True)
class Tier:
    """One multi-window burn-rate alert: fires when both windows burn faster than :meth:`factor`."""

    name: str
    severity: str
    long: int
    short: int
    budget: float
    keep_firing_for: int = 0

    def factor(self, window: int) -> float:
        """Burn rate that spends ``budget`` of the error budget in ``long`` seconds of a ``window`` SLO."""
        return self.budget * window / self.long

    def threshold(self, window: int, objective: float) -> float:
        """Error ratio both windows must exceed: ``factor * (1 - objective)``, to 12 significant digits."""
        return float(f"{self.factor(window) * error_budget(objective):.12g}")


def error_budget(objective: float) -> float:
    """``1 - objective`` to 12 significant digits (0.001 for 0.999, not 0.0010000000000000009)."""
    return float(f"{1.0 - objective:.12g}")


# Fastest first: a firing tier inhibits every tier after it for the same SLO.
DEFAULT_TIERS: tuple[Tier, ...] = (
    Tier("page_fast", "page", 3600, 300, 0.02),
    Tier("page_slow", "page", 21600, 1800, 0.05),
    Tier("ticket_fast", "ticket", 86400, 7200, 0.10),
    Tier("ticket_slow", "ticket", 259200, 21600, 0.10),
)
TIER_NAMES = tuple(t.name for t in DEFAULT_TIERS)
ALERT_NAME = "SitsSloBurnRate"
TierName = Literal["page_fast", "page_slow", "ticket_fast", "ticket_slow"]


class TierOverride(Section):
    """Per-tier settings; ``tiers: {ticket_slow: false}`` is short for ``{enabled: false}``."""

    enabled: bool = True
    long: Duration | None = Field(None, description="long window (default 1h, 6h, 1d, 3d)")
    short: Duration | None = Field(None, description="short window (default 5m, 30m, 2h, 6h)")
    budget: float | None = Field(None, gt=0, le=1, description="fraction of the error budget spent in `long`")
    keep_firing_for: KeepDuration | None = Field(None, description="this tier's flap guard (default: the SLO's)")


def _tier_shorthand(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: {"enabled": v} if isinstance(v, bool) else v for k, v in value.items()}
    return value


TierOverrides = Annotated[dict[TierName, TierOverride], BeforeValidator(_tier_shorthand)]


def resolve_tiers(overrides: dict[str, TierOverride], enabled_only: bool = False,
                  keep: int | None = None) -> tuple[Tier, ...]:
    """The default tiers with overrides; ``keep_firing_for``: the tier's own, else ``keep``, else its short window."""
    out = []
    for tier in DEFAULT_TIERS:
        o = overrides.get(tier.name) or TierOverride()
        if o.enabled or not enabled_only:
            short = o.short or tier.short
            tier_keep = next(k for k in (o.keep_firing_for, keep, short) if k is not None)
            out.append(replace(tier, long=o.long or tier.long, short=short, budget=o.budget or tier.budget,
                               keep_firing_for=tier_keep))
    return tuple(out)
