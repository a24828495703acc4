"""Input series shared by the promtool tests and the in-daemon evaluator (one step = one minute).

Each SLO reads its own workload (named like the SLO); ``good``/``total`` are per-step event counts.  A step
``m`` (1-based) holds the events of minute ``(m-1, m]``, so the Prometheus counters at minute ``m``
are the sums of steps ``1..m`` and start at 0 at minute 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sits_observe.config import Config, parse
from sits_observe.store.config import DEFAULT_BUCKETS
from sits_observe.frame import BucketLayout, Frame
from sits_observe.histogram import snap_edges
from sits_observe.slo.rules import counter_metric, le_label

STEP = 60
THRESHOLD = 0.25        # one of DEFAULT_BUCKETS
T0 = 700                # minutes of good traffic before the scaled burns (see test_rules.HAND)
STEPS = T0 + 290
# The default tiers scaled down 5x (1h/5m -> 12m/1m ... 3d/6h -> 864m/72m) with the SLO window scaled the
# same way (28d -> 8064m): every burn factor stays 13.44 / 5.6 / 2.8 / 0.933, as for 28d.
SCALED = {"window": "8064m", "tiers": {"page_fast": {"long": "12m", "short": "1m"},
                                       "page_slow": {"long": "72m", "short": "6m"},
                                       "ticket_fast": {"long": "288m", "short": "24m"},
                                       "ticket_slow": {"long": "864m", "short": "72m"}}}


@dataclass(frozen=True)
class Scenario:
    slo: str
    kind: str            # latency | ratio; the workload is the SLO's name
    good: np.ndarray     # per step
    total: np.ndarray


def _burn(per_step: int, bad: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps ``start+1 .. end`` (1-based) carry ``bad`` errors out of ``per_step`` events."""
    total = np.full(STEPS, per_step, dtype=np.int64)
    errors = np.zeros(STEPS, dtype=np.int64)
    errors[start:end] = bad
    return total - errors, total


def _pattern(per_step: int, bad: int, start: int, minutes: str) -> tuple[np.ndarray, np.ndarray]:
    """From step ``start+1`` on, one step per character of ``minutes``: ``x`` carries ``bad`` errors, ``.`` none."""
    good, total = _burn(per_step, 0, 0, 0)
    for k, c in enumerate(minutes):
        good[start + k] -= bad * (c == "x")
    return good, total


def _phases(per_step: int, start: int, phases: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """From step ``start+1`` on, ``(bad, minutes)`` phases: ``bad`` errors per step for that many steps."""
    good, total = _burn(per_step, 0, 0, 0)
    for bad, minutes in phases:
        good[start:start + minutes] -= bad
        start += minutes
    return good, total


# A 2 % burn (page_fast) with dips: 2 clean minutes (kept firing), then 6 minutes in which page_fast's condition
# is false (4 clean; at T0+27 the 12m window holds 8 bad minutes) and page_slow turns active for the first time at
# T0+27 (21 bad minutes in 72m): held, because page_fast is kept firing.  keep_firing_for 5m: resolves at T0+28.
FLAP = "x" * 12 + ".." + "x" * 8 + "...." + "xx"

SCENARIOS = [
    Scenario("fast", "latency", *_burn(600, 12, T0, T0 + 24)),      # 2 % slow requests (burn 20) for 24 min
    Scenario("slow", "latency", *_burn(1000, 4, T0, T0 + 220)),     # 0.4 % (burn 4) for 220 min
    Scenario("quiet", "ratio", *_burn(6, 3, 0, 100)),               # 50 % errors at 0.1 events/s
    Scenario("outage", "latency", *_burn(600, 600, 0, 10)),         # every request slow for 10 min, 28d tiers
    Scenario("flap", "latency", *_pattern(600, 12, T0, FLAP)),      # keep_firing_for 5m
    # 0.4 % (ticket_fast) for 206 min, then 2.4 % (page_fast takes over) with a 1-minute dip at 0.4 %
    Scenario("takeover", "latency", *_phases(1000, T0, [(4, 206), (24, 12), (4, 1), (24, 6), (4, 40)])),
    # 2 % (page_fast) for 20 min, then 0.8 % (burn 8: page_slow, not page_fast) for 200 min
    Scenario("slowdown", "latency", *_phases(1000, T0, [(20, 20), (8, 200)])),
]


def config(state_dir: str) -> Config:
    base = {"objective": 0.999}

    def latency(name: str) -> dict:
        return {"stage": "e2e", "workload": name, "threshold": THRESHOLD}
    return parse({"state_dir": state_dir, "slos": [
        # braces in the text: Prometheus reads annotations as Go templates (promtool refused `{{ under }}`)
        {**base, **SCALED, "name": "fast", "latency": latency("fast"), "description": "p99 {{ under }} 250 ms }} {}}"},
        {**base, **SCALED, "name": "slow", "latency": latency("slow")},
        {**base, **SCALED, "name": "quiet", "min_rate": 0.5,
         "ratio": {"total": "requests_total", "bad": "request_errors_total", "workload": "quiet"}},
        {**base, "window": "28d", "name": "outage", "latency": latency("outage")},
        {**base, **SCALED, "name": "flap", "keep_firing_for": "5m", "latency": latency("flap")},
        {**base, **SCALED, "name": "takeover", "latency": latency("takeover")},
        {**base, **SCALED, "name": "slowdown", "latency": latency("slowdown")},
    ]}, env={})


def promtool_series(scs: list[Scenario]) -> list[dict[str, str]]:
    """``input_series`` for promtool: cumulative counters from minute 0."""
    le = le_label(snap_edges(DEFAULT_BUCKETS)[DEFAULT_BUCKETS.index(THRESHOLD)])
    out = []
    for sc in scs:
        good = np.concatenate([[0], np.cumsum(sc.good)])
        total = np.concatenate([[0], np.cumsum(sc.total)])
        if sc.kind == "latency":
            labels = f'stage="e2e",workload="{sc.slo}"'
            named = [(f'sits_stage_latency_seconds_bucket{{{labels},le="{le}"}}', good),
                     (f'sits_stage_latency_seconds_count{{{labels}}}', total)]
        else:
            labels = f'workload="{sc.slo}"'
            named = [(f'{counter_metric("requests_total")}{{{labels}}}', total),
                     (f'{counter_metric("request_errors_total")}{{{labels}}}', total - good)]
        out += [{"series": name, "values": " ".join(str(int(v)) for v in values)} for name, values in named]
    return out


def frames(scs: list[Scenario] = SCENARIOS):
    """The same events as Frames, one per minute (ts = 60 * m)."""
    layout = BucketLayout(snap_edges(DEFAULT_BUCKETS))
    idx = DEFAULT_BUCKETS.index(THRESHOLD)
    for m in range(STEPS):
        frame = Frame(ts=float(STEP * (m + 1)), interval=float(STEP))
        for sc in scs:
            good, total = int(sc.good[m]), int(sc.total[m])
            if sc.kind == "latency":
                counts = np.zeros(layout.n, dtype=np.uint64)
                counts[idx], counts[-1] = good, total - good
                frame.add_hist("e2e", sc.slo, counts, 0.0)
            else:
                frame.add_counter("requests_total", sc.slo, total)
                frame.add_counter("request_errors_total", sc.slo, total - good)
        yield frame
