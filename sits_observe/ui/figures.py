"""Plotly figures as plain dicts (no plotly.py validation on the hot path) and their live patches.

Time heatmaps have one row per series (stage, GPU, bucket) and one column per bin of ticks (see
:mod:`.cache`).  A live update
appends the new columns to every row and slides the x-axis range; the browser holds at most 1.5
windows of columns before it gets a fresh figure, so no update ever deletes column by column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from dash import Patch, no_update

from .cache import ColumnCache, Columns, cells, times_ms
from .context import Window

__all__ = ["DARK_LOW", "HeatSpec", "SeriesSpec", "series_update", "time_range", "base_layout", "fmt_seconds",
           "fmt_count", "significant"]

FONT = {"family": "system-ui, -apple-system, 'Segoe UI', sans-serif", "size": 12, "color": "#222"}
# plotly.js draws these sequential scales dark at the low end; reversed, high values are the dark ones ("Reds"
# is light at the low end: reversed, no foreign use was drawn dark red and a co-tenant's 100 % light grey)
DARK_LOW = frozenset({"Blues", "Greens", "Greys", "YlOrRd", "YlGnBu", "Hot"})
SLACK = 1.5  # a browser holds at most SLACK windows of columns before it gets a new figure


def base_layout(title: str, height: int, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title, "x": 0.01, "font": {"size": 15}}, "height": height, "font": FONT,
            "margin": {"l": 110, "r": 30, "t": 40, "b": 50}, "paper_bgcolor": "white", "plot_bgcolor": "#fafafa",
            **extra}


def fmt_seconds(s: float) -> str:
    """``0.0123`` -> ``12.3 ms``; ``inf`` -> ``+Inf``."""
    if not math.isfinite(s):
        return "+Inf"
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def fmt_count(n: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def significant(a: np.ndarray, digits: int) -> np.ndarray:
    """Round to ``digits`` significant digits (NaN and 0 kept)."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.where(np.isfinite(a) & (a != 0), np.floor(np.log10(np.abs(a))), 0)
    scale = 10.0 ** (digits - 1 - mag)
    return np.round(a * scale) / scale


@dataclass(frozen=True)
class HeatSpec:
    """How one time heatmap looks: colour on the value or on log10 of it, units, hover text."""

    title: str
    ytitle: str
    colorbar: str
    hover: str  # value part of the hover, e.g. "p99 %{customdata:.3s}s" (log) or "%{z:.0f} %" (linear)
    log: bool = False
    ticks: Sequence[float] = ()  # colour-bar ticks in data units (log scales)
    tick_text: Callable[[float], str] = str
    colorscale: str = "Viridis"
    zmin: float | None = None  # in data units (log scales too); None: the colours span the data drawn
    zmax: float | None = None
    digits: int = 3
    height: int = 420
    floor: float = 0.0  # log scales: values <= floor are not drawn
    yorder: dict[str, Any] = field(default_factory=lambda: {"autorange": "reversed"})

    def _z(self, values: np.ndarray) -> dict[str, list[Any]]:
        """Rows x columns payload (``z`` and, for log scales, ``customdata`` with the real values)."""
        rows = np.asarray(values, dtype=np.float64).T
        if not self.log:
            return {"z": cells(significant(rows, self.digits), 12)}
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(rows > self.floor, np.log10(rows), np.nan)
        return {"z": cells(z, 3), "customdata": cells(significant(rows, self.digits), 12)}

    def figure(self, rows: Sequence[str], cols: Columns, window_s: float) -> dict[str, Any]:
        trace: dict[str, Any] = {
            "type": "heatmap", "x": times_ms(cols.ts), "y": list(rows), "colorscale": self.colorscale,
            "reversescale": self.colorscale in DARK_LOW,
            "hoverongaps": False, "xgap": 0, "ygap": 1,
            "hovertemplate": f"%{{y}}<br>%{{x|%H:%M:%S}}<br>{self.hover}<extra></extra>",
            "colorbar": {"title": {"text": self.colorbar, "side": "right"}, "thickness": 14},
            **self._z(cols.values),
        }
        if self.log:
            vals = [t for t in self.ticks if t > 0]
            trace["colorbar"].update(tickvals=[math.log10(t) for t in vals], ticktext=[self.tick_text(t) for t in vals])
            trace.update(zmin=_log(self.zmin), zmax=_log(self.zmax))
        else:
            trace.update(zmin=self.zmin, zmax=self.zmax)
        layout = base_layout(self.title, self.height,
                             xaxis={"type": "date", "title": {"text": "time (source clock, UTC)"},
                                    "range": time_range(cols, window_s), "tickformat": "%H:%M:%S"},
                             yaxis={"title": {"text": self.ytitle}, "type": "category", **self.yorder})
        return {"data": [trace], "layout": layout}

    def patch(self, cols: Columns, window_s: float, n_rows: int) -> Patch:
        p = Patch()
        p["data"][0]["x"].extend(times_ms(cols.ts))
        for key, rows in self._z(cols.values).items():
            for i in range(n_rows):
                p["data"][0][key][i].extend(rows[i])
        p["layout"]["xaxis"]["range"] = time_range(cols, window_s)
        return p


def _log(v: float | None) -> float | None:
    return None if v is None else math.log10(v)


def time_range(cols: Columns, window_s: float) -> list[float] | None:
    if not len(cols.ts):
        return None
    end = float(cols.ts[-1]) * 1000.0
    return [end - window_s * 1000.0, end]


def _held(held: Any, rows: list[str], limit: int, run: str) -> tuple[int | None, int]:
    """(tick, columns) a browser says it holds; (None, 0) when it holds another figure (of another cache or daemon
    run) or sends junk."""
    if not isinstance(held, dict) or held.get("rows") != rows or held.get("limit") != limit or held.get("run") != run:
        return None, 0
    tick, n = held.get("tick"), held.get("n")
    if not (isinstance(tick, int) and isinstance(n, int) and 0 <= n <= SLACK * limit):
        return None, 0
    return tick, n


class SeriesSpec(Protocol):
    """Draws one cache's rows over time: a whole figure, or a patch appending columns."""

    def figure(self, rows: Sequence[str], cols: Columns, window_s: float) -> dict[str, Any]: ...

    def patch(self, cols: Columns, window_s: float, n_rows: int) -> Patch: ...


def series_update(spec: SeriesSpec, cache: ColumnCache, held: Any, w: Window) -> tuple[Any, dict[str, Any]]:
    """Figure or patch for a browser holding ``held`` (``{"tick", "n", "rows", "limit", "run"}``) -> (output, new
    held)."""
    rows = list(cache.rows)
    limit = w.columns
    tick, n = _held(held, rows, limit, cache.run)
    cols = cache.columns(tick, limit)
    if not cols.full and n + len(cols.ts) > SLACK * limit:
        cols = cache.columns(None, limit)
    state = {"tick": cols.tick, "rows": rows, "limit": limit, "run": cache.run}
    if cols.full:
        return spec.figure(rows, cols, w.seconds), {**state, "n": len(cols.ts)}
    if not len(cols.ts):
        return no_update, {**state, "n": n}
    return spec.patch(cols, w.seconds, len(rows)), {**state, "n": n + len(cols.ts)}
