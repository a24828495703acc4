"""Counters are exported as running totals of each tick's increases: an increase below 0 is refused with its source's
part of the tick, so the total never goes down (Prometheus' rate() reads a drop as a reset and counts the whole total
again)."""

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sits_observe.clock import WallClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.frame import BucketLayout, Frame
from sits_observe.store import SeriesStore


class Counting:
    name = "server"

    def __init__(self, increases: list[float]) -> None:
        self.increases = iter(increases)

    def collect(self, frame: Frame) -> None:
        frame.add_counter("requests_total", "chat", next(self.increases))


def _total(body: str) -> float:
    return next(s.value for f in text_string_to_metric_families(body) for s in f.samples
                if s.name == "sits_workload_requests_total" and s.labels == {"workload": "chat"})


def test_a_negative_increase_is_refused_and_the_exported_total_never_goes_down(tmp_path):
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    daemon.sources.append(Counting([5.0, -1.0, 2.0]))
    client = create_app(daemon, ui=False).test_client()
    totals = []
    for _ in range(3):
        daemon.tick()
        totals.append(_total(client.get("/metrics").data.decode()))
    assert totals == [5.0, 5.0, 7.0]
    assert daemon.health["server"].errors == 1


def test_the_check_names_the_negative_increase_and_takes_zero():
    store = SeriesStore(BucketLayout(parse({}, env={}).store.snapped()), history=4)
    for known in (False, True):  # the slow path (a new key), then the fast one (a key the store holds)
        frame = Frame(ts=1.0, interval=1.0)
        frame.add_counter("requests_total", "chat", -0.5)
        assert store.check(frame) == ("counters[('requests_total', 'chat')] is -0.5: a counter's increase in one tick "
                                      "cannot be below 0"), known
        frame.counters[("requests_total", "chat")] = 0.0
        assert store.check(frame) is None
        store.ingest(frame)
    assert np.array_equal(store.counter_window("requests_total", "chat"), [0.0, 0.0])
