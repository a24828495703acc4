"""Datasets generated from the simulator through a real SeriesStore, and a model that learns from one."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from sits_observe.cli import main
from sits_observe.rca import dataset
from sits_observe.rca.evaluate import model_proba
from sits_observe.rca.features import FEATURES
from sits_observe.rca.generate import draw_variation
from sits_observe.rca.model import RcaModel
from sits_observe.rca.verdict import CAUSES
from sits_observe.sim.gpu import spec_for
from sits_observe.topology import preset


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "ds"
    assert main(["rca", "dataset", "--out", str(out), "--seed", "4", "--hours", "0.6", "--entities", "2",
                 "--rates", "0.7,1.2", "--bursty"]) == 0
    return out


def test_generated_dataset_has_the_daemon_features_and_ground_truth_labels(generated: Path) -> None:
    ds = dataset.read(generated)
    assert ds.features == FEATURES and ds.step == 1.0
    assert [e.name for e in ds.entities] == ["nvswitch-8-conv-s400", "nvswitch-8-conv-s401"]
    assert all(len(e.values) == 2160 for e in ds.entities)
    assert ds.labels and {lab.cause for lab in ds.labels} <= set(CAUSES) - {"healthy"}
    # gauges are there every tick; latency quantiles are missing (NaN) in ticks without events
    for name in ("gpu.temperature_celsius.max", "host.cpu_utilization_ratio", "workload.queue_depth.sum"):
        col = ds.entities[0].values[:, ds.features.index(name)]
        assert not np.isnan(col).any()
    summary = json.loads((generated / "generated.json").read_text())
    assert summary["options"]["bursty"] is True and summary["steps"] == 4320


def test_training_on_a_tiny_generated_dataset_learns_far_above_chance(generated: Path, tmp_path: Path) -> None:
    model_file = tmp_path / "m.pt"
    assert main(["rca", "train", "--dataset", str(generated), "--out", str(model_file), "--window", "16",
                 "--epochs", "8", "--hidden", "24,12", "--stride", "2", "--batch", "32", "--margin", "5",
                 "--threads", "1"]) == 0
    model = RcaModel.load(model_file)
    ds = dataset.read(generated)
    win = ds.windows(model.window, margin=5, baseline=model.baseline)
    pred = np.asarray(model.classes, dtype=object)[model_proba(model, win, np.arange(len(FEATURES))).argmax(1)]
    classes = sorted(set(win.y))
    recall = [float((pred[win.y == c] == c).mean()) for c in classes]
    assert len(classes) >= 3
    assert np.mean(recall) > 0.75 > 2 / len(classes)  # balanced accuracy far above chance (1 / classes)
    assert model.training["command"].startswith(f"sits-observe rca train --dataset {generated}")


def test_vary_makes_each_entity_a_different_healthy_host(tmp_path: Path) -> None:
    out = tmp_path / "vary"
    assert main(["rca", "dataset", "--out", str(out), "--seed", "6", "--hours", "0.1", "--entities", "2",
                 "--vary"]) == 0
    hosts = json.loads((out / "generated.json").read_text())["hosts"]
    assert list(hosts) == ["nvswitch-8-conv-s600", "nvswitch-8-conv-s601"]
    spec = spec_for(preset("nvswitch-8").gpus[0].model)
    for name, h in hosts.items():
        var, prompt, output = draw_variation(int(name.rsplit("s", 1)[1]), "nvswitch-8")  # same draw again
        assert h == {**asdict(var), "prompt_scale": round(prompt, 3), "output_scale": round(output, 3)}
        full_power = spec.inlet + var.inlet_offset + spec.resistance * var.resistance_scale * spec.tdp
        assert 60 <= full_power <= 85.01 and 0.6 <= var.power_limit <= 1 and 0 <= var.background_cpu <= 0.15
        assert 1 / 3 <= prompt <= 3 and 1 / 12 <= output <= 3
        assert var.affinity == 0.0 or 0.5 <= var.affinity <= 1.0
    assert hosts["nvswitch-8-conv-s600"] != hosts["nvswitch-8-conv-s601"]
    ds = dataset.read(out)
    temps = [np.nanmedian(e.values[-120:, ds.features.index("gpu.temperature_celsius.max")]) for e in ds.entities]
    assert abs(temps[0] - temps[1]) > 1.0  # the cooling draw shows in what the daemon would read


def test_vary_draws_session_routing_and_short_answers_on_a_share_of_hosts() -> None:
    draws = [draw_variation(seed, "nvswitch-8") for seed in range(200)]
    affine = np.mean([var.affinity > 0 for var, _, _ in draws])
    short = np.mean([output < 1 / 3 for _, _, output in draws])
    assert 0.4 < affine < 0.6 and 0.25 < short < 0.42  # half route by session, a third answer briefly


def test_generate_writes_each_entity_before_simulating_the_next(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """All entities were held in memory (then copied as float64) until the end: memory grew with entities x hours.
    Now each entity's rows are in metrics.csv's temporary file before the next is simulated, and the set is renamed at
    the end."""
    from sits_observe.rca import generate as gen

    out, seen = tmp_path / "ds", []

    def fake(seed: int, opts: gen.GenOptions, name: str, *_: object) -> tuple[dataset.Entity, list[dataset.Label]]:
        (tmp,) = out.glob("metrics.csv.*.tmp")
        seen.append(sorted({line.split(",")[1] for line in tmp.read_text().splitlines()[1:]}))
        values = np.full((3, len(FEATURES)), float(seed), np.float32)
        return dataset.Entity(name, gen.T0 + 1, values), [dataset.Label(name, gen.T0 + 1, gen.T0 + 2, "x")]

    monkeypatch.setattr(gen, "simulate", fake)
    summary = gen.generate(out, gen.GenOptions(entities=3))
    names = [f"nvswitch-8-conv-s{100 + k}" for k in range(3)]
    assert seen == [[], names[:1], names[:2]]
    ds = dataset.read(out)
    assert [e.name for e in ds.entities] == names and summary["steps"] == 9 and summary["labels"] == {"x": 3}
    assert sorted(p.name for p in out.iterdir()) == ["generated.json", "labels.csv", "metrics.csv"]
