"""``sits-observe rca dataset|train|eval``."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..argtypes import FRACTION, NON_NEGATIVE_INT, POSITIVE_INT, PROBABILITY, THREADS, float_in, int_at_least
from ..errors import ConfigError, ModelError
from ..interrupts import sigterm_unwinds
from .args import MAX_HOURS, MIN_HOURS, check_out, hidden_pair, host_topology, name_list, rate_list, severity_range
from .config import HEALTHY_MIN_CONFIDENCE, MAX_WIDTH, MIN_CONFIDENCE, SHIPPED_MODEL
from .floors import Floors, parse_floors

__all__ = ["register"]


@contextmanager
def _named_by_user() -> Iterator[None]:
    """A ModelError about a file named on this command line is the user's mistake: a usage error (exit 2).
    (The daemon, loading its model from config, logs the same error and runs on without classification.)"""
    try:
        yield
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc


def register(sub: Any) -> None:
    rca = sub.add_parser("rca", help="root-cause classifier: generate data, train, evaluate")
    cmds = rca.add_subparsers(dest="rca_command", required=True)

    d = cmds.add_parser("dataset", help="simulate a host with random faults; write metrics.csv + labels.csv")
    d.add_argument("--out", required=True, help="dataset directory to write")
    d.add_argument("--seed", type=NON_NEGATIVE_INT, default=1)
    d.add_argument("--force", action="store_true", help="replace a dataset already in --out")
    d.add_argument("--hours", type=float_in(MIN_HOURS, MAX_HOURS), default=2.0,
                   help=f"simulated hours per entity (at most {MAX_HOURS:g}; add --entities for more data)")
    d.add_argument("--topology", type=host_topology, default="nvswitch-8", help="nvswitch-8 or pcie-8")
    d.add_argument("--trace", choices=("conv", "code"), default="conv", help="Azure LLM trace to replay")
    d.add_argument("--severity", type=severity_range, default=(0.5, 1.0),
                   help="fault severity range LOW,HIGH, within (0, 1]")
    d.add_argument("--entities", type=POSITIVE_INT, default=1, help="independent simulated hosts (seeds seed*100+k)")
    d.add_argument("--rates", type=rate_list, default=(1.0,), help="request-rate multipliers, one per entity in turn")
    d.add_argument("--bursty", action="store_true", help="switch each entity's arrivals off and on by the minute")
    d.add_argument("--vary", action="store_true",
                   help="vary each entity's cooling, power limit, CPU load, request routing and prompt/output lengths "
                        "like a fleet's hosts")
    d.set_defaults(func=_dataset)

    t = cmds.add_parser("train", help="train the LSTM on a dataset directory")
    t.add_argument("--dataset", required=True, help="dataset directory (metrics.csv, labels.csv)")
    t.add_argument("--out", required=True,  # no default: an experiment must not replace the model daemons load
                   help=f"model file to write (the shipped one, which daemons without rca.model load: {SHIPPED_MODEL})")
    t.add_argument("--force", action="store_true", help="replace a model file already at --out")
    t.add_argument("--window", type=int_at_least(2), help="steps per window (default 64)")
    t.add_argument("--epochs", type=POSITIVE_INT,
                   help="epochs (default 12); without averaging, early stopping may end sooner")
    t.add_argument("--hidden", type=hidden_pair, help="LSTM hidden sizes H1,H2 (default 96,48)")
    t.add_argument("--dropout", type=FRACTION, help="dropout between layers and before the head (default 0.3)")
    t.add_argument("--summary", type=int_at_least(0, MAX_WIDTH),
                   help="width of the window-statistics layer beside the LSTMs (default 64); 0 = none")
    t.add_argument("--level-dropout", type=FRACTION,
                   help="share of training windows whose level inputs are hidden (default 0.5)")
    t.add_argument("--optional-dropout", type=FRACTION,
                   help="share of training windows in which each group of the features not every host has (NVML "
                        "per-process fields; servers' backlogs) is marked missing (default 0)")
    t.add_argument("--fallback-dropout", type=FRACTION,
                   help="train a second network with that share instead, for windows lacking a group of those "
                        "features (default 0.25); 0 = none")
    t.add_argument("--request-causes", type=name_list,
                   help="causes that act on requests: their windows with no request in flight are left out of "
                        "training (default network_ingress,scheduler_stall,gpu_memory_pressure; '' = none)")
    t.add_argument("--relative-only", type=name_list,
                   help="features the network sees only against the host's own baseline, never as levels "
                        "(default gpu.sm_clock_hertz.mean: a busy GPU's clock depends on its model; '' = none)")
    t.add_argument("--average-from", type=NON_NEGATIVE_INT,
                   help="average the weights of this epoch to the last (default 4); 0 = early stopping instead")
    t.add_argument("--stride", type=POSITIVE_INT, help="train on every N-th window (default 8)")
    t.add_argument("--batch", type=POSITIVE_INT, help="windows per optimizer step (default 256)")
    t.add_argument("--margin", type=NON_NEGATIVE_INT,
                   help="steps after a label edge left out as transition (default 10)")
    t.add_argument("--seed", type=NON_NEGATIVE_INT, help="random seed (default 0)")
    t.add_argument("--threads", type=THREADS, help="CPU threads for torch, 1-64 (default 2)")
    t.set_defaults(func=_train)

    e = cmds.add_parser("eval", help="score the model and two baselines on a dataset")
    e.add_argument("--model", default=str(SHIPPED_MODEL), help="model file")
    e.add_argument("--dataset", required=True, help="test dataset directory")
    e.add_argument("--train", help="dataset to fit the baselines on (default: the model's training data)")
    e.add_argument("--min-confidence", type=parse_floors, default=Floors.of(MIN_CONFIDENCE),
                   help=f"a fault cause below this is `unknown`: one floor (default {MIN_CONFIDENCE}) or floors per "
                        "cause (default=0.91,thermal_throttling=0.95), as rca.min_confidence")
    e.add_argument("--healthy-min-confidence", type=PROBABILITY, default=HEALTHY_MIN_CONFIDENCE,
                   help=f"a healthy verdict below this is `unknown` (default {HEALTHY_MIN_CONFIDENCE}, "
                        "as rca.healthy_min_confidence)")
    e.add_argument("--threads", type=THREADS, default=2, help="CPU threads, 1-64")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=_eval)


def _dataset(args: argparse.Namespace) -> int:
    import logging

    from .generate import GenOptions, generate

    logging.getLogger("sits_observe.sim").setLevel(logging.WARNING)  # fault start/end lines per entity

    if not args.out:  # Path("") is "." (the working directory): it was written into
        raise ConfigError("--out: empty; give a path")
    check_out(Path(args.out), directory=True, force=args.force)
    opts = GenOptions(seed=args.seed, hours=args.hours, topology=args.topology, trace=args.trace,
                      severity=args.severity, entities=args.entities, rates=args.rates, bursty=args.bursty,
                      vary=args.vary)
    with sigterm_unwinds():  # its trace copies in /tmp and NAME.tmp files removed
        summary = generate(args.out, opts)
    print(json.dumps(summary, sort_keys=True))
    return 0


def _train(args: argparse.Namespace) -> int:
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import dataset
    from .train import TrainOptions, networks, train

    names = ("window", "epochs", "hidden", "dropout", "summary", "level_dropout", "optional_dropout",
             "fallback_dropout", "average_from", "stride", "batch", "margin", "seed", "threads", "request_causes",
             "relative_only")
    given = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    check_out(Path(args.out), directory=False, force=args.force, dataset=Path(args.dataset))
    ds = dataset.read(args.dataset)
    unknown = [c for c in given.get("request_causes", ()) if c not in ds.classes()]
    if unknown:
        raise ConfigError(f"--request-causes: {', '.join(map(repr, unknown))} "
                          f"{'are not causes' if len(unknown) > 1 else 'is not a cause'} in "
                          f"{Path(args.dataset) / dataset.LABELS} (it has {', '.join(ds.classes()[1:]) or 'none'}); "
                          "name causes from it, or '' for none")
    foreign = [f for f in given.get("relative_only", ()) if f not in ds.features]
    if foreign:
        raise ConfigError(f"--relative-only: {', '.join(map(repr, foreign))} "
                          f"{'are not features' if len(foreign) > 1 else 'is not a feature'} of "
                          f"{Path(args.dataset) / dataset.METRICS}; name its columns, or '' for none")
    opts = replace(TrainOptions(), **given)
    cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}")]
    err = Console(stderr=True)
    with Progress(*cols, console=err, disable=not err.is_terminal) as bar:
        task = bar.add_task("epoch 1", total=None, info="")
        epochs = opts.epochs * networks(ds.features, opts)  # the fallback network's epochs follow the main one's

        def report(epoch: int, done: int, total: int, info: dict[str, float]) -> None:
            text = "  ".join(f"{k} {v:.4f}" for k, v in info.items())
            bar.update(task, description=f"epoch {epoch}/{epochs}", completed=done, total=total,
                       **({"info": text} if text else {}))
            if info and not err.is_terminal:
                print(f"epoch {epoch}: {text}", file=sys.stderr)

        model = train(ds, opts, report)
    model.training["command"] = (
        f"sits-observe rca train --dataset {args.dataset} --out {args.out}{' --force' if args.force else ''} "
        f"--window {opts.window} "
        f"--epochs {opts.epochs} --hidden {opts.hidden[0]},{opts.hidden[1]} --dropout {opts.dropout} "
        f"--summary {opts.summary} --level-dropout {opts.level_dropout} --optional-dropout {opts.optional_dropout} "
        f"--fallback-dropout {opts.fallback_dropout} "
        f"--average-from {opts.average_from} --request-causes '{','.join(opts.request_causes)}' "
        f"--relative-only '{','.join(opts.relative_only)}' "
        f"--stride {opts.stride} --batch {opts.batch} --margin {opts.margin} --seed {opts.seed} "
        f"--threads {opts.threads}")
    model.save(args.out)
    val, run = model.metrics["validation"], model.training
    kept = (f"weights averaged over epochs {run['averaged_epochs'][0]}-{run['averaged_epochs'][1]}"
            if run["averaged_epochs"] else f"best epoch {run['best_epoch']}/{run['epochs_run']}")
    print(f"wrote {args.out}: validation macro-F1 {val['macro_f1']:.4f}, healthy FP rate "
          f"{val['healthy_fp_rate']:.4f}, ECE {val['ece']:.4f}, temperature {model.temperature:.3f}, "
          f"{kept}, {run['seconds']:.0f} s")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rich.console import Console

    from . import dataset
    from .evaluate import evaluate, load_train, render
    from .model import RcaModel

    with _named_by_user():
        model = RcaModel.load(args.model)
        test = dataset.read(args.dataset)
        model.columns(test.features, source=str(args.dataset))  # fail on missing features before fitting baselines
        trained = model.training.get("tick_seconds")  # the daemon refuses such a model; eval scored it
        if isinstance(trained, float) and not math.isclose(test.step, trained, rel_tol=0.01):
            span, meant = model.window * test.step, model.window * trained
            raise ConfigError(f"{args.dataset}: steps of {test.step:g} s, but {args.model} was trained on ticks of "
                              f"{trained:g} s (its window of {model.window} would span {span:g} s instead of "
                              f"{meant:g} s); evaluate on data recorded every {trained:g} s")
        train = load_train(model, args.train)
        report = evaluate(model, test, train, args.min_confidence, threads=args.threads,
                          healthy_min_confidence=args.healthy_min_confidence)
    report["model"] = args.model
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        render(report, Console())
    return 0
