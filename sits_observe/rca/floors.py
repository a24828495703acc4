"""The classifier's operating point: the confidence a verdict needs before it names a cause.

``rca.min_confidence`` is one floor for every fault cause (a number) or a floor per cause (a mapping with a
``default`` for the causes it does not list); ``rca.healthy_min_confidence`` is the floor of ``healthy``,
never above the default.  Below its floor the top class is reported as ``unknown``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .verdict import HEALTHY

__all__ = ["DEFAULT", "Floors", "check_floors", "parse_floors"]

DEFAULT = "default"


@dataclass(frozen=True)
class Floors:
    """``default`` for every fault cause but those in ``causes``."""

    default: float
    causes: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, value: float | Mapping[str, float] | Floors) -> Floors:
        """From a config value: a number, or a mapping of causes (and ``default``) to floors."""
        if isinstance(value, Floors):
            return value
        if isinstance(value, Mapping):
            return cls(float(value[DEFAULT]), {k: float(v) for k, v in value.items() if k != DEFAULT})
        return cls(float(value))

    def healthy(self, floor: float | None = None) -> float:
        """The floor of ``healthy`` in force: ``floor`` capped at the default (no floor: the default)."""
        return self.default if floor is None else min(floor, self.default)

    def per_class(self, classes: Sequence[str], healthy: float | None = None) -> np.ndarray:
        """``(C,)`` floor of each class, ``healthy``'s from :meth:`healthy`."""
        hfloor = self.healthy(healthy)
        return np.array([hfloor if c == HEALTHY else self.causes.get(c, self.default) for c in classes])

    def unknown_causes(self, classes: Sequence[str]) -> list[str]:
        """The causes given a floor that are not among ``classes`` (a typo, or another model's vocabulary)."""
        return sorted(set(self.causes) - set(classes))

    def to_json(self) -> float | dict[str, float]:
        return {DEFAULT: self.default, **self.causes} if self.causes else self.default

    def __str__(self) -> str:
        extra = ", ".join(f"{c} {v:g}" for c, v in self.causes.items())
        return f"{self.default:g}" + (f" ({extra})" if extra else "")


def _number(value: object) -> float | None:
    """A floor as every other number of the config is taken (pydantic's lax mode): a number or a string of one
    (a quoted ``"0.91"``, as templating tools write it); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def check_floors(value: object) -> float | dict[str, float]:
    """Validation of ``rca.min_confidence`` (and ``--min-confidence``): ValueError saying what to write."""
    if (one := _number(value)) is not None:
        if not 0.0 <= one <= 1.0:
            raise ValueError("a floor is a confidence from 0 to 1")
        return one
    if not isinstance(value, Mapping):
        raise ValueError(f"give one floor (0.91) or causes and their floors with a `{DEFAULT}` for the others, "
                         f"e.g. {{{DEFAULT}: 0.91, thermal_throttling: 0.95}}")
    floors = {k: f for k, v in value.items() if isinstance(k, str) and (f := _number(v)) is not None}
    if odd := [f"{k}: {v!r}" for k, v in value.items() if k not in floors]:
        raise ValueError(f"each cause's floor is a number from 0 to 1: {', '.join(odd)}")
    if DEFAULT not in value:
        raise ValueError(f"floors per cause need a `{DEFAULT}` floor for the causes they do not list, e.g. "
                         f"{{{DEFAULT}: 0.91, thermal_throttling: 0.95}}")
    if HEALTHY in value:
        raise ValueError("the floor of `healthy` is rca.healthy_min_confidence; remove `healthy` here")
    bad = [f"{k}: {value[k]}" for k, v in floors.items() if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"floors are confidences from 0 to 1: {', '.join(bad)}")
    return floors


def parse_floors(text: str) -> Floors:
    """``--min-confidence``: ``0.91`` (one floor) or ``default=0.91,thermal_throttling=0.95`` (floors per cause)."""
    try:
        pairs = [part.split("=") for part in text.split(",") if part.strip()] if "=" in text else None
        if pairs is not None and any(len(p) != 2 for p in pairs):
            raise ValueError("write CAUSE=FLOOR pairs separated by commas")
        value = {k.strip(): float(v) for k, v in pairs} if pairs is not None else float(text)
        return Floors.of(check_floors(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be one floor from 0 to 1 or floors per cause "
                                         f"(default=0.91,thermal_throttling=0.95): {exc}, got {text!r}") from None
