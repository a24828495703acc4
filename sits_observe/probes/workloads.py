"""Which processes belong to which configured workload, and which library files they map (/proc scan).

A process belongs to the first workload (config order) whose every given criterion matches: ``pids``
lists it, ``comm`` (a regex, matched whole) matches /proc/PID/comm, ``exe`` equals the /proc/PID/exe
target, ``cgroup`` is a prefix of its cgroup v2 path. Workload ids are 1..N in config order (0 = none).

What another process writes into /proc (its comm: any process may name itself ``b"\\xffbad"``, its cgroup's
directory names, the names of the files it maps) need not be UTF-8: it is decoded with U+FFFD for the bytes
that are not, so such a name just fails to match a rule, which is text, and never fails the scan (a library
mapped under such a path is then not attached: the decoded path opens nothing).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from .config import WorkloadConfig

__all__ = ["FileId", "Mapping", "WorkloadTracker", "Libraries", "library_matcher"]

_DELETED = " (deleted)"

FileId = tuple[int, int]
"""A library file as a process sees it: ``(st_dev, st_ino)`` from ``stat``.  Through a container's overlay mount
that is the mount's own device (and the file's inode number): one image's library in N containers is N files here,
although the kernel puts an uprobe on the real file underneath, where it fires in every container."""


class Mapping(NamedTuple):
    """One file a process maps, from a line of /proc/PID/maps."""

    path: str
    """as the process maps it (relative to its root), without the kernel's ``" (deleted)"``"""
    deleted: bool
    """deleted (or replaced) since it was mapped: no path opens it any more"""
    file: FileId
    """the line's device (``major:minor``, hex) and inode columns"""
    area: str
    """the line's address range, the mapping's name under /proc/PID/map_files"""


class Libraries(NamedTuple):
    """The files of one library that workload processes map."""

    files: dict[FileId, tuple[str, str]]
    """file -> (path to open it through /proc/PID/root, path the process maps), of files that path still names"""
    held: frozenset[FileId]
    """files mapped that no path opens any more (deleted, replaced, or the path now names another file): to keep
    attached, not to attach"""


def _foreign_text(path: Path) -> str:
    """A /proc file whose text another process chose (see the module's docstring); OSError when it left.  Its
    lines are split at ``\\n`` only, where the kernel ends them: ``splitlines()`` also splits at ``\\x85`` or
    U+2028, which a name may hold, and a cgroup path cut there may read as the configured one."""
    return path.read_bytes().decode(errors="replace")


class _Proc:
    """Lazy reads of one /proc/PID; OSError (the process left) propagates to the scan."""

    def __init__(self, root: Path, pid: int) -> None:
        self.dir = root / str(pid)
        self._comm: str | None = None
        self._exe: str | None = None
        self._cgroup: str | None = None

    def comm(self) -> str:
        if self._comm is None:
            self._comm = _foreign_text(self.dir / "comm").removesuffix("\n")
        return self._comm

    def exe(self) -> str:
        if self._exe is None:
            self._exe = os.readlink(self.dir / "exe").removesuffix(" (deleted)")
        return self._exe

    def cgroup(self) -> str:
        if self._cgroup is None:
            lines = _foreign_text(self.dir / "cgroup").split("\n")
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
        for wid, w, comm in self._rules:  # every group has a criterion (refused at load without one)
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

    def mapped_files(self, pid: int) -> list[Mapping]:
        """The files mapped by ``pid``, once per (file, path) (empty if it left); anonymous and special mappings
        (``[stack]``, ``[vdso]``) are left out."""
        try:
            lines = _foreign_text(self._proc / str(pid) / "maps").split("\n")
        except OSError:
            return []
        out: dict[tuple[FileId, str], Mapping] = {}
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            major, _, minor = parts[3].partition(":")
            file = (os.makedev(int(major, 16), int(minor, 16)), int(parts[4]))
            path = parts[5].removesuffix(_DELETED)
            out.setdefault((file, parts[5]), Mapping(path, path != parts[5], file, parts[0]))
        return list(out.values())

    def _file_of(self, pid: int, mapping: Mapping) -> tuple[FileId, bool]:
        """``(st_dev, st_ino)`` of the file ``mapping`` maps, as ``stat`` of its path gives them, and whether the
        device is sure: ``stat`` of /proc/PID/map_files/<area> opens the mapped file itself, deleted or not.  Where
        that cannot be read (it needs CAP_SYS_ADMIN or, from kernel 5.9, CAP_CHECKPOINT_RESTORE; the mapping just
        went away) the maps line's columns stand in, whose inode is the file's but whose device may not be the
        one ``stat`` gives: on btrfs it is the filesystem's, not the subvolume's; on an overlay of layers on
        several filesystems (without xino) the overlay's; before kernel 6.8 the real file's under an overlay."""
        start, _, end = mapping.area.partition("-")  # map_files names are unpadded hex; maps pads to 8 digits
        try:
            st = os.stat(self._proc / str(pid) / "map_files" / f"{int(start, 16):x}-{int(end, 16):x}")
        except (OSError, ValueError):
            return mapping.file, False
        return (st.st_dev, st.st_ino), True

    def libraries(self, pids: Iterable[int], matches: Callable[[str], bool],
                  maps: dict[int, list[Mapping]] | None = None) -> Libraries:
        """The files standing for one library (``matches``) that the processes ``pids`` map; ``maps``: each pid's
        :meth:`mapped_files`, filled as read, so one scan for several libraries reads each /proc/PID/maps once (a
        CUDA process maps thousands of areas).

        A mapped file is offered for attaching through /proc/PID/root/<path> only where that path still names
        it (the same ``(st_dev, st_ino)``; the same inode where the device is not sure); a deleted one, or one
        whose path now names another file (replaced, or the path is gone), is only held: kept attached while
        mapped (:meth:`LibraryAttacher.release` holds by inode number)."""
        files: dict[FileId, tuple[str, str]] = {}
        held = set()
        maps = {} if maps is None else maps
        for pid in pids:
            if pid not in maps:
                maps[pid] = self.mapped_files(pid)
            for mapping in maps[pid]:
                if not matches(mapping.path):
                    continue
                file, sure = self._file_of(pid, mapping)
                where = f"{self._proc}/{pid}/root{mapping.path}"
                try:
                    st = None if mapping.deleted else os.stat(where)
                except OSError:
                    st = None
                if st is not None and ((st.st_dev, st.st_ino) == file if sure else st.st_ino == file[1]):
                    files.setdefault((st.st_dev, st.st_ino), (where, mapping.path))
                else:
                    held.add(file)
        return Libraries(files, frozenset(held - files.keys()))


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
