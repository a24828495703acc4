"""The UI on hosts unlike the demo's: no request stages (NVML or probes only), a GPU source that skips an
index (DCGM with a GPU off the bus), a source that is down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sits_observe.clock import WallClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.frame import GPU_FIELD_INDEX, GPU_FIELDS, GpuFrame, GpuInfo
from sits_observe.ui.app import _status
from sits_observe.ui.context import UiContext

from test_app import dash_call, find, page

STAGE_OUTPUTS = ["stages-p99.figure", "stages-hist.figure", "stages-held.data", "stages-stage.options",
                 "stages-stage.value"]


class Probe:
    """What a probes-only host produces: a device stage, never ``e2e``; silent until ``on``."""

    name = "probe"

    def __init__(self, layout: Any) -> None:
        self.layout, self.on = layout, False

    def collect(self, frame: Any) -> None:
        if self.on:
            frame.add_values("sync", "llm", np.array([0.001, 0.002]), self.layout)


class SkippingGpus:
    """A GPU source reporting GPUs 0, 1 and 3 (2 is missing), utilization 10, 20 and 99 %."""

    name = "dcgm"

    def collect(self, frame: Any) -> None:
        info = tuple(GpuInfo(i, f"GPU-{i}", "H100", f"00000000:{i:02X}:00.0") for i in (0, 1, 3))
        values = np.full((3, len(GPU_FIELDS)), np.nan)
        values[:, GPU_FIELD_INDEX["utilization_ratio"]] = (0.1, 0.2, 0.99)
        frame.gpu = GpuFrame(info, values, np.ones(3, dtype=bool))


class Hung:
    name = "nvml"

    def collect(self, frame: Any) -> None:
        raise RuntimeError("a call (GPU 3, utilization) has not returned since 17:58:07 UTC; " + "x" * 200)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon with no sources, no topology and no SLOs; tests add sources."""
    d = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    yield d
    d.close()


def test_a_page_opened_before_any_stage_follows_the_first_stage_that_appears(bare: Daemon) -> None:
    probe = Probe(bare.layout)
    bare.sources.append(probe)
    client = create_app(bare).test_client()
    for _ in range(6):  # a whole column of ticks at the default range (5 ticks) with no stage: that was a 500
        bare.tick()
    tree = page(client, "/stages")
    dropdown, held = find(tree, "stages-stage"), find(tree, "stages-held")["data"]
    assert dropdown["value"] == "e2e"  # nothing known yet

    def update(stage: Any) -> Any:
        return dash_call(client, STAGE_OUTPUTS, [("stages-tick.n_intervals", 1), ("stages-stage.value", stage)],
                         [("stages-held.data", held)])

    r = update("e2e")  # still no stage: the page keeps waiting, no error
    assert r.status_code == 200, r.get_data(as_text=True)
    probe.on = True
    for _ in range(3):
        bare.tick()
    r = update("e2e")  # e2e never comes on this host: the first stage with data is drawn, the menu offers it
    assert r.status_code == 200, r.get_data(as_text=True)
    out = r.get_json()["response"]
    assert out["stages-stage"] == {"options": ["sync"], "value": "sync"}
    assert out["stages-held"]["data"]["stage"] == "sync"
    assert client.get("/stages?stage=e2e").status_code == 400  # a URL still names a stage with data
    r = update(["e2e"])
    assert r.status_code == 400 and "stage: expected a stage name" in r.get_json()["error"]


def test_gpus_are_named_by_their_index_when_the_source_skips_one(bare: Daemon) -> None:
    bare.sources.append(SkippingGpus())
    client = create_app(bare).test_client()
    for _ in range(3):
        bare.tick()
    r = dash_call(client, ["load-heat.figure", "load-held.data"],
                  [("load-tick.n_intervals", 1), ("load-field.value", "utilization")],
                  [("load-held.data", {"window": 60})])
    trace = r.get_json()["response"]["load-heat"]["figure"]["data"][0]
    assert trace["y"] == ["GPU 0", "GPU 1", "GPU 3"]
    assert [row[-1] for row in trace["z"]] == [10.0, 20.0, 99.0]
    assert client.get("/topology?gpu=3").status_code == 200
    r = client.get("/topology?gpu=2")
    assert r.status_code == 400 and r.get_json()["error"] == "gpu: no GPU 2 on this host; GPUs are 0, 1, 3"


def test_the_status_line_names_a_source_that_is_down(bare: Daemon) -> None:
    bare.sources.append(Hung())
    bare.tick()
    items = {x.className: x.children for x in _status(UiContext(bare))}
    warn = items["item warn"]
    assert warn.startswith("source down: nvml (RuntimeError: a call (GPU 3, utilization) has not returned")
    assert warn.endswith("…)") and len(warn) < 120
    bare.sources.clear()
    bare.sources.append(SkippingGpus())
    bare.sources[0].name = "nvml"
    bare.tick()  # recovered: the warning goes
    assert "item warn" not in {x.className for x in _status(UiContext(bare))}


def test_the_status_line_says_when_the_tick_loop_has_stalled(bare: Daemon) -> None:
    """/healthz said 503 stalled while every page showed the last tick as current, all green."""
    bare.tick()
    assert "item bad" not in {x.className for x in _status(UiContext(bare))}
    bare.last_tick_at -= 100  # a source hung in the tick for 100 s (monotonic clock)
    bad = [x.children for x in _status(UiContext(bare)) if x.className == "item bad"]
    assert len(bad) == 1 and bad[0].startswith("no tick for 100 s: the tick loop is stalled"), bad


def test_start_up_placements_are_no_move(make_daemon: Any) -> None:
    """A fresh demo daemon has adopted its shards, and moved none: 'last move: adopt chat-2 → 4,5' it said."""
    d = make_daemon(ticks=3)
    actions = {x["action"] for x in d.scheduler.decisions_state(10)["decisions"]}
    assert actions and "migrate" not in actions
    assert not [x for x in _status(UiContext(d)) if str(x.children).startswith("last move")]


def test_a_window_kept_to_many_decimals_draws_and_a_range_under_a_tick_is_refused(make_daemon: Any) -> None:
    """The page's window went back to the server as text of 3 decimals: 7.5308587 s kept became '7.531', more
    than kept, and 0.0004 s '0.000': every update of the page was a 400."""
    d = make_daemon(ticks=70, tick_interval=0.1234567, store={"history": 61})
    client = create_app(d).test_client()
    held = find(page(client, "/load"), "load-held")["data"]
    assert held["window"] == pytest.approx(61 * 0.1234567)
    r = dash_call(client, ["load-heat.figure", "load-held.data"],
                  [("load-tick.n_intervals", 1), ("load-field.value", "utilization")], [("load-held.data", held)])
    assert r.status_code == 200, r.get_data(as_text=True)
    r = dash_call(client, ["page.children"], [("url.pathname", "/load"), ("url.search", "?range=0.0004")])
    assert r.status_code == 400
    assert "range: shorter than one tick (0.123457 s), got '0.0004'" in r.get_json()["error"]


def test_a_topology_update_on_a_host_without_one_is_a_404(bare: Daemon) -> None:
    """No page draws the matrix there; a crafted update was a 500 with a traceback in the log."""
    bare.tick()
    r = dash_call(create_app(bare).test_client(),
                  ["topo-links.figure", "topo-strip.figure", "topo-moves.children"],
                  [("topo-tick.n_intervals", 1)], [("topo-held.data", {})])
    assert r.status_code == 404 and r.get_json()["error"] == "no GPU topology on this host: nothing to update"


class Gpus:
    """A GPU source reporting the GPUs ``indices``: GPU i uses 10 (i + 1) % of its memory."""

    name = "dcgm"

    def __init__(self, indices: tuple[int, ...]) -> None:
        self.indices = indices

    def collect(self, frame: Any) -> None:
        info = tuple(GpuInfo(i, f"GPU-{i}", "H100", f"00000000:{i:02X}:00.0") for i in self.indices)
        values = np.full((len(info), len(GPU_FIELDS)), np.nan)
        values[:, GPU_FIELD_INDEX["memory_used_bytes"]] = [1e9 * (i + 1) for i in self.indices]
        values[:, GPU_FIELD_INDEX["memory_total_bytes"]] = 1e10
        frame.gpu = GpuFrame(info, values, np.ones(len(info), dtype=bool))


def test_a_gpu_appearing_while_a_load_update_reads_keeps_each_gpu_in_its_row(bare: Daemon,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The page chose its rows (GPUs 0, 1, 3) and the cache read the store after the tick thread had added GPU 2:
    4 columns into 3 rows was a 500. The tick runs inside the page's read of the GPU list, so the interleaving
    is the same on every run."""
    source = Gpus((0, 1, 3))
    bare.sources.append(source)
    client = create_app(bare).test_client()
    for _ in range(10):
        bare.tick()
    window = find(page(client, "/load", "?field=memory"), "load-held")["data"]["window"]
    listed = bare.store.gpu_info

    def listed_then_ticked() -> Any:
        gpus = listed()
        monkeypatch.setattr(bare.store, "gpu_info", listed)
        source.indices = (0, 1, 2, 3)
        for _ in range(5):  # a whole column of ticks with GPU 2
            bare.tick()
        return gpus

    monkeypatch.setattr(bare.store, "gpu_info", listed_then_ticked)

    def update() -> Any:  # a whole figure (the browser holds none)
        r = dash_call(client, ["load-heat.figure", "load-held.data"], [("load-tick.n_intervals", 1),
                      ("load-field.value", "memory")], [("load-held.data", {"window": window})])
        assert r.status_code == 200, r.get_data(as_text=True)
        return r.get_json()["response"]["load-heat"]["figure"]["data"][0]

    trace = update()
    assert trace["y"] == ["GPU 0", "GPU 1", "GPU 3"]
    assert [row[-1] for row in trace["z"]] == [10.0, 20.0, 40.0]
    trace = update()  # the next update draws GPU 2 too
    assert trace["y"] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert [row[-1] for row in trace["z"]] == [10.0, 20.0, 30.0, 40.0]


def test_the_decision_log_says_when_no_scheduler_runs(bare: Daemon, make_daemon: Any) -> None:
    """A host without a scheduler was told "No scheduler decision yet.", as if one were coming."""
    bare.tick()
    log = find(page(create_app(bare).test_client(), "/causes"), "causes-decisions")["children"]
    assert log["props"]["children"] == "The scheduler is not enabled (scheduler.enabled): it makes no decisions."
    d = make_daemon(ticks=1, scheduler={"enabled": False})
    assert d.scheduler is None
    assert "not enabled" in str(find(page(create_app(d).test_client(), "/causes"), "causes-decisions")["children"])


def test_a_move_whose_first_step_failed_at_once_is_not_shown_as_a_move() -> None:
    """The API and the alerts said 'failed'; the decision log showed a highlighted 'migrate' and the status line
    'last move: migrate ...' for a shard that never moved."""
    from sits_observe.ui.app import last_move
    from sits_observe.ui.pages.causes import decision_table

    failed = {"ts": 1.0, "action": "migrate", "trigger": "verdict", "shard_id": "chat-0", "source_gpus": [0, 1],
              "target_gpus": [2, 3], "reason": "p99 burn", "outcome": "failed", "failure": "actuator queue full"}
    moved = failed | {"outcome": "launched", "failure": None, "shard_id": "chat-1"}
    assert last_move(failed) == "last move: migrate chat-0 0,1 → 2,3 (failed)"
    assert last_move(moved) == "last move: migrate chat-1 0,1 → 2,3"
    assert last_move(None) == ""
    cells = [[td.children for td in tr.children] for tr in decision_table([failed, moved], True).children[1].children]
    assert cells[0][1] == "migrate (failed)" and cells[0][7] == "p99 burn; failed: actuator queue full"
    assert cells[1][1] == "migrate" and cells[1][7] == "p99 burn"


@pytest.mark.parametrize("ts, said", [(995.0, "likely cause: scheduler_stall (0.93, 5 s ago)"),
                                      (1000.0 - 1800, "likely cause: scheduler_stall (0.93, 30 min ago)"),
                                      (1000.0 - 3 * 3600, "likely cause: scheduler_stall (0.93, 3 h ago)"),
                                      (None, "likely cause: scheduler_stall (0.93)")])
def test_the_status_lines_likely_cause_says_how_old_it_is(ts: float | None, said: str) -> None:
    """An hour-old verdict (the classifier turned off at a SIGHUP, or no burn since) read as the current cause."""
    from sits_observe.ui.app import likely_cause

    assert likely_cause({"cause": "scheduler_stall", "confidence": 0.93, "ts": ts}, 1000.0) == said


class TroubledGpus:
    """GPUs 0, 1 and 3: GPU 1's XID count grows by 2, GPU 3 stops answering at ``lose``."""

    name = "nvml"

    def __init__(self) -> None:
        self.tick, self.lose = 0, 4

    def collect(self, frame: Any) -> None:
        self.tick += 1
        info = tuple(GpuInfo(i, f"GPU-{i}", "H100", f"00000000:{i:02X}:00.0") for i in (0, 1, 3))
        values = np.full((3, len(GPU_FIELDS)), np.nan)
        values[:, GPU_FIELD_INDEX["xid_errors_total"]] = (5.0, 1.0 + 2 * (self.tick >= 3), 0.0)
        healthy = np.array([True, True, self.tick < self.lose])
        if not healthy[2]:
            values[2] = np.nan  # a lost GPU gives no values
        frame.gpu = GpuFrame(info, values, healthy)


def test_the_status_line_names_a_lost_gpu_and_new_xid_errors(bare: Daemon) -> None:
    """A GPU off the bus only went blank on the pages, and an XID error showed nowhere in the UI."""
    src = TroubledGpus()
    bare.sources.append(src)
    said = []
    for _ in range(5):
        bare.tick()
        said.append([x.children for x in _status(UiContext(bare)) if x.className == "item bad"
                     and str(x.children).startswith("GPU")])
    assert said[0] == [] and said[1] == []  # an old XID count (GPU 0's 5) is no news
    assert said[2] == ["GPU 1: 2 XID errors in 5 min"]
    assert said[4] == ["GPU 3 lost · GPU 1: 2 XID errors in 5 min"]


def test_the_last_move_is_shown_however_many_decisions_came_after_it(make_daemon: Any) -> None:
    """The status line looked for a migration among the newest 64 decisions only: a busy scheduler's "no action"
    decisions hid an older move (and the ring of decisions_kept forgets it too)."""
    from sits_observe.scheduler.triggers import Trigger

    d = make_daemon(ticks=5, scheduler={"actuator": "sim", "decisions_kept": 16})
    sched = d.scheduler
    moved = sched.manual_reshard("chat-1", "move it for the UI test")
    for _ in range(100):
        t = Trigger("imbalance", "none", False, sched.seen.now, "nothing better")
        sched.tracer.record(sched.decider.decision(t, "shard.reshard", "no_action", "nothing better", "chat-0", None,
                                                   ()))
    assert all(x["action"] == "no_action" for x in sched.decisions_state(100)["decisions"])
    assert sched.decisions_state(1)["last_move"]["id"] == moved["id"]
    line = [x.children for x in _status(UiContext(d)) if str(x.children).startswith("last move")]
    gpus = ",".join(map(str, moved["source_gpus"])) + " → " + ",".join(map(str, moved["target_gpus"]))
    assert line == [f"last move: migrate chat-1 {gpus}"]
