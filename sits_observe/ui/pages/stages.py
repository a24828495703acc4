"""Stages: p99 of every stage over time (log colour), and one stage's latency histogram over time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dash import Dash, Input, Output, State, ctx as dash_ctx, dcc, html, no_update
from werkzeug.exceptions import BadRequest

from ...frame import STAGES
from ..cache import binned_counts, binned_quantile
from ..context import UiContext, Window
from ..figures import HeatSpec, fmt_count, fmt_seconds, series_update
from ..params import fmt_range, parse_choice

PATH = "/stages"
TITLE = "Stages"
PARAMS = ("stage", "range")

P99 = HeatSpec(
    title="p99 latency by stage (merged histogram of each column)", ytitle="stage", colorbar="p99 latency",
    hover="p99 %{customdata:.3s}s", log=True, ticks=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0),
    tick_text=fmt_seconds, colorscale="YlOrRd", zmin=1e-6, zmax=100.0, height=440)  # one colour, one latency
HIST = HeatSpec(
    title="latency histogram", ytitle="latency bucket (upper edge)", colorbar="events per tick",
    hover="%{customdata:,} events", log=True, ticks=(1, 10, 100, 1e3, 1e4, 1e5, 1e6), tick_text=fmt_count,
    colorscale="Blues", digits=9, height=520, yorder={})


def stages(ctx: UiContext) -> list[str]:
    """Stages with data, in vocabulary order (request, device, host tiers); unknown names last."""
    have = set(ctx.store.stages())
    return [s for s in STAGES if s in have] + sorted(have - set(STAGES))


def options(ctx: UiContext, q: Mapping[str, str]) -> dict[str, Any]:
    known = stages(ctx) or list(STAGES)
    default = "e2e" if "e2e" in known else known[0]
    return {"stage": parse_choice("stage", q.get("stage"), known, default), "window": ctx.window(q)}


def _bucket_rows(ctx: UiContext) -> tuple[str, ...]:
    edges = ctx.store.layout.edges
    return tuple(f"≤ {fmt_seconds(e)}" for e in edges) + (f"> {fmt_seconds(edges[-1])}",)


def _p99_cache(ctx: UiContext, w: Window) -> Any:
    rows = tuple(stages(ctx))
    store = ctx.store
    windows = [lambda n, s=s: store.hist_window(s, None, n) for s in rows]
    uppers = store.layout.uppers()
    return ctx.cache("stage-p99", rows, lambda t, k, b: binned_quantile(windows, uppers, 0.99, t, k, b), w.bin)


def _hist_cache(ctx: UiContext, stage: str, w: Window) -> Any:
    store = ctx.store
    return ctx.cache(("stage-hist", stage), _bucket_rows(ctx),
                     lambda t, k, b: binned_counts([lambda n: store.hist_window(stage, None, n)], t, k, b), w.bin)


def _hist_spec(stage: str, w: Window) -> HeatSpec:
    per = fmt_range(w.bin * w.seconds / w.ticks)
    return replace(HIST, title=f"{stage}: latency histogram (events per bucket per {per})",
                   colorbar=f"events per {per}")


def _update(ctx: UiContext, stage: str, w: Window, held: dict[str, Any] | None) -> tuple[Any, Any, dict[str, Any]]:
    held = held or {}
    p99, p99_held = series_update(P99, _p99_cache(ctx, w), held.get("p99"), w)
    hist_held = held.get("hist") if held.get("stage") == stage else None
    hist, hist_held = series_update(_hist_spec(stage, w), _hist_cache(ctx, stage, w), hist_held, w)
    return p99, hist, {"p99": p99_held, "hist": hist_held, "stage": stage, "window": w.seconds}


def layout(ctx: UiContext, opts: dict[str, Any]) -> Any:
    p99, hist, held = _update(ctx, opts["stage"], opts["window"], None)
    return html.Div([
        dcc.Graph(id="stages-p99", figure=p99, config={"displaylogo": False}),
        html.Div([html.Label("Stage", htmlFor="stages-stage"),
                  dcc.Dropdown(id="stages-stage", options=stages(ctx) or [opts["stage"]], value=opts["stage"],
                               clearable=False, style={"width": "14em"})], className="controls"),
        dcc.Graph(id="stages-hist", figure=hist, config={"displaylogo": False}),
        dcc.Store(id="stages-held", data=held),
        dcc.Interval(id="stages-tick", interval=ctx.interval_ms),
    ])


def held_stage(ctx: UiContext, stage: Any) -> str:
    """The stage a live update draws: the one the page holds while it has data, else the first with data.

    A page opened before any stage had data holds the default (``e2e``), which a host without request
    stages (NVML only, probes only) never gets; it moves to the first stage that appears instead of
    failing every update. Only a URL's ``?stage=`` is refused for a stage without data.
    """
    known = stages(ctx)
    if not isinstance(stage, str):
        raise BadRequest(f"stage: expected a stage name from the page, got {type(stage).__name__}; reload the page")
    if stage in known:
        return stage
    if known:
        return known[0]
    return stage if stage in STAGES else "e2e"  # nothing has data yet: no cache for a name we do not know


def register(app: Dash, ctx: UiContext) -> None:
    @app.callback(Output("stages-p99", "figure"), Output("stages-hist", "figure"), Output("stages-held", "data"),
                  Output("stages-stage", "options"), Output("stages-stage", "value"),
                  Input("stages-tick", "n_intervals"), Input("stages-stage", "value"), State("stages-held", "data"),
                  prevent_initial_call=True)
    def update(_n: int, raw: Any, held: Any) -> tuple[Any, ...]:
        stage = held_stage(ctx, raw)
        held = held if isinstance(held, dict) else {}
        if dash_ctx.triggered_id == "stages-stage":
            held = {**held, "hist": None}
        p99, hist, held = _update(ctx, stage, ctx.held_window(held.get("window")), held)
        return p99, hist, held, stages(ctx) or [stage], stage if stage != raw else no_update
