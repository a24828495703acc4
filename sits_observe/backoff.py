"""Exponential back-off with jitter: the one delay rule of the alert senders and the span sender."""

from __future__ import annotations

import math
import random

__all__ = ["backoff_delay"]


def backoff_delay(attempts: int, initial: float, maximum: float, multiplier: float, jitter: float,
                  rng: random.Random) -> float:
    """Seconds to wait after ``attempts`` (>= 1) failed tries in a row: ``initial * multiplier**(attempts - 1)``
    up to ``maximum``, scaled by a random factor in ``1 +- jitter``."""
    steps = attempts - 1  # multiplier**steps overflows a float after ~1,000 attempts at 2
    at_max = multiplier > 1 and steps >= math.log(maximum / initial, multiplier)
    delay = maximum if at_max else min(maximum, initial * multiplier ** steps)
    return delay * (1.0 + rng.uniform(-jitter, jitter))
