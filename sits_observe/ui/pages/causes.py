"""Causes and decisions: each SLO's burn rate over time above the classifier's verdicts (same time axis),
and the scheduler's decision log (trigger, shard, from -> to GPUs, score, span id)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dash import Dash, Input, Output, Patch, State, ctx as dash_ctx, dcc, html, no_update

from ...rca.verdict import CAUSES, UNKNOWN
from ...slo.sli import threshold_index
from .. import parts
from ..cache import Columns, cells, times_ms
from ..context import UiContext, Window
from ..figures import base_layout, series_update, time_range
from ..params import parse_choice

PATH = "/causes"
TITLE = "Causes & decisions"
PARAMS = ("range",)
DECISIONS_READ = 256  # newest decisions read from the scheduler's ring
DECISIONS_SHOWN = 50
BURN_WINDOW = 300.0  # seconds: burn rate over the fastest alert tier's short window (5m)
FILTERS = {"moves": "placements and moves", "all": "all decisions (with no-action)"}


def options(ctx: UiContext, q: Mapping[str, str]) -> dict[str, Any]:
    return {"window": ctx.window(q)}


def _bad_total(spec: Any, store: Any, buckets: Sequence[float]) -> Any:
    """``n -> (bad, total)`` events per tick of one SLO's SLI over the newest ``n`` ticks."""
    if spec.latency is not None:
        sli, idx = spec.latency, threshold_index(spec.latency.threshold, buckets)

        def latency(n: int) -> tuple[np.ndarray, np.ndarray]:
            h = store.hist_window(sli.stage, sli.workload, n).astype(np.float64)
            total = h.sum(axis=1)
            return total - h[:, : idx + 1].sum(axis=1), total  # good: buckets at or under the threshold

        return latency
    r = spec.ratio

    def ratio(n: int) -> tuple[np.ndarray, np.ndarray]:
        counted = store.counter_window(r.bad or r.good, r.workload, n)
        total = store.counter_window(r.total, r.workload, n)
        return (counted if r.bad else total - counted), total

    return ratio


def _burn_read(ctx: UiContext) -> tuple[tuple[str, ...], Any]:
    """Rows (SLO names) and a reader of each SLO's burn rate over the trailing ``BURN_WINDOW`` at each
    column's end (error ratio / error budget), the window of the fastest alert tier."""
    cfg, store = ctx.daemon.config, ctx.store
    specs = list(getattr(cfg, "slos", []))
    readers = [(_bad_total(s, store, cfg.store.buckets), 1.0 - s.objective) for s in specs]
    span = max(1, int(round(BURN_WINDOW / ctx.tick_interval)))

    def read(t: int, k: int, b: int) -> np.ndarray:
        extra = max(0, min(span, min(store.ticks, store.history) - t - k))  # look-back for the first columns
        ends = extra + b * np.arange(1, t // b + 1)
        starts = np.maximum(ends - span, 0)
        out = []
        for bad_total, budget in readers:
            bad, total = (np.concatenate([[0.0], np.cumsum(a[: t + extra])]) for a in bad_total(t + k + extra))
            n_bad, n_total = bad[ends] - bad[starts], total[ends] - total[starts]
            with np.errstate(divide="ignore", invalid="ignore"):
                out.append(np.where(n_total > 0, n_bad / n_total, np.nan) / budget)
        return np.column_stack(out) if out else np.zeros((t // b, 0))

    return tuple(s.name for s in specs), read


@dataclass(frozen=True)
class Timeline:
    """Burn-rate lines (top) and the verdict markers (bottom) on one time axis."""

    verdicts: list[dict[str, Any]]

    def figure(self, rows: Sequence[str], cols: Columns, window_s: float) -> dict[str, Any]:
        x = times_ms(cols.ts)
        lines = [{"type": "scatter", "mode": "lines", "name": name, "x": x, "y": cells(cols.values[:, i], 4),
                  "xaxis": "x", "yaxis": "y", "connectgaps": False,
                  "hovertemplate": f"{name}<br>%{{x|%H:%M:%S}}: burn %{{y:.3g}}x<extra></extra>"}
                 for i, name in enumerate(rows)]
        layout = base_layout("SLO burn rate over the last 5 minutes, and the likely cause", 580, showlegend=True,
                             legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.1},
                             margin={"l": 190, "r": 30, "t": 60, "b": 50},
                             xaxis={"type": "date", "title": {"text": "time (source clock, UTC)"}, "anchor": "y2",
                                    "range": time_range(cols, window_s), "tickformat": "%H:%M:%S"},
                             yaxis={"domain": [0.5, 1], "rangemode": "tozero",
                                    "title": {"text": "burn rate (x budget)"}},
                             yaxis2={"domain": [0, 0.42], "type": "category", "title": {"text": "verdict"},
                                     "categoryorder": "array", "categoryarray": list(CAUSES) + [UNKNOWN]},
                             shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": v, "y1": v,
                                      "line": {"color": "#dc2626" if v > 10 else "#9ca3af", "dash": "dot", "width": 1},
                                      "label": {"text": f"x{v:g}", "textposition": "end", "font": {"size": 10}}}
                                     for v in (1.0, 14.4)])
        return {"data": [*lines, verdict_trace(self.verdicts)], "layout": layout}

    def patch(self, cols: Columns, window_s: float, n_rows: int) -> Patch:
        p = Patch()
        x = times_ms(cols.ts)
        for i in range(n_rows):
            p["data"][i]["x"].extend(x)
            p["data"][i]["y"].extend(cells(cols.values[:, i], 4))
        p["layout"]["xaxis"]["range"] = time_range(cols, window_s)
        return p


def _verdict_points(verdicts: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {
        "x": [round(float(v.get("ts", 0)) * 1000) for v in verdicts], "y": [v.get("cause") for v in verdicts],
        "text": [f"{v.get('cause')} ({float(v.get('confidence', 0)):.2f}), trigger {v.get('trigger', '?')}"
                 f"{', by the fallback network' if v.get('network') == 'fallback' else ''}<br>"
                 f"GPUs {', '.join(map(str, v.get('gpus') or [])) or '-'}; "
                 f"stages {', '.join(v.get('stages') or []) or '-'}" for v in verdicts],
        "color": [float(v.get("confidence", 0)) for v in verdicts],
    }


def verdict_trace(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Markers: one per verdict, colour = confidence; hover names the trigger, the GPUs and stages implicated and
    the fallback network when it scored the window."""
    pts = _verdict_points(verdicts)
    return {"type": "scatter", "mode": "markers", "name": "verdict", "xaxis": "x", "yaxis": "y2", "showlegend": False,
            "x": pts["x"], "y": pts["y"], "text": pts["text"],
            "hovertemplate": "%{x|%H:%M:%S}<br>%{text}<extra></extra>",
            "marker": {"size": 9, "color": pts["color"], "cmin": 0, "cmax": 1,
                       "colorscale": "Viridis", "line": {"width": 0.5, "color": "#333"},
                       "colorbar": {"title": {"text": "confidence"}, "thickness": 12, "len": 0.42, "y": 0.21}}}


def _timeline(ctx: UiContext, w: Window, held: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Burn lines and verdict markers: a whole figure, or a patch appending columns and new verdicts."""
    rows, read = _burn_read(ctx)
    cache = ctx.cache("slo-burn", rows, read, w.bin)
    latest = ctx.store.latest_ts
    ctx.verdicts.refresh(ctx)
    numbered = ctx.verdicts.after(0, latest - w.seconds if math.isfinite(latest) else -math.inf)
    seen = held.get("verdict") if isinstance(held.get("verdict"), int) else 0
    fig, series_held = series_update(Timeline([v for _, v in numbered]), cache, held.get("series"), w)
    fresh = [v for n, v in numbered if n > seen]
    if fresh and not isinstance(fig, dict):
        fig = fig if isinstance(fig, Patch) else Patch()
        trace, pts = fig["data"][len(rows)], _verdict_points(fresh)
        for key in ("x", "y", "text"):
            trace[key].extend(pts[key])
        trace["marker"]["color"].extend(pts["color"])
    return fig, {"series": series_held, "verdict": numbered[-1][0] if numbered else seen}


def _update(ctx: UiContext, w: Window, held: dict[str, Any] | None, shown: str = "moves",
            changed: bool = False) -> tuple[Any, Any, dict[str, Any]]:
    held = held or {}
    fig, timeline_held = _timeline(ctx, w, held)
    decisions = parts.decisions(ctx, DECISIONS_READ)
    newest_d = decisions[0].get("id") if decisions else None
    if shown == "moves":
        decisions = [d for d in decisions if d.get("action") != "no_action"]
    fresh = changed or not held or newest_d != held.get("decision")
    table = decision_table(decisions[:DECISIONS_SHOWN], ctx.part("scheduler") is not None) if fresh else no_update
    return fig, table, {**timeline_held, "decision": newest_d, "window": w.seconds}


def _gpus(g: Any) -> str:
    return ",".join(str(x) for x in g) if g else "-"


def decision_table(decisions: list[dict[str, Any]], scheduling: bool) -> Any:
    """``scheduling``: the daemon runs a scheduler (without one there is no decision to wait for)."""
    if not decisions:
        return html.P("No scheduler decision yet." if scheduling else
                      "The scheduler is not enabled (scheduler.enabled): it makes no decisions.", className="note")
    head = html.Tr([html.Th(h) for h in ("time (source clock)", "action", "trigger", "shard", "from → to GPUs",
                                         "score", "cause (confidence)", "reason", "span id")])
    rows = []
    for d in decisions:
        ts = d.get("ts")
        when = time.strftime("%H:%M:%S", time.gmtime(ts)) if isinstance(ts, (int, float)) and math.isfinite(ts) else "-"
        cause, failed = d.get("cause") or "none", d.get("outcome") == "failed"  # its first step failed at once
        action = d.get("action", "?") + (" (failed)" if failed else "")
        reason = (d.get("reason") or "") + (f"; failed: {d.get('failure')}" if failed else "")
        rows.append(html.Tr([
            html.Td(when), html.Td(action, className="hot" if d.get("action") == "migrate" and not failed else ""),
            html.Td(d.get("trigger", "?")), html.Td(d.get("shard_id") or "-"),
            html.Td(f"{_gpus(d.get('source_gpus'))} → {_gpus(d.get('target_gpus'))}"),
            html.Td(f"{float(d.get('score') or 0):.3f}"),
            html.Td(f"{cause} ({float(d.get('confidence') or 0):.2f})" if cause != "none" else "-"),
            html.Td(reason), html.Td(d.get("span_id") or "-", className="mono")],
            className="decision", **{"data-shard": d.get("shard_id") or "", "data-span": d.get("span_id") or ""}))
    return html.Table([html.Thead(head), html.Tbody(rows)], className="grid")


def layout(ctx: UiContext, opts: dict[str, Any]) -> Any:
    fig, table, held = _update(ctx, opts["window"], None)
    return html.Div([
        dcc.Graph(id="causes-timeline", figure=fig, config={"displaylogo": False}),
        html.Div([html.H2("Scheduler decisions (newest first)"),
                  dcc.RadioItems(id="causes-filter", options=FILTERS, value="moves", inline=True)],
                 className="controls"),
        html.Div(table, id="causes-decisions"),
        dcc.Store(id="causes-held", data=held),
        dcc.Interval(id="causes-tick", interval=ctx.interval_ms),
    ])


def register(app: Dash, ctx: UiContext) -> None:
    @app.callback(Output("causes-timeline", "figure"), Output("causes-decisions", "children"),
                  Output("causes-held", "data"), Input("causes-tick", "n_intervals"), Input("causes-filter", "value"),
                  State("causes-held", "data"), prevent_initial_call=True)
    def update(_n: int, shown: str, held: Any) -> tuple[Any, Any, dict[str, Any]]:
        held = held if isinstance(held, dict) else {}
        shown = parse_choice("filter", shown, FILTERS, "moves")
        return _update(ctx, ctx.held_window(held.get("window")), held, shown, dash_ctx.triggered_id == "causes-filter")
