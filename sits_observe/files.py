"""Files replaced whole: written beside themselves, flushed to disk, then renamed over, so a full disk, a kill, an
interrupt or a power loss leaves the old file (or none), never a half-written or empty one."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

__all__ = ["replace_whole"]


def replace_whole(path: Path, write: Callable[[Path], object]) -> None:
    """``write(NAME.<unique>.tmp)`` beside ``path`` (its own name: two writers of one path do not share it), flush it
    to disk, rename it over ``path`` and flush the directory (the rename itself); the temporary file is removed on
    any failure (raised again)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        _fsync(tmp, os.O_RDONLY)
        tmp.replace(path)
    except BaseException:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    with suppress(OSError):  # replaced already; a filesystem that cannot flush a directory (EINVAL) keeps it so
        _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
