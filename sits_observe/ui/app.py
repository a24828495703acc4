"""The Dash app mounted at ``/`` on the daemon's Flask server: a header, a status line, the pages.

Page URLs take query parameters (``/load?field=temperature&range=15m``); they are checked before the
page is served, so a bad one is answered 400 (unknown page 404) with the reason, as JSON like the API.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from dash import Dash, Input, Output, dcc, html
from flask import Flask, request
from werkzeug.exceptions import BadRequest, NotFound

from . import parts
from .context import UiContext
from .pages import DEFAULT, PAGES
from .params import parse_query

__all__ = ["create_dash"]

INDEX_ENDPOINTS = ("/", "/<path:path>")  # Dash's index and catch-all routes (endpoint = rule)


def create_dash(server: Flask, daemon: Any, *, incremental: bool = True) -> Dash:
    """Mount the UI on ``server``; ``incremental=False`` is the full-recompute baseline of ``bench ui``."""
    ctx = UiContext(daemon, incremental=incremental)
    app = Dash("sits_observe.ui", server=server, url_base_pathname="/", title="sits-observe", update_title=None,
               suppress_callback_exceptions=True, serve_locally=True)
    app.layout = lambda: _shell(ctx)  # per page load, so the status line is current
    for page in PAGES.values():
        page.register(app, ctx)

    update_path = app.config.routes_pathname_prefix + "_dash-update-component"

    @server.before_request
    def check_page_url() -> None:
        if request.endpoint in INDEX_ENDPOINTS:
            try:
                search = request.query_string.decode()
            except UnicodeDecodeError:
                raise BadRequest("query string is not UTF-8") from None
            _options(ctx, request.path, search)
        elif request.path == update_path and request.method == "POST":
            _check_callback_body(request.get_json(silent=True), app.callback_map)

    @app.callback(Output("page", "children"), Input("url", "pathname"), Input("url", "search"))
    def route(path: Any, search: Any) -> Any:
        if not isinstance(path, (str, type(None))) or not isinstance(search, (str, type(None))):
            raise BadRequest("url: pathname and search must be strings; reload the page")
        page, opts = _options(ctx, path or "/", search)
        return page.layout(ctx, opts)

    @app.callback(Output("status", "children"), Input("status-tick", "n_intervals"))
    def status(_n: int | None) -> list[Any]:
        return _status(ctx)

    return app


def _check_callback_body(body: Any, callbacks: Mapping[str, Any]) -> None:
    """Refuse (400) a live-update request that is not the shape dash-renderer sends, before Dash reads it."""
    if not isinstance(body, dict):
        raise BadRequest("callback: body must be a JSON object")
    output = body.get("output")
    if not isinstance(output, str) or output not in callbacks:
        raise BadRequest(f"callback: no callback for output {str(output)[:80]!r}")
    declared = callbacks[output]
    for key in ("inputs", "state"):
        items = body.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise BadRequest(f"callback: {key} must be a list of objects")
        if _ids(items) != _ids(declared.get(key, [])):  # one missing or another's: a 500 inside Dash, and a traceback
            raise BadRequest(f"callback: {key} must be {_ids(declared.get(key, []))} for output {output[:80]!r}")
    outputs, changed = body.get("outputs", []), body.get("changedPropIds", [])
    # Dash splits each changed id to find the trigger: a number or null there was a 500, and a traceback
    changed_ok = isinstance(changed, list) and all(isinstance(c, str) for c in changed)
    if not isinstance(outputs, (dict, list)) or not changed_ok:
        raise BadRequest("callback: outputs must be an object or a list, changedPropIds a list of strings")
    want = declared["output"] if isinstance(declared["output"], list) else [declared["output"]]
    got = outputs if isinstance(outputs, list) else [outputs]
    if not all(isinstance(o, dict) for o in got) or _ids(got) != [(o.component_id, o.component_property) for o in want]:
        raise BadRequest(f"callback: outputs do not match output {output[:80]!r}")


def _ids(items: list[Any]) -> list[tuple[Any, Any]]:
    return [(i.get("id"), i.get("property")) for i in items]


def _options(ctx: UiContext, path: str, search: str | None) -> tuple[Any, dict[str, Any]]:
    if path == "/api" or path.startswith("/api/"):  # the API's own routes matched first; this one is not one
        raise NotFound(f"no such API path {path[:80]!r}")
    page = PAGES.get(DEFAULT if path == "/" else path)
    if page is None:
        raise NotFound(f"no UI page {path[:80]!r}; pages: {', '.join(PAGES)}")
    return page, page.options(ctx, parse_query(search, page.PARAMS, page.PATH))


def _shell(ctx: UiContext) -> html.Div:
    topo = ctx.daemon.topology
    host = f"{topo.name}, {topo.n} GPUs" if topo is not None else "no GPU topology"
    return html.Div([
        dcc.Location(id="url", refresh=False),
        html.Header([
            html.Span("sits-observe", className="brand"),
            html.Span(host, className="host"),
            html.Nav([dcc.Link(p.TITLE, href=path, className="nav") for path, p in PAGES.items()]),
        ]),
        html.Div(_status(ctx), id="status", className="status"),
        dcc.Interval(id="status-tick", interval=ctx.interval_ms),
        html.Main(id="page"),
    ])


def _status(ctx: UiContext) -> list[Any]:
    """One line that answers "is anything wrong, why, and what did the daemon do" on every page."""
    store = ctx.store
    if not store.ticks:
        return [html.Span("waiting for the first tick", className="item")]
    clock = time.strftime("%H:%M:%S", time.gmtime(store.latest_ts))
    items = [html.Span(f"tick {store.ticks} · {clock} (source clock)", className="item")]
    if (since := ctx.daemon.stalled_seconds()) is not None:  # what the page shows is that old, not current
        items.append(html.Span(f"no tick for {since:.0f} s: the tick loop is stalled (a source or consumer hung in "
                               "it); what is shown is as of the last tick", className="item bad"))
    firing = parts.alerts(ctx)
    names = ", ".join(f"{a['labels'].get('slo', '?')} ({a['labels'].get('burn_tier', '?')})"
                      for a in firing[:2] if isinstance(a.get("labels"), dict))
    count = f"{len(firing)} alert{'s' if len(firing) != 1 else ''} firing"
    items.append(html.Span(f"{count}: {names}" if names else count, className="item bad" if firing else "item ok"))
    down = _sources_down(ctx)
    if down:
        items.append(html.Span(down, className="item warn"))
    if gpus := parts.gpu_trouble(ctx):
        items.append(html.Span(gpus, className="item bad"))
    ctx.verdicts.refresh(ctx)  # every open page polls the classifier, so the causes timeline misses none
    v = ctx.verdicts.latest()
    if v:
        items.append(html.Span(likely_cause(v, store.latest_ts), className="item"))
    move = last_move(parts.last_move(ctx))
    if move:
        items.append(html.Span(move, className="item warn" if move.endswith("(failed)") else "item"))
    return items


def likely_cause(v: dict[str, Any], now: float) -> str:
    """The status line's newest verdict with its age on the source clock (one from an hour ago, the classifier
    since turned off or quiet, read as current)."""
    ts = v.get("ts")
    age = now - ts if isinstance(ts, (int, float)) and math.isfinite(ts) else math.nan
    when = "" if not age >= 0 else f", {age:.0f} s ago" if age < 120 else f", {age / 60:.0f} min ago" \
        if age < 7200 else f", {age / 3600:.0f} h ago"
    return f"likely cause: {v.get('cause')} ({float(v.get('confidence', 0)):.2f}{when})"


def last_move(m: dict[str, Any] | None) -> str:
    """The status line's ``last move: ...`` for the newest migration (not a start-up adopt), or ``""`` without one;
    one whose first step failed at once says so (it moved nothing)."""
    if m is None:
        return ""
    gpus = ",".join(map(str, m.get("source_gpus") or [])) + " → " + ",".join(map(str, m.get("target_gpus") or []))
    failed = " (failed)" if m.get("outcome") == "failed" else ""
    return f"last move: migrate {m.get('shard_id') or ''} {gpus}{failed}"


def _sources_down(ctx: UiContext) -> str:
    """``source down: nvml (CollectorError: ...)``, naming every source whose last read failed; else ``""``."""
    sources = ctx.daemon.status().get("sources") or []
    down = [f"{s.get('name', '?')} ({_cut(str(s.get('last_error') or 'failing'), 80)})"
            for s in sources if isinstance(s, dict) and not s.get("healthy", True)]
    if not down:
        return ""
    return f"source{'s' if len(down) > 1 else ''} down: {'; '.join(down[:3])}" + (
        f" and {len(down) - 3} more" if len(down) > 3 else "")


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
