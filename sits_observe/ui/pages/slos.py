"""SLOs: error budget left, burn rate over every alert window against the tier thresholds, tier state,
and the alerts firing now with the likely cause the classifier attached."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from dash import Dash, Input, Output, Patch, dcc, html

from .. import parts
from ..context import UiContext
from ..figures import base_layout

PATH = "/slos"
TITLE = "SLOs"
PARAMS: tuple[str, ...] = ()
TIER_THRESHOLDS = (("fast page", 14.4), ("slow page", 6.0), ("fast ticket", 3.0), ("slow ticket", 1.0))


def options(ctx: UiContext, q: Mapping[str, str]) -> dict[str, Any]:
    return {}


def _budget(slos: list[dict[str, Any]]) -> dict[str, Any]:
    names = [s["name"] for s in slos]
    left = [(s.get("error_budget") or {}).get("remaining_ratio") for s in slos]
    pct = [None if v is None else round(100.0 * v, 2) for v in left]
    colors = ["#9ca3af" if v is None else "#dc2626" if v < 25 else "#f59e0b" if v < 50 else "#16a34a" for v in pct]
    return {"y": names, "x": pct, "text": ["no data" if v is None else f"{v:.1f} %" for v in pct],
            "marker": {"color": colors}}


def budget_figure(slos: list[dict[str, Any]]) -> dict[str, Any]:
    trace = {"type": "bar", "orientation": "h", "textposition": "auto", "hovertemplate": "%{y}: %{x:.2f} % left"
             "<extra></extra>", **_budget(slos)}
    layout = base_layout("Error budget left", 120 + 40 * max(len(slos), 1),
                         xaxis={"title": {"text": "% of the error budget left (negative: overspent)"},
                                "rangemode": "tozero"},
                         yaxis={"type": "category", "autorange": "reversed"})
    return {"data": [trace], "layout": layout}


def _burn_traces(slos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in slos:
        ws = s.get("windows") or []
        out.append({"type": "bar", "name": s["name"], "x": [w["window"] for w in ws],
                    "y": [w.get("burn_rate") for w in ws],
                    "hovertemplate": f"{s['name']}<br>%{{x}}: burn %{{y:.3g}}x<extra></extra>"})
    return out


def burn_figure(slos: list[dict[str, Any]]) -> dict[str, Any]:
    lines = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": v, "y1": v,
              "line": {"color": "#dc2626" if v > 5 else "#f59e0b", "width": 1, "dash": "dash"},
              "label": {"text": f"{name} x{v:g}", "textposition": "end", "font": {"size": 10}}}
             for name, v in TIER_THRESHOLDS]
    layout = base_layout("Burn rate by window (x the rate that spends the budget exactly over the SLO window)",
                         380, barmode="group", shapes=lines,
                         xaxis={"title": {"text": "window"}, "type": "category"},
                         yaxis={"title": {"text": "burn rate (log)"}, "type": "log"},
                         legend={"orientation": "h", "y": -0.25})
    return {"data": _burn_traces(slos), "layout": layout}


def _tier_state(t: dict[str, Any]) -> tuple[str, str]:
    if t.get("firing"):
        return "firing", "hot"
    if t.get("inhibited"):
        return "burning (inhibited by a faster tier)", ""
    if t.get("held_back_low_traffic"):
        return "burning, held back (traffic below min_rate)", ""
    return "ok", ""


def tiers_table(slos: list[dict[str, Any]]) -> html.Table:
    head = html.Tr([html.Th(h) for h in ("SLO", "objective", "tier", "severity", "windows", "threshold", "state")])
    rows = []
    for s in slos:
        for t in s.get("tiers") or []:
            state, cls = _tier_state(t)
            rows.append(html.Tr([html.Td(s["name"]), html.Td(f"{100 * s['objective']:g} %"), html.Td(t["burn_tier"]),
                                 html.Td(t["severity"]), html.Td(f"{t['long']} / {t['short']}"),
                                 html.Td(f"x{t['factor']:g}"), html.Td(state, className=cls)]))
    return html.Table([html.Thead(head), html.Tbody(rows)], className="grid")


def alerts_table(alerts: list[dict[str, Any]]) -> Any:
    if not alerts:
        return html.P("No alert is firing.", className="note")
    head = html.Tr([html.Th(h) for h in ("SLO", "tier", "severity", "since (source clock)", "likely cause")])
    rows = []
    for a in alerts:
        lab, ann = a.get("labels") or {}, a.get("annotations") or {}
        since = a.get("starts_at")
        when = "-" if not isinstance(since, (int, float)) or not math.isfinite(since) else \
            time.strftime("%H:%M:%S", time.gmtime(since))
        cause = ann.get("likely_cause")
        cause_txt = f"{cause} ({ann.get('confidence', '?')})" if cause else "not classified yet"
        rows.append(html.Tr([html.Td(lab.get("slo", "?")), html.Td(lab.get("burn_tier", "?")),
                             html.Td(lab.get("severity", "?"), className="hot"), html.Td(when), html.Td(cause_txt)]))
    return html.Table([html.Thead(head), html.Tbody(rows)], className="grid")


def _tables(ctx: UiContext, slos: list[dict[str, Any]]) -> list[Any]:
    return [html.H2("Alerts firing"), alerts_table(parts.alerts(ctx)), html.H2("Burn-rate tiers"), tiers_table(slos)]


def layout(ctx: UiContext, opts: dict[str, Any]) -> Any:
    slos = parts.slos(ctx)
    if not slos:
        return html.P("No SLOs are configured: add an `slos:` section (docs/slo.md).", className="empty")
    return html.Div([
        html.Div([dcc.Graph(id="slos-budget", figure=budget_figure(slos), config={"displaylogo": False},
                            className="narrow"),
                  dcc.Graph(id="slos-burn", figure=burn_figure(slos), config={"displaylogo": False},
                            className="wide")], className="row"),
        html.Div(_tables(ctx, slos), id="slos-tables"),
        dcc.Interval(id="slos-tick", interval=ctx.interval_ms),
    ])


def register(app: Dash, ctx: UiContext) -> None:
    @app.callback(Output("slos-budget", "figure"), Output("slos-burn", "figure"), Output("slos-tables", "children"),
                  Input("slos-tick", "n_intervals"), prevent_initial_call=True)
    def update(_n: int) -> tuple[Patch, Patch, list[Any]]:
        slos = parts.slos(ctx)
        budget, burn = Patch(), Patch()
        for key, value in _budget(slos).items():
            budget["data"][0][key] = value
        burn["data"] = _burn_traces(slos)
        return budget, burn, _tables(ctx, slos)
