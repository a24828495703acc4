"""What the SLO engine shows: exported samples and the JSON of ``/api/v1/slos`` and ``/api/v1/alerts``.

Called with the engine's lock held; reads only its :class:`~.plan.Plan` and latest :class:`~.plan.Evaluation`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..frame import Sample
from .tiers import TIER_NAMES, format_duration

if TYPE_CHECKING:
    from ..alerting.formats import Alert
    from .evaluate import SloEngine

__all__ = ["metrics_of", "slo_view", "alerts_view"]

_HELP = {
    "sits_slo_objective_ratio": "Target fraction of good events.",
    "sits_slo_sli_ratio": "Fraction of good events over the window (absent while the window saw no events).",
    "sits_slo_burn_rate": "Error ratio over the window divided by the error budget (1 - objective).",
    "sits_slo_error_budget_remaining_ratio": "Fraction of the SLO window's error budget left (< 0 when overspent).",
    "sits_slo_alert_firing": "1 while this burn tier's alert fires (at most one tier per SLO fires at a time).",
}


def _s(name: str, labels: tuple[tuple[str, str], ...], value: float) -> Sample:
    return Sample(name, "gauge", _HELP[name], labels, float(value))


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 9)


def metrics_of(engine: SloEngine) -> list[Sample]:
    ev, out = engine.last, []
    for i, spec in enumerate(engine.specs):
        slo = (("slo", spec.name),)
        out.append(_s("sits_slo_objective_ratio", slo, spec.objective))
        for tier in engine.plan.tiers[i].values():
            labels = (*slo, ("severity", tier.severity), ("burn_tier", tier.name))
            out.append(_s("sits_slo_alert_firing", labels, engine.firing_tiers[i, TIER_NAMES.index(tier.name)]))
        if ev is None:
            continue
        out.append(_s("sits_slo_error_budget_remaining_ratio", slo, ev.budget[i]))
        for k in engine.plan.slo_pairs[i]:
            if ev.sums[1, k] > 0:
                labels = (*slo, ("window", format_duration(int(engine.plan.windows[k]))))
                out.append(_s("sits_slo_sli_ratio", labels, 1.0 - ev.err[k]))
                out.append(_s("sits_slo_burn_rate", labels, ev.burn[k]))
    return out


def slo_view(engine: SloEngine, i: int) -> dict[str, Any]:
    spec, ev = engine.specs[i], engine.last
    kind = "latency" if spec.latency is not None else "ratio"
    out: dict[str, Any] = {
        "name": spec.name, "description": spec.description, "objective": spec.objective,
        "window": format_duration(spec.window), "min_rate": spec.min_rate,
        "sli": {"kind": kind, **getattr(spec, kind).model_dump()},
        "ts": None if ev is None else ev.ts,
        "firing": None,
    }
    fastest = engine.firing[i]
    if fastest is not None:
        alert = engine.alerts[(i, fastest)]
        out["firing"] = {"burn_tier": fastest, "since": alert.starts_at, "fingerprint": alert.fingerprint}
    if ev is not None:
        windows = []
        for k in engine.plan.slo_pairs[i]:
            good, total = ev.sums[:, k]
            windows.append({"window": format_duration(int(engine.plan.windows[k])), "good": float(good),
                            "total": float(total), "sli": _num(1.0 - ev.err[k]), "burn_rate": _num(ev.burn[k]),
                            "events_per_second": _num(ev.rate[k])})
        out["windows"] = windows
        out["error_budget"] = {"remaining_ratio": _num(ev.budget[i]), "consumed_ratio": _num(1.0 - ev.budget[i])}
    tiers = []
    for j, name in enumerate(TIER_NAMES):
        tier = engine.plan.tiers[i].get(name)
        if tier is None:
            continue
        row = {"burn_tier": name, "severity": tier.severity, "long": format_duration(tier.long),
               "short": format_duration(tier.short), "factor": round(tier.factor(spec.window), 6),
               "keep_firing_for": format_duration(tier.keep_firing_for)}
        if ev is not None:
            thr = engine.plan.t_threshold[i, j]
            burning = bool(ev.err[engine.plan.t_long[i, j]] > thr and ev.err[engine.plan.t_short[i, j]] > thr)
            row.update(active=bool(ev.active[i, j]), firing=bool(ev.firing[i, j]), held=bool(ev.held[i, j]),
                       held_back_low_traffic=burning and not bool(ev.active[i, j]),
                       condition_held_at=_num(ev.last_true[i, j]), held_until=_num(ev.held_until[i, j]))
        tiers.append(row)
    out["tiers"] = tiers
    return out


def _alert_json(alert: Alert) -> dict[str, Any]:
    return {**alert.to_json(), "fingerprint": alert.fingerprint}


def alerts_view(engine: SloEngine) -> dict[str, Any]:
    order = sorted(engine.alerts, key=lambda k: (k[0], TIER_NAMES.index(k[1])))
    return {"firing": [_alert_json(engine.alerts[k]) for k in order],
            "recent": [_alert_json(a) for a in reversed(engine.recent)]}
