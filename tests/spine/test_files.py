"""Files replaced whole (`sits_observe.files`): the model file, the SLO rules, the simulated clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sits_observe import files
from sits_observe.files import replace_whole


def test_two_writers_of_one_path_do_not_share_a_temporary_file(tmp_path: Path) -> None:
    """Both wrote NAME.tmp: the second (here inside the first's write, as two `rca train --force` or two
    `slo rules -o` at once) renamed the first's half-written file away and the first failed."""
    path = tmp_path / "rules.yml"

    def outer(tmp: Path) -> None:
        tmp.write_text("outer, first half\n")
        replace_whole(path, lambda inner: inner.write_text("inner\n"))
        with tmp.open("a") as f:
            f.write("outer, second half\n")

    replace_whole(path, outer)
    assert path.read_text() == "outer, first half\nouter, second half\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rules.yml"]


def test_the_new_file_is_on_disk_before_the_rename_and_the_rename_after(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither was flushed: after a power loss (XFS, ext4 without auto_da_alloc) the rules file could be empty,
    which Prometheus loads without a word, every SLO alert gone."""
    events: list[str] = []
    fsync, replace = os.fsync, Path.replace

    def recorded_fsync(fd: int) -> None:
        events.append("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def recorded_replace(self: Path, target: Path) -> Path:
        events.append(f"rename {self.parent}")
        return replace(self, target)

    monkeypatch.setattr(files.os, "fsync", recorded_fsync)
    monkeypatch.setattr(Path, "replace", recorded_replace)
    path = tmp_path / "sim-clock"
    written: list[Path] = []
    replace_whole(path, lambda tmp: (written.append(tmp), tmp.write_text("1.0\n")))
    assert events == [f"fsync {written[0]}", f"rename {tmp_path}", f"fsync {tmp_path}"]
    assert path.read_text() == "1.0\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_text("old")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        replace_whole(path, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"] and path.read_text() == "old"
