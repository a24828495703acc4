"""``rca dataset``: run the simulator under random faults and write the generic dataset format.

Each entity is one simulated host (``seed * 100 + k`` for entity ``k``) on the given topology and trace,
with ``Scenario.random`` faults (every class, random onset, duration, severity and target shard) plus
load surges laid over the whole run (hard negatives: they overlap healthy time and faults alike and are
never labeled).  Entity ``k`` replays the trace at ``rates[k % len(rates)]``; with ``bursty`` its arrivals
are also switched off and on (a two-state Markov chain per minute: off about a fifth of the time, on
minutes keep 30-100 % of their requests), so one trace yields many load levels and idle spells.  With
``vary`` each host also differs from the nominal box the way healthy hosts of one fleet differ
(:func:`draw_variation`): cooling, power limit, other CPU work, session-affine routing on half the
hosts, and its traffic's prompt and output lengths (each scaled by one log-uniform factor in [1/3, 3],
except that a third of the hosts answer briefly, their output factor drawn from [1/12, 1/3]).
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

from ..config import SimConfig
from ..store.config import StoreConfig
from ..frame import BucketLayout, Frame
from ..sim.faults import CAUSES, LOAD_SURGE, FaultSpec, Scenario
from ..sim.gpu import spec_for
from ..sim.host import SimulatedHost
from ..sim.shards import default_placement
from ..sim.trace import Trace
from ..sim.variation import NOMINAL, HostVariation
from ..store.series import SeriesStore
from ..topology import preset
from .dataset import Dataset, Entity, Label
from .features import FEATURES
from .writer import Writer

__all__ = ["SHIPPED_TRAIN", "GenOptions", "draw_variation", "generate", "simulated_host", "simulate"]

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
    vary: bool = False
    interval: float = 1.0


# The training set of the shipped model (models/README.md gives the command line).
SHIPPED_TRAIN = GenOptions(seed=1, hours=3.0, topology="nvswitch-8", trace="conv", severity=(0.5, 0.8), entities=32,
                           rates=(0.5, 0.8, 1.1, 1.4), bursty=True, vary=True)


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


def draw_variation(seed: int, topology: str) -> tuple[HostVariation, float, float]:
    """One host's departure from the nominal box, and its prompt and output length factors.

    The GPUs' full-power steady temperature lands uniformly in 60-85 C (below the 87 C slowdown, as on a
    warm but working box), half the hosts run a power limit of 60-95 % of TDP, other work takes 0-15 %
    of the CPUs, half route requests by session (prefix-cache affinity: 50-100 % of them go to their
    session's replica whatever its load, the rest to the least-loaded one).  Prompt and output lengths
    are each scaled by a log-uniform factor in [1/3, 3], except that a third of the hosts answer briefly
    (output factor in [1/12, 1/3]).  The routing and short-answer draws come from their own stream, so
    every other draw is the same as without them.
    """
    rng = np.random.default_rng([seed, 13])
    routing = np.random.default_rng([seed, 17])  # its own stream: the other draws stay as they were
    spec = spec_for(preset(topology).gpus[0].model)
    inlet = float(rng.uniform(-6.0, 8.0))
    full = float(rng.uniform(60.0, 85.0))
    var = HostVariation(
        inlet_offset=round(inlet, 2),
        resistance_scale=round(max(0.3, (full - spec.inlet - inlet) / (spec.resistance * spec.tdp)), 3),
        power_limit=round(float(rng.uniform(0.6, 0.95)), 3) if rng.random() < 0.5 else 1.0,
        background_cpu=round(float(rng.uniform(0.0, 0.15)), 3),
        affinity=round(float(routing.uniform(0.5, 1.0)), 3) if routing.random() < 0.5 else 0.0,
    )
    prompt, output = np.exp(rng.uniform(np.log(1 / 3), np.log(3.0), 2))
    if routing.random() < 1 / 3:  # a short-answer application: few requests in flight at a time
        output = float(np.exp(routing.uniform(np.log(1 / 12), np.log(1 / 3))))
    return var, float(prompt), float(output)


def _trace_variant(trace: str, seed: int, path: Path, bursty: bool, prompt_scale: float, output_scale: float
                   ) -> str:
    """Write ``trace`` to ``path`` (same CSV format) with on/off modulated arrivals if ``bursty`` and
    prompt and output lengths scaled (within the trace's own range); returns the path."""
    tr = Trace.load(trace)
    rng = np.random.default_rng([seed, 11])
    keep = np.ones(len(tr.offsets), dtype=bool)
    if bursty:
        minute = (tr.offsets // 60).astype(np.int64)
        on = np.empty(int(minute.max()) + 1, dtype=bool)
        state = True
        for m in range(len(on)):
            state = (rng.random() >= 0.12) if state else (rng.random() < 0.5)
            on[m] = state
        keep_share = np.where(on, rng.uniform(0.3, 1.0, len(on)), 0.0)
        keep = rng.random(len(tr.offsets)) < keep_share[minute]
    prompt = np.clip(np.round(tr.prompt[keep] * prompt_scale), 1, tr.prompt.max()).astype(np.int64)
    output = np.clip(np.round(tr.output[keep] * output_scale), 1, tr.output.max()).astype(np.int64)
    stamps = np.datetime64("2023-11-16T00:00:00", "ns") + (tr.offsets[keep] * 1e9).astype("timedelta64[ns]")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{t},{p},{o}" for t, p, o in zip(stamps.astype(str), prompt, output)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def simulated_host(seed: int, opts: GenOptions, layout: BucketLayout, rate: float = 1.0,
                   trace_path: str | None = None, variation: HostVariation = NOMINAL) -> SimulatedHost:
    """The simulated host of entity ``seed``, with its random faults and surges, binning into ``layout``."""
    cfg = SimConfig(topology=opts.topology, trace=opts.trace, seed=seed, rate=rate, trace_path=trace_path)
    return SimulatedHost(cfg, layout, scenario=_scenario(seed, opts), variation=variation)


def simulate(seed: int, opts: GenOptions, name: str, rate: float = 1.0, trace_path: str | None = None,
             variation: HostVariation = NOMINAL) -> tuple[Entity, list[Label]]:
    """One simulated host: its feature grid and the labels from its fault log."""
    layout = BucketLayout(StoreConfig().snapped())  # the daemon's default store.buckets (checks.other_buckets)
    host = simulated_host(seed, opts, layout, rate, trace_path, variation)
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
    """Simulate ``opts.entities`` hosts, write the dataset to ``out`` and return a summary.  Each entity's rows
    are written as it finishes (:class:`~.writer.Writer`), so memory is that of one entity whatever their number."""
    t0 = time.perf_counter()
    labels: list[Label] = []
    hosts: dict[str, dict[str, Any]] = {}
    steps = 0
    with (tempfile.TemporaryDirectory(prefix="sits-rca-trace-") as tmp,
          Writer(out, FEATURES, opts.interval) as w):
        for k in range(opts.entities):
            seed = opts.seed * 100 + k
            rate = opts.rates[k % len(opts.rates)]
            var, prompt, output = draw_variation(seed, opts.topology) if opts.vary else (NOMINAL, 1.0, 1.0)
            path = (_trace_variant(opts.trace, seed, Path(tmp) / f"{seed}.csv", opts.bursty, prompt, output)
                    if opts.bursty or opts.vary else None)
            name = f"{opts.topology}-{opts.trace}-s{seed}"
            ent, labs = simulate(seed, opts, name, rate, path, var)
            w.add(ent)
            steps += len(ent.values)
            labels += labs
            if opts.vary:
                hosts[name] = {**asdict(var), "prompt_scale": round(prompt, 3), "output_scale": round(output, 3)}
        summary = {
            "out": str(out), "options": asdict(opts), "steps": steps,
            "features": len(FEATURES), "buckets": list(StoreConfig().snapped()),  # the layout its quantiles come from
            "labels": {c: sum(1 for lab in labels if lab.cause == c)
                       for c in Dataset(FEATURES, opts.interval, [], labels).classes()[1:]},
            "seconds": round(time.perf_counter() - t0, 1), **({"hosts": hosts} if hosts else {}),
        }
        w.commit(labels, {"generated.json": json.dumps(summary, indent=2, sort_keys=True) + "\n"})  # one set
    return summary
