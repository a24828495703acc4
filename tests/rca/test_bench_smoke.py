"""`bench rca --quick`: the smoke run generates, trains, times and fits both baselines end to end."""

from __future__ import annotations

import json

import pytest

from sits_observe.cli import main


def test_bench_rca_quick_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "rca", "--quick", "--json", "--samples", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    lstm, base = out["lstm"], out["baselines"]
    assert out["features"] == 53 and lstm["epochs_run"] == 2 and lstm["model_bytes"] > 0
    assert lstm["inference_batch1"]["p99_ms"] >= lstm["inference_batch1"]["median_ms"] > 0
    assert base["gbt"]["fit_seconds"] > 0 and base["thresholds"]["inference_batch1"]["median_ms"] > 0
    assert set(out["targets"]) == {"train_seconds", "inference_ms", "model_bytes"}
    # a quick run says nothing of the shipped model's targets (it said true), and says what it timed
    assert out["meets_targets"] is None and out["epochs"] == 2 and out["samples"] == 20
    assert out["options"]["quick"] is True and out["options"]["samples"] == 20  # every bench echoes its options
