"""One compiled BPF object: compile/load, its workload map, draining, run stats (its uprobes on library files:
:mod:`.uprobes`)."""

from __future__ import annotations

import atexit
import ctypes as ct
import functools
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..errors import ProbeError
from ..frame import BucketLayout
from .drain import SeriesDelta, StageDrain
from .features import optional_available, prog_info
from .specs import ProbeSpec, main_text

__all__ = ["compile_bpf", "close_bpf", "compile_probe", "attach_path", "Program"]


@functools.cache
def _bpf_class() -> type:
    """bcc's ``BPF``, unloading what it loaded when loading fails.

    bcc loads and attaches the tracepoint programs one by one in its constructor: one that the verifier refuses
    left those before it attached (running on every event) with their program, map and perf event fds open, held
    by bcc's own atexit hook for the life of the process; a probe's fallback (``compile_probe``) then loaded a
    second copy beside them.
    """
    from bcc import BPF

    class _BPF(BPF):  # type: ignore[misc,valid-type]
        def _trace_autoload(self) -> None:
            try:
                super()._trace_autoload()
            except BaseException:
                close_bpf(self)
                raise

    return _BPF


def close_bpf(bpf: Any) -> None:
    """Detach and unload ``bpf``, and drop bcc's atexit hook, which would hold it until the process exits."""
    bpf.cleanup()
    atexit.unregister(bpf.cleanup)


def compile_bpf(path: Path, flags: list[str]) -> Any:
    """Compile ``path`` (absolute) with bcc and load it; tracepoint programs attach as they load.  Where one
    fails to load, none stays loaded."""
    try:
        return _bpf_class()(text=main_text(path).encode(), cflags=flags)
    except Exception as exc:  # bcc raises bare Exception for compile, verifier and attach failures
        raise ProbeError(f"{path.name}: {exc} (clang/verifier output, if any, is on stderr)") from exc


def compile_probe(spec: ProbeSpec, wanted: tuple[str, ...], flags: Callable[[tuple[str, ...]], list[str]]
                  ) -> tuple[Any, tuple[str, ...]]:
    """Compile ``spec`` with the optional kernel features of ``wanted`` (``specs.wanted``, in order of preference)
    this kernel offers; where that fails, again without the first of them, and so on.

    ``flags(optional)`` gives the cflags; returns the BPF object and the optional macros it kept.
    """
    optional = tuple(m for m in wanted if optional_available(m))
    for i in range(len(optional)):
        try:
            return _loaded(spec, flags(optional[i:])), optional[i:]
        except ProbeError:
            pass
    return _loaded(spec, flags(())), ()


def _loaded(spec: ProbeSpec, flags: list[str]) -> Any:
    """:func:`compile_bpf`, and a uprobe program's functions through the verifier now: bcc loads them only at their
    first attach, so a variant the verifier refuses (a helper this kernel lacks for uprobes) passed here and then
    failed every attach, never falling back."""
    bpf = compile_bpf(spec.path, flags)
    if spec.kind == "uprobe":
        try:
            for name in ("call_return", *(f"enter_{stage}" for stage in spec.stages)):
                bpf.load_func(name.encode(), bpf.KPROBE)
        except Exception as exc:  # bcc raises bare Exception for verifier failures
            close_bpf(bpf)
            raise ProbeError(f"{spec.path.name}: {exc} (verifier output is on stderr)") from exc
    return bpf


def attach_path(spec: ProbeSpec, kept: tuple[str, ...]) -> str:
    """How a loaded program is attached: ``raw_tracepoint``, ``tracepoint`` or ``uprobe``."""
    if spec.kind == "uprobe":
        return "uprobe"
    return "raw_tracepoint" if "USE_RAW_TP" in kept else "tracepoint"


class Program:
    """A loaded program with the shared stage maps of ``bpf/stage.h``."""

    def __init__(self, bpf: Any, layout: BucketLayout) -> None:
        self.bpf = bpf
        self._workloads = bpf[b"workloads"]
        self._dropped = bpf[b"stage_dropped"]
        self._drain = StageDrain(bpf[b"stage_latency"], layout)
        self._tgids: dict[int, int] = {}

    def set_workloads(self, tgids: dict[int, int]) -> None:
        """Make the kernel's tgid -> workload map equal ``tgids``, as far as it holds them: what is written is
        known entry by entry (a full map stopped the update half-way, and the tgids written were never known:
        never deleted, dead processes held the map for good).  Raises ProbeError naming the setting when
        processes did not fit."""
        table = self._workloads
        gone = self._tgids.keys() - tgids.keys()
        for tgid in gone:
            with suppress(KeyError):
                del table[table.Key(tgid)]
            del self._tgids[tgid]
        if gone:
            self._forget_connections(gone)
        left_out = 0
        for tgid, wid in tgids.items():
            if self._tgids.get(tgid) != wid:
                try:
                    table[table.Key(tgid)] = table.Leaf(wid)
                except Exception:  # noqa: BLE001 - bcc raises a bare Exception (E2BIG when the map is full)
                    left_out += 1
                    continue
                self._tgids[tgid] = wid
        if left_out:
            # the same words each time (logged once): how many are left out is in sits_probe_errors_total's rate
            raise ProbeError(f"the workload map is full ({len(self._tgids)} processes, probes.max_processes): "
                             "workload processes past it are not timed; raise probes.max_processes")

    def _forget_connections(self, gone: set[int]) -> None:
        """Delete the connections of processes no longer tracked (the syscalls program's ``conns``): a process
        that exits forgets no fd it did not close, and one that reused its tgid would find them."""
        try:
            conns = self.bpf[b"conns"]
        except KeyError:  # not the syscalls program
            return
        stale = [k for k in conns.keys() if k.tgid in gone]
        for key in stale:
            with suppress(KeyError):
                del conns[key]

    def drain(self) -> list[SeriesDelta]:
        return self._drain.drain()

    def dropped(self) -> int:
        """Events lost because a map was full, all CPUs, since load."""
        return int(sum(self._dropped[ct.c_int(0)]))

    def kernel_counts(self) -> dict[str, int]:
        """The kernel's counters of the loaded programs since load (:func:`prog_info`: ``recursion_misses``,
        ``run_time_ns``, ``run_cnt``), summed over them, each program's fdinfo read once; a counter no program
        shows is left out."""
        out: dict[str, int] = {}
        for fn in list(self.bpf.funcs.values()):  # a scrape's thread: the tick's first attach of a function adds one
            for key, value in prog_info(fn.fd).items():
                if key in ("recursion_misses", "run_time_ns", "run_cnt"):
                    out[key] = out.get(key, 0) + value
        return out

    def close(self) -> None:
        close_bpf(self.bpf)
