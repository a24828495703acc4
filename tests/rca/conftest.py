"""Small synthetic datasets for the RCA tests: each cause lifts one feature for a while."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))  # in_thread

from sits_observe.rca.dataset import Dataset, Entity, Label
from sits_observe.rca.model import RcaModel
from sits_observe.rca.train import TrainOptions, train

CAUSES = ("cpu_contention", "thermal_throttling", "network_ingress")
# Feature names the SeriesStore computes, so a model trained here also runs on a real store.
FEATURES = ("host.cpu_utilization_ratio", "gpu.temperature_celsius.max", "stage.ingress.p99", "stage.e2e.p99")
BASE = np.array([0.3, 60.0, 0.002, 0.5], dtype=np.float32)


def synth(seed: int = 0, steps: int = 3000, entities: int = 2, features: Sequence[str] = FEATURES) -> Dataset:
    """Noise around ``BASE``; cause ``k`` raises feature ``k`` (and end-to-end latency) by half or more."""
    rng = np.random.default_rng(seed)
    ents, labels = [], []
    for e in range(entities):
        v = (BASE * rng.normal(1.0, 0.05, (steps, len(BASE)))).astype(np.float32)
        s = 80
        while s < steps - 150:
            dur, k = int(rng.integers(60, 140)), int(rng.integers(0, len(CAUSES)))
            v[s:s + dur, k] *= 1.8
            v[s:s + dur, 3] *= 1.5
            labels.append(Label(f"host{e}", 1000.0 + s, 1000.0 + s + dur, CAUSES[k]))
            s += dur + int(rng.integers(80, 200))
        ents.append(Entity(f"host{e}", 1000.0, v[:, :len(features)]))
    return Dataset(tuple(features), 1.0, ents, labels, "synthetic")


@pytest.fixture(name="synth")
def synth_fixture() -> Callable[..., Dataset]:
    return synth


@pytest.fixture(scope="session")
def tiny_model() -> RcaModel:
    return train(synth(), TrainOptions(window=16, epochs=10, hidden=(16, 8), batch=64, patience=10, stride=2, margin=5,
                                      threads=1))


def _untrained(features: tuple[str, ...], seed: int) -> RcaModel:
    import torch

    from sits_observe.rca.model import Normalizer

    torch.manual_seed(seed)
    ones = np.ones(len(features), dtype=np.float32)
    return RcaModel.new(features, ("healthy", "scheduler_stall"), 8, (6, 4), 0.0, Normalizer(ones, 0 * ones, ones))


@pytest.fixture
def untrained() -> Callable[[tuple[str, ...], int], RcaModel]:
    """A model with random weights (window 8, two classes, identity normalization) over ``features``."""
    return _untrained
