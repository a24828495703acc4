"""Bad SLO specs are refused at config load with one line naming the field, the value and the fix."""

import contextlib
import os
import subprocess
import sys

import pytest
import yaml

from sits_observe.config import load, parse
from sits_observe.errors import ConfigError

LATENCY = {"stage": "e2e", "threshold": 0.25}


def _errors(tmp_path, data):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load(f, env={})
    return f, str(err.value).splitlines()


@pytest.mark.parametrize("slo, line", [
    ({"objective": 99.9, "latency": LATENCY},
     "slos[0].objective: must be a ratio between 0 and 1, not a percentage: write 0.999, got 99.9"),
    ({"objective": 0.999, "latency": {"stage": "prefil", "threshold": 0.25}},
     "slos[0].latency.stage: unknown stage; did you mean 'prefill'?"),
    ({"objective": 0.999, "latency": {"stage": "e2e", "threshold": 0.3}},
     "slos[0].latency.threshold: 0.3 s is not a bucket edge; the nearest edges in store.buckets are 0.25 and 0.5: "
     "use one of them, or add 0.3 to store.buckets, got 0.3"),
    ({"objective": 0.999, "window": "2d", "latency": LATENCY},
     "slos[0].window: 2d is shorter than the longest alert window 3d (tier ticket_slow); use a window of at "
     "least 3d or disable the tier with `tiers: {ticket_slow: false}`, got '2d'"),
    ({"objective": 0.999, "latency": LATENCY, "tiers": {"ticket_slow": {"long": "40d", "short": "1d"}}},  # default 28d
     "slos[0].window: 28d is shorter than the longest alert window 40d (tier ticket_slow)"),
    ({"objective": 0.999, "latency": LATENCY, "min_rate": float("inf")},  # no tier could ever fire
     "slos[0].min_rate: Input should be a finite number, got inf"),
    ({"objective": 0.999, "latency": {"stage": "e2e", "threshold": float("inf")}},  # "add inf to store.buckets"
     "slos[0].latency.threshold: must be a latency in seconds between 1e-09 and 1099.51 (a bucket edge of "
     "store.buckets), got inf"),
    ({"objective": 0.999, "latency": {"stage": "e2e", "threshold": 1e-12}},
     "slos[0].latency.threshold: must be a latency in seconds between 1e-09 and 1099.51"),
    ({"objective": 0.999, "window": "99999999999999999999w", "latency": LATENCY},
     "slos[0].window: must be at most a year (366d); SLO windows are usually 7d to 90d, got '99999999999999999999w'"),
    ({"objective": 0.9, "latency": LATENCY},  # page_fast's threshold 13.44 x 0.1: more than every request failing
     "slos[0]: SLO 's': tier page_fast can never fire: it needs an error ratio over 13.44 x (1 - 0.9) = 1.344, and "
     "an error ratio is at most 1; give the tier a budget share under 0.01488 (`tiers: {page_fast: {budget: ...}}`), "
     "a long window of at least 1h20m39s, or disable it with `tiers: {page_fast: false}`"),
    ({"objective": 0.999, "window": "monthly", "latency": LATENCY},
     "slos[0].window: must be a duration like 30s, 5m, 1h or 28d"),
    ({"objective": 0.999},
     "slos[0].ratio: set exactly one SLI: `latency` (stage, threshold) or `ratio` (total, bad|good)"),
    ({"objective": 0.999, "ratio": {"total": "requests_total"}},
     "slos[0].ratio.good: set exactly one of `bad` (error counter) or `good` (success counter) beside `total`"),
    ({"objective": 0.999, "ratio": {"total": "requests", "bad": "request_errors_total"}},  # the daemon read nothing
     "slos[0].ratio.total: 'requests' is not a counter name: counters end in _total"),
    ({"objective": 0.999, "latency": LATENCY, "tiers": {"page_fast": {"short": "2h"}}},
     "slos[0].tiers: page_fast: short window 2h must be shorter than the long window 1h"),
    ({"objective": 0.999, "latency": LATENCY, "labels": {"severity": "low"}},
     "slos[0].labels: ['severity'] are set by sits-observe; choose other label names"),
    ({"objective": 0.999, "latency": LATENCY, "keep_firing_for": "-5m"},
     "slos[0].keep_firing_for: must be a duration like 30s, 5m, 1h or 28d (units w, d, h, m, s), or 0s to resolve "
     "as soon as the condition clears, got '-5m'"),
    ({"objective": 0.999, "latency": LATENCY, "keep_firing_for": "5 minutes"},
     "slos[0].keep_firing_for: must be a duration like"),
    ({"objective": 0.999, "latency": LATENCY, "tiers": {"page_fast": {"keep_firing_for": 1.5}}},
     "slos[0].tiers.page_fast.keep_firing_for: must be a duration like"),
])
def test_bad_spec_names_field_and_fix(tmp_path, slo, line):
    f, lines = _errors(tmp_path, {"slos": [{"name": "s", **slo}]})
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{f}: {line}"), lines[0]


def test_threshold_must_be_one_of_the_configured_buckets(tmp_path):
    data = {"store": {"buckets": [0.1, 0.3, 1.0]},
            "slos": [{"name": "s", "objective": 0.99, "latency": {"stage": "e2e", "threshold": 0.25}}]}
    _, lines = _errors(tmp_path, data)
    assert "nearest edges in store.buckets are 0.1 and 0.3" in lines[0]
    data["slos"][0]["latency"]["threshold"] = 0.3
    assert parse(data, env={}).slos[0].latency.threshold == 0.3


def test_duplicate_names_and_receivers_never_echo_secrets(tmp_path):
    data = {"slos": [{"name": "a", "objective": 0.99, "latency": LATENCY}] * 2,
            "alerting": {"receivers": [
                {"type": "slack", "url": "hps://hooks.example/services/T0/B0/TOKENVALUE", "secret": "hunter2"},
                {"type": "webhook", "url": "http://127.0.0.1:1/x", "secret": 5},
            ]}}
    f, lines = _errors(tmp_path, data)
    assert f"{f}: slos[1].name: duplicate SLO name (also [0]); names must be unique, got 'a'" in lines
    assert any(line.startswith(f"{f}: alerting.receivers[0].url: must be an http:// or https:// URL") for line in lines)
    assert any(line.startswith(f"{f}: alerting.receivers[1].secret:") for line in lines)
    text = "\n".join(lines)
    assert "TOKENVALUE" not in text and "hunter2" not in text and ", got 5" not in text


def test_config_errors_never_echo_the_token_or_url_credentials(tmp_path):
    data = {"api_token": "S3CRET-TOKEN", "workloads": [{"name": "a", "comm": "x"}, {"name": "a", "comm": "y"}],
            "servers": [{"kind": "vllm", "url": "http://scraper:pw-SECRET@127.0.0.1:99999/metrics?key=Q-SECRET",
                         "workload": "a"}],
            "alerting": {"receivers": {"type": "slack", "url": "https://hooks.example/services/HOOK-SECRET"}}}
    _, lines = _errors(tmp_path, data)
    text = "\n".join(lines)
    assert "servers[0].url:" in text and "alerting.receivers: Input should be a valid list" in text
    assert "got 'http://127.0.0.1:99999/<hidden>'" in text  # scheme and host: path and query may be secret
    del data["servers"], data["alerting"]  # a check across list items: it used to print the whole file
    _, more = _errors(tmp_path, data)
    assert "workloads[1].name: duplicate workload name (also [0]); names must be unique, got 'a'" in more[0]
    for secret in ("S3CRET-TOKEN", "pw-SECRET", "Q-SECRET", "HOOK-SECRET"):
        assert secret not in text + "\n".join(more)
    _, lines = _errors(tmp_path, {"api_token": "  "})
    assert "api_token: must not be empty" in lines[0]


def test_receiver_urls_with_a_bad_port_or_raw_unicode_are_refused_at_load(tmp_path):
    data = {"slos": [{"name": "a", "objective": 0.99, "latency": LATENCY}],
            "alerting": {"receivers": [{"type": "webhook", "url": "http://am:99999/x"},
                                       {"type": "webhook", "url": "http://am:abc/x"},
                                       {"type": "slack", "url": "https://hooks.example/services/équipe"},
                                       {"type": "webhook", "url": "http://127.0.0.1:1/hook/T0KEN with space"},
                                       {"type": "webhook", "url": "http://127.0.0.1:1/hook/T0KEN\tx"}]}}
    f, lines = _errors(tmp_path, data)
    text = "\n".join(lines)
    for i in (0, 1):
        assert f"{f}: alerting.receivers[{i}].url: has a port that is not a number in 1-65535" in text
    assert f"{f}: alerting.receivers[2].url: has characters outside ASCII; percent-encode them" in text
    for i in (3, 4):  # http.client would refuse them at every delivery attempt
        assert f"{f}: alerting.receivers[{i}].url: has a space or control character; percent-encode it" in text
    assert "services" not in text and "T0KEN" not in text  # a Slack URL is a secret: never echoed


@pytest.mark.parametrize("fix", [{"budget": 0.0148}, {"long": "1h20m39s"}, False])
def test_a_tier_that_could_never_fire_is_accepted_with_each_fix_the_error_names(fix):
    spec = parse({"slos": [{"name": "s", "objective": 0.9, "latency": LATENCY, "tiers": {"page_fast": fix}}]},
                 env={}).slos[0]
    assert all(t.threshold(spec.window, spec.objective) < 1 for t in spec.enabled_tiers())


def test_tier_shorthand_defaults_and_round_trip():
    cfg = parse({"slos": [{"name": "s", "objective": 0.99, "window": "2d", "latency": LATENCY,
                           "tiers": {"ticket_slow": False, "ticket_fast": {"long": "12h", "budget": 0.05}}}],
                 "alerting": {"receivers": [{"type": "webhook", "url": "http://127.0.0.1:1/x", "secret": "k"}]}},
                env={})
    spec = cfg.slos[0]
    assert [t.name for t in spec.enabled_tiers()] == ["page_fast", "page_slow", "ticket_fast"]
    assert spec.alert_windows() == (300, 1800, 3600, 7200, 21600, 43200)
    assert spec.enabled_tiers()[2].factor(spec.window) == pytest.approx(0.05 * 48 / 12)
    # `sits-observe demo` re-validates a dumped config: the sections must survive that
    again = parse(cfg.model_dump(mode="python", exclude_unset=True), env={})
    assert again.slos == cfg.slos and again.alerting.receivers[0].secret.get_secret_value() == "k"


def test_slo_rules_command(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text(yaml.safe_dump({"slos": [{"name": "s", "objective": 0.99, "latency": LATENCY}]}))
    out = tmp_path / "rules.yml"
    cli = [sys.executable, "-m", "sits_observe", "slo", "rules"]
    res = subprocess.run([*cli, "--config", str(good), "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(out.read_text())["groups"][0]["name"] == "sits-slo-s"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"slos": [{"name": "s", "objective": 99.9, "latency": LATENCY}]}))
    res = subprocess.run([*cli, "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"sits-observe: error: {bad}: slos[0].objective: must be a ratio between 0 and 1" in res.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    res = subprocess.run([*cli, "--config", str(empty)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no SLOs configured" in res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the rules file to another user (root)")
def test_slo_rules_keeps_the_rules_files_owner_and_group(tmp_path):
    """The new file was root's: a root:prometheus 0640 rules file rewritten by root became root:root 0640, which
    Prometheus (running as prometheus) could no longer read."""
    cfg, out = tmp_path / "c.yaml", tmp_path / "rules.yml"
    cfg.write_text(yaml.safe_dump({"slos": [{"name": "s", "objective": 0.99, "latency": LATENCY}]}))
    out.write_text("groups: []\n")
    os.chown(out, 0, 65534)
    out.chmod(0o640)
    cli = [sys.executable, "-m", "sits_observe", "slo", "rules", "--config", str(cfg), "-o", str(out)]
    assert subprocess.run(cli, capture_output=True, timeout=60).returncode == 0
    st = out.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 65534, 0o640)
    assert yaml.safe_load(out.read_text())["groups"][0]["name"] == "sits-slo-s"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_slo_rules_on_a_full_disk_keeps_the_rules_file_it_was_replacing(tmp_path):
    """-o wrote in place: a full disk truncated the rules file Prometheus loads and left half a new one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        cfg, out = tmp_path / "c.yaml", disk / "rules.yml"
        cli = [sys.executable, "-m", "sits_observe", "slo", "rules", "--config", str(cfg), "-o", str(out)]
        cfg.write_text(yaml.safe_dump({"slos": [{"name": "s", "objective": 0.99, "latency": LATENCY}]}))
        assert subprocess.run(cli, capture_output=True, timeout=60).returncode == 0
        out.chmod(0o640)
        kept = out.read_bytes()
        with (disk / "filler").open("wb") as f:  # the disk full but for a few KiB
            with contextlib.suppress(OSError):
                f.write(b"x" * (1 << 20))
        (disk / "filler").write_bytes((disk / "filler").read_bytes()[:-(len(kept) + 4096)])
        cfg.write_text(yaml.safe_dump({"slos": [{"name": f"s{i}", "objective": 0.99, "latency": LATENCY}
                                                for i in range(20)]}))
        res = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert f"sits-observe: error: {out}: cannot write the rules: No space left on device" in res.stderr
        assert out.read_bytes() == kept and sorted(p.name for p in disk.iterdir()) == ["filler", "rules.yml"]
        (disk / "filler").unlink()
        assert subprocess.run(cli, capture_output=True, timeout=60).returncode == 0
        assert len(yaml.safe_load(out.read_text())["groups"]) == 20 and out.stat().st_mode & 0o777 == 0o640
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_keep_firing_for_defaults_to_the_short_window_and_can_be_set_per_slo_and_tier():
    def keeps(**slo):
        spec = parse({"slos": [{"name": "s", "objective": 0.999, "latency": LATENCY, **slo}]}, env={}).slos[0]
        return [t.keep_firing_for for t in spec.enabled_tiers()]
    assert keeps() == [300, 1800, 7200, 21600]
    assert keeps(keep_firing_for="10m") == [600] * 4
    assert keeps(keep_firing_for="0s", tiers={"ticket_slow": {"keep_firing_for": "1h"}}) == [0, 0, 0, 3600]
    assert keeps(tiers={"page_fast": {"short": "2m"}}) == [120, 1800, 7200, 21600]
