"""The model file: round trip, refusing mismatched features, clear errors for broken files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from sits_observe.errors import ModelError
from sits_observe.rca.config import SHIPPED_MODEL
from sits_observe.rca.dataset import Dataset
from sits_observe.rca.evaluate import evaluate, model_proba, render
from sits_observe.rca.features import OPTIONAL_FEATURES
from sits_observe.rca.floors import Floors
from sits_observe.rca.model import RcaModel


def test_learns_far_above_chance_and_beats_nothing_but_itself(tiny_model: RcaModel,
                                                            synth: Callable[..., Dataset]) -> None:
    test = synth(seed=7, steps=1500)
    report = evaluate(tiny_model, test, synth(), min_confidence=0.0, healthy_min_confidence=0.0)  # no abstaining
    # four classes, chance macro-F1 about 0.25
    assert report["lstm"]["macro_f1"] > 0.85
    assert set(report["baselines"]) == {"thresholds", "gbt"}
    assert report["lstm"]["confusion"]["labels"][-1] == "unknown"
    for system in (report["lstm"], *report["baselines"].values()):  # the FP rate split adds up to the whole
        split = system["healthy_fp_split"]
        healthy = system["per_class"]["healthy"]["support"]
        assert split["after_fault_windows"] + split["steady_windows"] == healthy
        assert 0 < split["after_fault_windows"] < healthy
        whole = (split["after_fault"] * split["after_fault_windows"]
                 + split["steady"] * split["steady_windows"]) / healthy
        assert whole == pytest.approx(system["healthy_fp_rate"], abs=2e-4)
    val = tiny_model.metrics["validation"]
    assert val["macro_f1"] > 0.8 and 0.25 <= tiny_model.temperature <= 10
    assert (report["min_confidence"], report["healthy_min_confidence"]) == (0.0, 0.0)
    console = Console(record=True, width=200)
    render({**report, "min_confidence": 0.9, "healthy_min_confidence": 0.6}, console)  # the table says at which floors
    assert "names a fault cause from 0.9 and healthy from 0.6" in " ".join(console.export_text().split())
    render({**report, "min_confidence": {"default": 0.6, "thermal_throttling": 0.87}}, console)  # floors per cause
    assert "from 0.6 (thermal_throttling 0.87) and healthy" in " ".join(console.export_text().split())


def test_file_round_trip_gives_the_same_probabilities(tmp_path: Path, tiny_model: RcaModel,
                                                     synth: Callable[..., Dataset]) -> None:
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    back = RcaModel.load(path)
    assert back.features == tiny_model.features and back.classes == tiny_model.classes
    assert back.window == tiny_model.window and back.temperature == tiny_model.temperature
    assert back.metrics == tiny_model.metrics and back.training["options"]["window"] == 16
    win = synth(seed=3, steps=300).windows(back.window)
    cols = back.columns(synth().features)
    np.testing.assert_allclose(model_proba(back, win, cols), model_proba(tiny_model, win, cols), rtol=1e-5)


def test_refuses_a_dataset_without_its_features_and_lists_them(tiny_model: RcaModel,
                                                              synth: Callable[..., Dataset]) -> None:
    other = synth(features=("host.cpu_utilization_ratio", "gpu.temperature_celsius.max"))
    with pytest.raises(ModelError) as err:
        evaluate(tiny_model, other, synth())
    msg = str(err.value)
    assert "lacks 2 of the model's 4 features: stage.ingress.p99, stage.e2e.p99" in msg
    assert "synthetic" in msg


def test_the_shipped_model_takes_the_optional_features_as_empty_columns() -> None:
    shipped = RcaModel.load(SHIPPED_MODEL)
    assert OPTIONAL_FEATURES <= set(shipped.features)
    without = [f for f in shipped.features if f not in OPTIONAL_FEATURES]
    with pytest.raises(ModelError, match="add them as empty columns"):
        shipped.columns(without, source="dcgm-host")
    cols = shipped.columns(list(shipped.features))  # the columns present but empty: accepted, read as missing
    raw = np.full((2, shipped.window, len(shipped.features)), np.nan, dtype=np.float32)
    raw[:] = shipped.norm.typical()
    raw[:, :, [shipped.features.index(f) for f in OPTIONAL_FEATURES]] = np.nan
    proba = shipped.proba(raw[:, :, cols], raw[:, -1, cols])
    assert list(shipped.decide(proba, 0.6)) == ["healthy", "healthy"]  # a typical host without them is healthy


def test_a_fault_cause_needs_more_confidence_than_a_healthy_verdict(tiny_model: RcaModel) -> None:
    classes = list(tiny_model.classes)
    proba = np.full((3, len(classes)), 0.0)
    fault = next(i for i, c in enumerate(classes) if c != "healthy")
    proba[0, classes.index("healthy")] = proba[1, fault] = 0.7  # both under 0.9, over 0.6
    proba[2, fault] = 0.95
    for p in proba:
        p[p == 0] = (1 - p.max()) / (len(classes) - 1)
    assert list(tiny_model.decide(proba, 0.9, 0.6)) == ["healthy", "unknown", classes[fault]]
    assert list(tiny_model.decide(proba, 0.9)) == ["unknown", "unknown", classes[fault]]  # one floor for all
    assert list(tiny_model.decide(proba, 0.6)) == ["healthy", classes[fault], classes[fault]]
    assert list(tiny_model.decide(proba, 0.65, 0.8)) == ["healthy", classes[fault], classes[fault]]  # capped
    # a model without a healthy class holds every class to the fault floor
    renamed = dataclasses.replace(tiny_model, classes=tuple(f"cause_{i}" for i in range(len(classes))))
    assert list(renamed.decide(proba, 0.9, 0.6)) == ["unknown", "unknown", f"cause_{fault}"]


def test_floors_per_cause_hold_each_cause_to_its_own_floor(tiny_model: RcaModel) -> None:
    classes = list(tiny_model.classes)
    a, b = [i for i, c in enumerate(classes) if c != "healthy"][:2]
    proba = np.full((4, len(classes)), 0.0)
    proba[0, a] = proba[1, b] = 0.8
    proba[2, a] = proba[3, b] = 0.97
    for p in proba:
        p[p == 0] = (1 - p.max()) / (len(classes) - 1)
    floors = Floors.of({"default": 0.6, classes[a]: 0.9})  # cause a needs 0.9, every other cause 0.6
    assert list(tiny_model.decide(proba, floors, 0.6)) == ["unknown", classes[b], classes[a], classes[b]]
    assert list(tiny_model.decide(proba, {"default": 0.99, classes[b]: 0.7})) == [
        "unknown", classes[b], "unknown", classes[b]]
    assert list(floors.per_class(classes, 0.8)) == [0.6 if c == "healthy" else 0.9 if i == a else 0.6
                                                    for i, c in enumerate(classes)]  # healthy capped at default
    assert floors.unknown_causes(classes + ["x"]) == [] and Floors.of({"default": 0.6, "x": 0.5}).unknown_causes(
        classes) == ["x"]


def test_a_quoted_floor_is_taken_as_every_other_number_of_the_config_is() -> None:
    """rca.min_confidence was a plain number field, which takes "0.91" (a templated YAML value) as 0.91: the floors
    per cause refused it, so a config that ran before stopped the daemon with exit 2."""
    from sits_observe.config import parse

    assert parse({"rca": {"min_confidence": "0.8"}}, env={}).rca.min_confidence == 0.8
    cfg = parse({"rca": {"min_confidence": {"default": "0.8", "thermal_throttling": 0.9}}}, env={})
    assert cfg.rca.min_confidence == {"default": 0.8, "thermal_throttling": 0.9}


@pytest.mark.parametrize("damage,needle", [
    (lambda b: b[: len(b) // 2], "truncated, corrupt"),
    (lambda b: b"not a model at all\n", "truncated, corrupt"),
    (lambda b: b"", "truncated, corrupt"),
])
def test_broken_files_raise_a_clear_model_error(tmp_path: Path, tiny_model: RcaModel,
                                                damage: Callable[[bytes], bytes], needle: str) -> None:
    good = tmp_path / "good.pt"
    tiny_model.save(good)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(damage(good.read_bytes()))
    with pytest.raises(ModelError) as err:
        RcaModel.load(bad)
    assert str(bad) in str(err.value) and needle in str(err.value) and "rca train" in str(err.value)


def test_a_foreign_torch_file_is_refused(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "weights.pt"
    torch.save({"layer.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(ModelError, match="incomplete or inconsistent"):
        RcaModel.load(path)
    with pytest.raises(ModelError, match="no such model file"):
        RcaModel.load(tmp_path / "missing.pt")
    torch.save(torch.zeros(3), path)  # a torch file, but not a mapping at all
    with pytest.raises(ModelError, match="incomplete or inconsistent"):
        RcaModel.load(path)


def test_a_model_whose_normalisation_does_not_fit_its_features_is_refused(tmp_path: Path,
                                                                          tiny_model: RcaModel) -> None:
    import torch

    path = tmp_path / "m.pt"
    tiny_model.save(path)
    blob = torch.load(path, weights_only=True)
    blob["meta"]["norm"]["scale"] = blob["meta"]["norm"]["scale"][:-1]  # one feature short
    torch.save(blob, path)
    with pytest.raises(ModelError, match="normalisation sizes do not fit"):  # not at the first inference
        RcaModel.load(path)


def test_a_file_from_before_the_summary_branch_loads_as_lstm_only(tmp_path: Path,
                                                                  synth: Callable[..., Dataset]) -> None:
    import torch

    from sits_observe.rca.train import TrainOptions, train

    old = train(synth(steps=600), TrainOptions(window=16, epochs=1, hidden=(8, 4), summary=0, stride=4, margin=5,
                                               threads=1))
    assert old.net.summary is None
    path = tmp_path / "old.pt"
    old.save(path)
    blob = torch.load(path, weights_only=True)
    del blob["meta"]["summary"]  # what files written before the summary branch hold
    torch.save(blob, path)
    back = RcaModel.load(path)
    assert back.summary == 0 and back.net.summary is None
    win = synth(seed=3, steps=200).windows(back.window)
    cols = back.columns(synth().features)
    np.testing.assert_allclose(model_proba(back, win, cols), model_proba(old, win, cols), rtol=1e-5)


def test_the_head_reads_window_statistics_beside_the_lstms(tiny_model: RcaModel) -> None:
    import copy

    import torch

    net = copy.deepcopy(tiny_model.net).eval()
    assert tiny_model.summary == 64 and net.summary is not None
    # last, mean, std, min and max of the level and host-relative inputs (not the missing indicators)
    assert net.summary[0].in_features == 5 * 2 * len(tiny_model.features)
    x = torch.randn(4, tiny_model.window, 3 * len(tiny_model.features), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = net(x)
        net.summary[0].weight.zero_()
        net.summary[0].bias.zero_()
        assert not torch.allclose(before, net(x))


def test_windows_lacking_an_optional_group_are_scored_by_the_fallback(
        tmp_path: Path, untrained: Callable[..., RcaModel]) -> None:
    import torch

    features = ("stage.e2e.p99", "gpu.backlog_utilization_ratio.min", "gpu.backlog_utilization_ratio.mean",
                "gpu.serving_utilization_ratio.min")
    model, fallback = untrained(features, 1), untrained(features, 2)
    model.fallback = fallback
    raw = np.random.default_rng(0).random((4, 8, 4)).astype(np.float32)
    raw[1, :, 1:3] = np.nan  # no backlog at any step: the fallback's
    raw[2, :5, 1:3] = np.nan  # a backlog at some steps: the main network's
    raw[3, :, 3] = np.nan  # no per-process field at any step: the fallback's
    base = raw[:, 0].copy()
    assert model.lacking(raw).tolist() == [False, True, False, True]
    got = model.proba(raw, base)
    np.testing.assert_allclose(got[[0, 2]], model._own_proba(raw[[0, 2]], base[[0, 2]]), rtol=1e-6)
    np.testing.assert_allclose(got[[1, 3]], fallback._own_proba(raw[[1, 3]], base[[1, 3]]), rtol=1e-6)
    assert not np.allclose(got[[1, 3]], model._own_proba(raw[[1, 3]], base[[1, 3]]))
    path = tmp_path / "m.pt"
    model.save(path)
    np.testing.assert_allclose(RcaModel.load(path).proba(raw, base), got, rtol=1e-6)
    blob = torch.load(path, weights_only=True)
    blob["fallback"]["meta"]["window"] = 16  # a fallback that does not fit the main network
    torch.save(blob, path)
    with pytest.raises(ModelError, match="fallback network's features, classes, window or baseline differ"):
        RcaModel.load(path)
    del blob["fallback"]["state"]  # a damaged fallback part
    torch.save(blob, path)
    with pytest.raises(ModelError, match="incomplete or inconsistent"):
        RcaModel.load(path)


def test_relative_only_features_are_never_seen_as_levels(tmp_path: Path, untrained: Callable[..., RcaModel]) -> None:
    from sits_observe.rca.model import encode

    features = ("stage.e2e.p99", "gpu.sm_clock_hertz.mean", "gpu.backlog_utilization_ratio.min")
    model = untrained(features, 1)
    model.relative_only = ("gpu.sm_clock_hertz.mean",)
    raw = np.random.default_rng(0).random((3, 8, 3)).astype(np.float32) + 1.0
    base = np.ones((3, 3), dtype=np.float32)
    x = encode(raw, base, model.norm, relative_only=model.level_free())
    plain = encode(raw, base, model.norm)
    assert (x[..., 1] == 0).all() and (plain[..., 1] != 0).all()  # the clock's level: always the typical one
    np.testing.assert_array_equal(x[..., [0, 2, 3, 4, 5]], plain[..., [0, 2, 3, 4, 5]])  # its rise over base stays
    path = tmp_path / "m.pt"
    model.save(path)
    back = RcaModel.load(path)
    assert back.relative_only == ("gpu.sm_clock_hertz.mean",)
    np.testing.assert_allclose(back.proba(raw, base), model.proba(raw, base), rtol=1e-6)
    assert not np.allclose(model._own_proba(raw, base),
                           dataclasses.replace(model, relative_only=())._own_proba(raw, base))


def test_an_explanation_scores_every_variant_with_the_network_the_window_went_to(
        untrained: Callable[..., RcaModel], monkeypatch: pytest.MonkeyPatch) -> None:
    from sits_observe.rca.explain import explain

    features = ("stage.e2e.p99", "gpu.backlog_utilization_ratio.min", "gpu.backlog_utilization_ratio.mean")
    model = untrained(features, 1)
    model.fallback = untrained(features, 2)
    scored = {"main": 0, "fallback": 0}
    for name, net in (("main", model), ("fallback", model.fallback)):
        own = net._own_proba
        monkeypatch.setattr(net, "_own_proba", lambda r, b, own=own, name=name: scored.__setitem__(
            name, scored[name] + len(r)) or own(r, b))
    raw = np.random.default_rng(0).random((8, 3)).astype(np.float32)
    raw[:, 1:] = np.nan  # no backlog: the fallback's window
    explain(model, raw, raw[0].copy(), 1, None, top=3)
    # the window and its 3 variants (one per feature occluded, a backlog one filled in among them): all
    # through the fallback; the main network's pass over every row is overwritten for those routed away
    assert scored["fallback"] == 4


@pytest.mark.parametrize(("path", "value", "needle"), [
    (("baseline", "every"), 0, "baseline.every 0 is outside 1..1000000"),  # a ZeroDivisionError every tick
    (("baseline", "horizon"), float("inf"), "OverflowError"),
    (("hidden",), [1 << 40, 8], "hidden[0] 1099511627776 is outside"),  # a tensor of terabytes
    (("temperature",), -1.0, "temperature -1.0 is not a positive number"),  # inverted probabilities
    (("temperature",), float("nan"), "temperature nan is not a positive number"),
    (("window",), 1, "window 1 is outside 2..100000"),
])
def test_a_model_file_with_sizes_no_model_can_have_is_refused(tmp_path: Path, tiny_model: RcaModel,
                                                               path: tuple[str, ...], value: object,
                                                               needle: str) -> None:
    import torch

    good = tmp_path / "m.pt"
    tiny_model.save(good)
    blob = torch.load(good, weights_only=True)
    target = blob["meta"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    torch.save(blob, good)
    with pytest.raises(ModelError, match="incomplete or inconsistent") as err:
        RcaModel.load(good)
    assert needle in str(err.value), str(err.value)


def test_a_file_damaged_inside_its_weights_is_refused(tmp_path: Path, tiny_model: RcaModel) -> None:
    """torch reads a model file without checking its checksums: bytes changed inside a tensor loaded, and every
    verdict was NaN (the daemon stored none, served NaN as JSON, and said RCA was on)."""
    import zipfile

    good = tmp_path / "good.pt"
    tiny_model.save(good)
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        entry = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    h = entry.header_offset  # the data follow the 30-byte local header, its name and its extra field
    start = h + 30 + int.from_bytes(raw[h + 26:h + 28], "little") + int.from_bytes(raw[h + 28:h + 30], "little")
    raw[start + 4:start + 12] = b"\xff" * 8
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ModelError) as err:
        RcaModel.load(bad)
    assert f"{bad}: damaged (a disk or copy error): its entry {entry.filename} fails its checksum" in str(err.value)


@pytest.mark.parametrize("edit,needle", [
    (lambda blob: blob["state"]["head.bias"].fill_(float("nan")), "weights head.bias hold NaN or infinite values"),
    (lambda blob: blob["meta"]["norm"]["std"].__setitem__(0, float("inf")), "normalisation holds NaN or infinite"),
    (lambda blob: blob["meta"].__setitem__("classes", list(range(len(blob["meta"]["classes"])))),
     "classes are not all names"),
    (lambda blob: blob["meta"]["features"].__setitem__(0, 7), "features are not all names"),
    (lambda blob: blob["meta"].__setitem__("metrics", {"validation": 0.9}), "metrics is not a mapping of mappings"),
    (lambda blob: blob["meta"].__setitem__("training", []), "training is not a mapping"),
])
def test_a_file_whose_values_no_trained_model_has_is_refused(tmp_path: Path, tiny_model: RcaModel,
                                                             edit: Callable[[dict], object], needle: str) -> None:
    """Such files loaded: NaN weights gave NaN verdicts; numbers as names failed the daemon's start with a
    traceback, metrics that are no mapping every GET /api/v1/verdicts."""
    import torch

    path = tmp_path / "m.pt"
    tiny_model.save(path)
    blob = torch.load(path, weights_only=True)
    edit(blob)
    torch.save(blob, path)
    with pytest.raises(ModelError, match="incomplete or inconsistent") as err:
        RcaModel.load(path)
    assert needle in str(err.value), str(err.value)
