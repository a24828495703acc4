"""The colours of the time heatmaps, checked against the colour scales plotly.js draws (plotly's own copy of them)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from _plotly_utils.colors import plotlyjs

from sits_observe.ui.cache import Columns
from sits_observe.ui.figures import HeatSpec
from sits_observe.ui.pages import load, stages

PERCEPTUAL = {"Viridis", "Cividis"}  # dark to light by design: high values are the light ones
SPECS = {**{f"load {name}": load._spec(name, 2) for name in load.FIELDS}, "stages p99": stages.P99,
         "stages histogram": stages.HIST}


def _lightness(color: str) -> float:
    r, g, b = (int(x) for x in re.findall(r"\d+", color))
    return 0.299 * r + 0.587 * g + 0.114 * b


def _trace(spec: HeatSpec, values: list[float]) -> dict[str, object]:
    cols = Columns(len(values), np.arange(len(values), dtype=np.float64), np.array([values, values]).T, True)
    return spec.figure(["a", "b"], cols, 60.0)["data"][0]


@pytest.mark.parametrize("name", [n for n, s in SPECS.items() if s.colorscale not in PERCEPTUAL])
def test_high_values_are_drawn_dark(name: str) -> None:
    """The foreign-use map reversed 'Reds' (light at its low end in plotly.js): a GPU no other process touched
    was dark red, one a co-tenant had whole light grey."""
    trace = _trace(SPECS[name], [1.0, 50.0])
    scale = getattr(plotlyjs, str(trace["colorscale"]))
    low, high = (scale[-1], scale[0]) if trace["reversescale"] else (scale[0], scale[-1])
    assert _lightness(high) < _lightness(low), (trace["colorscale"], trace["reversescale"])


def test_p99_colours_span_1us_to_100s_whatever_the_data() -> None:
    """docs/ui.md: colour on a log scale from 1 µs to 100 s. The scale spanned the data drawn instead: p99s of 1.0
    and 1.1 ms were the two ends of it, and one colour meant another latency at the next update."""
    for values in ([1e-3, 1.1e-3], [2e-6, 30.0]):
        trace = _trace(stages.P99, values)
        assert (trace["zmin"], trace["zmax"]) == (math.log10(1e-6), math.log10(100.0))
