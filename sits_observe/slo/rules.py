"""Prometheus recording and alerting rules equivalent to the in-daemon evaluation.

One rule group per SLO, evaluated in order within each evaluation:

* ``sits_slo:error_ratio{slo, window}`` for every alert window and the SLO window (rates of the
  exported counters, summed over instances), and ``sits_slo:events_per_second{slo, window}`` for the
  short windows when ``min_rate`` is set;
* ``sits_slo:error_budget_remaining{slo, window}`` over the SLO window (1 when it holds no event);
* ``sits_slo:burn_condition{slo, burn_tier}``: present while the tier's long and short windows burn
  above its threshold and the short window has ``min_rate`` events/s; its value is the long-window
  burn rate;
* ``sits_slo:burn_condition_held{slo, burn_tier}``, the flap guard: present while the condition holds
  or held at an evaluation at most ``keep_firing_for`` ago; its value is the time of that evaluation
  (the rule reads its own previous value);
* per tier, fastest first (not for the fastest): ``sits_slo:burn_held_until{slo, burn_tier}``, while
  the tier's held condition is present: the latest held-condition time of the faster tiers plus the
  tier's short window and ``keep_firing_for`` while any is present, else its own previous value; and ``sits_slo:burn_held``, the
  held condition while a faster one is present or it last held no later than ``burn_held_until`` (its
  windows may still lag the faster incident); then alert ``SitsSloBurnRate``, the held condition ``unless``
  ``burn_held``, without ``for`` or ``keep_firing_for`` (so a tier taken over resolves at once), and with
  the same labels and annotations as the daemon's alerts: the daemon's :func:`~.burn.fire`, evaluation
  for evaluation.

Latency SLIs select the exported bucket whose ``le`` is the snapped threshold edge, written as the
exporter writes it (the shortest text that reads back exactly).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from ..histogram import snap_edges
from .sli import threshold_index
from .spec import SloSpec
from .tiers import ALERT_NAME, Tier, error_budget, format_duration

__all__ = ["rule_groups", "dump_rules", "le_label", "counter_metric"]

HIST = "sits_stage_latency_seconds"


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # repeated label maps stay written out, no &id001
        return True


def le_label(edge: float) -> str:
    """The ``le`` label value the exporter writes for a snapped edge (exact, as :mod:`sits_observe.export` writes it)."""
    return repr(float(edge))


def counter_metric(name: str) -> str:
    """The exported name of a Frame counter (``requests_total`` -> ``sits_workload_requests_total``)."""
    return f"sits_workload_{name}" if name.endswith("_total") else f"sits_workload_{name}_total"


def _selector(metric: str, **labels: str | None) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items() if v is not None)
    return f"{metric}{{{inner}}}"


def _series(spec: SloSpec, snapped: Sequence[float], buckets: Sequence[float]) -> tuple[str, str, bool]:
    """(total selector, numerator selector, numerator counts errors)."""
    if spec.latency is not None:
        lat = spec.latency
        le = le_label(snapped[threshold_index(lat.threshold, buckets)])
        return (_selector(f"{HIST}_count", stage=lat.stage, workload=lat.workload),
                _selector(f"{HIST}_bucket", stage=lat.stage, workload=lat.workload, le=le), False)
    ratio = spec.ratio
    assert ratio is not None
    total = _selector(counter_metric(ratio.total), workload=ratio.workload)
    if ratio.bad is not None:
        return total, _selector(counter_metric(ratio.bad), workload=ratio.workload), True
    return total, _selector(counter_metric(ratio.good or ""), workload=ratio.workload), False


def _rate(selector: str, window: str) -> str:
    return f"sum(rate({selector}[{window}]))"


def _group(spec: SloSpec, snapped: Sequence[float], buckets: Sequence[float]) -> dict[str, Any]:
    total, part, counts_errors = _series(spec, snapped, buckets)
    slo = {"slo": spec.name}
    rules: list[dict[str, Any]] = []
    rate_windows = {t.short for t in spec.enabled_tiers()} if spec.min_rate > 0 else set()
    for w in sorted({*spec.alert_windows(), spec.window}):
        d = format_duration(w)
        t, p = _rate(total, d), f"({_rate(part, d)} or vector(0))"
        labels = {**slo, "window": d}
        rules.append({"record": "sits_slo:error_ratio", "expr": f"{p} / {t}" if counts_errors else f"1 - {p} / {t}",
                      "labels": labels})
        if w in rate_windows:
            rules.append({"record": "sits_slo:events_per_second", "expr": t, "labels": labels})
    budget = error_budget(spec.objective)
    d = format_duration(spec.window)
    # no event in the window: the ratio is 0/0 (NaN) or absent; the budget is whole then, as the daemon says (a NaN
    # compares false, so it is dropped and the constant stands in, with the same labels)
    whole = f'label_replace(label_replace(vector(1), "slo", "{spec.name}", "", ""), "window", "{d}", "", "")'
    rules.append({"record": "sits_slo:error_budget_remaining",
                  "expr": f"(1 - {_selector('sits_slo:error_ratio', slo=spec.name, window=d)} / {budget!r} > -Inf)"
                          f" or on(slo) {whole}",
                  "labels": slo})
    tiers = spec.enabled_tiers()
    for tier in tiers:
        rules.append({"record": "sits_slo:burn_condition", "expr": _condition(spec, tier, budget),
                      "labels": {**slo, "burn_tier": tier.name}})
    for tier in tiers:
        expr = f"{_selector('sits_slo:burn_condition', slo=spec.name, burn_tier=tier.name)} * 0 + time()"
        if tier.keep_firing_for:
            kept = _selector("sits_slo:burn_condition_held", slo=spec.name, burn_tier=tier.name)
            expr += f" or {kept} >= time() - {tier.keep_firing_for}"
        rules.append({"record": "sits_slo:burn_condition_held", "expr": expr,
                      "labels": {**slo, "burn_tier": tier.name}})
    for k, tier in enumerate(tiers):
        expr = _selector("sits_slo:burn_condition_held", slo=spec.name, burn_tier=tier.name)
        if k:
            held = _selector("sits_slo:burn_held", slo=spec.name, burn_tier=tier.name)
            until = _selector("sits_slo:burn_held_until", slo=spec.name, burn_tier=tier.name)
            names = "|".join(t.name for t in tiers[:k])
            faster = f'sits_slo:burn_condition_held{{slo="{spec.name}",burn_tier=~"{names}"}}'
            rules.append({"record": "sits_slo:burn_held_until",
                          "expr": f"((max by (slo) ({faster}) + {tier.short + tier.keep_firing_for}) and on(slo) {expr})"
                                  f" or on(slo) ({until} and on(slo) {expr})",
                          "labels": {**slo, "burn_tier": tier.name}})
            rules.append({"record": "sits_slo:burn_held",
                          "expr": f"{expr} and on(slo) ({faster} or on(slo) ({expr} <= on(slo) {until}))",
                          "labels": {**slo, "burn_tier": tier.name}})
            expr += " unless on(slo) " + held
        labels = spec.alert_labels(tier)
        del labels["alertname"]
        rules.append({"alert": ALERT_NAME, "expr": expr, "labels": labels,
                      "annotations": {k: _literal(v) for k, v in spec.alert_annotations(tier).items()}})
    return {"name": f"sits-slo-{spec.name}", "rules": rules}


def _literal(text: str) -> str:
    """``text`` as Prometheus shows it: annotations are Go templates, so a description with ``{{`` failed
    promtool. With braces in it, each brace is written as an action printing it (pairs alone were not enough:
    ``{}}`` became ``{{{ "}}" }}``)."""
    return re.sub(r"[{}]", lambda m: '{{ "' + m.group(0) + '" }}', text)


def _condition(spec: SloSpec, tier: Tier, budget: float) -> str:
    threshold = tier.threshold(spec.window, spec.objective)
    err = [_selector("sits_slo:error_ratio", slo=spec.name, window=format_duration(w)) for w in (tier.long, tier.short)]
    cond = f"{err[0]} > {threshold!r} and on(slo) {err[1]} > {threshold!r}"
    if spec.min_rate > 0:
        events = _selector("sits_slo:events_per_second", slo=spec.name, window=format_duration(tier.short))
        cond += f" and on(slo) {events} >= {spec.min_rate!r}"
    return f"max by (slo) ({cond}) / {budget!r}"


def rule_groups(specs: Sequence[SloSpec], buckets: Sequence[float]) -> dict[str, Any]:
    """The rule file as a mapping (``{"groups": [...]}``); ``buckets`` are ``store.buckets`` as configured."""
    snapped = snap_edges(buckets)
    return {"groups": [_group(s, snapped, buckets) for s in specs]}


def dump_rules(specs: Sequence[SloSpec], buckets: Sequence[float], source: str) -> str:
    header = (f"# Prometheus rules for {len(specs)} SLO(s), generated by `sits-observe slo rules` from {source}.\n"
              "# Regenerate instead of editing; see docs/slo.md.\n")
    return header + yaml.dump(rule_groups(specs, buckets), Dumper=_Dumper, sort_keys=False, width=1000)
