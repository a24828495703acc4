"""The generic labeled dataset: ``metrics.csv`` + ``labels.csv`` in one directory, read, written and windowed.

``metrics.csv``: ``timestamp`` (unix seconds), ``entity``, then one numeric column per feature, one row
per entity per step.  ``labels.csv``: ``entity,start,end,cause``; a step at ``t`` carries ``cause`` when
``start <= t < end`` (a later row wins where labels overlap); time no label covers is ``healthy``.

Gaps: each entity is laid on a regular grid (the step is the median spacing of its timestamps), so a
missing step is a row of NaN at its own time and never shifts a window; empty cells are NaN too.  NaN is
carried forward inside each window with a missing indicator by :func:`sits_observe.rca.encoding.encode`.

Each window also carries the entity's own *baseline* at its last step (:func:`~.steps.rolling_baseline`: the
per-feature median of the preceding ``horizon`` steps, refreshed every ``every`` steps), the same
figure the daemon keeps from its store, so a model can tell "high for this host" from "high".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .csvfile import numeric, read_csv, require
from .steps import DEFAULT_BASELINE, Baseline, observed_columns, rolling_baseline
from .verdict import HEALTHY, UNKNOWN

__all__ = [
    "LABELS",
    "METRICS",
    "Dataset",
    "Entity",
    "Label",
    "Windows",
    "read",
]

METRICS = "metrics.csv"
LABELS = "labels.csv"
_HINT = f"a dataset directory holds {METRICS} and {LABELS}"
_ENTITY = "every row names the host (or other series) it belongs to"


@dataclass(frozen=True, slots=True)
class Label:
    entity: str
    start: float
    end: float
    cause: str


@dataclass(slots=True)
class Entity:
    """One entity's grid: ``values[i]`` is the step at ``t0 + i * step`` (NaN = not observed)."""

    name: str
    t0: float
    values: np.ndarray  # (T, F) float32

    def times(self, step: float) -> np.ndarray:
        return self.t0 + step * np.arange(len(self.values))


@dataclass(slots=True)
class Windows:
    """Windows over the concatenated entity grids: rows ``ends[k] - window + 1 .. ends[k]`` of ``data``."""

    data: np.ndarray  # (total steps, F) float32, NaN = missing
    base: np.ndarray  # (total steps, F) float32, the entity's baseline at each step
    ends: np.ndarray  # (M,) int64 row index of each window's last step
    y: np.ndarray  # (M,) object: the cause at the last step
    times: np.ndarray  # (M,) float64 timestamp of the last step
    window: int

    def __len__(self) -> int:
        return len(self.ends)

    def batch(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """Raw windows ``(len(idx), window, F)`` with NaN kept."""
        ends = self.ends if idx is None else self.ends[idx]
        rows = ends[:, None] + np.arange(1 - self.window, 1)[None, :]
        return self.data[rows]

    def bases(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """The baseline at each window's last step, ``(len(idx), F)``."""
        return self.base[self.ends if idx is None else self.ends[idx]]

    def steps_where(self, flag: np.ndarray) -> np.ndarray:
        """``(M,)``: how many steps of each window have ``flag`` (one bool per row of ``data``) set."""
        count = np.concatenate([[0], np.cumsum(flag)])  # count[i + 1]: flagged rows among 0..i
        return count[self.ends + 1] - count[self.ends + 1 - self.window]

    def subset(self, mask: np.ndarray) -> Windows:
        return Windows(self.data, self.base, self.ends[mask], self.y[mask], self.times[mask], self.window)


@dataclass(slots=True)
class Dataset:
    features: tuple[str, ...]
    step: float
    entities: list[Entity]
    labels: list[Label]
    path: str = ""

    def causes(self, entity: Entity) -> np.ndarray:
        """The cause of every step of ``entity`` (object array of str)."""
        t = entity.times(self.step)
        out = np.full(len(t), HEALTHY, dtype=object)
        for lab in self.labels:
            if lab.entity == entity.name:
                out[(t >= lab.start) & (t < lab.end)] = lab.cause
        return out

    def near_boundary(self, entity: Entity, margin: int) -> np.ndarray:
        """Steps within ``margin`` steps after a label starts or ends (transition, not scored)."""
        t = entity.times(self.step)
        out = np.zeros(len(t), dtype=bool)
        for lab in self.labels:
            if lab.entity == entity.name:
                for edge in (lab.start, lab.end):
                    out |= (t >= edge) & (t < edge + margin * self.step)
        return out

    def after_fault(self, win: Windows) -> np.ndarray:
        """Of ``win`` (made by :meth:`windows` of this dataset), the healthy windows that still hold steps
        of a fault that has ended: its after-effects (a queue draining, a die cooling) may still show."""
        faulty = np.concatenate([np.zeros(0, bool), *(self.causes(e) != HEALTHY for e in self.entities)])
        return (win.y == HEALTHY) & (win.steps_where(faulty) > 0)

    def classes(self) -> list[str]:
        """``healthy`` first, then every cause in the labels, sorted."""
        return [HEALTHY] + sorted({lab.cause for lab in self.labels} - {HEALTHY})

    def windows(self, window: int, stride: int = 1, margin: int = 0, baseline: Baseline = DEFAULT_BASELINE) -> Windows:
        """Every ``stride``-th window whose last step was observed, at most half of whose steps are
        missing, and whose last step is not within ``margin`` steps after a label boundary (observed:
        :func:`observed_columns`, as the daemon decides which windows to classify).  The daemon also passes over a
        window without GPU readings on its last step or on most steps (its GPU source down); generated datasets have
        none, a dataset of a real host's metrics with NVML gaps is trained and scored on them too."""
        if window < 2:
            raise ConfigError(f"window: must be at least 2 steps, got {window}")
        data, base, ends, ys, ts = [], [], [], [], []
        offset = 0
        observed = observed_columns(self.features)
        for ent in self.entities:
            vals = ent.values
            n = len(vals)
            if n >= window:
                row_seen = ~np.isnan(vals[:, observed]).all(axis=1)
                seen_in_window = np.convolve(row_seen.astype(np.int64), np.ones(window, np.int64))[window - 1:n]
                local = np.arange(window - 1, n)
                ok = row_seen[local] & (seen_in_window * 2 >= window)
                if margin:
                    ok &= ~self.near_boundary(ent, margin)[local]
                local = local[ok][::stride]
                ends.append(local + offset)
                ys.append(self.causes(ent)[local])
                ts.append(ent.times(self.step)[local])
            data.append(vals)
            base.append(rolling_baseline(vals, baseline))
            offset += n
        cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
        empty = np.zeros((0, len(self.features)), np.float32)
        return Windows(
            data=np.concatenate(data) if data else empty,
            base=np.concatenate(base) if base else empty,
            ends=cat(ends, np.int64).astype(np.int64),
            y=cat(ys, object).astype(object),
            times=cat(ts, np.float64),
            window=window,
        )


def _labels(path: Path, entities: Sequence[str]) -> list[Label]:
    """The labels of ``path``; each must name one of ``entities`` (those in metrics.csv)."""
    df = read_csv(path, _HINT)
    missing = [c for c in ("entity", "start", "end", "cause") if c not in df.columns]
    if missing:
        raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}; expected entity,start,end,cause")
    require(df["entity"], path, "entity", _ENTITY)
    se = numeric(df, ["start", "end"], path)
    known = set(entities)
    out = []
    for i, (ent, cause) in enumerate(zip(df["entity"], df["cause"])):
        start, end = (float(x) for x in se[i])
        if ent not in known:
            some = ", ".join(map(repr, entities[:3])) + (", ..." if len(entities) > 3 else "")
            raise ConfigError(f"{path}: line {i + 2}: entity {ent!r} is not in {METRICS} (it has {some}); "
                              "correct the name or remove the row")
        if not np.isfinite(start) or not np.isfinite(end) or end <= start:
            raise ConfigError(f"{path}: line {i + 2}: start must be before end, got {start!r}..{end!r}; "
                              "a label covers start <= t < end in unix seconds")
        if not isinstance(cause, str) or not cause.strip():
            raise ConfigError(f"{path}: line {i + 2}: cause is empty")
        if cause.strip() == UNKNOWN:
            raise ConfigError(f"{path}: line {i + 2}: cause {UNKNOWN!r} is reserved for the model's abstention; "
                              "name the cause, or leave the time unlabeled (healthy) or out of the dataset")
        out.append(Label(str(ent), start, end, cause.strip()))
    return out


def read(directory: str | Path) -> Dataset:
    """Read a dataset directory; bad files raise ConfigError naming the file, line, column and value."""
    d = Path(directory)
    path = d / METRICS
    df = read_csv(path, _HINT)
    if list(df.columns[:2]) != ["timestamp", "entity"] or len(df.columns) < 3:
        raise ConfigError(f"{path}: header must be timestamp,entity,<feature>..., got {','.join(df.columns[:3])}")
    features = tuple(df.columns[2:])
    ts = numeric(df, ["timestamp"], path)[:, 0]
    if np.isnan(ts).any():
        i = int(np.flatnonzero(np.isnan(ts))[0])
        raise ConfigError(f"{path}: line {i + 2}: timestamp is empty")
    vals = numeric(df, features, path).astype(np.float32)
    require(df["entity"], path, "entity", _ENTITY)
    ents = df["entity"].astype(str).to_numpy()
    diffs = [np.diff(np.unique(ts[ents == e])) for e in pd.unique(ents)]
    diffs = np.concatenate(diffs) if diffs else np.zeros(0)
    if not diffs.size:
        raise ConfigError(f"{path}: every entity needs at least two distinct timestamps to find the step")
    step = float(np.median(diffs))
    entities = []
    for name in pd.unique(ents):
        sel = ents == name
        t = ts[sel]
        order = np.argsort(t, kind="stable")
        if (same := np.flatnonzero(np.diff(t[order]) == 0)).size:  # one row would silently replace the other
            line, when = int(np.flatnonzero(sel)[order[same[0] + 1]]) + 2, float(t[order[same[0]]])
            raise ConfigError(f"{path}: line {line}: entity {name!r} has timestamp {when!r} twice; keep one row "
                              "per entity and timestamp")
        t0 = float(t.min())
        idx = np.rint((t - t0) / step).astype(np.int64)
        if int(idx.max()) + 1 > 10 * len(t) + 1000:  # a grid mostly of gaps: a stray timestamp, not data
            far = int(np.flatnonzero(sel)[int(np.argmax(t))])
            raise ConfigError(f"{path}: line {far + 2}: entity {name!r}: timestamp {float(ts[far])!r} is "
                              f"{int(idx.max())} steps of {step:g} s after its first for {len(t)} rows; "
                              "a timestamp in another unit (ms?) or of another entity")
        grid = np.full((int(idx.max()) + 1, len(features)), np.nan, dtype=np.float32)
        grid[idx] = vals[sel]  # two timestamps on one step (jitter): the later row wins
        entities.append(Entity(str(name), t0, grid))
    labels = _labels(d / LABELS, [e.name for e in entities])
    span = {e.name: (e.t0, e.t0 + step * (len(e.values) - 1)) for e in entities}  # first and last step
    if labels and not any(lab.start <= span[lab.entity][1] and lab.end > span[lab.entity][0] for lab in labels):
        lo, hi = min(a for a, _ in span.values()), max(b for _, b in span.values())  # all healthy, without a word
        raise ConfigError(f"{d / LABELS}: none of its {len(labels)} labels covers a step of {METRICS} (timestamps "
                          f"{lo:.0f} to {hi:.0f}): give start and end in its unit, seconds (not ms?)")
    return Dataset(features, step, entities, labels, str(d))
