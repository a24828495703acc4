"""`sits-observe slo rules`: write Prometheus rules for the configured SLOs."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..config import load
from ..errors import ConfigError
from ..files import replace_whole
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
    if args.output == "":  # an unset variable in `-o "$RULES"`: the file was left as it was, the rules on stdout
        raise ConfigError("-o: empty; give the rules file to write, or leave -o out for stdout")
    if args.output:
        try:
            _write(Path(args.output), text)
        except OSError as exc:  # a full disk, a directory, no permission: name the file
            raise ConfigError(f"{args.output}: cannot write the rules: {exc.strerror}; give another -o path") from None
        print(f"{args.output}: {len(cfg.slos)} SLO rule group(s) written", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _write(path: Path, text: str) -> None:
    """``text`` into ``path``: a regular file (or none yet) is written beside it (``NAME.<unique>.tmp``, which a
    rule_files glob such as ``*.yml`` does not match) with its mode, owner and group (root rewriting a
    ``root:prometheus 0640`` file must leave Prometheus able to read it), and renamed over it, so a full disk leaves
    the rules Prometheus loads whole (writing in place truncated them first); anything else (``/dev/stdout``, a
    FIFO) is written to."""
    target = path.resolve()  # a rules file reached through a symlink is replaced where it lies
    if target.exists() and not target.is_file():
        target.write_text(text)
        return

    def write(tmp: Path) -> None:
        tmp.write_text(text)
        if target.exists():
            shutil.copymode(target, tmp)
            st = target.stat()
            with suppress(PermissionError):  # not root: the file becomes the writer's, as any rewrite makes it
                os.chown(tmp, st.st_uid, st.st_gid)

    replace_whole(target, write)
