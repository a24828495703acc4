"""What each probe loads: its BPF program, its stages and tracepoints, and the ``-D`` flags for it.

The C lives in ``bpf/`` at the repository root (``<program>.bpf.c`` beside ``<program>.h``; an installed wheel
carries it as ``sits_observe/bpf``); it is compiled by bcc from its absolute path and specialised only through
``cflags``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .. import histogram
from ..frame import STAGES
from ..shipped import shipped
from .config import ProbesConfig

__all__ = ["BPF_DIR", "Feature", "ProbeSpec", "SPECS", "TracepointPlan", "plan_tracepoints", "wanted", "cflags",
           "source_files", "main_text", "render_source"]

BPF_DIR = shipped("bpf")
# sched_switch prev_state: runnable when no bit below TASK_REPORT_MAX (0x100 since Linux 4.14) is set.
RUNQ_STATE_MASK = 0xFF
CALL_STALE_NS = 600 * 10**9
# an entry at the stack pointer of the call in progress this soon after it is another trap of that entry (one image's
# library attached once per container); later it is a new call from the same frame, the last one's return missed
CALL_TRAP_NS = 10**6


@dataclass(frozen=True)
class Feature:
    """``-D<macro>`` is passed when every tracepoint (``category:event``) exists."""

    macro: str
    tracepoints: tuple[str, ...]


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    program: str
    kind: Literal["tracepoint", "uprobe"]
    stages: tuple[str, ...]
    features: tuple[Feature, ...] = ()
    # each group names features of which at least one must be present for the probe to load
    requires: tuple[tuple[str, ...], ...] = ()
    # macros for kernel features tried first, in order of preference, and dropped one by one (first
    # first) while the program fails to load; USE_RAW_TP: raw_syscalls tracepoints instead of syscalls:*
    optional: tuple[str, ...] = ()
    defines: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return BPF_DIR / f"{self.program}.bpf.c"


def _syscall(name: str) -> Feature:
    return Feature(f"HAVE_{name.upper()}", (f"syscalls:sys_enter_{name}", f"syscalls:sys_exit_{name}"))


_CALL_DEFINES = {"CALL_STALE_NS": f"{CALL_STALE_NS}ULL", "CALL_TRAP_NS": f"{CALL_TRAP_NS}ULL"}
SPECS: dict[str, ProbeSpec] = {
    "runq": ProbeSpec(
        "runq", "runq", "tracepoint", ("runq",),
        features=(Feature("HAVE_SCHED_WAKEUP", ("sched:sched_wakeup",)),
                  Feature("HAVE_SCHED_SWITCH", ("sched:sched_switch",)),
                  Feature("HAVE_SCHED_WAKEUP_NEW", ("sched:sched_wakeup_new",)),
                  Feature("HAVE_SCHED_PROCESS_EXIT", ("sched:sched_process_exit",)),
                  Feature("HAVE_SCHED_PROCESS_FREE", ("sched:sched_process_free",))),
        requires=(("HAVE_SCHED_WAKEUP",), ("HAVE_SCHED_SWITCH",)),
        defines={"RUNQ_STATE_MASK": hex(RUNQ_STATE_MASK)}),
    "syscalls": ProbeSpec(
        "syscalls", "syscalls", "tracepoint", ("ingress", "egress"),
        features=tuple(_syscall(s) for s in ("accept", "accept4", "read", "recvfrom", "recvmsg", "write",
                                             "sendto", "sendmsg", "close")),
        requires=(("HAVE_ACCEPT", "HAVE_ACCEPT4"), ("HAVE_READ", "HAVE_RECVFROM", "HAVE_RECVMSG"),
                  ("HAVE_WRITE", "HAVE_SENDTO", "HAVE_SENDMSG")),
        optional=("USE_RAW_TP", "HAVE_TASK_STORAGE")),
    "block_io": ProbeSpec(
        "block_io", "block_io", "tracepoint", ("block_io",),
        features=(Feature("HAVE_BLOCK_RQ", ("block:block_rq_issue", "block:block_rq_complete")),
                  Feature("HAVE_BLOCK_RQ_INSERT", ("block:block_rq_insert",)),
                  Feature("HAVE_BLOCK_RQ_REQUEUE", ("block:block_rq_requeue",))),
        requires=(("HAVE_BLOCK_RQ",),)),
    "cuda": ProbeSpec("cuda", "calls", "uprobe", ("launch", "h2d", "d2h", "sync", "alloc"),
                      optional=("HAVE_TASK_STORAGE",), defines=_CALL_DEFINES),
    "nccl": ProbeSpec("nccl", "calls", "uprobe", ("collective",),
                      optional=("HAVE_TASK_STORAGE",), defines=_CALL_DEFINES),
}


@dataclass(frozen=True)
class TracepointPlan:
    macros: tuple[str, ...]
    missing: tuple[str, ...]
    problem: str | None


def plan_tracepoints(spec: ProbeSpec, exists: Callable[[str, str], bool]) -> TracepointPlan:
    """Which features the running kernel has; ``problem`` says why the probe cannot load."""
    macros, missing = [], []
    for feat in spec.features:
        gone = [tp for tp in feat.tracepoints if not exists(*tp.split(":", 1))]
        if gone:
            missing.extend(gone)
        else:
            macros.append(feat.macro)
    problem = None
    for group in spec.requires:
        if not set(group) & set(macros):
            need = [tp for feat in spec.features if feat.macro in group for tp in feat.tracepoints]
            problem = f"missing tracepoint(s): needs {' or '.join(need)}"
            break
    return TracepointPlan(tuple(macros), tuple(missing), problem)


def wanted(spec: ProbeSpec, cfg: ProbesConfig) -> tuple[str, ...]:
    """The optional features of ``spec`` to try, as the config asks: ``USE_RAW_TP`` only with
    ``probes.syscalls.attach: raw_tracepoint`` (on the raw tracepoints every syscall on the host runs the two
    programs, where the ``syscalls:*`` ones run them for the timed syscalls alone)."""
    raw = cfg.syscalls.attach == "raw_tracepoint"
    return tuple(m for m in spec.optional if m != "USE_RAW_TP" or raw)


def cflags(spec: ProbeSpec, cfg: ProbesConfig, n_workloads: int, macros: tuple[str, ...] = (),
           extra: dict[str, str] | None = None) -> list[str]:
    """The ``-I``/``-D`` flags that specialise ``spec.program`` for this config."""
    defines = {
        "HIST_SUB_BITS": str(histogram.SUB_BITS),
        "HIST_MAX_EXP": str(histogram.MAX_EXP),
        **{f"STAGE_{s.upper()}": str(i) for i, s in enumerate(STAGES)},
        "MAX_PROCESSES": str(cfg.max_processes),
        "MAX_THREADS": str(cfg.max_threads),
        "MAX_CONNS": str(cfg.max_threads),
        "MAX_REQUESTS": str(cfg.max_threads),
        "HIST_ENTRIES": str(max(256, len(spec.stages) * (n_workloads + 1) * cfg.blocks_per_series)),
        "BLOCK_UNATTRIBUTED": "1" if cfg.block_io.unattributed else "0",
        **spec.defines,
        **(extra or {}),
    }
    return [f"-I{BPF_DIR}"] + [f"-D{k}={v}" for k, v in defines.items()] + [f"-D{m}" for m in macros]


_INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def source_files(path: Path, missing: list[Path] | None = None) -> Iterator[Path]:
    """``path`` then the local headers it includes, depth first, each once; an included file that is not there is
    left out (added to ``missing`` when given)."""
    seen: set[Path] = set()
    stack = [path]
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        yield p
        included = [p.parent / inc for inc in _INCLUDE.findall(p.read_text())]
        if missing is not None:
            missing += [inc for inc in included if not inc.is_file() and inc not in missing]
        stack.extend(reversed([inc for inc in included if inc.is_file()]))


_FRAGMENT = re.compile(r'^#include "([^"]+\.c)"$')


def main_text(path: Path) -> str:
    """The text bcc compiles for ``path``: the file with each ``#include "<name>.c"`` line replaced by
    that file, ``#line`` markers keeping clang's file names and line numbers.  bcc rewrites map calls
    only in the text it compiles, never in an included file, so the map accessors every program shares
    (``stage_record.c``) are pasted in rather than included."""
    out = [f'#line 1 "{path}"']
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if m := _FRAGMENT.match(line):
            frag = path.parent / m.group(1)
            out += [f'#line 1 "{frag}"', frag.read_text().rstrip(), f'#line {n + 1} "{path}"']
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def render_source(path: Path, flags: list[str]) -> str:
    """The C bcc compiles for ``path`` with ``flags``, its local headers after it (for ``--print-bpf``)."""
    out = [f"// bcc src_file: {path}", "// cflags: " + " ".join(flags)]
    for p in source_files(path):
        out += ["", f"// ---- {os.path.relpath(p, path.parent)} ----", p.read_text().rstrip()]
    return "\n".join(out) + "\n"
