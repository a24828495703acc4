"""Uprobes on library files: the symbols a library defines (:func:`find_symbols`), and the uprobe pairs
(``enter_<stage>`` and ``call_return``) attached, retried and detached file by file as workload processes map
libraries (:class:`LibraryAttacher`) for a loaded program (:mod:`.program`)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Collection
from contextlib import suppress
from typing import Any

from ..errors import ProbeError
from .workloads import FileId

__all__ = ["find_symbols", "LibraryAttacher"]


def find_symbols(path: str, symbols: set[str]) -> dict[str, int]:
    """Address of each of ``symbols`` that the ELF file at ``path`` defines (one pass over its symbols)."""
    from bcc import BPF

    pattern = "^(" + "|".join(re.escape(s) for s in sorted(symbols)) + ")$"
    try:
        found = BPF.get_user_functions_and_addresses(path.encode(), pattern.encode())
    except Exception as exc:  # bcc raises bare Exception
        raise ProbeError(f"cannot read its symbols: {exc}") from exc
    return {name.decode(): addr for name, addr in found}


class LibraryAttacher:
    """Attaches ``enter_<stage>``/``call_return`` to each configured symbol of each library file.

    Files are keyed by :data:`~.workloads.FileId` (device and inode as the processes see them), so a library
    mapped by many processes (or via several paths) is attached once; through containers' overlay mounts (each
    its own device) one image's library is attached once per container.  An address named by two symbols is
    attached once, for the first stage that lists it.  A file counts as done once its symbols were read and at
    least one probe attached.  Otherwise (the process it was opened through exited, an attach failed, none of
    the symbols is there) it is tried again when offered again, through whichever process maps it then, after
    skipping 0, 1, 3, 7 ... offers (at most :data:`MAX_SKIP`), so a file without the symbols is not read at
    every scan.  :meth:`release` detaches the files that no process maps any more: what is attached is bounded
    by what is mapped now.
    """

    MAX_SKIP = 127

    def __init__(self, bpf: Any, stages: dict[str, tuple[str, ...]]) -> None:
        self._bpf = bpf
        self._stages = stages
        self.files: dict[FileId, str] = {}  # attached: file -> path as the process maps it
        # attached: file -> (its probes, (bcc event name, perf event fd) of each of its uprobes and uretprobes)
        self._events: dict[FileId, tuple[int, list[tuple[bytes, int]]]] = {}
        self.missing: dict[str, list[str]] = {}
        self.failed: dict[FileId, str] = {}  # not attached: file -> its last problem
        self._retry: dict[FileId, tuple[int, int]] = {}  # file -> (failures, offers left to skip)
        self.probes = 0
        self.detached = 0  # files detached by release(), since start

    def attach(self, file: FileId, path: str, shown: str) -> str | None:
        """Attach to one file (opened at ``path``, named ``shown`` in reports); returns what to report."""
        if file in self.files:
            return None
        failures, skip = self._retry.get(file, (0, 0))
        if skip:
            self._retry[file] = (failures, skip - 1)
            return None
        before, fds = self.probes, dict(self._bpf.uprobe_fds)
        problem = self._attach(path, shown)
        if self.probes > before:
            self.files[file] = shown
            # What this file added to bcc's BPF.uprobe_fds (event name -> perf event fd, filled by attach_u[ret]probe,
            # emptied by the public detach_uprobe_event; relied on as bcc 0.26 has them): detaching by these needs
            # neither the file, which may be gone with its container, nor bcc's event naming (path and address).
            self._events[file] = (self.probes - before,
                                  [(ev, fd) for ev, fd in self._bpf.uprobe_fds.items() if fds.get(ev) != fd])
            self.failed.pop(file, None)
            self._retry.pop(file, None)
        else:
            self.failed[file] = problem or f"{shown}: no probe attached"
            self._retry[file] = (failures + 1, min(2**failures - 1, self.MAX_SKIP))
        return problem

    def release(self, mapped: dict[FileId, tuple[str, str]], held: Collection[FileId] = ()
                ) -> list[tuple[str, str | None]]:
        """Detach each attached file that is neither in ``mapped`` (file -> (path, name) of the files workload
        processes map now, to attach) nor held (an inode number in ``held``, files still mapped that no path opens
        any more: deleted or replaced since; keeping one too many attached for a while costs nothing); forget the
        files that failed and are not in ``mapped``.  Either is attached afresh if offered again.

        Returns (name, problem or None) for each file detached.
        """
        for file in self.failed.keys() - mapped.keys():
            del self.failed[file]
            del self._retry[file]
        inodes = {ino for _, ino in held}  # by inode: a held file's device may be the maps line's, not stat's
        gone = [file for file in self.files if file not in mapped and file[1] not in inodes]
        out = []
        for file in gone:
            probes, events = self._events.pop(file)
            problems = [p for p in (self._detach(ev, fd) for ev, fd in events) if p]
            self.probes -= probes
            out.append((self.files.pop(file), "; ".join(problems) or None))
        self.detached += len(gone)
        names = set(self.files.values()) | {shown for _, shown in mapped.values()}
        self.missing = {shown: syms for shown, syms in self.missing.items() if shown in names}
        return out

    def _detach(self, ev_name: bytes, fd: int) -> str | None:
        if self._bpf.uprobe_fds.get(ev_name) != fd:
            # bcc's entry of that name is another file's: one attached later through the same path and address
            # (a reused pid in /proc/PID/root/...); this probe is only its fd, which closing removes
            os.close(fd)
            _forget_probe(self._bpf)
            return None
        try:
            self._bpf.detach_uprobe_event(ev_name)
        except Exception as exc:  # bcc raises bare Exception, after closing the fd (a tracefs event may be left)
            # and before its own _del_uprobe_fd, done here: cleanup() then does not close that fd number again,
            # and the probe leaves bcc's count of open probes
            self._bpf._del_uprobe_fd(ev_name)
            return f"{ev_name.decode(errors='replace')}: {exc}"
        return None

    def _attach(self, path: str, shown: str) -> str | None:
        wanted = {sym for syms in self._stages.values() for sym in syms}
        # bcc's messages name the path opened (/proc/PID/root/...): said as shown, or each process that mapped the
        # file would make a new text, logged and remembered anew (ProbeSource's once-per-text)
        try:
            addr_of = find_symbols(path, wanted)
        except ProbeError as exc:
            return f"{shown}: {str(exc).replace(path, shown)}"
        done: set[int] = set()
        problems = []
        for stage, symbols in self._stages.items():
            for sym in symbols:
                addr = addr_of.get(sym)
                if addr is None or addr in done:
                    continue
                try:  # the return first: a call entered between the two would never be seen to return (it is
                    # lost; the thread's next call from that frame starts afresh)
                    self._bpf.attach_uretprobe(name=path.encode(), addr=addr, fn_name=b"call_return")
                    try:
                        self._bpf.attach_uprobe(name=path.encode(), addr=addr, fn_name=f"enter_{stage}".encode())
                    except Exception:
                        with suppress(Exception):  # a lone return probe would end an enclosing call's timing
                            self._bpf.detach_uretprobe(name=path.encode(), addr=addr)
                        raise
                except Exception as exc:
                    problems.append(f"{sym}: attach failed: {str(exc).replace(path, shown)}")
                    continue
                done.add(addr)
                self.probes += 1
        self.missing[shown] = sorted(wanted - addr_of.keys())
        if self.missing[shown]:
            problems.append("symbols not in the library (skipped): " + ", ".join(self.missing[shown]))
        return f"{shown}: " + "; ".join(problems) if problems else None


def _forget_probe(bpf: Any) -> None:
    """Count one probe out of bcc's open probes, closed behind bcc's back (its ``uprobe_fds`` names another fd).

    bcc counts the probes open in this process, for its quota (``BCC_PROBE_LIMIT``, 1000 by default: "Number of
    open probes would exceed global quota"), in a global of its module, lowered only by its own ``_del_uprobe_fd``
    (bcc 0.26's ``bcc._num_open_probes``; relied on as that version has it).  Left alone, each such probe would
    stay counted for the life of the process.  The module is looked for along the object's classes (compile_bpf's
    subclass of bcc's BPF; a stand-in of the tests counts in its own module).
    """
    for cls in type(bpf).__mro__:  # bcc's BPF, or a subclass of it (compile_bpf's)
        module = sys.modules.get(cls.__module__)
        if module is not None and hasattr(module, "_num_open_probes"):
            module._num_open_probes -= 1
            return
