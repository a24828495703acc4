"""Every Grafana dashboard query, run against a real Prometheus scraping the demo daemon.

Template variables are resolved the way Grafana does (``label_values(selector, label)`` through the
series API, multi-value regex for ``=~``), built-in intervals get concrete values, and each panel
target, variable query and annotation must parse and return a non-empty result.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from e2e_servers import Stack, get_json

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
BUILTINS = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m"}  # scrape interval is 1 s here
DATA_TIMEOUT = 150.0  # seconds: some series exist only after the first alert, verdict or decision
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")


def test_dashboards_are_generated_from_the_script() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in DASHBOARDS] == ["gpu-topology-load.json", "host-overview.json", "slos-causes.json",
                                           "stage-latency.json"]


def substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unresolved variable in {expr}"
    return expr


def prom(stack: Stack, path: str, **params: str) -> Any:
    """GET a Prometheus API path; a bad query (HTTP 400) fails the test at once with Prometheus' reason."""
    url = f"{stack.prometheus}{path}?{urllib.parse.urlencode(params)}"
    try:
        body = get_json(url)
    except urllib.error.HTTPError as exc:
        reason = json.loads(exc.read() or b"{}").get("error", exc.reason)
        pytest.fail(f"Prometheus refused {params}: {reason}")
    assert body["status"] == "success", body
    return body["data"]


def resolve(stack: Stack, dash: dict[str, Any], deadline: float) -> dict[str, str]:
    """Variable -> value as Grafana would substitute it (all values, regex-escaped, as ``(a|b)``)."""
    values = dict(BUILTINS)
    for var in dash["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        query = var["query"]["query"]
        m = LABEL_VALUES.match(query)
        assert m, f"variable {var['name']}: not a label_values() query: {query}"
        selector = substitute(m["selector"], values)
        found: set[str] = set()
        while not found and time.monotonic() < deadline:
            found = {s[m["label"]] for s in prom(stack, "/api/v1/series", **{"match[]": selector}) if m["label"] in s}
            if not found:
                time.sleep(1)
        assert found, f"variable {var['name']}: {query} found no values"
        values[var["name"]] = "(" + "|".join(grafana_escape(v) for v in sorted(found)) + ")"
    return values


def grafana_escape(value: str) -> str:
    """A value in a ``=~"..."`` matcher: regex-escaped, then backslashes doubled for the PromQL string."""
    return re.escape(value).replace("\\", "\\\\")


def queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(f"annotation {a['name']}", a["expr"]) for a in dash["annotations"]["list"]]
    for p in dash["panels"]:
        out += [(f"panel {p['title']!r} target {t['refId']}", t["expr"]) for t in p["targets"]]
    return out


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_query_returns_data(stack: Stack, path: Path) -> None:
    dash = json.loads(path.read_text())
    deadline = time.monotonic() + DATA_TIMEOUT
    values = resolve(stack, dash, deadline)
    assert values["instance"] == "(" + grafana_escape(stack.instance) + ")"
    pending = {name: substitute(expr, values) for name, expr in queries(dash)}
    while True:
        for name, expr in list(pending.items()):
            if prom(stack, "/api/v1/query", query=expr)["result"]:
                del pending[name]
        if not pending or time.monotonic() > deadline:
            break
        stack.check_alive()
        time.sleep(2)
    assert not pending, f"{path.name}: no data after {DATA_TIMEOUT:g} s for " + "; ".join(
        f"{n}: {e}" for n, e in pending.items())
