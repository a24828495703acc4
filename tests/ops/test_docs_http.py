"""README.md and docs/*.md are the operator's contract: these tests keep them and the code in agreement, both ways.
What the code has (a command's flag, a config field, an exported metric family, an API route) must be documented,
and what the docs name must exist. The docs are read as text, so "documented" means named in the right place:

- Metrics: the families of a real scrape of ``/metrics`` (the demo's config: simulator, SLOs, classifier,
  scheduler, a webhook receiver; a few ticks by hand) and every ``sits_...`` name the code writes as a string (for
  the families a short demo does not show: probes, NVML-only fields, verdicts) must be named in the docs (a table
  headed ``metric (`sits_gpu_...`)`` names ``sits_gpu_`` + its first cell; ``pcie_tx_...`` after
  ``pcie_rx_bytes_...`` is the ``tx`` twin). Every ``sits_...`` name in the docs must be scraped or written in the
  code (a string in ``sits_observe/``, not a docstring, or a field name that an f-string such as
  ``f"sits_gpu_{name}"`` prefixes); a metric table's ``type`` must be the scraped one.
- Routes: every ``/api/v1/...``, ``/metrics``, ``/healthz`` or ``/readyz`` path the docs name (``GET``, ``POST``
  or ``DELETE`` before it included, when given; ``<id>``, ``{id}`` or ``N`` stands for any value) must be routed,
  and every route of the daemon's Flask app (the UI left out), with each method, named in the docs (a path without
  a method names its ``GET``).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import pytest
import yaml
from docs_text import DOCS, ROOT, SPAN, Row, sections
from flask import Flask
from werkzeug.exceptions import HTTPException

from sits_observe.config import parse
from sits_observe.export.http import create_app
from sits_observe.runtime import DEMO_DEFAULTS
from sits_observe.wiring import build_daemon

NOT_METRICS = {"sits_observe": "the package", "sits_bench_call": "the probes benchmark's C function"}


@dataclass
class Running:
    types: dict[str, str]  # family -> its TYPE on /metrics
    routes: list[tuple[str, str]]  # (rule, method)
    app: Flask


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The demo's daemon (simulator, SLOs, classifier, scheduler) with a webhook receiver, ticked by hand."""
    data = {**yaml.safe_load(DEMO_DEFAULTS.read_text()), "state_dir": str(tmp_path_factory.mktemp("docs")),
            "sim": {"scenario": "mixed", "speed": 1000},
            "alerting": {"receivers": [{"type": "webhook", "url": "http://127.0.0.1:9/hook", "timeout": 0.2}]}}
    daemon = build_daemon(parse(data, env={}))
    try:
        app = create_app(daemon, ui=False)
        for _ in range(30):
            daemon.tick()
        r = app.test_client().get("/metrics")
        assert r.status_code == 200, r.data[:300]
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", r.data.decode(), re.M))
        routes = [(rule.rule, m) for rule in app.url_map.iter_rules() if rule.endpoint != "static"
                  for m in sorted(rule.methods - {"HEAD", "OPTIONS"})]
        yield Running(types, routes, app)
    finally:
        daemon.close()


METRIC = re.compile(r"(?<![\w/.])sits_[a-z0-9_]+(?::[a-z0-9_]+)?")


def metric_rows() -> Iterator[tuple[Row, str]]:
    """The names in the first column of the metric tables: one headed ``metric (`sits_gpu_...`)`` prefixes its
    names, and ``pcie_tx_...`` after ``pcie_rx_bytes_...`` is its twin."""
    for row in (r for s in sections() for r in s.rows if r.header[0].startswith("metric")):
        prefix = "".join(re.findall(r"`(sits_\w+?)\.\.\.`", row.header[0]))
        previous = ""
        for token in SPAN.findall(row.cells[0]):
            if not (prefix or token.startswith(("sits_", "..."))):
                continue  # `GET /healthz` in README's table of metrics and paths
            name = re.sub(r"\{.*", "", token if token.startswith("sits_") else prefix + token)
            if "..." in token:
                twin = previous.replace("_rx_", "_tx_")
                assert fnmatch.fnmatchcase(twin, name.replace("...", "*")), f"{row.where}: `{token}` after {previous}?"
                name = twin
            previous = name
            yield row, name


def doc_metrics() -> dict[str, str]:
    """Every metric name the docs write, in the text or a metric table, with where."""
    out: dict[str, str] = {}
    for path in DOCS:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            for m in METRIC.finditer(line):
                after = line[m.end():m.end() + 2]
                if m[0].endswith("_") or after[:1] in ("*", "<") or re.match(r"[/.]\w", after):
                    continue  # a prefix (`sits_gpu_*`, `sits_workload_<name>`), a path or a module
                out.setdefault(m[0], f"{path.relative_to(ROOT)}:{no}")
    for row, name in metric_rows():
        out.setdefault(name, row.where)
    return {n: w for n, w in out.items() if n not in NOT_METRICS}


@cache
def code_strings() -> tuple[set[str], set[str]]:
    """The string constants in sits_observe/ (docstrings left out), and the prefixes of the names it makes
    (``f"sits_gpu_{spec.name}"``: ``sits_gpu_``)."""
    strings: set[str] = set()
    prefixes: set[str] = set()
    for path in (ROOT / "sits_observe").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                strings.add(node.value)
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(first := node.values[0], ast.Constant):
                if re.fullmatch(r"sits_[a-z_]+_", str(first.value)) and len(node.values) > 1:
                    prefixes.add(str(first.value))
    return strings, prefixes


def exportable(name: str, scraped: set[str]) -> bool:
    strings, prefixes = code_strings()
    in_code = {m for s in strings for m in METRIC.findall(s)}
    family = re.sub(r"_(bucket|sum|count)$", "", name)  # a histogram's series
    bare = name.removesuffix("_total")  # prometheus_client's Counter("x") is x_total
    made = any(name.startswith(p) and {name[len(p):], bare[len(p):]} & strings for p in prefixes)
    return bool({name, family} & scraped or {name, bare} & in_code or made)


def test_every_exported_metric_family_is_documented(running: Running) -> None:
    """The families of the scrape, and every metric name the code writes out (probes, NVML-only fields and verdicts
    do not show in the demo); ``x_created`` is client_python's creation time of a documented ``x``."""
    documented = doc_metrics()
    written = {m for s in code_strings()[0] for m in METRIC.findall(s) if not m.endswith("_")} - set(NOT_METRICS)
    missing = sorted(f for f in set(running.types) | written if not {f, f + "_total", f.removesuffix("_created")}
                     & set(documented))
    assert not missing, "metrics on /metrics or in the code that README.md and docs/*.md do not name:\n" + "\n".join(
        missing)


def test_every_metric_the_docs_name_can_be_exported(running: Running) -> None:
    wrong = sorted(f"{where}: {name}" for name, where in doc_metrics().items()
                   if not exportable(name, set(running.types)))
    assert not wrong, "metric names in the docs that the code never exports:\n" + "\n".join(wrong)


def test_documented_metric_types_are_the_exported_ones(running: Running) -> None:
    """A metric table's ``type`` column (its first word: ``gauge (latest value)``) for the families scraped."""
    wrong = [f"{row.where}: {name}: documented {row.cells[1]}, exported as {running.types[name]}"
             for row, name in metric_rows() if row.header[1:2] == ["type"] and name in running.types
             and row.cells[1].split()[:1] != [running.types[name]]]
    assert not wrong, "metric types in the docs that are not the exported ones:\n" + "\n".join(wrong)


# ---- HTTP routes -------------------------------------------------------------------------------------------------


ROUTE = re.compile(r"(?:\b(GET|POST|PUT|PATCH|DELETE)\s+)?(/(?:api/v1/|healthz|readyz|metrics)[^\s`'\"),;|?]*)")


def doc_paths() -> list[tuple[str, str | None, str]]:
    """(where, method or None, path with placeholders as 1) of every route path the docs name."""
    out = []
    for path in DOCS:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            for m in ROUTE.finditer(line):
                url = m[2].rstrip(".")
                if "..." in url or url == "/api/v1/":
                    continue
                parts = ["1" if re.fullmatch(r"<\w+>|\{\w+\}|[A-Z_]+", p) else p for p in url.split("/")]
                out.append((f"{path.relative_to(ROOT)}:{no}", m[1], "/".join(parts)))
    return out


def _match(app: Flask, path: str, method: str) -> str | None:
    try:
        rule, _ = app.url_map.bind("localhost").match(path, method=method, return_rule=True)
    except HTTPException:
        return None
    return rule.rule


def test_every_path_the_docs_name_is_routed(running: Running) -> None:
    adapter = running.app.url_map.bind("localhost")
    wrong = []
    for where, method, path in doc_paths():
        if method is None and not adapter.allowed_methods(path):
            wrong.append(f"{where}: {path}")
        elif method is not None and _match(running.app, path, method) is None:
            wrong.append(f"{where}: {method} {path}")
    assert not wrong, "paths in the docs that the HTTP server does not route:\n" + "\n".join(wrong)


def test_every_route_is_documented(running: Running) -> None:
    named = {(_match(running.app, path, method or "GET"), method or "GET") for _, method, path in doc_paths()}
    missing = [f"{method} {rule}" for rule, method in running.routes if (rule, method) not in named]
    assert not missing, "routes (method and path) that README.md and docs/*.md do not name:\n" + "\n".join(missing)
