"""``sits-observe probes``: what would attach and why not (``--list``), and the C to load (``--print-bpf``).

Neither compiles nor loads anything, so both work without root (``--list`` then says why probes are off).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..config import Config, load
from ..errors import ConfigError, ProbeError
from . import specs
from .features import environment_problem, raw_syscalls_supported, tracepoint_exists
from .uprobes import find_symbols
from .workloads import WorkloadTracker, library_matcher

__all__ = ["register", "list_probes", "print_bpf"]


def register(sub: Any) -> None:
    p = sub.add_parser("probes", help="eBPF probes: what would attach and why not, the C that is loaded")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="each probe: would it attach, and if not, why")
    what.add_argument("--print-bpf", metavar="NAME", choices=sorted(specs.SPECS),
                      help=f"print the C bcc compiles for probe NAME ({', '.join(specs.SPECS)}) with its cflags")
    p.add_argument("--config", help="YAML config (default $SITS_CONFIG, else built-in defaults)")
    p.add_argument("--json", action="store_true", help="--list as one JSON object")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.print_bpf and args.json:  # it printed the C and ignored --json
        raise ConfigError("--json: goes with --list; --print-bpf prints C source")
    cfg = load(args.config)
    if args.print_bpf:
        print(print_bpf(cfg, args.print_bpf), end="")
        return 0
    rows = list_probes(cfg)
    if args.json:
        print(json.dumps({"probes": rows}, sort_keys=True))
        return 0
    for row in rows:
        print(f"{row['probe']:9} {'would attach' if row['would_attach'] else 'off':13} "
              f"{row['program']:17} {row['why'] or ''}".rstrip())
        for key in ("attach", "timed", "files", "missing_symbols", "missing_tracepoints"):
            if row.get(key):
                print(f"{'':9} {key}: {row[key]}")
    return 0


def print_bpf(cfg: Config, name: str) -> str:
    """The program source for probe ``name`` with the cflags this config and kernel give it (optional
    features included; the daemon drops them where the kernel refuses them)."""
    spec = specs.SPECS[name]
    plan = specs.plan_tracepoints(spec, tracepoint_exists)
    flags = specs.cflags(spec, cfg.probes, len(cfg.workloads), plan.macros + specs.wanted(spec, cfg.probes))
    return specs.render_source(spec.path, flags)


def _attach(spec: specs.ProbeSpec, cfg: Config) -> str:
    """The attach path the daemon tries first (a program that then fails to load falls back)."""
    if spec.kind == "uprobe":
        return "uprobe"
    return "raw_tracepoint" if "USE_RAW_TP" in specs.wanted(spec, cfg.probes) and raw_syscalls_supported() \
        else "tracepoint"


def list_probes(cfg: Config) -> list[dict[str, Any]]:
    """One row per probe: would it attach now, and why not (no program is compiled or loaded)."""
    off = environment_problem() if cfg.probes.enabled else "disabled in config (probes.enabled: false)"
    tracker = WorkloadTracker(cfg.workloads)
    tgids = tracker.scan()
    rows = []
    for name, spec in specs.SPECS.items():
        pcfg = getattr(cfg.probes, name)
        plan = specs.plan_tracepoints(spec, tracepoint_exists)
        row: dict[str, Any] = {"probe": name, "program": spec.path.name, "stages": list(spec.stages),
                               "attach": _attach(spec, cfg), "missing_tracepoints": list(plan.missing)}
        why = off or (None if pcfg.enabled else "disabled in config") or plan.problem
        if spec.kind == "uprobe":
            timed = pcfg.timed()
            row["timed"] = {stage: list(syms) for stage, syms in timed.items()}
            files = tracker.libraries(tgids, library_matcher(pcfg.library)).files
            row["files"] = sorted(shown for _, shown in files.values())
            row["missing_symbols"] = {}
            wanted = {s for syms in timed.values() for s in syms}
            found_any = False
            for path, shown in files.values() if off is None else ():
                try:
                    found = set(find_symbols(path, wanted))
                except ProbeError as exc:
                    row["missing_symbols"][shown] = [str(exc)]
                    continue
                found_any = found_any or bool(found)
                row["missing_symbols"][shown] = sorted(wanted - found)
            if not why and not files:
                why = f"no workload process maps {pcfg.library} (now)"
            elif not why and not found_any:
                why = f"none of the configured symbols is in {pcfg.library}"
        if not why and not cfg.workloads:  # the daemon loads no probe then, block_io included
            why = "no workloads configured"
        row["would_attach"] = why is None
        row["why"] = why
        rows.append(row)
    return rows

