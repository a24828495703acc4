"""Burn-rate maths, tier scaling and the window rings, against hand-computed values."""

import math

import numpy as np
import pytest

from sits_observe.errors import SloError
from sits_observe.slo.burn import budget_remaining, burn_rate, error_ratio, fire, tier_active
from sits_observe.slo.tiers import DEFAULT_TIERS, error_budget, format_duration, parse_duration
from sits_observe.slo.window import Levels, WindowRing

DAY = 86400
TIERS = {t.name: t for t in DEFAULT_TIERS}


@pytest.mark.parametrize("window, tier, factor, threshold_999", [
    # 30d: the SRE Workbook's 14.4 / 6 / 3 / 1
    (30 * DAY, "page_fast", 14.4, 0.0144),
    (30 * DAY, "page_slow", 6.0, 0.006),
    (30 * DAY, "ticket_fast", 3.0, 0.003),
    (30 * DAY, "ticket_slow", 1.0, 0.001),
    # 28d, scaled as Sloth does: budget share * 672h / long window
    (28 * DAY, "page_fast", 0.02 * 672 / 1, 0.01344),
    (28 * DAY, "page_slow", 0.05 * 672 / 6, 0.0056),
    (28 * DAY, "ticket_fast", 0.10 * 672 / 24, 0.0028),
    (28 * DAY, "ticket_slow", 0.10 * 672 / 72, 0.000933333333333),
    # a 7d SLO: 2 % of the budget in 1h is 3.36x
    (7 * DAY, "page_fast", 3.36, 0.00336),
])
def test_tier_factor_and_threshold(window, tier, factor, threshold_999):
    assert TIERS[tier].factor(window) == pytest.approx(factor, rel=1e-12)
    assert TIERS[tier].threshold(window, 0.999) == pytest.approx(threshold_999, rel=1e-12)


@pytest.mark.parametrize("objective, budget", [(0.999, 0.001), (0.99, 0.01), (0.9995, 0.0005), (0.5, 0.5)])
def test_error_budget_is_clean(objective, budget):
    assert error_budget(objective) == budget


@pytest.mark.parametrize("good, total, err, burn_999, remaining_999", [
    (1000, 1000, 0.0, 0.0, 1.0),
    (999, 1000, 0.001, 1.0, 0.0),
    (990, 1000, 0.01, 10.0, -9.0),
    (9995, 10000, 0.0005, 0.5, 0.5),
    (0, 10, 1.0, 1000.0, -999.0),
    (0, 0, math.nan, math.nan, 1.0),  # no events: no ratio, nothing burned
])
def test_ratio_burn_and_budget(good, total, err, burn_999, remaining_999):
    e = error_ratio(np.array([good]), np.array([total]))[0]
    assert e == pytest.approx(err, nan_ok=True)
    assert burn_rate(e, 0.001) == pytest.approx(burn_999, nan_ok=True)
    assert budget_remaining(np.array([e]), 0.001)[0] == pytest.approx(remaining_999)


@pytest.mark.parametrize("err_long, err_short, rate_short, min_rate, active", [
    (0.02, 0.02, 10.0, 0.0, True),
    (0.02, 0.01, 10.0, 0.0, False),      # short window already recovered
    (0.01, 0.02, 10.0, 0.0, False),      # a blip: long window not burning
    (0.02, 0.02, 0.05, 0.1, False),      # held back: too few events
    (0.02, 0.02, 0.1, 0.1, True),        # min_rate is inclusive
    (0.01344, 0.02, 10.0, 0.0, False),   # the threshold itself does not fire (>)
    (math.nan, 0.02, 10.0, 0.0, False),  # no events in the long window
])
def test_tier_active(err_long, err_short, rate_short, min_rate, active):
    assert bool(tier_active(err_long, err_short, rate_short, 0.01344, min_rate)) is active


def _fire_over_time(active, keep, hold_for=2.0):
    """Run :func:`fire` for one SLO, one evaluation per second, every tier's short window ``hold_for``
    seconds; the firing rows."""
    until, last_true = np.full(4, np.nan), np.full(4, np.nan)
    got = []
    for ts, row in enumerate(active):
        firing, _, last_true, until = fire(np.array(row, dtype=bool), until, last_true, float(ts), np.full(4, keep),
                                           np.full(4, hold_for))
        got.append(firing.astype(int).tolist())
    return got


@pytest.mark.parametrize("name, active, firing", [
    ("all tiers at once: one alert, the fastest",
     [[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1]],
     [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]]),
    ("escalation: ticket, then page takes over, ticket stays quiet after",
     [[0, 0, 0, 1], [0, 0, 1, 1], [1, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0]],
     [[0, 0, 0, 1], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
    ("a slower tier that cleared may fire again on its own",
     [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]],
     [[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]),
    ("the page clears, the ticket-level burn goes on: the ticket fires once its 2 s short window is past it",
     [[0, 0, 1, 0], [1, 0, 1, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]],
     [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]),
])
def test_inhibit_over_time_without_keep_firing_for(name, active, firing):
    assert _fire_over_time(active, 0.0) == firing, name


# keep_firing_for = 2 s, one evaluation per second: a tier's condition is kept while it held at most 2 s ago,
# so an alert resolves at the third evaluation in a row that finds its condition false.
@pytest.mark.parametrize("name, active, firing", [
    ("dips of one and two evaluations: one alert, resolved 2 s after the last clear",
     [[1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
     [[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]),
    ("a faster tier takes over: the ticket resolves at that step; the page runs out its keep_firing_for",
     [[0, 0, 0, 1], [1, 0, 0, 1], [1, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
     [[0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]),
    ("takeover, then the page flaps: kept, and the ticket (kept through its own dip) never fires again",
     [[0, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0],
      [0, 0, 0, 1]],
     [[0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0],
      [0, 0, 0, 1]]),
])
def test_keep_firing_for_over_time(name, active, firing):
    assert _fire_over_time(active, 2.0) == firing, name


SLOWER_TURNS_ACTIVE = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0],
                       [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]


@pytest.mark.parametrize("name, hold_for, firing", [
    ("its 5 s short window may still hold the page's errors until 5 s: held through its own dips, one alert",
     5.0, [[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0],
           [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]),
    ("with a 2 s short window its condition at 3 s is its own burn: it fires",
     2.0, [[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0],
           [0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]),
])
def test_a_slower_tier_turning_active_while_the_faster_alert_is_kept(name, hold_for, firing):
    assert _fire_over_time(SLOWER_TURNS_ACTIVE, 2.0, hold_for) == firing, name


def test_fire_is_vectorised_over_slos():
    active = np.array([[1, 0, 0, 0], [0, 0, 0, 1]], dtype=bool)
    last = np.full((2, 4), np.nan)
    last[1, 0] = 6.0  # row 1: the page's condition held 4 s ago
    firing, held, last_true, until = fire(active, np.full((2, 4), np.nan), last, 10.0, np.full((2, 4), 5.0),
                                          np.array([[60.0, 360.0, 1440.0, 4320.0]] * 2))
    assert firing.astype(int).tolist() == [[1, 0, 0, 0], [1, 0, 0, 0]]  # row 1: page kept, ticket held
    assert held.astype(int).tolist() == [[0, 0, 0, 0], [0, 0, 0, 1]]
    assert np.isnan(until[0]).all() and until[1, 3] == 6.0 + 4320.0 and np.isnan(until[1, :3]).all()
    assert last_true[0].tolist()[0] == 10.0 and np.isnan(last_true[0, 1:]).all()
    assert last_true[1, 0] == 6.0 and last_true[1, 3] == 10.0


@pytest.mark.parametrize("text, seconds, back", [
    ("5m", 300, "5m"), ("1h30m", 5400, "1h30m"), ("28d", 28 * DAY, "28d"), ("4w", 28 * DAY, "28d"),
    ("90s", 90, "1m30s"), ("8064m", 8064 * 60, "5d14h24m"), (3600, 3600, "1h"),
])
def test_durations(text, seconds, back):
    assert parse_duration(text) == seconds
    assert format_duration(seconds) == back


@pytest.mark.parametrize("bad", ["", "5", "5x", "1h5", "-1h", "0s", True, 0, 1.5])
def test_bad_durations(bad):
    with pytest.raises(ValueError, match="duration like"):
        parse_duration(bad)


def _brute(ts, deltas, t, w):
    keep = (ts > t - w) & (ts <= t)
    return deltas[keep].sum(axis=0)


def test_window_ring_matches_brute_force_sums():
    """Ticks every second; 2 s fine slots and 20 s coarse slots; events steady within each 20 s."""
    rng = np.random.default_rng(7)
    levels = Levels(res=(2.0, 20.0), slots=40)
    ring = WindowRing(2, levels)
    ts = np.arange(1, 601, dtype=float)
    per_block = rng.integers(0, 50, size=(30, 2))            # events per tick, constant within 20 s blocks
    total = np.repeat(per_block, 20, axis=0).astype(float)    # (600, 2): series 0 and 1
    good = np.floor(total * np.array([0.9, 0.5]))
    windows = np.array([10.0, 60.0, 100.0, 300.0, 600.0])
    lv = np.array([levels.level_of(w) for w in windows])
    assert lv.tolist() == [0, 0, 1, 1, 1]
    rows = np.repeat([0, 1], len(windows))
    wins, lvs = np.tile(windows, 2), np.tile(lv, 2)
    for k, t in enumerate(ts):
        ring.add(t, good[k], total[k])
        if t % 20 == 0 or t % 7 == 0:
            got = ring.sums(t, rows, wins, lvs)
            for p, (row, w) in enumerate(zip(rows, wins)):
                expect_total = _brute(ts, total[:, row], t, w)
                expect_good = _brute(ts, good[:, row], t, w)
                assert got[1, p] == pytest.approx(expect_total, abs=1e-6), (t, row, w)
                assert got[0, p] == pytest.approx(expect_good, abs=1e-6), (t, row, w)


def test_window_ring_restores_from_written_edges_and_fills_gaps():
    levels = Levels(res=(1.0, 10.0), slots=64)
    ring = WindowRing(1, levels)
    stored: dict[int, dict[int, np.ndarray]] = {0: {}, 1: {}}
    for t in [*range(1, 101), 160, 161]:  # 59 s without ticks, then two more
        for lvl, idx, v in ring.add(float(t), np.array([1.0]), np.array([2.0])):
            stored[lvl][idx] = v
    fresh = WindowRing(1, levels)
    for lvl, edges in stored.items():
        idx = np.array(sorted(edges))
        fresh.restore(lvl, idx, np.array([edges[i] for i in idx]))
    rows, windows = np.array([0, 0, 0]), np.array([30.0, 60.0, 300.0])
    lv = np.array([levels.level_of(w) for w in windows])
    # ticks 160 and 161 in the last 30 s and 60 s (the gap had no events), all 102 in the last 300 s
    assert ring.sums(161.0, rows, windows, lv)[1].tolist() == [4.0, 4.0, 2 * 102.0]
    assert fresh.sums(161.0, rows, windows, lv).tolist() == ring.sums(161.0, rows, windows, lv).tolist()
    fresh.add(162.0, np.array([1.0]), np.array([2.0]))
    assert fresh.sums(162.0, rows, windows, lv)[1].tolist() == [6.0, 6.0, 2 * 103.0]


def test_window_ring_clock_steps():
    ring = WindowRing(1, Levels(res=(1.0,), slots=16))
    ring.add(100.0, np.array([1.0]), np.array([1.0]))
    ring.add(90.0, np.array([1.0]), np.array([1.0]))  # NTP step back within the slack: held at 100
    assert ring.ts == 100.0 and ring.cum[1, 0] == 2.0
    ring.add(100.0 - 300, np.array([1.0]), np.array([1.0]))  # chrony correcting a clock 5 min fast at boot: held
    assert ring.ts == 100.0 and ring.cum[1, 0] == 3.0
    with pytest.raises(SloError, match="went back"):
        ring.add(100.0 - 901, np.array([1.0]), np.array([1.0]))
