"""Training regularizers: level dropout hides level inputs from a share of windows; optional-feature dropout
marks the features not every host has missing; weight averaging."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from sits_observe.cli import main
from sits_observe.rca import train as train_mod
from sits_observe.rca.dataset import Dataset, Entity
from sits_observe.rca.features import OPTIONAL_FEATURES, OPTIONAL_GROUPS
from sits_observe.rca.model import RcaNet
from sits_observe.rca.train import TrainOptions, idle, split, train

TINY = {"window": 16, "hidden": (8, 4), "batch": 64, "stride": 4, "margin": 5, "threads": 1}


def _inputs_seen(monkeypatch: pytest.MonkeyPatch, ds: Dataset, **opts: float) -> np.ndarray:
    """(windows, W, 3F) inputs of the training windows the net saw in one epoch with ``opts``."""
    seen: list[np.ndarray] = []
    forward = RcaNet.forward

    def spy(self: RcaNet, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            seen.append(x.numpy().copy())
        return forward(self, x)

    monkeypatch.setattr(RcaNet, "forward", spy)
    train(ds, TrainOptions(epochs=1, average_from=0, **opts, **TINY))  # type: ignore[arg-type]
    return np.concatenate(seen)


def _level_share_hidden(monkeypatch: pytest.MonkeyPatch, ds: Dataset, level_dropout: float) -> float:
    """Share of training windows whose level inputs (the first F) were all zero when the net saw them."""
    x = _inputs_seen(monkeypatch, ds, level_dropout=level_dropout)
    return float((x[:, :, :len(ds.features)] == 0).reshape(len(x), -1).all(1).mean())


def test_level_dropout_hides_the_levels_of_that_share_of_windows(monkeypatch: pytest.MonkeyPatch,
                                                                  synth: Callable[..., Dataset]) -> None:
    ds = synth(steps=1200)
    assert _level_share_hidden(monkeypatch, ds, 0.0) == 0.0
    assert 0.4 < _level_share_hidden(monkeypatch, ds, 0.5) < 0.6


def _missing_seen(monkeypatch: pytest.MonkeyPatch, ds: Dataset, optional_dropout: float,
                  fallback_dropout: float = 0.0) -> np.ndarray:
    """(windows, W, F) missing indicators (the last F inputs) of the training windows the nets saw."""
    x = _inputs_seen(monkeypatch, ds, optional_dropout=optional_dropout, fallback_dropout=fallback_dropout,
                     level_dropout=0.0)
    return x[:, :, 2 * len(ds.features):]


def test_optional_dropout_hides_each_group_together_for_whole_windows(
        monkeypatch: pytest.MonkeyPatch, synth: Callable[..., Dataset]) -> None:
    assert OPTIONAL_GROUPS == ({"gpu.serving_utilization_ratio.min", "gpu.serving_utilization_ratio.mean",
                                "gpu.foreign_utilization_ratio.max"},
                               {"gpu.backlog_utilization_ratio.min", "gpu.backlog_utilization_ratio.mean"})
    assert OPTIONAL_FEATURES == OPTIONAL_GROUPS[0] | OPTIONAL_GROUPS[1]
    base = synth(steps=1200)
    features = (*base.features, "gpu.serving_utilization_ratio.min", "gpu.foreign_utilization_ratio.max",
                "gpu.backlog_utilization_ratio.min")
    ds = Dataset(features, base.step, [Entity(e.name, e.t0, np.concatenate([e.values, e.values[:, :3]], axis=1))
                                       for e in base.entities], base.labels, "synthetic")
    assert not _missing_seen(monkeypatch, ds, 0.0).any()
    miss = _missing_seen(monkeypatch, ds, 0.4)
    assert (miss.min(axis=1) == miss.max(axis=1)).all()  # missing for the whole window or not at all
    assert not miss[:, :, :4].any()  # the other features are never hidden
    per_process, backlog = miss[:, 0, 4], miss[:, 0, 6]
    assert (per_process == miss[:, 0, 5]).all()  # a group goes together, as on a DCGM host
    assert 0.3 < per_process.mean() < 0.5 and 0.3 < backlog.mean() < 0.5
    both = (per_process * backlog).mean()  # each group on its own: a host may have one and not the other
    assert 0.5 * 0.16 < both < 1.5 * 0.16 and (per_process != backlog).any()
    # the defaults: the main network sees every window whole, the fallback network the same windows with the
    # groups hidden (its own epochs, after the main network's)
    seen = _missing_seen(monkeypatch, ds, 0.0, 0.4)
    main, fallback = seen[:len(seen) // 2], seen[len(seen) // 2:]
    assert not main.any() and 0.3 < fallback[:, 0, 6].mean() < 0.5
    # a dataset without optional features trains exactly as before (no random draws spent on them)
    torch.testing.assert_close(train(base, TrainOptions(epochs=1, **TINY)).net.state_dict(),
                               train(base, TrainOptions(epochs=1, optional_dropout=0.0, **TINY)).net.state_dict())


def test_accumulate_is_the_running_mean() -> None:
    states = [{"w": torch.tensor([float(i), 2.0 * i])} for i in (1, 2, 6)]
    avg: dict[str, torch.Tensor] = {}
    for n, s in enumerate(states, 1):
        train_mod._accumulate(avg, s, n)
    torch.testing.assert_close(avg["w"], torch.tensor([3.0, 6.0]))
    assert states[0]["w"][0] == 1.0  # the first state was copied, not aliased


def test_the_model_is_the_mean_of_the_averaged_epochs_weights(monkeypatch: pytest.MonkeyPatch,
                                                                 synth: Callable[..., Dataset]) -> None:
    ds = synth(steps=1200)
    folded: list[dict[str, torch.Tensor]] = []
    accumulate = train_mod._accumulate

    def spy(average: dict[str, torch.Tensor], state: dict[str, torch.Tensor], n: int) -> None:
        folded.append({k: v.detach().clone() for k, v in state.items()})
        accumulate(average, state, n)

    monkeypatch.setattr(train_mod, "_accumulate", spy)
    averaged = train(ds, TrainOptions(epochs=4, average_from=2, patience=1, **TINY))
    assert averaged.training["epochs_run"] == 4 and averaged.training["averaged_epochs"] == [2, 4]
    assert len(folded) == 3  # epochs 2, 3, 4, whatever the validation loss did
    for name, value in averaged.net.state_dict().items():
        torch.testing.assert_close(value, torch.stack([s[name] for s in folded]).mean(0))
    assert any(not torch.equal(folded[-1][k], v) for k, v in averaged.net.state_dict().items())
    folded.clear()
    stopped = train(ds, TrainOptions(epochs=4, average_from=0, **TINY))
    assert stopped.training["averaged_epochs"] is None and not folded


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("--level-dropout", "1.5", "argument --level-dropout: must be a number in [0, 1), got '1.5'"),
    ("--optional-dropout", "-0.1", "argument --optional-dropout: must be a number in [0, 1), got '-0.1'"),
    ("--average-from", "-1", "argument --average-from: must be an integer >= 0, got '-1'"),
])
def test_bad_regularizer_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str,
                                                  value: str, needle: str) -> None:
    with pytest.raises(SystemExit) as stop:  # refused while parsing the command line
        main(["rca", "train", "--dataset", str(tmp_path), option, value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_idle_windows_of_request_causes_are_left_out_of_training(monkeypatch: pytest.MonkeyPatch,
                                                                 synth: Callable[..., Dataset]) -> None:
    base = synth(steps=1200)
    ents = []
    for e in base.entities:
        running = np.full((len(e.values), 1), 5.0, np.float32)
        running[300:700] = 0.0  # an idle stretch: no request in flight
        ents.append(Entity(e.name, e.t0, np.concatenate([e.values, running], axis=1)))
    ds = Dataset((*base.features, "workload.running_requests.sum"), base.step, ents, base.labels, "synthetic")
    win = ds.windows(TINY["window"], TINY["stride"], TINY["margin"])
    step = win.ends % 1200  # each entity has 1200 steps
    quiet = idle(win, ds.features)
    assert (quiet == ((step - TINY["window"] + 1 >= 300) & (step < 700))).all() and quiet.any()
    assert not idle(base.windows(16, 4, 5), base.features).any()  # no activity feature: nothing is idle
    blind = Dataset(ds.features, ds.step, [Entity(e.name, e.t0, e.values.copy()) for e in ds.entities], ds.labels, "x")
    for e in blind.entities:
        e.values[:, -1] = np.nan  # activity never observed: unknown, not idle
    assert not idle(blind.windows(TINY["window"], TINY["stride"], TINY["margin"]), blind.features).any()
    tr, _ = split(win, TrainOptions().val_every)
    y = np.asarray(win.y)
    dropped = int((tr & quiet & (y == "network_ingress")).sum())
    assert dropped > 0 and (tr & quiet & (y != "network_ingress")).any()  # idle windows of other labels stay
    seen = {causes: len(_inputs_seen(monkeypatch, ds, request_causes=causes, level_dropout=0.0))
            for causes in ((), ("network_ingress",))}
    assert seen[()] - seen[("network_ingress",)] == dropped  # only the idle windows of that cause
