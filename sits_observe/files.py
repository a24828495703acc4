"""Files replaced whole: written beside themselves, then renamed over, so a full disk, a kill or an interrupt leaves
the old file (or none), never a half-written one."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

__all__ = ["replace_whole"]


def replace_whole(path: Path, write: Callable[[Path], object]) -> None:
    """``write(NAME.tmp)`` beside ``path``, then rename it over ``path``; the temporary file is removed on any
    failure (raised again)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
