"""The UI over HTTP (Flask test client, the same app the daemon serves): page URLs, bad inputs, and
live updates whose patches rebuild exactly the figure a fresh page load would draw."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.ui.bench import GRAPHS
from sits_observe.ui.pages import PAGES

STAGE_OUTPUTS = ["stages-p99.figure", "stages-hist.figure", "stages-held.data", "stages-stage.options",
                 "stages-stage.value"]


def dash_call(client: Any, outputs: list[str], inputs: list[tuple[str, Any]], state: list[tuple[str, Any]] = (),
              changed: str | None = None) -> Any:
    """POST one callback as dash-renderer does; ids are ``component.property``."""
    def item(spec: str, value: Any = None, with_value: bool = True) -> dict[str, Any]:
        cid, prop = spec.rsplit(".", 1)
        return {"id": cid, "property": prop, **({"value": value} if with_value else {})}

    body = {"output": outputs[0] if len(outputs) == 1 else "..%s.." % "...".join(outputs),
            "outputs": ([item(o, with_value=False) for o in outputs] if len(outputs) > 1
                        else item(outputs[0], with_value=False)),
            "inputs": [item(i, v) for i, v in inputs], "state": [item(s, v) for s, v in state],
            "changedPropIds": [changed or inputs[0][0]]}
    return client.post("/_dash-update-component", json=body)


def page(client: Any, path: str, search: str = "") -> Any:
    r = dash_call(client, ["page.children"], [("url.pathname", path), ("url.search", search)])
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()["response"]["page"]["children"]


def find(tree: Any, cid: str) -> dict[str, Any]:
    """The props of the component with id ``cid`` in a serialized layout."""
    if isinstance(tree, dict):
        props = tree.get("props", {})
        if props.get("id") == cid:
            return props
        for v in props.values():
            if isinstance(v, (dict, list)) and (hit := find(v, cid)):
                return hit
    elif isinstance(tree, list):
        for v in tree:
            if hit := find(v, cid):
                return hit
    return {}


def apply_patch(obj: Any, patch: dict[str, Any]) -> Any:
    """Apply dash Patch operations (the ones the UI sends: Assign, Extend) to a JSON object."""
    obj = copy.deepcopy(obj)
    for op in patch["operations"]:
        *path, last = op["location"]
        target = obj
        for key in path:
            target = target[key]
        if op["operation"] == "Assign":
            target[last] = op["params"]["value"]
        elif op["operation"] == "Extend":
            target[last].extend(op["params"]["value"])
        else:
            raise AssertionError(f"unexpected patch operation {op['operation']}")
    return obj


@pytest.mark.parametrize(("url", "status", "says"), [
    ("/topology?gpu=99", 400, "gpu: no GPU 99 on this host; GPUs are 0-7"),
    ("/topology?gpu=-1", 400, "gpu: expected a GPU index"),
    ("/load?range=abc", 400, "range: expected a duration"),
    ("/load?range=10y", 400, "range: expected a duration"),
    ("/stages?range=30d", 400, "range: this daemon keeps 10m of history"),
    ("/stages?range=1e400", 400, "range: expected a duration"),
    ("/load?field=fan", 400, "field: unknown value 'fan'"),
    ("/stages?stage=nope", 400, "stage: unknown value 'nope'"),
    ("/slos?x=1", 400, "unknown parameter 'x'"),
    ("/load?range=1m&range=2m", 400, "given 2 times"),
    ("/load?" + "a" * 5000, 400, "at most 512"),
    ("/no-such-page", 404, "no UI page '/no-such-page'; pages: /topology, /load"),
    ("/favicon.ico", 404, "no UI page"),
    ("/api/v1/nope", 404, "no such API path '/api/v1/nope'"),
    ("/topology?gpu=%C2%B2", 400, "gpu: expected a GPU index (0-7), got '²'"),
    ("/topology?gpu=%EF%BC%91", 400, "gpu: expected a GPU index"),
])
def test_bad_page_urls_get_a_reason(client: Any, url: str, status: int, says: str) -> None:
    r = client.get(url)
    assert r.status_code == status
    assert says in r.get_json()["error"]
    assert "Traceback" not in r.get_data(as_text=True)


def test_pages_and_metrics_after_a_flood_of_bad_requests(client: Any) -> None:
    for _ in range(200):
        client.get("/stages?range=99999999h")
        client.get(b"/load?field=%ff%fe".decode("latin-1"))
    for url in ("/", "/topology?gpu=3", "/load?field=temperature&range=5m", "/load?field=foreign",
                "/load?field=backlog", "/stages?stage=decode", "/slos", "/causes?range=90s"):
        r = client.get(url)
        assert r.status_code == 200 and b"_dash-config" in r.data, url
    m = client.get("/metrics")
    assert m.status_code == 200 and b"sits_stage_latency_seconds_bucket" in m.data


def count_graphs(tree: Any) -> int:
    if isinstance(tree, dict):
        return (tree.get("type") == "Graph") + sum(count_graphs(v) for v in tree.get("props", {}).values())
    return sum(count_graphs(v) for v in tree) if isinstance(tree, list) else 0


def test_every_page_draws_the_graphs_the_bench_waits_for(client: Any) -> None:
    assert list(GRAPHS) == list(PAGES)
    for path, graphs in GRAPHS.items():
        assert count_graphs(page(client, path)) == graphs, path


def test_crafted_callback_inputs_are_refused(client: Any) -> None:
    r = dash_call(client, ["page.children"], [("url.pathname", "/topology"), ("url.search", "?gpu=12")])
    assert r.status_code == 400 and "no GPU 12" in r.get_json()["error"]
    held = {"p99": None, "hist": None, "stage": "e2e", "window": 1e12}
    r = dash_call(client, STAGE_OUTPUTS, [("stages-tick.n_intervals", 1), ("stages-stage.value", "e2e")],
                  [("stages-held.data", held)])
    error = r.get_json()["error"]
    assert r.status_code == 400
    assert "window: 1000000000000.0 s is not between one tick and the history kept (10m)" in error
    r = dash_call(client, ["load-heat.figure", "load-held.data"], [("load-tick.n_intervals", 1),
                  ("load-field.value", "../../etc")], [("load-held.data", {"window": 60})])
    assert r.status_code == 400 and "field: unknown value" in r.get_json()["error"]
    r = dash_call(client, ["load-heat.figure", "load-held.data"], [("load-tick.n_intervals", 1),
                  ("load-field.value", {"a": 1})], [("load-held.data", {"window": 60})])
    assert r.status_code == 400 and "field: expected a string, got dict" in r.get_json()["error"]
    r = dash_call(client, ["page.children"], [("url.pathname", 5), ("url.search", ["a"])])
    assert r.status_code == 400 and "url: pathname and search must be strings" in r.get_json()["error"]
    for body in ([], {}, {"output": "x.y", "inputs": []}, {"output": "page.children", "inputs": 5}):
        r = client.post("/_dash-update-component", json=body)
        assert r.status_code == 400 and r.get_json()["error"].startswith("callback: "), body
    # inputs, state or outputs other than the callback's own: each was a 500 inside Dash, and a logged traceback
    load = {"output": "..load-heat.figure...load-held.data..",
            "outputs": [{"id": "load-heat", "property": "figure"}, {"id": "load-held", "property": "data"}],
            "inputs": [{"id": "load-tick", "property": "n_intervals", "value": 1},
                       {"id": "load-field", "property": "value", "value": "power"}],
            "state": [{"id": "load-held", "property": "data", "value": {"window": 60}}], "changedPropIds": []}
    for change, says in (({"state": []}, "callback: state must be [('load-held', 'data')]"),
                         ({"inputs": load["inputs"][:1]}, "callback: inputs must be [('load-tick', 'n_intervals'), "),
                         ({"inputs": [{}, {}]}, "callback: inputs must be"),
                         ({"outputs": {}}, "callback: outputs do not match output '..load-heat.figure"),
                         ({"changedPropIds": [1]}, "callback: outputs must be an object or a list, changedPropIds a "
                                                   "list of strings"),
                         ({"changedPropIds": [None]}, "callback: outputs must be"),
                         ({"changedPropIds": [{"id": "load-field"}]}, "callback: outputs must be")):
        r = client.post("/_dash-update-component", json={**load, **change})
        assert r.status_code == 400 and r.get_json()["error"].startswith(says), (change, r.get_data(as_text=True))
    assert client.post("/_dash-update-component", json=load).status_code == 200
    # junk where the browser's figure state should be: answered with a whole new figure, not an error
    r = dash_call(client, ["load-heat.figure", "load-held.data"], [("load-tick.n_intervals", 1),
                  ("load-field.value", "power")], [("load-held.data", {"window": 60, "heat": {"tick": "x"}})])
    assert r.status_code == 200 and "data" in r.get_json()["response"]["load-heat"]["figure"]


@pytest.mark.parametrize(("ticks", "history", "search"), [(300, 600, "?range=5m"), (1000, 1000, "")])
def test_live_updates_patch_to_the_fresh_figure(make_daemon: Callable[..., Daemon], ticks: int, history: int,
                                                search: str) -> None:
    d = make_daemon(ticks=ticks, store={"history": history}, ui={"history": history})
    client = create_app(d).test_client()
    tree = page(client, "/stages", search)
    figs = {g: find(tree, g)["figure"] for g in ("stages-p99", "stages-hist")}
    held = find(tree, "stages-held")["data"]
    patched = 0
    for step in (1, 3, 4, 10):
        for _ in range(step):
            d.tick()
        r = dash_call(client, STAGE_OUTPUTS, [("stages-tick.n_intervals", step), ("stages-stage.value", "e2e")],
                      [("stages-held.data", held)])
        assert r.status_code in (200, 204)
        if r.status_code == 204:
            continue
        out = r.get_json()["response"]
        held = out["stages-held"]["data"]
        for g in figs:
            new = out.get(g, {}).get("figure")
            if isinstance(new, dict) and "operations" in new:
                figs[g] = apply_patch(figs[g], new)
                patched += 1
            elif new is not None:
                figs[g] = new
        fresh = page(client, "/stages", search)
        for g, fig in figs.items():
            want = find(fresh, g)["figure"]
            n = len(want["data"][0]["x"])
            got_trace, want_trace = fig["data"][0], want["data"][0]
            assert got_trace["x"][-n:] == want_trace["x"]
            for key in ("z", "customdata"):
                assert [row[-n:] for row in got_trace[key]] == want_trace[key], (g, key, step)
            assert fig["layout"]["xaxis"]["range"] == want["layout"]["xaxis"]["range"]
    assert patched >= 4


def test_ui_can_be_switched_off(make_daemon: Callable[..., Daemon]) -> None:
    client = create_app(make_daemon(ticks=2, ui={"enabled": False})).test_client()
    assert client.get("/").status_code == 404 and client.get("/stages").status_code == 404
    assert client.get("/metrics").status_code == 200


def test_a_migration_in_flight_is_outlined_and_logged(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(ticks=5)
    client = create_app(d).test_client()
    tree = page(client, "/topology")
    assert find(tree, "topo-moves")["children"] == "No shard is migrating."
    decision = d.scheduler.manual_reshard("chat-1", "move it for the UI test")
    d.tick()
    r = dash_call(client, ["topo-links.figure", "topo-strip.figure", "topo-moves.children"],
                  [("topo-tick.n_intervals", 1)], [("topo-held.data", {"gpu": None})])
    out = r.get_json()["response"]
    text = out["topo-moves"]["children"]
    source, target = decision["source_gpus"], decision["target_gpus"]
    assert text.startswith("Migrating: shard chat-1: GPUs ") and f"{','.join(map(str, source))} → " in text
    strip_ops = {tuple(op["location"]): op["params"]["value"] for op in out["topo-strip"]["figure"]["operations"]}
    boxes = strip_ops[("layout", "shapes")]
    assert len(boxes) == len(source) + len(target)  # one outline per GPU the shard leaves or moves to
    assert {b["line"]["dash"] for b in boxes} == {"dash", "solid"}
    tree = page(client, "/causes")
    rows = find(tree, "causes-decisions")["children"]["props"]["children"][1]["props"]["children"]
    first = rows[0]["props"]
    assert first["data-shard"] == "chat-1" and first["data-span"] == decision["span_id"]


def test_a_gpu_of_unknown_numa_node_is_a_block_of_its_own_not_node_0() -> None:
    """A GPU NVML could not open at start has no NUMA node; the matrix drew it inside node 0's square."""
    from dataclasses import replace

    from sits_observe.topology import NUMA_UNKNOWN, preset
    from sits_observe.ui.pages.topology import link_figure

    topo = preset("pcie-8")
    topo = replace(topo, gpus=tuple(replace(g, numa_node=NUMA_UNKNOWN) if g.index == 1 else g for g in topo.gpus))
    fig = link_figure(topo)
    assert fig["data"][0]["x"] == [f"GPU {i}" for i in (0, 2, 3, 4, 5, 6, 7, 1)]
    squares = [(s["label"]["text"], s["x0"] + 0.5, s["x1"] - 0.5) for s in fig["layout"]["shapes"]]
    assert squares == [("NUMA 0", 0, 2), ("NUMA 1", 3, 6), ("NUMA unknown", 7, 7)]


def test_the_live_strip_matches_store_rows_to_gpus_by_index() -> None:
    """The strip read the store's rows by position; the store keeps them in the order the GPUs were seen."""
    from types import SimpleNamespace

    from sits_observe.frame import GPU_FIELD_INDEX, GpuFrame, GpuInfo
    from sits_observe.topology import preset
    from sits_observe.ui.pages.topology import order, strip_values

    topo = preset("pcie-8")
    seen = [7, 6, 5, 4, 3, 2, 1]  # GPU 0 never reported
    latest = GpuFrame.empty([GpuInfo(i, f"GPU-{i}", "H100", f"0:{i}") for i in seen])
    for r, i in enumerate(seen):
        latest.values[r, GPU_FIELD_INDEX["utilization_ratio"]] = i / 10
        latest.values[r, GPU_FIELD_INDEX["memory_used_bytes"]] = i
        latest.values[r, GPU_FIELD_INDEX["memory_total_bytes"]] = 100
    ctx = SimpleNamespace(store=SimpleNamespace(gpu_latest=lambda: latest))
    assert strip_values(ctx, topo, order(topo)) == [[None, None]] + [[10.0 * i, float(i)] for i in range(1, 8)]


def test_a_page_open_across_a_daemon_restart_gets_a_new_figure(make_daemon: Callable[..., Daemon]) -> None:
    """A restarted daemon counts ticks from 0 again: a browser holding tick 10 of the last run was sent ticks 10-30
    of the new one to append to the old run's figure (the new run's first 10 ticks never drawn)."""
    before = make_daemon(ticks=10)
    held = find(page(create_app(before).test_client(), "/load"), "load-held")["data"]
    after = make_daemon(ticks=30)
    client = create_app(after).test_client()
    r = dash_call(client, ["load-heat.figure", "load-held.data"],
                  [("load-tick.n_intervals", 1), ("load-field.value", "utilization")], [("load-held.data", held)])
    assert r.status_code == 200, r.get_data(as_text=True)
    fig = r.get_json()["response"]["load-heat"]["figure"]
    assert "operations" not in fig
    assert fig["data"][0]["x"] == find(page(client, "/load"), "load-heat")["figure"]["data"][0]["x"]
