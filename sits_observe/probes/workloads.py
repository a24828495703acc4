"""Which processes belong to which configured workload, and which library files they map (/proc scan).

A process belongs to the first workload (config order) whose every given criterion matches: ``pids``
lists it, ``comm`` (a regex, matched whole) matches /proc/PID/comm, ``exe`` equals the /proc/PID/exe
target, ``cgroup`` is a prefix of its cgroup v2 path. Workload ids are 1..N in config order (0 = none).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from ..config import WorkloadConfig

__all__ = ["FileId", "WorkloadTracker", "Libraries", "library_matcher"]

_DELETED = " (deleted)"

FileId = tuple[int, int, int, int]
"""A library file as uprobes know it: ``(st_ino, st_size, st_mtime_ns, st_ctime_ns)``, without ``st_dev``.
Through an overlay mount (a container's root) ``stat`` gives the mount's own device but the real file's inode
number and times, and the kernel attaches an uprobe to the real file, where it fires for every process that maps
it, whichever container.  Keyed by device, one image's library in N containers was attached N times, and each
call trapped N times (counted once, through the nesting check, but paid N times)."""


class Libraries(NamedTuple):
    """The files of one library that workload processes map."""

    files: dict[FileId, tuple[str, str]]
    """file -> (path to open it through /proc/PID/root, path the process maps), of files on disk"""
    deleted: frozenset[str]
    """paths of files still mapped although deleted (or replaced) since: they cannot be opened by path"""


class _Proc:
    """Lazy reads of one /proc/PID; OSError (the process left) propagates to the scan."""

    def __init__(self, root: Path, pid: int) -> None:
        self.dir = root / str(pid)
        self._comm: str | None = None
        self._exe: str | None = None
        self._cgroup: str | None = None

    def comm(self) -> str:
        if self._comm is None:
            self._comm = (self.dir / "comm").read_text().rstrip("\n")
        return self._comm

    def exe(self) -> str:
        if self._exe is None:
            self._exe = os.readlink(self.dir / "exe").removesuffix(" (deleted)")
        return self._exe

    def cgroup(self) -> str:
        if self._cgroup is None:
            lines = (self.dir / "cgroup").read_text().splitlines()
            self._cgroup = next((ln[3:] for ln in lines if ln.startswith("0::")), "")
        return self._cgroup


class WorkloadTracker:
    """Scans /proc for the configured workloads' processes (``proc`` is injectable for tests)."""

    def __init__(self, workloads: Sequence[WorkloadConfig], proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._rules = [(wid, w, re.compile(w.comm) if w.comm else None)
                       for wid, w in enumerate(workloads, start=1)]
        self.names = {wid: w.name for wid, w, _ in self._rules}

    def _match(self, pid: int) -> int:
        p = _Proc(self._proc, pid)
        for wid, w, comm in self._rules:
            if not (w.pids or comm or w.exe or w.cgroup):
                continue
            if w.pids and pid not in w.pids:
                continue
            if comm and not comm.fullmatch(p.comm()):
                continue
            if w.exe and p.exe() != w.exe:
                continue
            if w.cgroup and not _under(p.cgroup(), w.cgroup):
                continue
            return wid
        return 0

    def workload_of(self, pid: int) -> str | None:
        """The workload name of ``pid`` (None when no group matches or the process left)."""
        try:
            return self.names.get(self._match(pid))
        except OSError:
            return None

    def scan(self) -> dict[int, int]:
        """tgid -> workload id of every live process of a configured workload."""
        if not self._rules:
            return {}
        out = {}
        for entry in os.scandir(self._proc):
            if not entry.name.isdigit():
                continue
            try:
                wid = self._match(int(entry.name))
            except OSError:
                continue
            if wid:
                out[int(entry.name)] = wid
        return out

    def mapped_files(self, pid: int) -> set[str]:
        """Paths of the files mapped by ``pid`` (empty if it left); a file deleted (or replaced) since it was
        mapped keeps the kernel's ``" (deleted)"`` suffix."""
        try:
            text = (self._proc / str(pid) / "maps").read_text()
        except OSError:
            return set()
        out = set()
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                out.add(parts[5])
        return out

    def libraries(self, pids: Iterable[int], matches: Callable[[str], bool]) -> Libraries:
        """The files standing for one library (``matches``) that the processes ``pids`` map."""
        files: dict[FileId, tuple[str, str]] = {}
        deleted = set()
        for pid in pids:
            for mapped in self.mapped_files(pid):
                path = mapped.removesuffix(_DELETED)
                if not matches(path):
                    continue
                if path != mapped:
                    deleted.add(path)
                    continue
                where = f"{self._proc}/{pid}/root{path}"
                try:
                    st = os.stat(where)
                except OSError:
                    continue
                files.setdefault((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), (where, path))
        return Libraries(files, frozenset(deleted))


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix == "/" else prefix + "/")


def library_matcher(library: str) -> Callable[[str], bool]:
    """Does a mapped path stand for ``library``?

    An absolute path matches itself and its resolved target. A file name matches mapped files of that
    name or of the same stem with any version: ``libcuda.so.1`` matches ``libcuda.so.535.104.05``
    (the driver maps its versioned file), never ``libcudart.so.12``.
    """
    if library.startswith("/"):
        names = {library, os.path.realpath(library)}
        return lambda path: path in names
    stem = library[: library.index(".so") + 3] if ".so" in library else library
    return lambda path: (base := os.path.basename(path)) == library or base == stem or base.startswith(stem + ".")
