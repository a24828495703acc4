"""Argparse ``type=`` helpers shared by every command and benchmark.

A flag outside its range is a usage error caught while the command line is parsed, before any work starts:
argparse prints ``argument --seed: must be an integer >= 0, got '-1'`` and exits 2, with no traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["FRACTION", "NON_NEGATIVE_FLOAT", "NON_NEGATIVE_INT", "POSITIVE_FLOAT", "POSITIVE_INT", "PROBABILITY",
           "THREADS", "float_in", "int_at_least"]


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer ``>= low`` (and ``<= high``, given one)."""
    want = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    return parse


def float_in(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False
             ) -> Callable[[str], float]:
    """A finite number in the interval from ``low`` to ``high`` (each end open or closed)."""
    if math.isinf(high):
        want = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        want = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    return parse


POSITIVE_INT = int_at_least(1)  # counts: ticks, samples, rounds, ...
THREADS = int_at_least(1, 64)  # CPU threads (as rca.threads): torch fails to start far more with a traceback
NON_NEGATIVE_INT = int_at_least(0)  # seeds, margins
POSITIVE_FLOAT = float_in(0.0, low_open=True)  # durations, speeds, rates
NON_NEGATIVE_FLOAT = float_in(0.0)  # cooldowns
FRACTION = float_in(0.0, 1.0, high_open=True)  # dropout shares: [0, 1)
PROBABILITY = float_in(0.0, 1.0)  # confidences: [0, 1]
