"""``rca dataset``: run the simulator under random faults and write the generic dataset format.

Each entity is one simulated host (``seed * 100 + k`` for entity ``k``) on the given topology and trace,
with ``Scenario.random`` faults (every class, random onset, duration, severity and target shard) plus
load surges laid over the whole run (hard negatives: they overlap healthy time and faults alike and are
never labeled).  Entity ``k`` replays the trace at ``rates[k % len(rates)]``; with ``bursty`` its arrivals
are also switched off and on (a two-state Markov chain per minute: off about a fifth of the time, on
minutes keep 30-100 % of their requests), so one trace yields many load levels and idle spells.
Frames go into a SeriesStore and the features are read back with ``store.window(FEATURES, ...)``,
exactly as the daemon reads them; labels come from the simulator's fault log (ground truth, on the
source clock).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import SimConfig, StoreConfig
from ..frame import BucketLayout, Frame
from ..sim.faults import CAUSES, LOAD_SURGE, FaultSpec, Scenario
from ..sim.host import SimulatedHost
from ..sim.shards import default_placement
from ..sim.trace import Trace
from ..store.series import SeriesStore
from ..topology import preset
from . import dataset
from .dataset import Dataset, Entity, Label
from .features import FEATURES

__all__ = ["SHIPPED_TRAIN", "GenOptions", "generate", "simulate"]

T0 = 1_700_000_000.0  # source-clock start of every entity (the simulator's clock, not wall time)
CHUNK = 2048  # ticks simulated between feature reads (the store keeps 2 * CHUNK)


@dataclass(frozen=True)
class GenOptions:
    seed: int = 1
    hours: float = 2.0
    topology: str = "nvswitch-8"
    trace: str = "conv"
    severity: tuple[float, float] = (0.5, 1.0)
    entities: int = 1
    surges_per_hour: float = 1.5
    rates: tuple[float, ...] = (1.0,)
    bursty: bool = False
    interval: float = 1.0


# The training set of the shipped model (models/README.md gives the command line).
SHIPPED_TRAIN = GenOptions(seed=1, hours=3.0, topology="nvswitch-8", trace="conv", severity=(0.5, 0.8), entities=16,
                           rates=(0.5, 0.8, 1.1, 1.4), bursty=True)


def _scenario(seed: int, opts: GenOptions) -> Scenario:
    """``Scenario.random`` with the fault kinds dealt from shuffled rounds of every cause (so each class
    gets its share even in a short run), plus load surges at random times."""
    sc = Scenario.random(seed, opts.hours, opts.topology, severity_range=opts.severity)
    rng = np.random.default_rng([seed, 7])
    shards = [p.id for p in default_placement(preset(opts.topology))]
    deck: list[str] = []
    faults = []
    for f in sc.faults:
        if f.kind == LOAD_SURGE:
            continue
        if not deck:
            deck = [str(k) for k in rng.permutation(CAUSES)]
        kind = deck.pop()
        target = {} if kind == "network_ingress" else {"shard": f.target.shard or str(rng.choice(shards))}
        faults.append(FaultSpec(**{**f.model_dump(), "kind": kind, "target": target}))
    end = opts.hours * 3600.0
    for onset in np.sort(rng.uniform(0, end, rng.poisson(opts.surges_per_hour * opts.hours))):
        faults.append(FaultSpec(kind=LOAD_SURGE, onset=round(float(onset), 1),
                                duration=round(float(rng.uniform(120, 600)), 1),
                                severity=round(float(rng.uniform(*opts.severity)), 3)))
    return sc.model_copy(update={"faults": sorted(faults, key=lambda f: f.onset)})


def _bursty_trace(trace: str, seed: int, path: Path) -> str:
    """Write ``trace`` with on/off modulated arrivals to ``path`` (same CSV format); returns the path."""
    tr = Trace.load(trace)
    rng = np.random.default_rng([seed, 11])
    minute = (tr.offsets // 60).astype(np.int64)
    on = np.empty(int(minute.max()) + 1, dtype=bool)
    state = True
    for m in range(len(on)):
        state = (rng.random() >= 0.12) if state else (rng.random() < 0.5)
        on[m] = state
    keep_share = np.where(on, rng.uniform(0.3, 1.0, len(on)), 0.0)
    keep = rng.random(len(tr.offsets)) < keep_share[minute]
    stamps = np.datetime64("2023-11-16T00:00:00", "ns") + (tr.offsets[keep] * 1e9).astype("timedelta64[ns]")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{t},{p},{o}" for t, p, o in zip(stamps.astype(str), tr.prompt[keep], tr.output[keep])]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def simulate(seed: int, opts: GenOptions, name: str, rate: float = 1.0, trace_path: str | None = None
             ) -> tuple[Entity, list[Label]]:
    """One simulated host: its feature grid and the labels from its fault log."""
    layout = BucketLayout(StoreConfig().snapped())
    cfg = SimConfig(topology=opts.topology, trace=opts.trace, seed=seed, rate=rate, trace_path=trace_path)
    host = SimulatedHost(cfg, layout, scenario=_scenario(seed, opts))
    store = SeriesStore(layout, history=2 * CHUNK)
    steps = round(opts.hours * 3600.0 / opts.interval)
    parts, pending = [], 0
    for i in range(steps):
        frame = Frame(ts=T0 + (i + 1) * opts.interval, interval=opts.interval)
        host.collect(frame)
        store.ingest(frame)
        pending += 1
        if pending == CHUNK or i == steps - 1:
            parts.append(store.window(FEATURES, pending))
            pending = 0
    values = np.concatenate(parts).astype(np.float32)
    labels = [Label(name, rec.start, rec.end, rec.cause) for rec in host.fault_log() if rec.kind != LOAD_SURGE]
    return Entity(name, T0 + opts.interval, values), labels


def generate(out: str | Path, opts: GenOptions) -> dict[str, Any]:
    """Simulate ``opts.entities`` hosts, write the dataset to ``out`` and return a summary."""
    t0 = time.perf_counter()
    ents, labels = [], []
    with tempfile.TemporaryDirectory(prefix="sits-rca-trace-") as tmp:
        for k in range(opts.entities):
            seed = opts.seed * 100 + k
            rate = opts.rates[k % len(opts.rates)]
            path = _bursty_trace(opts.trace, seed, Path(tmp) / f"{seed}.csv") if opts.bursty else None
            ent, labs = simulate(seed, opts, f"{opts.topology}-{opts.trace}-s{seed}", rate, path)
            ents.append(ent)
            labels += labs
    ds = Dataset(FEATURES, opts.interval, ents, labels, str(out))
    dataset.write(out, ds)
    summary = {
        "out": str(out), "options": asdict(opts), "steps": int(sum(len(e.values) for e in ents)),
        "features": len(FEATURES), "labels": {c: sum(1 for lab in labels if lab.cause == c) for c in ds.classes()[1:]},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (Path(out) / "generated.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
