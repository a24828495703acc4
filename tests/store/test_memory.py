"""The store's memory: never more than its config's estimate at full cardinality, and that of the series seen."""

import subprocess
import sys
import textwrap

FILL = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from sits_observe.store.config import StoreConfig
    from sits_observe.frame import BucketLayout, Frame
    from sits_observe.store import SeriesStore

    history, cap, series = (int(a) for a in sys.argv[1:4])
    cfg = StoreConfig()  # its buckets (the store itself takes any history and cap)
    layout = BucketLayout(cfg.snapped())
    frame = Frame(ts=0.0, interval=1.0)
    for i in range(series):
        frame.add_hist("e2e", f"w{i}", np.ones(layout.n, np.uint64), 1.0)
        frame.workload_gauges[("queue_depth", f"w{i}")] = 1.0
        frame.counters[("requests_total", f"w{i}")] = 1.0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store = SeriesStore(layout, history, cap)
    for t in range(history):  # every row of every ring written, as a full history of ticks does
        frame.ts = float(t)
        store.ingest(frame)
    assert store.workload_gauge_window("queue_depth", "w0")[-1] == 1.0
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    estimate = history * cap * ((len(cfg.buckets) + 1) * 4 + 8 + 8 + 8)  # the config check's
    print(peak, estimate)
""")


def _peak_and_estimate(history: int, cap: int, series: int) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", FILL, str(history), str(cap), str(series)], capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    return int(out[0]), int(out[1])


def test_rings_at_full_cardinality_stay_within_the_config_estimate():
    """A cap not a power of two: the rings doubled past it (4096 columns for 2500 series), and each doubling held
    the old and the new rings at once: 3x the estimate at the peak."""
    peak, estimate = _peak_and_estimate(60, 2500, 2500)
    assert peak <= 1.2 * estimate, (peak, estimate)


def test_rings_of_a_few_series_take_the_memory_of_those_series():
    """Rings as wide as the cap from the start, mapped lazily: 16 series of a 4096-series store take a few MiB."""
    peak, estimate = _peak_and_estimate(3600, 4096, 16)
    assert peak <= 64 * 2**20 and peak < estimate / 20, (peak, estimate)
