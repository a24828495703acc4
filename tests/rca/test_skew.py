"""Train/serve agreement: for one simulated host, the windows, baselines and probabilities the daemon's RCA engine
classifies are the ones ``rca dataset`` + :meth:`Dataset.windows` (training) and ``model_proba`` (``rca eval``) use."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sits_observe.clock import SimClock
from sits_observe.config import parse
from sits_observe.store.config import DEFAULT_BUCKETS
from sits_observe.daemon import Daemon
from sits_observe.frame import GPU_FIELD_INDEX, Frame
from sits_observe.rca import dataset
from sits_observe.rca.dataset import Dataset, Entity
from sits_observe.rca.steps import Baseline
from sits_observe.rca.engine import RcaEngine
from sits_observe.rca.evaluate import model_proba
from sits_observe.rca.features import FEATURES, OPTIONAL_GROUPS
from sits_observe.rca.generate import T0, GenOptions, generate, simulated_host
from sits_observe.rca.model import RcaModel
from sits_observe.sim.host import SimulatedHost

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "rca-lstm.pt"
PER_PROCESS = sorted(OPTIONAL_GROUPS[0])  # NVML's per-process fields: absent with DCGM
Seen = list[tuple[float, np.ndarray, np.ndarray, str]]


class Recording(RcaEngine):
    """The engine as the daemon runs it, keeping what each classification was given and which network scored it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: Seen = []

    def classify(self, raw: np.ndarray, base: np.ndarray, ts: float, trigger: str, store: Any = None) -> Any:
        v = super().classify(raw, base, ts, trigger, store)
        self.seen.append((ts, raw.copy(), base.copy(), v.network))
        return v


class Shaped:
    """The simulated host as a daemon source, with its data withheld on the ticks ``off`` (the simulator still
    advances: a source that answered nothing) and without the GPU fields ``strip`` (a host without them)."""

    name = "sim"

    def __init__(self, host: SimulatedHost, off: range = range(0), strip: tuple[str, ...] = ()) -> None:
        self.host, self.off, self.strip, self.ticks = host, off, strip, 0

    def collect(self, frame: Frame) -> None:
        self.ticks += 1
        self.host.collect(Frame(ts=frame.ts, interval=frame.interval) if self.ticks in self.off else frame)
        if frame.gpu is not None:
            frame.gpu.values[:, [GPU_FIELD_INDEX[f.split(".")[1]] for f in self.strip]] = np.nan


def _run(tmp_path: Path, model: Path, ticks: int, history: int, source: Callable[[Daemon], Any],
         buckets: list[float] | None = None) -> tuple[Daemon, Recording, np.ndarray]:
    """Tick a daemon with the RCA engine classifying every tick; also the store's feature row of every tick."""
    store: dict[str, Any] = {"history": history} | ({"buckets": buckets} if buckets else {})
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "sim"}, "store": store,
                 "rca": {"model": str(model), "every_ticks": 1, "burn_every_ticks": 1}}, env={})
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 1.0, start=T0))  # the generator's clock: T0 + 1, T0 + 2, ...
    daemon.sources.append(source(daemon))
    engine = Recording(cfg.rca, cfg.state_dir, tick_seconds=1.0)
    daemon.consumers.append(engine)
    rows = []
    for _ in range(ticks):
        daemon.tick()
        rows.append(daemon.store.window(FEATURES, 1)[0])
    engine.close()
    return daemon, engine, np.asarray(rows, dtype=np.float32)


def _same(a: np.ndarray, b: np.ndarray, rtol: float) -> None:
    assert a.shape == b.shape
    assert (np.isnan(a) == np.isnan(b)).all()
    np.testing.assert_allclose(a, b, rtol=rtol, atol=0)


@pytest.mark.parametrize("strip", [(), tuple(PER_PROCESS)], ids=["every-feature", "no-per-process-fields"])
def test_the_daemon_classifies_what_training_and_eval_read_with_the_shipped_model(tmp_path: Path,
                                                                                 strip: tuple[str, ...]) -> None:
    """150 ticks of one simulated host (3 baseline refreshes): the dataset ``rca dataset`` writes and the daemon's
    store agree tick by tick (the CSV keeps 6 digits), and so do the windows, baselines, the network each window
    goes to (the fallback where a whole optional group is missing) and the shipped model's probabilities."""
    opts = GenOptions(seed=2, hours=150 / 3600)
    generate(tmp_path / "ds", opts)
    ds = dataset.read(tmp_path / "ds")
    for f in strip:  # the same host without these fields: empty columns in its dataset
        ds.entities[0].values[:, ds.features.index(f)] = np.nan
    model = RcaModel.load(SHIPPED)
    cols = model.columns(ds.features)
    _, engine, rows = _run(tmp_path, SHIPPED, 150, 3600,
                           lambda d: Shaped(simulated_host(opts.seed * 100, opts, d.layout), strip=strip))
    _same(ds.entities[0].values, rows, 1e-5)

    win = ds.windows(model.window, baseline=model.baseline)
    assert [s[0] for s in engine.seen] == list(win.times) and len(win) == 150 - model.window + 1
    raw, base = np.stack([s[1] for s in engine.seen]), np.stack([s[2] for s in engine.seen])
    _same(win.batch()[..., cols], raw.astype(np.float32), 1e-5)
    _same(win.bases()[:, cols], base, 1e-5)
    assert {s[3] for s in engine.seen} == {"fallback" if strip else "main"}
    served, trained = model.proba(raw, base), model_proba(model, win, cols)
    assert np.abs(served - trained).max() < 1e-3
    assert (model.decide(served, 0.91, 0.6) == model.decide(trained, 0.91, 0.6)).all()


def test_baseline_cadence_horizon_and_ticks_without_data_are_those_of_training(
        tmp_path: Path, untrained: Callable[[tuple[str, ...], int], RcaModel]) -> None:
    """A baseline of 60 ticks refreshed every 7 over a ring of 60 (its horizon, as the defaults: 3600 and 3600),
    and a source that answers nothing for 13 ticks, whose rows then hold only rates (0): the engine classifies
    exactly the windows :meth:`Dataset.windows` makes of the same rows, with the same baselines."""
    model = dataclasses.replace(untrained(FEATURES, 0), baseline=Baseline(horizon=60, every=7))
    path = tmp_path / "m.pt"
    model.save(path)
    opts = GenOptions(seed=3, hours=1.0)
    _, engine, rows = _run(tmp_path, path, 150, 60,
                           lambda d: Shaped(simulated_host(300, opts, d.layout), off=range(40, 53)))
    rates = np.array([f.endswith(".rate") for f in FEATURES])
    assert np.isnan(rows[45, ~rates]).all() and (rows[45, rates] == 0).all()

    win = Dataset(FEATURES, 1.0, [Entity("h", T0 + 1, rows)], []).windows(model.window, baseline=model.baseline)
    assert [s[0] for s in engine.seen] == list(win.times)
    assert not {T0 + t for t in range(40, 53)} & set(win.times)  # no window ends on a tick without data
    _same(win.batch(), np.stack([s[1] for s in engine.seen]).astype(np.float32), 0)
    _same(win.bases(), np.stack([s[2] for s in engine.seen]), 1e-6)


@pytest.mark.parametrize(("buckets", "warned"), [(None, False), (sorted({*DEFAULT_BUCKETS, 0.3}), True),
                                                 ([0.001, 0.01, 0.1, 1.0, 10.0], True)])
def test_store_buckets_other_than_trainings_are_one_warning(tmp_path: Path, tiny_model: RcaModel,
                                                           caplog: pytest.LogCaptureFixture,
                                                           buckets: list[float] | None, warned: bool) -> None:
    """Latency quantiles are interpolated within the store's buckets: with other ``store.buckets`` than the
    default ones ``rca dataset`` bins with, the model's quantile features are not those it was trained on."""
    path = tmp_path / "m.pt"
    tiny_model.save(path)
    opts = GenOptions(seed=2, hours=1.0)
    with caplog.at_level(logging.WARNING, logger="sits_observe.rca"):
        _, engine, _ = _run(tmp_path, path, 40, 3600, lambda d: simulated_host(200, opts, d.layout), buckets)
    said = [r.message for r in caplog.records if "store.buckets differ" in r.message]
    assert engine.seen and len(said) == int(warned)
    if warned:
        assert "2 latency quantile features" in said[0] and ("lacks" in said[0]) == (len(buckets or ()) < 10)
