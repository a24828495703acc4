"""Command line: thin wiring from arguments to config, pipeline and server.

Every user mistake ends as one line on stderr and exit code 2; no tracebacks for user errors.
Subsystems add their own commands through ``register(subparsers)`` in their ``commands`` module, and
benchmarks through ``add_arguments(parser)`` / ``run(args) -> dict`` in their ``bench`` module (imported
only when that benchmark runs).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .errors import SitsError
from .interrupts import hold_sighup

__all__ = ["main", "BENCHES"]

# bench name -> (module, function)
BENCHES: dict[str, tuple[str, str]] = {
    "pipeline": ("sits_observe.export.bench", "run"),
    "probes": ("sits_observe.probes.bench", "run"),
    "collectors": ("sits_observe.collectors.bench", "run"),
    "slo": ("sits_observe.slo.bench", "run"),
    "rca": ("sits_observe.rca.bench", "run"),
    "scheduler": ("sits_observe.scheduler.bench", "run_scheduler"),
    "loop": ("sits_observe.scheduler.bench", "run_loop"),
    "ui": ("sits_observe.ui.bench", "run"),
    "soak": ("sits_observe.soak", "run"),
}
COMMAND_MODULES = (
    "sits_observe.runtime",
    "sits_observe.doctor",
    "sits_observe.probes.commands",
    "sits_observe.collectors.commands",
    "sits_observe.rca.commands",
    "sits_observe.slo.commands",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 already; keep its one-line form
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sits-observe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"sits-observe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    bench = sub.add_parser("bench", help="run a benchmark (JSON with --json)")
    bench.add_argument("name", choices=sorted(BENCHES))
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own options (--help)")
    bench.set_defaults(func=_bench)
    return parser


def _bench(args: argparse.Namespace) -> int:
    module, func = BENCHES[args.name]
    mod = importlib.import_module(module)
    p = _Parser(prog=f"sits-observe bench {args.name}")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add = getattr(mod, "add_arguments_" + func.removeprefix("run_"), None) or getattr(mod, "add_arguments")
    add(p)
    sub_args = p.parse_args(args.rest)
    result: dict[str, Any] = getattr(mod, func)(sub_args)
    # what was measured, as given: a run of 1 tick or 1 process reads like a default one otherwise
    result["options"] = {k: v if isinstance(v, (int, float, str, bool, list, tuple, type(None))) else str(v)
                         for k, v in sorted(vars(sub_args).items()) if k != "json"}
    if sub_args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["run"], ["demo"]):  # the daemon: its reload signal must not end it while it starts
        before = signal.getsignal(signal.SIGHUP)
        hold_sighup()
        try:
            return _main(argv)
        finally:  # a caller in the same process (the tests) gets its own handler back
            signal.signal(signal.SIGHUP, signal.SIG_DFL if before is None else before)
    return _main(argv)


def _main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except SitsError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"sits-observe: error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # e.g. an output file that cannot be written
        where = f"{exc.filename}: " if exc.filename else ""  # stdout on a full disk has none: ": No space ..."
        print(f"sits-observe: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2 if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
