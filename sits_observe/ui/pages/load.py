"""Load: one GPU field (utilization, memory, temperature, ...) as a GPU x time heatmap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from dash import Dash, Input, Output, State, ctx as dash_ctx, dcc, html

from ..cache import binned_mean
from ..context import UiContext
from ..figures import HeatSpec, series_update
from ..params import parse_choice

PATH = "/load"
TITLE = "Load"
PARAMS = ("field", "range")


@dataclass(frozen=True)
class LoadField:
    label: str
    unit: str
    read: Callable[[Any, int], np.ndarray]  # (store, k) -> (k, gpus) in display units
    zmin: float | None = None
    zmax: float | None = None
    colorscale: str = "Viridis"


def _scaled(field: str, factor: float) -> Callable[[Any, int], np.ndarray]:
    return lambda store, k: store.gpu_window(field, k) * factor


def _memory(store: Any, k: int) -> np.ndarray:
    with store.reading(), np.errstate(divide="ignore", invalid="ignore"):  # both of the same ticks and GPUs
        return 100.0 * store.gpu_window("memory_used_bytes", k) / store.gpu_window("memory_total_bytes", k)


FIELDS: dict[str, LoadField] = {
    "utilization": LoadField("GPU utilization", "%", _scaled("utilization_ratio", 100.0), 0, 100),
    "foreign": LoadField("Foreign GPU use (other processes)", "%", _scaled("foreign_utilization_ratio", 100.0), 0,
                         100, "Reds"),
    "backlog": LoadField("GPU use where the replica has requests waiting", "%",
                         _scaled("backlog_utilization_ratio", 100.0), 0, 100),
    "memory": LoadField("GPU memory used", "%", _memory, 0, 100, "Cividis"),
    "temperature": LoadField("GPU temperature", "°C", _scaled("temperature_celsius", 1.0), colorscale="YlOrRd"),
    "power": LoadField("GPU power", "W", _scaled("power_watts", 1.0), colorscale="Hot"),
    "sm_clock": LoadField("SM clock", "MHz", _scaled("sm_clock_hertz", 1e-6), colorscale="Blues"),
    "pcie_rx": LoadField("PCIe receive", "GB/s", _scaled("pcie_rx_bytes_per_second", 1e-9), colorscale="Greens"),
    "nvlink_rx": LoadField("NVLink receive", "GB/s", _scaled("nvlink_rx_bytes_per_second", 1e-9),
                           colorscale="Greens"),
}


def options(ctx: UiContext, q: Mapping[str, str]) -> dict[str, Any]:
    return {"field": parse_choice("field", q.get("field"), FIELDS, "utilization"), "window": ctx.window(q)}


def _gpu_indices(ctx: UiContext) -> tuple[int, ...]:
    """One row per GPU the source reports, by its index (DCGM may skip one: rows 0, 1, 3)."""
    return tuple(g.index for g in ctx.store.gpu_info())


def _by_index(read: Callable[[Any, int], np.ndarray], indices: tuple[int, ...]) -> Callable[[Any, int], np.ndarray]:
    """``read`` with its columns put in the rows of the GPUs ``indices`` (NaN for a GPU the store no longer has).

    The rows are chosen before the cache reads, and the tick thread may change the store's GPUs in between (a
    GPU appears, one is renumbered): the store's columns are matched to the rows by GPU index under its lock,
    not by position (a read of 4 GPUs into the rows of 3 was a 500)."""
    def cols(store: Any, k: int) -> np.ndarray:
        with store.reading():
            vals, at = read(store, k), {g.index: c for c, g in enumerate(store.gpu_info())}
        out = np.full((len(vals), len(indices)), np.nan)
        for row, gpu in enumerate(indices):
            if (c := at.get(gpu)) is not None:
                out[:, row] = vals[:, c]
        return out

    return cols


def _spec(name: str, n_gpus: int) -> HeatSpec:
    f = FIELDS[name]
    return HeatSpec(title=f"{f.label} by GPU ({f.unit}, mean of each column)", ytitle="GPU", colorbar=f.unit,
                    hover=f"{f.label} %{{z:.4g}} {f.unit}", colorscale=f.colorscale, zmin=f.zmin, zmax=f.zmax,
                    height=max(320, 140 + 34 * n_gpus))


def _update(ctx: UiContext, name: str, seconds: float, held: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    w = ctx.held_window(seconds)
    store, indices = ctx.store, _gpu_indices(ctx)
    read, rows = _by_index(FIELDS[name].read, indices), tuple(f"GPU {g}" for g in indices)
    cache = ctx.cache(("gpu", name), rows, lambda t, k, b: binned_mean(lambda n: read(store, n), t, k, b), w.bin)
    fig, heat_held = series_update(_spec(name, len(rows)), cache, held, w)
    return fig, {"heat": heat_held, "field": name, "window": w.seconds}


def layout(ctx: UiContext, opts: dict[str, Any]) -> Any:
    fig, held = _update(ctx, opts["field"], opts["window"].seconds, None)
    return html.Div([
        html.Div([html.Label("Field", htmlFor="load-field"),
                  dcc.Dropdown(id="load-field", value=opts["field"], clearable=False, style={"width": "18em"},
                               options=[{"label": f"{f.label} ({f.unit})", "value": k} for k, f in FIELDS.items()])],
                 className="controls"),
        dcc.Graph(id="load-heat", figure=fig, config={"displaylogo": False}),
        dcc.Store(id="load-held", data=held),
        dcc.Interval(id="load-tick", interval=ctx.interval_ms),
    ])


def register(app: Dash, ctx: UiContext) -> None:
    @app.callback(Output("load-heat", "figure"), Output("load-held", "data"),
                  Input("load-tick", "n_intervals"), Input("load-field", "value"), State("load-held", "data"),
                  prevent_initial_call=True)
    def update(_n: int, name: str, held: Any) -> tuple[Any, dict[str, Any]]:
        name = parse_choice("field", name, FIELDS, "utilization")
        held = held if isinstance(held, dict) else {}
        same = dash_ctx.triggered_id != "load-field" and held.get("field") == name
        return _update(ctx, name, held.get("window"), held.get("heat") if same else None)
