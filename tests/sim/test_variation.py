"""Host variation: warmer cooling, a lower power limit and other CPU work change the gauges the way a
real box would, never set a fault's signature, and the nominal variation changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from sits_observe.config import SimConfig
from sits_observe.frame import THROTTLE_REASONS
from sits_observe.sim.gpu import T_SLOWDOWN
from sits_observe.sim.host import SimulatedHost
from sits_observe.sim.variation import NOMINAL, HostVariation
from sits_observe.store.series import SeriesStore

from sim_helpers import run_until

BITS = {name: bit for bit, name in THROTTLE_REASONS}
BUSY = [0, 1, 2, 3, 4, 5]  # the GPUs of the three serving pairs


def _run(layout, variation: HostVariation, seconds: float = 300) -> SeriesStore:
    sim = SimulatedHost(SimConfig(scenario="quiet", seed=5, rate=1.4), layout, variation=variation)
    store = SeriesStore(layout, history=int(seconds))
    run_until(sim, store, seconds)
    return store


def _gpu(store: SeriesStore, field: str, last: int = 120) -> np.ndarray:
    return store.gpu_window(field, last)[:, BUSY]


def _mean_prefill(store: SeriesStore) -> float:
    return float(store.hist_sum_window("prefill", "chat", 240).sum() / store.hist_window("prefill", "chat", 240).sum())


@pytest.fixture(scope="module")
def nominal(layout) -> SeriesStore:
    return _run(layout, NOMINAL)


def test_nominal_variation_is_the_preset(layout, nominal):
    again = _run(layout, HostVariation())
    for field in ("temperature_celsius", "sm_clock_hertz", "power_watts", "throttle_reasons"):
        assert np.array_equal(nominal.gpu_window(field, 300), again.gpu_window(field, 300), equal_nan=True)


def test_power_limit_caps_power_and_clocks_and_reports_the_power_cap_not_thermal(layout, nominal):
    capped = _run(layout, HostVariation(power_limit=0.6))
    power = _gpu(capped, "power_watts")
    assert power.max() <= 0.6 * 700 * 1.001  # the limit holds once the clock has settled
    assert power.mean() < _gpu(nominal, "power_watts").mean()
    assert np.median(_gpu(capped, "sm_clock_hertz")) < 0.95 * np.median(_gpu(nominal, "sm_clock_hertz"))
    reasons = _gpu(capped, "throttle_reasons").astype(int)
    assert ((reasons & BITS["sw_power_cap"]) > 0).mean() > 0.5
    assert not (reasons & (BITS["hw_thermal_slowdown"] | BITS["sw_thermal_slowdown"])).any()
    # slower clocks make the same prompts take longer
    assert _mean_prefill(capped) > 1.05 * _mean_prefill(nominal)


def test_warmer_cooling_raises_temperature_without_throttling_below_the_slowdown(layout, nominal):
    warm = _run(layout, HostVariation(inlet_offset=6.0, resistance_scale=1.3))
    t_warm, t_nom = _gpu(warm, "temperature_celsius"), _gpu(nominal, "temperature_celsius")
    assert t_warm.mean() > t_nom.mean() + 10 and t_warm.max() < T_SLOWDOWN
    assert not (_gpu(warm, "throttle_reasons").astype(int) & BITS["hw_thermal_slowdown"]).any()
    hot = _run(layout, HostVariation(inlet_offset=10.0, resistance_scale=2.5))
    assert (_gpu(hot, "throttle_reasons").astype(int) & BITS["hw_thermal_slowdown"]).any()


def test_background_cpu_work_shows_in_host_cpu(layout, nominal):
    busy = _run(layout, HostVariation(background_cpu=0.1))
    diff = busy.host_window("cpu_utilization_ratio", 120).mean() - nominal.host_window("cpu_utilization_ratio", 120).mean()
    assert diff == pytest.approx(0.1, abs=0.02)
    assert np.array_equal(_gpu(busy, "utilization_ratio") > 0, _gpu(nominal, "utilization_ratio") > 0)


def _idle_beside_busy(store: SeriesStore, last: int) -> float:
    """Share of ticks in which a serving pair sits idle while another is busy."""
    util = store.gpu_window("utilization_ratio", last)[:, BUSY]
    pairs = np.stack([util[:, 0:2].max(1), util[:, 2:4].max(1), util[:, 4:6].max(1)], axis=1)
    return float(((pairs.min(1) < 0.1) & (pairs.max(1) > 0.5)).mean())


def test_session_affinity_leaves_a_replica_idle_beside_busy_ones_at_the_same_load(layout):
    def run(variation: HostVariation) -> SeriesStore:
        sim = SimulatedHost(SimConfig(scenario="quiet", seed=5, rate=0.3), layout, variation=variation)
        store = SeriesStore(layout, history=600)
        run_until(sim, store, 600)
        return store

    balanced, sticky = run(NOMINAL), run(HostVariation(affinity=1.0))
    assert _idle_beside_busy(sticky, 540) > 2 * _idle_beside_busy(balanced, 540) + 0.02
    served = [float(s.hist_window("e2e", "chat", 540).sum()) for s in (balanced, sticky)]
    assert served[1] == pytest.approx(served[0], rel=0.1)  # the same requests, only placed differently
    assert np.array_equal(run(HostVariation(affinity=0.0)).gpu_window("utilization_ratio", 540),
                          balanced.gpu_window("utilization_ratio", 540), equal_nan=True)
