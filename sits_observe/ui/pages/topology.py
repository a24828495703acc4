"""Topology: the GPU x GPU link matrix (kind and bandwidth, NUMA blocks outlined) beside a live
per-GPU utilization/memory strip; GPUs of a shard under migration are outlined on both."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from dash import Dash, Input, Output, Patch, State, dcc, html
from werkzeug.exceptions import NotFound

from ...frame import GPU_FIELD_INDEX as F
from ...topology import NUMA_UNKNOWN, LinkKind, Topology
from .. import parts
from ..context import UiContext
from ..figures import base_layout
from ..params import parse_gpu

PATH = "/topology"
TITLE = "Topology"
PARAMS = ("gpu",)

ABBREV = {LinkKind.SELF: "X", LinkKind.NVSWITCH: "NVS", LinkKind.PCIE_SWITCH: "PIX",
          LinkKind.PCIE_HOST_BRIDGE: "PHB", LinkKind.NUMA_INTERCONNECT: "SYS", LinkKind.NETWORK: "NET"}
LEGEND = ("NVS NVSwitch fabric · NV# NVLink bridge (# links) · PIX same PCIe switch · "
          "PHB across a PCIe host bridge · SYS across the NUMA interconnect · NET network")
SOURCE, TARGET, PICKED = "#e6550d", "#31a354", "#111111"


def options(ctx: UiContext, q: Mapping[str, str]) -> dict[str, Any]:
    return {"gpu": parse_gpu(q.get("gpu"), ctx.gpu_indices)}


def order(topo: Topology) -> list[int]:
    """GPU indices grouped by NUMA node, so each node is one block of the matrix (GPUs of unknown node last)."""
    return sorted(range(topo.n), key=lambda i: (topo.gpus[i].numa_node == NUMA_UNKNOWN, topo.gpus[i].numa_node, i))


def _abbrev(topo: Topology, i: int, j: int) -> str:
    kind = topo.kinds[i][j]
    return f"NV{int(topo.nvlinks[i, j])}" if kind == LinkKind.NVLINK else ABBREV.get(kind, kind.value)


def link_figure(topo: Topology) -> dict[str, Any]:
    idx = order(topo)
    labels = [f"GPU {i}" for i in idx]
    gbs = topo.bandwidth[np.ix_(idx, idx)] / 1e9
    with np.errstate(divide="ignore"):
        z = np.where(gbs > 0, np.log10(np.maximum(gbs, 1e-9)), np.nan)
    text = [[_abbrev(topo, i, j) for j in idx] for i in idx]
    kinds = [[topo.kinds[i][j].value for j in idx] for i in idx]
    nvl = topo.nvlinks[np.ix_(idx, idx)]
    hover = [[f"{kinds[a][b]}" + (f", {int(nvl[a, b])} NVLinks" if nvl[a, b] else "") for b in range(len(idx))]
             for a in range(len(idx))]
    ticks = sorted({round(float(v), 1) for v in gbs.flat if v > 0})
    trace = {
        "type": "heatmap", "x": labels, "y": labels, "z": [[None if math.isnan(v) else round(v, 4) for v in r]
                                                            for r in z],
        "text": text, "texttemplate": "%{text}", "customdata": [[[h, round(float(g), 1)] for h, g in zip(hr, gr)]
                                                               for hr, gr in zip(hover, gbs)],
        "hovertemplate": "%{y} → %{x}<br>%{customdata[0]}<br>%{customdata[1]} GB/s per direction<extra></extra>",
        "colorscale": "Viridis", "xgap": 2, "ygap": 2, "hoverongaps": False,
        "colorbar": {"title": {"text": "link bandwidth", "side": "right"}, "thickness": 14,
                     "tickvals": [math.log10(t) for t in ticks], "ticktext": [f"{t:g} GB/s" for t in ticks]},
    }
    layout = base_layout(f"GPU links ({topo.name})", 520,
                         xaxis={"title": {"text": "peer GPU"}, "side": "bottom", "type": "category"},
                         yaxis={"title": {"text": "GPU"}, "autorange": "reversed", "type": "category"},
                         shapes=numa_shapes(topo, idx))
    return {"data": [trace], "layout": layout}


def numa_shapes(topo: Topology, idx: list[int]) -> list[dict[str, Any]]:
    """One outlined square per NUMA node (its GPUs are contiguous in ``idx``)."""
    shapes, start = [], 0
    while start < len(idx):
        node = topo.gpus[idx[start]].numa_node
        end = start
        while end + 1 < len(idx) and topo.gpus[idx[end + 1]].numa_node == node:
            end += 1
        name = "NUMA unknown" if node == NUMA_UNKNOWN else f"NUMA {node}"
        shapes.append({"type": "rect", "xref": "x", "yref": "y", "x0": start - 0.5, "x1": end + 0.5,
                       "y0": start - 0.5, "y1": end + 0.5, "line": {"color": "#d62728", "width": 2, "dash": "dot"},
                       "label": {"text": name, "textposition": "top left", "font": {"size": 11}}})
        start = end + 1
    return shapes


def _row_box(pos: int, color: str, dash: str) -> dict[str, Any]:
    """An outline around one GPU's row (x in paper units: the whole width of the plot)."""
    return {"type": "rect", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": pos - 0.5, "y1": pos + 0.5,
            "line": {"color": color, "width": 3, "dash": dash}, "fillcolor": "rgba(0,0,0,0)"}


def highlights(idx: list[int], moves: list[parts.Move], picked: int | None) -> list[dict[str, Any]]:
    pos = {g: p for p, g in enumerate(idx)}
    out = []
    for m in moves:
        out += [_row_box(pos[g], SOURCE, "dash") for g in m.source if g in pos]
        out += [_row_box(pos[g], TARGET, "solid") for g in m.target if g in pos]
    if picked is not None and picked in pos:
        out.append(_row_box(pos[picked], PICKED, "dot"))
    return out


def strip_values(ctx: UiContext, topo: Topology, idx: list[int]) -> list[list[float | None]]:
    """Utilization and memory (%) of the topology's GPUs ``idx``, matched to the store's rows by GPU index (the
    store keeps a row per GPU seen, in the order they were seen)."""
    latest = ctx.store.gpu_latest()
    if latest is None:
        return [[None, None] for _ in idx]
    v = latest.values
    util = 100.0 * v[:, F["utilization_ratio"]]
    with np.errstate(divide="ignore", invalid="ignore"):
        mem = 100.0 * v[:, F["memory_used_bytes"]] / v[:, F["memory_total_bytes"]]
    row = {g.index: r for r, g in enumerate(latest.info)}
    rows = [row.get(topo.gpus[i].index) for i in idx]
    return [[None if not np.isfinite(x) else round(float(x), 1) for x in (util[r], mem[r])] if r is not None
            else [None, None] for r in rows]


def strip_figure(ctx: UiContext, topo: Topology, idx: list[int], shapes: list[dict[str, Any]]) -> dict[str, Any]:
    trace = {"type": "heatmap", "x": ["utilization", "memory"], "y": [f"GPU {i}" for i in idx],
             "z": strip_values(ctx, topo, idx), "zmin": 0, "zmax": 100, "colorscale": "Blues", "reversescale": True,
             "xgap": 2, "ygap": 2,
             "texttemplate": "%{z:.0f}%", "hovertemplate": "%{y} %{x}: %{z:.1f} %<extra></extra>",
             "colorbar": {"title": {"text": "% (now)", "side": "right"}, "thickness": 12}}
    layout = base_layout("Live load", 520, margin={"l": 70, "r": 20, "t": 40, "b": 50},
                         xaxis={"side": "bottom", "type": "category"},
                         yaxis={"autorange": "reversed", "type": "category"}, shapes=shapes)
    return {"data": [trace], "layout": layout}


def _moves_text(moves: list[parts.Move]) -> str:
    if not moves:
        return "No shard is migrating."
    return "Migrating: " + "; ".join(
        f"shard {m.shard}: GPUs {','.join(map(str, m.source)) or '-'} → {','.join(map(str, m.target))} ({m.state})"
        for m in moves)


def layout(ctx: UiContext, opts: dict[str, Any]) -> Any:
    topo = ctx.daemon.topology
    if topo is None:
        return html.P("No GPU topology is known (gpu.backend is none, or NVML is unavailable).", className="empty")
    idx = order(topo)
    moves = parts.migrations(ctx)
    shapes = highlights(idx, moves, opts["gpu"])
    links = link_figure(topo)
    links["layout"]["shapes"] = links["layout"]["shapes"] + shapes
    return html.Div([
        html.Div([dcc.Graph(id="topo-links", figure=links, config={"displaylogo": False}, className="wide"),
                  dcc.Graph(id="topo-strip", figure=strip_figure(ctx, topo, idx, shapes), config={"displaylogo": False},
                            className="narrow")], className="row"),
        html.P(LEGEND, className="legend"),
        html.P(_moves_text(moves), id="topo-moves", className="moves"),
        dcc.Store(id="topo-held", data={"gpu": opts["gpu"]}),
        dcc.Interval(id="topo-tick", interval=ctx.interval_ms),
    ])


def register(app: Dash, ctx: UiContext) -> None:
    @app.callback(Output("topo-links", "figure"), Output("topo-strip", "figure"), Output("topo-moves", "children"),
                  Input("topo-tick", "n_intervals"), State("topo-held", "data"), prevent_initial_call=True)
    def update(_n: int, held: Any) -> tuple[Patch, Patch, str]:
        topo = ctx.daemon.topology
        if topo is None:  # a host without a topology draws no matrix to update (a crafted request got a 500)
            raise NotFound("no GPU topology on this host: nothing to update")
        held = held if isinstance(held, dict) else {}
        picked = parse_gpu(str(held["gpu"]) if held.get("gpu") is not None else None, ctx.gpu_indices)
        idx = order(topo)
        moves = parts.migrations(ctx)
        shapes = highlights(idx, moves, picked)
        links, strip = Patch(), Patch()
        links["layout"]["shapes"] = numa_shapes(topo, idx) + shapes
        strip["data"][0]["z"] = strip_values(ctx, topo, idx)
        strip["layout"]["shapes"] = shapes
        return links, strip, _moves_text(moves)
