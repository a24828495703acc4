"""mean_series divides the sums of some ticks by the counts of the same ticks, whatever tick lands meanwhile."""

import threading

import numpy as np

from sits_observe.config import parse
from sits_observe.frame import BucketLayout, Frame
from sits_observe.store import SeriesStore


def _frame(layout: BucketLayout, t: int, seconds: float) -> Frame:
    frame = Frame(ts=float(t), interval=1.0)
    frame.add_values("e2e", "chat", np.full(10, seconds), layout)
    return frame


def test_a_tick_landing_between_the_sums_and_the_counts_is_not_mixed_in():
    """The two reads took the lock one after the other: a tick between them gave counts of one tick more than the
    sums (a ValueError while the history fills, a mean of the wrong ticks once it is full)."""
    layout = BucketLayout(parse({}, env={}).store.snapped())
    store = SeriesStore(layout, history=8)
    for t in range(2):
        store.ingest(_frame(layout, t, 0.5))
    read = store.hist_sum_window
    tried = []

    def then_a_tick(*args, **kwargs):
        out = read(*args, **kwargs)

        def tick() -> None:  # the tick thread, taking the store's lock as ingest does, if it is free
            if store.reading().acquire(blocking=False):
                try:
                    store.ingest(_frame(layout, 2, 0.001))
                finally:
                    store.reading().release()
            tried.append(True)

        thread = threading.Thread(target=tick)
        thread.start()
        thread.join()
        return out

    store.hist_sum_window = then_a_tick
    means = store.mean_series("e2e", "chat", last=8)
    assert tried and np.allclose(means, [0.5, 0.5])
