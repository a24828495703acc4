"""`sits-observe bench soak` runs the real daemon as a child and measures it (figures in docs/performance.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sits_observe.cli import main
from sits_observe.soak import growth


def test_a_short_soak_measures_the_real_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 6 simulated minutes at 100x: about 4 s of ticks, a sample every simulated minute
    assert main(["bench", "soak", "--json", "--hours", "0.1", "--warmup", "0.02", "--every", "60", "--speed", "100",
                 "--dir", str(tmp_path / "run")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] and out["stopped"] == "reached --hours" and out["simulated_hours"] >= 0.1
    assert out["daemon"]["exit_code"] == 0 and out["daemon"]["log_errors"] == 0
    assert not Path(f"/proc/{out['daemon']['pid']}").exists()  # drained and gone
    samples = out["samples"]
    assert len(samples) >= 6
    assert all(b["sim_hours"] > a["sim_hours"] and b["wall_s"] >= a["wall_s"] for a, b in zip(samples, samples[1:]))
    assert all(b["cpu_s"] >= a["cpu_s"] for a, b in zip(samples, samples[1:]))
    for s in samples:  # a Python daemon with numpy and torch; 8 GPUs, 3 SLOs, a classifier
        assert 50 < s["rss_mib"] <= s["rss_peak_mib"] and s["threads"] > 1 and s["fds"] > 3
        assert s["series"] > 500 and s["families"] > 20 and s["metrics_bytes"] > 10_000
        assert s["state_bytes"] == sum(s["files"].values()) > 0
        assert s["rows"]["slo.db/slis"] == 3 and s["rows"]["scheduler.sqlite/shards"] == 3
    growth_keys = set(out["growth"])
    assert {"rss_mib", "threads", "fds", "series", "state_bytes", "rows/slo.db/edges"} <= growth_keys
    assert out["growing"] == sorted(k for k, v in out["growth"].items() if v["grows"])
    assert out["bounded"] is (not out["growing"])
    assert out["state_after_exit"]["rows"]["slo.db/slis"] == 3
    assert out["options"]["hours"] == 0.1 and out["machine"]["cpus"] >= 1


@pytest.mark.parametrize(("values", "grows", "slope", "last_slope"), [
    ([100.0] * 8, False, 0.0, 0.0),                              # flat
    ([100.0 + 10 * h for h in range(8)], True, 10.0, 10.0),      # steady growth
    ([100, 104, 101, 103, 102, 104, 103, 104], False, None, None),  # noise within 5 %
    ([100, 200, 300, 400, 500, 500, 500, 500], True, None, 0.0),  # grew, then a cap: still "grows", now flat
    ([0, 0, 0, 0, 0, 0, 1, 1], False, None, None),               # under 1 unit
    ([0, 0, 0, 0, 0, 0, 2, 2], True, None, None),                # rows where there were none
])
def test_growth_compares_the_last_quarter_with_the_first(values: list[float], grows: bool, slope: float | None,
                                                         last_slope: float | None) -> None:
    g = growth([(float(h), float(v)) for h, v in enumerate(values)], 0.05)
    assert g["grows"] is grows
    if slope is not None:
        assert g["slope_per_hour"] == pytest.approx(slope)
    if last_slope is not None:
        assert g["last_quarter_slope_per_hour"] == pytest.approx(last_slope)


@pytest.mark.parametrize(("argv", "message"), [
    (["--hours", "1", "--warmup", "1"], "bench soak: --warmup 1 must be less than --hours 1"),
    (["--hours", "0.1", "--warmup", "0.05", "--every", "600"], "leaves fewer than 4 samples after --warmup"),
    (["--hours", "168", "--every", "10"], "makes more than 10000 samples; raise --every"),
])
def test_soak_options_that_cannot_make_a_verdict_are_refused(argv: list[str], message: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "soak", *argv, "--dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_soak_needs_an_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old-state").write_text("x")
    assert main(["bench", "soak", "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"sits-observe: error: bench soak: --dir: {tmp_path} is not an empty "
                                               "directory; a soak starts from empty state")


def test_a_scenario_the_daemon_refuses_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "soak", "--scenario", "nosuch", "--dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sits-observe: error: bench soak: the daemon exited with 2 before it "
                                               "was ready: <demo>: sim.scenario: unknown scenario 'nosuch'")
