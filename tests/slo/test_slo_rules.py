"""Generated Prometheus rules: real `promtool check rules` and `promtool test rules`, and the same input
series through the in-daemon evaluator, which must fire and resolve at the same evaluation steps."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.clock import WallClock
from sits_observe.export.http import create_app
from sits_observe.slo.evaluate import SloEngine
from sits_observe.slo.rules import dump_rules, rule_groups
from sits_observe.slo.tiers import TIER_NAMES

sys.path.insert(0, str(Path(__file__).parent))
import slo_scenarios as S  # noqa: E402

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
T0 = S.T0

# Hand-computed firing tier per SLO at chosen minutes; SLOs not named fire nothing.  keep_firing_for is each
# tier's short window (1m, 6m, 24m, 72m scaled; 5m for the 28d outage) unless the SLO sets it (flap: 5m): a
# tier's condition is kept while it held at most keep_firing_for ago, so an alert resolves at the
# keep_firing_for-th minute after the first one with its condition false.
#  fast: 12m window error ratio 0.02*k/12 > 13.44*0.001 -> k >= 9 bad minutes; the 1m short window clears
#        the minute after the burn (T0+25), kept 1m: resolved at T0+26; page_slow turns active at k = 21
#        (0.02*21/72 > 0.0056) while page_fast fires, so it is held, and stays held until its 6m window clears
#        at T0+29: it never fires.
#        Ticket tiers: 0.02*24/288 < 0.0028, and 0.02*24/(T0+24) < 0.000933 (the 864m window is not full).
#  slow: burn 4 never reaches 5.6 (no page); 288m: 0.004*k/288 > 0.0028 -> k >= 202 (ticket_fast); the
#        864m window holds T0+k minutes: 0.004*k/(T0+k) > 0.000933 -> k >= 214, so ticket_slow turns active
#        after ticket_fast and is held; the 24m window clears at T0+228 (16 bad minutes: 0.004*16/24 < 0.0028),
#        kept 24m: resolved at T0+252; ticket_slow stays held until its 72m window clears.
#  quiet: 50 % errors would fire every tier, but 0.1 events/s < min_rate 0.5.
#  outage (28d, default windows): every tier is active from minute 1; page_fast fires (13.44x over 1h/5m),
#        the 5m window clears at minute 15, kept 5m: resolved at 20; the slower tiers stay held until they
#        clear: one alert.
#  flap (see slo_scenarios.FLAP): fires at T0+9, kept through the clean T0+13..14, condition false from T0+23,
#        page_slow active but held at T0+27, resolved at T0+28: one alert (without the guard: three alerts
#        and a page_slow one).
#  takeover: 0.4 % for 206 min: ticket_fast fires at T0+202 as for slow; then 2.4 %: after j minutes the 12m
#        window holds (24j + 4(12-j))/12000 > 0.01344 -> j >= 6: page_fast fires at T0+212 and ticket_fast
#        resolves at that same step (page_slow, active from the same minute, is held too); the 1m window dips
#        at T0+219 (0.4 %): kept; from T0+226 it stays clean: resolved at T0+227.  ticket_fast stays held (its
#        condition holds until T0+273, then is kept 24m; held until page_fast's last T0+225 + 24m + 24m): no
#        second ticket.
#  slowdown: page_fast as for fast (T0+9), its 1m window falls to 0.8 % at T0+21: kept 1m, resolved at
#        T0+22; page_slow active from T0+21 (0.02*20 + 0.008 over 72m > 0.0056), held while page_fast is
#        kept and then until T0+20 + 6m + 6m = T0+32 (its windows may still lag the 2 %); still active at
#        T0+33: fires (the burn goes on at 8x). The 0.8 % ends at T0+220; the 6m window holds > 0.0056
#        through T0+221 (0.008*5/6), kept 6m: resolved at T0+228. The ticket tiers stay held (page_slow
#        kept, then their windows lag it: ticket_fast last active T0+235 < T0+221 + 48m).
PF, PS, TF = ("page_fast",), ("page_slow",), ("ticket_fast",)
HAND = {
    1: {"outage": PF}, 19: {"outage": PF}, 20: {}, 40: {}, 130: {},
    T0 + 8: {}, T0 + 9: {"fast": PF, "flap": PF, "slowdown": PF}, T0 + 13: {"fast": PF, "flap": PF, "slowdown": PF},
    T0 + 14: {"fast": PF, "flap": PF, "slowdown": PF}, T0 + 21: {"fast": PF, "flap": PF, "slowdown": PF},
    T0 + 22: {"fast": PF, "flap": PF}, T0 + 25: {"fast": PF, "flap": PF}, T0 + 26: {"flap": PF},
    T0 + 27: {"flap": PF}, T0 + 28: {}, T0 + 30: {}, T0 + 32: {}, T0 + 33: {"slowdown": PS},
    T0 + 201: {"slowdown": PS}, T0 + 202: {"slow": TF, "takeover": TF, "slowdown": PS},
    T0 + 211: {"slow": TF, "takeover": TF, "slowdown": PS},
    T0 + 212: {"slow": TF, "takeover": PF, "slowdown": PS}, T0 + 219: {"slow": TF, "takeover": PF, "slowdown": PS},
    T0 + 226: {"slow": TF, "takeover": PF, "slowdown": PS}, T0 + 227: {"slow": TF, "slowdown": PS},
    T0 + 228: {"slow": TF},
    T0 + 251: {"slow": TF}, T0 + 252: {}, T0 + 280: {}, T0 + 290: {},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rules")
    cfg = S.config(str(tmp / "state"))
    (tmp / "state").mkdir()
    rules = tmp / "rules.yml"
    rules.write_text(dump_rules(cfg.slos, cfg.store.buckets, "test"))
    engine = SloEngine.from_config(cfg)
    steps = {}
    for frame in S.frames():
        engine.on_tick(frame)
        steps[int(frame.ts // 60)] = {s.name: tuple(t for t, f in zip(TIER_NAMES, row) if f)
                                      for s, row in zip(engine.specs, engine.firing_tiers) if row.any()}
    engine.close()
    return cfg, rules, steps


def _expected_alerts(cfg, firing: dict) -> list[dict]:
    out = []
    for spec in cfg.slos:
        for tier_name in firing.get(spec.name, ()):
            tier = next(t for t in spec.enabled_tiers() if t.name == tier_name)
            labels = spec.alert_labels(tier)
            del labels["alertname"]
            out.append({"exp_labels": labels, "exp_annotations": spec.alert_annotations(tier)})
    return out


def _alert_test(cfg, minute: int, firing: dict, names: tuple[str, ...]) -> dict:
    mine = {k: v for k, v in firing.items() if k in names}
    return {"eval_time": f"{minute}m", "alertname": "SitsSloBurnRate", "exp_alerts": _expected_alerts(cfg, mine)}


def _promtool(*args, cwd):
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_generated_rules_pass_promtool_check(tmp_path):
    cfg = parse({"slos": [
        {"name": "e2e", "objective": 0.999, "description": "Chat requests under 250 ms.", "min_rate": 0.1,
         "latency": {"stage": "e2e", "workload": "chat", "threshold": 0.25}, "labels": {"team": "serving"}},
        {"name": "errors", "objective": 0.99, "window": "30d", "tiers": {"ticket_slow": False},
         "ratio": {"total": "requests_total", "bad": "request_errors_total"}},
        {"name": "goodput", "objective": 0.995, "window": "7d", "tiers": {"ticket_slow": {"long": "2d"}},
         "ratio": {"total": "requests_total", "good": "tokens_generated_total"}},
    ]}, env={})
    out = tmp_path / "rules.yml"
    out.write_text(dump_rules(cfg.slos, cfg.store.buckets, "test"))
    res = _promtool("check", "rules", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: " in res.stdout
    groups = yaml.safe_load(out.read_text())["groups"]
    assert [g["name"] for g in groups] == ["sits-slo-e2e", "sits-slo-errors", "sits-slo-goodput"]
    alerts = [r for r in groups[1]["rules"] if "alert" in r]
    assert [a["labels"]["burn_tier"] for a in alerts] == ["page_fast", "page_slow", "ticket_fast"]


def test_daemon_fires_and_resolves_at_hand_computed_steps(setup):
    _, _, steps = setup
    assert {m: steps[m] for m in HAND} == HAND
    # and nothing else ever fires for quiet
    assert not any("quiet" in s for s in steps.values())


def test_promtool_fires_at_the_same_steps_as_the_daemon(setup, tmp_path):
    cfg, rules, steps = setup
    # every step where the daemon's firing set changes, the step before it, and the hand-computed ones;
    # two test groups: the scaled burns after T0, and the first minutes (28d outage, quiet)
    check = set(HAND)
    for m in range(2, S.STEPS + 1):
        if steps[m] != steps[m - 1]:
            check |= {m - 1, m}
    groups = []
    for names in (("fast", "slow", "flap", "takeover", "slowdown"), ("outage", "quiet")):
        mine = sorted(m for m in check if m > S.T0) if "fast" in names else sorted(m for m in check if m < S.T0)
        tests = [_alert_test(cfg, m, steps[m], names) for m in mine]
        # and the hand-computed table, independently of the daemon
        tests += [_alert_test(cfg, m, HAND[m], names) for m in HAND if m in mine]
        groups.append({"interval": "1m", "alert_rule_test": tests,
                       "input_series": S.promtool_series([sc for sc in S.SCENARIOS if sc.slo in names])})
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": groups}
    test_file = tmp_path / "slo_test.yml"
    test_file.write_text(yaml.safe_dump(spec, width=10**9))
    res = _promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "SUCCESS" in res.stdout


def test_the_budget_left_of_a_window_without_events_is_whole_as_the_daemon_says(tmp_path):
    """The rule was 1 - ratio / budget: with no event in the window the ratio is 0/0, so the budget left was NaN
    where the daemon exports 1 (dashboards and alerts on it broke on a quiet service)."""
    cfg = parse({"slos": [{"name": "errors", "objective": 0.99, "window": "30d",
                           "ratio": {"total": "requests_total", "bad": "request_errors_total", "workload": "w"}}]},
                env={})
    rules = tmp_path / "rules.yml"
    rules.write_text(dump_rules(cfg.slos, cfg.store.buckets, "test"))
    total, bad = (f'{S.counter_metric(n)}{{workload="w"}}' for n in ("requests_total", "request_errors_total"))
    left = 'sits_slo:error_budget_remaining{slo="errors"}'
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [{"series": total, "values": "100+0x20"},  # no event
                                            {"series": bad, "values": "0+0x20"}],
         "promql_expr_test": [{"expr": left, "eval_time": "10m",
                               "exp_samples": [{"labels": f'{left[:-1]},window="30d"}}', "value": 1}]}]},
        {"interval": "1m", "input_series": [{"series": total, "values": "0+100x20"},  # 0.5 % errors: half left
                                            {"series": bad, "values": "0+0.5x20"}],
         "promql_expr_test": [{"expr": left, "eval_time": "10m",
                               "exp_samples": [{"labels": f'{left[:-1]},window="30d"}}', "value": 0.5}]}]}]}
    test_file = tmp_path / "budget_test.yml"
    test_file.write_text(yaml.safe_dump(spec, width=10**9))
    res = _promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, (res.stdout + res.stderr)[-3000:]


class _Traffic:
    name = "traffic"

    def __init__(self, layout):
        self.layout = layout

    def collect(self, frame):
        frame.add_values("e2e", "chat", np.array([0.1, 0.2, 0.3, 3.0]), self.layout)
        frame.add_counter("requests_total", "chat", 4)
        frame.add_counter("request_errors_total", "chat", 1)


def test_rule_selectors_match_the_daemons_own_metrics(tmp_path):
    """Every series the generated rules read is one the daemon's /metrics exposes (names, labels, `le`)."""
    cfg = parse({"state_dir": str(tmp_path), "slos": [
        {"name": "lat", "objective": 0.99, "latency": {"stage": "e2e", "workload": "chat", "threshold": 0.25}},
        {"name": "all", "objective": 0.99, "latency": {"stage": "e2e", "threshold": 2.5}},
        {"name": "err", "objective": 0.99, "ratio": {"total": "requests_total", "bad": "request_errors_total"}},
    ]}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0))
    daemon.sources.append(_Traffic(daemon.layout))
    client = create_app(daemon, ui=False).test_client()
    daemon.tick()
    exposed = [(s.name, s.labels) for f in text_string_to_metric_families(client.get("/metrics").data.decode())
               for s in f.samples]
    exprs = " ".join(r["expr"] for g in rule_groups(cfg.slos, cfg.store.buckets)["groups"] for r in g["rules"])
    selectors = set(re.findall(r"(sits_(?:stage|workload)_\w+)\{([^}]*)\}", exprs))
    assert len(selectors) == 6
    for name, matchers in selectors:
        want = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
        assert any(n == name and want.items() <= labels.items() for n, labels in exposed), (name, want)


def test_rules_are_made_from_a_config_written_for_another_host(tmp_path):
    """`slo rules --config prod.yaml` on a CI box or the Prometheus host refused a valid production config: its
    listen host does not resolve there, nor does its actuator's program exist (check-config still says so)."""
    cfg = tmp_path / "prod.yaml"
    cfg.write_text("listen: gpu-node-07.prod.invalid:9477\n"
                   "scheduler: {actuator: command, command: {argv: [/opt/orchestrator/move-shard]}}\n"
                   "slos:\n  - {name: e2e, objective: 0.99, latency: {stage: e2e, workload: chat, threshold: 0.25}}\n")
    out = tmp_path / "rules.yml"
    res = subprocess.run([sys.executable, "-m", "sits_observe", "slo", "rules", "--config", str(cfg), "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _promtool("check", "rules", str(out), cwd=tmp_path).returncode == 0
    res = subprocess.run([sys.executable, "-m", "sits_observe", "check-config", str(cfg)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "does not resolve" in res.stderr and "program does not exist" in res.stderr
