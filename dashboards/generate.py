"""Write the Grafana dashboards in this folder from one description (``python dashboards/generate.py``).

The JSON files are what users import; this script keeps their shared parts (datasource variable,
``instance``/``workload`` variables, panel plumbing) identical.  ``--check`` exits 1 when a committed
file differs from what the script would write.  Metric names are the daemon's ``sits_*`` names.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
INST = 'instance=~"$instance"'
WL = f'{INST},workload=~"$workload"'
RI = "$__rate_interval"


def _var(name: str, query: str, label: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
        "refresh": 2, "sort": 3 if name == "gpu" else 1, "multi": multi, "includeAll": multi,
        "allValue": ".*" if multi else None, "current": {}, "options": [], "hide": 0,
    }


DATASOURCE_VAR = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "options": []}
INSTANCE_VAR = _var("instance", "label_values(sits_build_info, instance)", "Host")
WORKLOAD_VAR = _var("workload", "label_values(sits_stage_latency_seconds_count{%s}, workload)" % INST, "Workload")


def _q(expr: str, legend: str = "", **extra: Any) -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend, "datasource": DS, **extra}


def hq(q: float, sel: str, by: str = "") -> str:
    """histogram_quantile over the stage histogram, aggregated by ``le`` plus ``by``."""
    grp = f"le, {by}" if by else "le"
    return (f"histogram_quantile({q}, sum by ({grp}) "
            f"(rate(sits_stage_latency_seconds_bucket{{{sel}}}[{RI}])))")


def panel(kind: str, title: str, targets: list[dict[str, Any]], *, unit: str = "short", w: int = 12,
          h: int = 8, desc: str = "", options: dict[str, Any] | None = None,
          defaults: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """One panel; grid positions are filled in by :func:`dashboard`."""
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return {
        "type": kind, "title": title, "description": desc, "datasource": DS, "targets": targets,
        "gridPos": {"w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, **(defaults or {})}, "overrides": []},
        "options": options or {}, **extra,
    }


def ts(title: str, targets: list[dict[str, Any]], unit: str, **kw: Any) -> dict[str, Any]:
    return panel("timeseries", title, targets, unit=unit,
                 options={"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
                          "tooltip": {"mode": "multi", "sort": "desc"}}, **kw)


def stat(title: str, expr: str, unit: str, *, thresholds: list[tuple[str, float | None]] | None = None,
         w: int = 6, desc: str = "") -> dict[str, Any]:
    steps = [{"color": c, "value": v} for c, v in (thresholds or [("green", None)])]
    return panel("stat", title, [_q(expr)], unit=unit, w=w, h=4, desc=desc,
                 options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background",
                          "graphMode": "area"},
                 defaults={"thresholds": {"mode": "absolute", "steps": steps}})


def dashboard(uid: str, title: str, desc: str, variables: list[dict[str, Any]],
              panels: list[dict[str, Any]]) -> dict[str, Any]:
    """Lay panels out left to right, wrapping at 24 columns."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g.update(x=x, y=y)
        x += g["w"]
        row_h = max(row_h, g["h"])
        p["id"] = i
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["sits-observe"], "editable": True,
        "schemaVersion": 39, "version": 1, "timezone": "browser", "refresh": "30s", "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [DATASOURCE_VAR, *variables]},
        "annotations": {"list": [{
            "name": "SLO alerts", "datasource": DS, "enable": True, "iconColor": "red",
            "expr": f"max by (slo, burn_tier) (sits_slo_alert_firing{{{INST}}})",
            "titleFormat": "{{slo}} burning ({{burn_tier}})", "step": "30s",
        }]},
        "panels": panels,
    }


def host_overview() -> dict[str, Any]:
    e2e = f'{WL},stage="e2e"'
    return dashboard("sits-host-overview", "sits-observe / Host overview",
                     "Requests, stages, GPUs and SLOs of one inference host at a glance.",
                     [INSTANCE_VAR, WORKLOAD_VAR], [
        stat("End-to-end p99", hq(0.99, e2e), "s"),
        stat("Requests / s", f"sum(rate(sits_stage_latency_seconds_count{{{e2e}}}[{RI}]))", "reqps"),
        stat("SLO alerts firing", f"sum(sits_slo_alert_firing{{{INST}}})", "none",
             thresholds=[("green", None), ("red", 1)]),
        stat("Lowest error budget left", f"min(sits_slo_error_budget_remaining_ratio{{{INST}}})", "percentunit",
             thresholds=[("red", None), ("orange", 0.25), ("green", 0.5)]),
        ts("p99 latency by stage", [_q(hq(0.99, WL, "stage"), "{{stage}}")], "s"),
        ts("Request rate by workload",
           [_q(f'sum by (workload) (rate(sits_stage_latency_seconds_count{{{e2e}}}[{RI}]))', "{{workload}}")],
           "reqps"),
        ts("GPU utilization", [_q(f"max by (gpu) (sits_gpu_utilization_ratio{{{INST}}})", "GPU {{gpu}}")],
           "percentunit", defaults={"min": 0, "max": 1}),
        ts("GPU memory used", [_q(f"max by (gpu) (sits_gpu_memory_used_bytes{{{INST}}}) / "
                                  f"max by (gpu) (sits_gpu_memory_total_bytes{{{INST}}})", "GPU {{gpu}}")],
           "percentunit", defaults={"min": 0, "max": 1}),
        ts("Host CPU and memory", [_q(f"max(sits_host_cpu_utilization_ratio{{{INST}}})", "CPU"),
                                   _q(f"max by (numa_node) (sits_host_numa_cpu_utilization_ratio{{{INST}}})",
                                      "CPU NUMA node {{numa_node}}"),
                                   _q(f"max(sits_host_memory_used_ratio{{{INST}}})", "memory")],
           "percentunit", defaults={"min": 0, "max": 1},
           desc="Host CPU busy overall and per NUMA node (a contended node slows the GPUs it feeds), memory used."),
        ts("SLO burn rate (highest of its windows)",
           [_q(f"max by (slo) (sits_slo_burn_rate{{{INST}}})", "{{slo}}")], "x",
           desc="Highest burn rate over every window of the SLO (the alert windows and the SLO window); 1 spends "
                "the budget exactly over the SLO window."),
        ts("Queue depth and KV cache", [_q(f"sum by (workload) (sits_workload_queue_depth{{{WL}}})",
                                           "queued {{workload}}"),
                                        _q(f"max by (workload) (sits_workload_kv_cache_usage_ratio{{{WL}}}) * 100",
                                           "KV cache % {{workload}}")], "short",
           desc="Requests waiting to be scheduled, and KV-cache blocks in use (percent)."),
        ts("Preemptions and errors / s",
           [_q(f"sum by (workload) (rate(sits_workload_preemptions_total{{{WL}}}[{RI}]))", "preempted {{workload}}"),
            _q(f"sum by (workload) (rate(sits_workload_request_errors_total{{{WL}}}[{RI}]))", "errors {{workload}}")],
           "ops"),
        ts("Daemon tick duration (p99)",
           [_q(f"histogram_quantile(0.99, sum by (le) (rate(sits_tick_duration_seconds_bucket{{{INST}}}[{RI}])))",
               "p99 tick")], "s", desc="Wall time of one daemon tick (collect, store, evaluate, decide)."),
        ts("Likely cause confidence", [_q(f"max by (cause) (sits_rca_verdict_confidence{{{INST}}})", "{{cause}}")],
           "percentunit", defaults={"min": 0, "max": 1}),
    ])


def stage_latency() -> dict[str, Any]:
    stage_var = _var("stage", "label_values(sits_stage_latency_seconds_count{%s}, stage)" % INST, "Stage")
    sel = f'{WL},stage=~"$stage"'
    heat = panel(
        "heatmap", "Latency distribution ($stage)",
        [_q(f"sum by (le) (increase(sits_stage_latency_seconds_bucket{{{sel}}}[{RI}]))", "{{le}}",
            format="heatmap")],
        unit="s", w=24, h=10, desc="Requests per latency bucket over time; a tail that grows rises to the top.",
        options={"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
                 "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5},
                 "rowsFrame": {"layout": "le"}, "tooltip": {"show": True, "yHistogram": True}},
        repeat="stage", repeatDirection="v")
    quantiles = [_q(hq(q, sel, "stage"), f"p{q * 100:g} {{{{stage}}}}") for q in (0.5, 0.9, 0.99, 0.999)]
    return dashboard("sits-stage-latency", "sits-observe / Stage latency",
                     "Per-stage latency from sits_stage_latency_seconds: bucket heatmaps and quantiles.",
                     [INSTANCE_VAR, WORKLOAD_VAR, stage_var], [
        heat,
        ts("Quantiles ($stage)", quantiles, "s"),
        ts("Mean latency by stage",
           [_q(f"sum by (stage) (rate(sits_stage_latency_seconds_sum{{{sel}}}[{RI}])) / "
               f"sum by (stage) (rate(sits_stage_latency_seconds_count{{{sel}}}[{RI}]))", "{{stage}}")], "s"),
        ts("Tail spread p99 / p50", [_q(f"{hq(0.99, sel, 'stage')} / {hq(0.5, sel, 'stage')}", "{{stage}}")],
           "x", desc="How many times slower the slowest 1 % are than the median."),
        ts("Events / s by stage",
           [_q(f"sum by (stage) (rate(sits_stage_latency_seconds_count{{{sel}}}[{RI}]))", "{{stage}}")], "ops"),
        ts("p99 by workload", [_q(hq(0.99, sel, "workload"), "{{workload}}")], "s", w=24),
    ])


GPU_SEL = f'{INST},gpu=~"$gpu"'


def _gpu_ts(title: str, field: str, unit: str, **kw: Any) -> dict[str, Any]:
    return ts(title, [_q(f"max by (gpu) (sits_gpu_{field}{{{GPU_SEL}}})", "GPU {{gpu}}")], unit, **kw)


def gpu_topology_load() -> dict[str, Any]:
    gpu_var = _var("gpu", "label_values(sits_gpu_utilization_ratio{%s}, gpu)" % INST, "GPU")
    links = panel(
        "table", "Link bandwidth between GPUs (GB/s)",
        [_q(f"max by (gpu, peer_gpu) (sits_gpu_link_bandwidth_bytes_per_second{{{INST}}}) / 1e9",
            format="table", instant=True)],
        unit="none", w=12, h=10, desc="Nominal one-direction bandwidth of the fastest path between two GPUs.",
        transformations=[{"id": "groupingToMatrix", "options": {
            "rowField": "gpu", "columnField": "peer_gpu", "valueField": "Value", "emptyValue": "null"}}],
        defaults={"custom": {"cellOptions": {"type": "color-background"}}, "color": {"mode": "continuous-BlPu"},
                  "decimals": 0})
    kinds = panel(
        "table", "Link kind between GPUs",
        [_q(f"count by (gpu, peer_gpu, link) (sits_gpu_link_bandwidth_bytes_per_second{{{INST}}})",
            format="table", instant=True)],
        w=12, h=10, desc="nvswitch, nvlink, pcie_switch, pcie_host_bridge or numa_interconnect.",
        transformations=[{"id": "groupingToMatrix", "options": {
            "rowField": "gpu", "columnField": "peer_gpu", "valueField": "link", "emptyValue": "null"}}])
    return dashboard("sits-gpu-topology-load", "sits-observe / GPU topology & load",
                     "The GPU link matrix and per-GPU load, clocks, power, temperature and traffic.",
                     [INSTANCE_VAR, gpu_var], [
        links, kinds,
        _gpu_ts("Utilization", "utilization_ratio", "percentunit", defaults={"min": 0, "max": 1}),
        ts("Memory used", [_q(f"max by (gpu) (sits_gpu_memory_used_bytes{{{GPU_SEL}}}) / "
                              f"max by (gpu) (sits_gpu_memory_total_bytes{{{GPU_SEL}}})", "GPU {{gpu}}")],
           "percentunit", defaults={"min": 0, "max": 1}),
        ts("Serving and foreign GPU use",
           [_q(f"max by (gpu) (sits_gpu_serving_utilization_ratio{{{GPU_SEL}}})", "serving GPU {{gpu}}"),
            _q(f"max by (gpu) (sits_gpu_foreign_utilization_ratio{{{GPU_SEL}}})", "foreign GPU {{gpu}}"),
            _q(f"max by (gpu) (sits_gpu_backlog_utilization_ratio{{{GPU_SEL}}})", "with requests waiting GPU {{gpu}}")],
           "percentunit", defaults={"min": 0, "max": 1},
           desc="Utilization of GPUs a workload's process uses (an idle one: a frozen or starved serving loop), "
                "the share of time other processes' kernels ran (a co-tenant; both with workloads configured), "
                "and the utilization of GPUs whose replica has requests waiting or running (idle there: its "
                "serving loop is not issuing work; local servers configured). NVML backend only."),
        _gpu_ts("SM clock", "sm_clock_hertz", "hertz"),
        _gpu_ts("Power", "power_watts", "watt"),
        _gpu_ts("Temperature", "temperature_celsius", "celsius"),
        ts("Active throttle reasons",
           [_q(f"count by (reason) (max_over_time(sits_gpu_throttle_reasons{{{GPU_SEL}}}[$__range]))",
               "{{reason}}")], "short", desc="GPUs that had each throttle reason active in the time range."),
        ts("PCIe traffic", [_q(f"sum by (gpu) (sits_gpu_pcie_rx_bytes_per_second{{{GPU_SEL}}})", "rx GPU {{gpu}}"),
                            _q(f"-sum by (gpu) (sits_gpu_pcie_tx_bytes_per_second{{{GPU_SEL}}})", "tx GPU {{gpu}}")],
           "Bps", desc="Receive above zero, transmit below."),
        ts("NVLink traffic", [_q(f"sum by (gpu) (rate(sits_gpu_nvlink_rx_bytes_total{{{GPU_SEL}}}[{RI}]))",
                                 "rx GPU {{gpu}}"),
                              _q(f"-sum by (gpu) (rate(sits_gpu_nvlink_tx_bytes_total{{{GPU_SEL}}}[{RI}]))",
                                 "tx GPU {{gpu}}")], "Bps", desc="Receive above zero, transmit below."),
        ts("Utilization spread across GPUs", [_q(f"stddev(sits_gpu_utilization_ratio{{{INST}}})", "stddev")],
           "percentunit", desc="The scheduler's load-imbalance trigger watches this (default 0.3)."),
        ts("XID errors", [_q(f"sum by (gpu) (increase(sits_gpu_xid_errors_total{{{GPU_SEL}}}[{RI}]))",
                             "GPU {{gpu}}")], "short"),
    ])


def slos_causes() -> dict[str, Any]:
    slo_var = _var("slo", "label_values(sits_slo_error_budget_remaining_ratio{%s}, slo)" % INST, "SLO")
    sel = f'{INST},slo=~"$slo"'
    return dashboard("sits-slos-causes", "sits-observe / SLOs & causes",
                     "Error budgets and burn rates, the likely cause the classifier names, and what the "
                     "scheduler did about it.", [INSTANCE_VAR, slo_var], [
        panel("bargauge", "Error budget remaining",
              [_q(f"max by (slo) (sits_slo_error_budget_remaining_ratio{{{sel}}})", "{{slo}}")],
              unit="percentunit", w=8, options={"orientation": "horizontal", "displayMode": "gradient"},
              defaults={"min": 0, "max": 1, "thresholds": {"mode": "absolute", "steps": [
                  {"color": "red", "value": None}, {"color": "orange", "value": 0.25},
                  {"color": "green", "value": 0.5}]}}),
        ts("Burn rate by window", [_q(f"max by (slo, window) (sits_slo_burn_rate{{{sel}}})", "{{slo}} {{window}}")],
           "x", w=16),
        panel("state-timeline", "Alerts firing by burn tier",
              [_q(f"max by (slo, burn_tier) (sits_slo_alert_firing{{{sel}}})", "{{slo}} {{burn_tier}}")],
              w=24, h=6, options={"mergeValues": True, "showValue": "never"},
              defaults={"mappings": [{"type": "value", "options": {
                  "0": {"text": "ok", "color": "green"}, "1": {"text": "firing", "color": "red"}}}]}),
        ts("SLI by window", [_q(f"max by (slo, window) (sits_slo_sli_ratio{{{sel}}})", "{{slo}} {{window}}")],
           "percentunit"),
        ts("Likely cause (classifier confidence)",
           [_q(f"max by (cause) (sits_rca_verdict_confidence{{{INST}}})", "{{cause}}")], "percentunit",
           defaults={"min": 0, "max": 1}),
        panel("bargauge", "Verdicts by cause in range",
              [_q(f"sum by (cause) (increase(sits_rca_verdicts_total{{{INST}}}[$__range]))", "{{cause}}")],
              w=8, options={"orientation": "horizontal", "displayMode": "basic"}),
        ts("Scheduler decisions", [_q(f"sum by (action) (increase(sits_scheduler_decisions_total{{{INST}}}[{RI}]))",
                                      "{{action}}")], "short", w=8),
        ts("Alert deliveries",
           [_q(f"sum by (receiver, outcome) (increase(sits_webhook_deliveries_total{{{INST}}}[{RI}]))",
               "{{receiver}} {{outcome}}")], "short", w=8),
    ])


DASHBOARDS = {
    "host-overview.json": host_overview,
    "stage-latency.json": stage_latency,
    "gpu-topology-load.json": gpu_topology_load,
    "slos-causes.json": slos_causes,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
