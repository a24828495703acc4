"""`sits-observe slo rules`: write Prometheus rules for the configured SLOs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..config import load
from ..errors import ConfigError
from .rules import dump_rules

__all__ = ["register"]


def register(sub: Any) -> None:
    slo = sub.add_parser("slo", help="SLO tools")
    slo_sub = slo.add_subparsers(dest="slo_command", required=True, parser_class=type(slo))
    rules = slo_sub.add_parser("rules", help="write Prometheus recording and alerting rules for the configured SLOs")
    rules.add_argument("--config", help="YAML config with `slos:` (default $SITS_CONFIG)")
    rules.add_argument("-o", "--output", help="rules file to write (default: stdout)")
    rules.set_defaults(func=_rules)


def _rules(args: argparse.Namespace) -> int:
    source = args.config if args.config is not None else os.environ.get("SITS_CONFIG")  # "" is refused by load
    cfg = load(source, this_host=False)  # rules are made where Prometheus runs: not this host's checks
    if not cfg.slos:
        raise ConfigError(f"{source or '<defaults>'}: slos: no SLOs configured; add a `slos:` list (docs/slo.md)")
    text = dump_rules(cfg.slos, cfg.store.buckets, source or "<defaults>")
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:  # a full disk, a directory, no permission: name the file
            raise ConfigError(f"{args.output}: cannot write the rules: {exc.strerror}; give another -o path") from None
        print(f"{args.output}: {len(cfg.slos)} SLO rule group(s) written", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
