"""Workload tracking from a /proc tree (a fake one here: the matching rules, table-driven) and the
library names uprobes attach to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sits_observe.config import parse
from sits_observe.probes.workloads import WorkloadTracker, library_matcher


def _proc(tmp_path: Path, pid: int, comm: str, exe: str, cgroup: str, maps: list[str] = ()) -> None:
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    os.symlink(exe, d / "exe")
    (d / "cgroup").write_text(f"12:cpu:/legacy\n0::{cgroup}\n")
    (d / "maps").write_text("".join(f"7f00-7f01 r-xp 00000000 fe:00 {i} {m}\n" for i, m in enumerate(maps))
                            + "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    _proc(tmp_path, 100, "vllm", "/usr/bin/python3.11", "/system.slice/vllm.service")
    _proc(tmp_path, 101, "vllm-helper", "/usr/bin/python3.11", "/system.slice/vllm.service")
    _proc(tmp_path, 200, "tritonserver", "/opt/tritonserver/bin/tritonserver", "/kubepods/pod1/c1",
          ["/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05", "/usr/lib/libcudart.so.12",
           "/usr/lib/x86_64-linux-gnu/libcuda.so.530.30.02 (deleted)", "/tmp/gone.so (deleted)"])
    _proc(tmp_path, 300, "bash", "/usr/bin/bash", "/user.slice")
    (tmp_path / "self").mkdir()
    return tmp_path


@pytest.mark.parametrize("workloads, want", [
    ([{"name": "a", "comm": "vllm"}], {100: 1}),  # comm is matched whole: not vllm-helper
    ([{"name": "a", "comm": "vllm.*"}], {100: 1, 101: 1}),
    ([{"name": "a", "exe": "/opt/tritonserver/bin/tritonserver"}], {200: 1}),
    ([{"name": "a", "cgroup": "/system.slice/vllm.service"}], {100: 1, 101: 1}),
    ([{"name": "a", "cgroup": "/kubepods/"}], {200: 1}),
    ([{"name": "a", "cgroup": "/system.slice/vllm"}], {}),  # a prefix of the path, not of a name
    ([{"name": "a", "pids": [300, 999]}], {300: 1}),
    ([{"name": "a", "comm": "vllm.*", "exe": "/nope"}], {}),  # every given criterion must match
    ([{"name": "a", "comm": ".*"}, {"name": "b", "pids": [300]}], {100: 1, 101: 1, 200: 1, 300: 1}),  # first wins
    ([{"name": "a", "pids": [300]}, {"name": "b", "comm": "(bash|vllm)"}], {300: 1, 100: 2}),
    ([{"name": "a"}], {}),  # no criterion: matches nothing
])
def test_scan_matches_workloads(proc: Path, workloads: list, want: dict) -> None:
    tracker = WorkloadTracker(parse({"workloads": workloads}).workloads, proc=proc)
    assert tracker.scan() == want


def test_mapped_files_skip_anonymous_mappings_and_mark_deleted_ones(proc: Path) -> None:
    tracker = WorkloadTracker([], proc=proc)
    assert tracker.mapped_files(200) == {"/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05",
                                         "/usr/lib/libcudart.so.12",
                                         "/usr/lib/x86_64-linux-gnu/libcuda.so.530.30.02 (deleted)",
                                         "/tmp/gone.so (deleted)"}
    assert tracker.mapped_files(12345) == set()


def test_libraries_are_opened_through_the_process_root_and_deleted_ones_only_named(proc: Path) -> None:
    """A library deleted (or replaced, as by a driver upgrade) since it was mapped has no path to open it by; its
    name keeps what is attached to it attached while a process maps it."""
    lib = proc / "rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    os.symlink(proc / "rootfs", proc / "200" / "root")
    st = lib.stat()
    files, deleted = WorkloadTracker([], proc=proc).libraries([200, 12345], library_matcher("libcuda.so.1"))
    file_id = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert files == {file_id: (f"{proc}/200/root/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05",
                               "/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05")}
    assert deleted == {"/usr/lib/x86_64-linux-gnu/libcuda.so.530.30.02"}


@pytest.mark.parametrize("library, path, match", [
    ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", True),
    ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05", True),
    ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so", True),
    ("libcuda.so.1", "/usr/local/cuda/lib64/libcudart.so.12", False),
    ("libnccl.so.2", "/opt/conda/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2", True),
    ("libnccl.so.2", "/usr/lib/libnccl-net.so", False),
    ("/opt/lib/libcuda.so.1", "/opt/lib/libcuda.so.1", True),
    ("/opt/lib/libcuda.so.1", "/usr/lib/libcuda.so.1", False),
])
def test_library_matcher(library: str, path: str, match: bool) -> None:
    assert library_matcher(library)(path) is match
