"""Files replaced whole: written beside themselves, flushed to disk, then renamed over, so a full disk, a kill, an
interrupt or a power loss leaves the old file (or none), never a half-written or empty one."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

__all__ = ["replace_whole", "flush", "flush_renames", "temporary_name"]


def replace_whole(path: Path, write: Callable[[Path], object]) -> None:
    """``write(NAME.<unique>.tmp)`` beside ``path`` (its own name: two writers of one path do not share it), flush it
    to disk, rename it over ``path`` and flush the directory (the rename itself); the temporary file is removed on
    any failure (raised again)."""
    tmp = temporary_name(path)
    try:
        write(tmp)
        flush(tmp)
        tmp.replace(path)
    except BaseException:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    flush_renames(path.parent)


def temporary_name(path: Path) -> Path:
    """``NAME.<pid>-<random>.tmp`` beside ``path``: a writer's own, which another writer of ``path`` does not share."""
    return path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def flush_renames(directory: Path) -> None:
    """Flush the renames made in ``directory``, as far as its filesystem can (one that cannot flush a directory,
    EINVAL, keeps them as they are: they are made already)."""
    with suppress(OSError):
        flush(directory)


def flush(path: Path) -> None:
    """``fsync`` a file, or a directory (the renames in it)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
