"""Workload tracking from a /proc tree (a fake one here: the matching rules, table-driven) and the
library names uprobes attach to."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sits_observe.config import parse
from sits_observe.probes.workloads import Mapping, WorkloadTracker, library_matcher


def _maps(maps: list[tuple[str, str, int]]) -> str:
    """/proc/PID/maps text: two mappings (code, data) of each (path, device, inode), then the stack."""
    lines = []
    for i, (path, dev, ino) in enumerate(maps):
        lines += [f"7f{i:02x}0000-7f{i:02x}1000 r-xp 00000000 {dev} {ino}                    {path}\n",
                  f"7f{i:02x}1000-7f{i:02x}2000 rw-p 00001000 {dev} {ino}                    {path}\n"]
    return "".join(lines) + "7ffd0000-7ffe0000 rw-p 00000000 00:00 0                          [stack]\n"


def _proc(tmp_path: Path, pid: int, comm: str, exe: str, cgroup: str, maps: list[tuple[str, str, int]] = ()) -> None:
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    os.symlink(exe, d / "exe")
    (d / "cgroup").write_text(f"12:cpu:/legacy\n0::{cgroup}\n")
    (d / "maps").write_text(_maps(maps))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    _proc(tmp_path, 100, "vllm", "/usr/bin/python3.11", "/system.slice/vllm.service")
    _proc(tmp_path, 101, "vllm-helper", "/usr/bin/python3.11", "/system.slice/vllm.service")
    _proc(tmp_path, 200, "tritonserver", "/opt/tritonserver/bin/tritonserver", "/kubepods/pod1/c1",
          [("/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05", "fd:01", 1001),
           ("/usr/lib/libcudart.so.12", "fd:01", 1002),
           ("/usr/lib/x86_64-linux-gnu/libcuda.so.530.30.02 (deleted)", "fd:01", 1003),
           ("/tmp/gone.so (deleted)", "00:27", 1004)])
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
])
def test_scan_matches_workloads(proc: Path, workloads: list, want: dict) -> None:
    tracker = WorkloadTracker(parse({"workloads": workloads}).workloads, proc=proc)
    assert tracker.scan() == want


def test_mapped_files_give_each_file_once_with_its_device_and_inode(proc: Path) -> None:
    """A file's device (hex major:minor) and inode columns; anonymous and special mappings left out; a file deleted
    (or replaced) since it was mapped marked as such."""
    tracker = WorkloadTracker([], proc=proc)
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so"
    assert sorted(tracker.mapped_files(200)) == sorted([
        Mapping(f"{lib}.535.104.05", False, (os.makedev(0xFD, 1), 1001), "7f000000-7f001000"),
        Mapping("/usr/lib/libcudart.so.12", False, (os.makedev(0xFD, 1), 1002), "7f010000-7f011000"),
        Mapping(f"{lib}.530.30.02", True, (os.makedev(0xFD, 1), 1003), "7f020000-7f021000"),
        Mapping("/tmp/gone.so", True, (os.makedev(0, 0x27), 1004), "7f030000-7f031000")])
    assert tracker.mapped_files(12345) == []


def test_the_maps_columns_are_what_stat_gives() -> None:
    """This process's own mapping of a file on tmpfs (where they agree, unlike btrfs): the maps line's device and
    inode are the file's st_dev and st_ino."""
    with tempfile.NamedTemporaryFile(dir="/dev/shm", suffix=".so") as f:
        f.write(b"\0" * 8192)
        f.flush()
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
            mapped = [m for m in WorkloadTracker([]).mapped_files(os.getpid()) if m.path == f.name]
        st = os.stat(f.name)
    assert [m.file for m in mapped] == [(st.st_dev, st.st_ino)]


LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05"


def _columns(of: Path, device_off: bool = False) -> tuple[str, int]:
    """The maps columns of ``of``; ``device_off``: another device (as btrfs, or an overlay before kernel 6.8, show)."""
    st = of.stat()
    return f"{os.major(st.st_dev) + device_off:02x}:{os.minor(st.st_dev):02x}", st.st_ino


@pytest.mark.parametrize("deleted, columns, map_file, offered", [
    (False, "lib", None, True),  # maps and stat agree (ext4, xfs, tmpfs, an overlay of layers on one fs)
    (False, "other", None, False),  # the path now names another file (replaced, not deleted): only held
    (True, "lib", None, False),  # deleted since: no path opens it
    (False, "other", "lib", True),  # maps disagrees with stat (btrfs, overlay layers on several fs): map_files
    (False, "lib", "other", False),  # map_files opens another file than the path names
    (True, "other", "other", False),  # deleted: held as what map_files opens
    (False, "lib, device off", None, True),  # map_files unreadable (the shipped unit: no CAP_SYS_ADMIN) and the
    # maps device not stat's (btrfs subvolumes, an overlay before kernel 6.8): the inode says it is the file
])
def test_a_mapped_library_is_offered_only_where_its_path_still_names_it(
        proc: Path, deleted: bool, columns: str, map_file: str | None, offered: bool) -> None:
    """Process 200 (root: proc/rootfs) maps LIB, with the device and inode of ``columns`` in its maps line;
    ``map_file``: the file /proc/200/map_files/<area> opens (None: unreadable, as without CAP_SYS_ADMIN)."""
    files = {"lib": proc / f"rootfs{LIB}", "other": proc / "elsewhere.so"}
    for f in files.values():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"\x7fELF")
    os.symlink(proc / "rootfs", proc / "200" / "root")
    name, off, _ = columns.partition(", device off")
    (proc / "200" / "maps").write_text(_maps([(LIB + " (deleted)" * deleted, *_columns(files[name], bool(off)))]))
    columns = name
    if map_file is not None:
        (proc / "200" / "map_files").mkdir()
        os.symlink(files[map_file], proc / "200" / "map_files" / "7f000000-7f001000")
    st = files[map_file or columns].stat()
    got = WorkloadTracker([], proc=proc).libraries([200, 12345], library_matcher("libcuda.so.1"))
    if offered:
        assert got == ({(st.st_dev, st.st_ino): (f"{proc}/200/root{LIB}", LIB)}, set())
    else:
        assert got == ({}, {(st.st_dev, st.st_ino)})


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


def test_a_mapping_below_0x10000000_is_found_under_map_files(proc: Path) -> None:
    """maps pads addresses to 8 hex digits, map_files names them unpadded (and refuses a leading zero): a
    non-PIE program's mapping at 0x1000000 fell back to the maps columns even with the capability."""
    lib = proc / f"rootfs{LIB}"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    os.symlink(proc / "rootfs", proc / "200" / "root")
    dev, ino = _columns(lib, device_off=True)  # the maps columns alone would not name the file exactly
    (proc / "200" / "maps").write_text(f"01000000-01001000 r-xp 00000000 {dev} {ino}    {LIB}\n")
    (proc / "200" / "map_files").mkdir()
    os.symlink(lib, proc / "200" / "map_files" / "1000000-1001000")
    tracker = WorkloadTracker([], proc=proc)
    (mapping,) = tracker.mapped_files(200)
    st = lib.stat()
    assert tracker._file_of(200, mapping) == ((st.st_dev, st.st_ino), True)


UNIT_CAPS = "+sys_ptrace,+dac_read_search,+checkpoint_restore"  # what docs/sits-observe.service gives to these reads


@pytest.mark.parametrize("caps, sure", [(UNIT_CAPS, True), ("+sys_ptrace,+dac_read_search", False)])
def test_a_non_root_daemon_names_another_users_mapped_library(caps: str, sure: bool) -> None:
    """A real privilege drop to user nobody with the shipped unit's capabilities: map_files names the file (it
    needs CAP_CHECKPOINT_RESTORE); without that capability the maps line stands in and the library is still
    offered."""
    script = ("import json, sys; from sits_observe.probes.workloads import WorkloadTracker, library_matcher; "
              "pid, path = int(sys.argv[1]), sys.argv[2]; t = WorkloadTracker([]); "
              "m = [x for x in t.mapped_files(pid) if x.path == path]; "
              "print(json.dumps({'files': [list(k) for k in t.libraries([pid], library_matcher('libcuda.so.1')).files],"
              " 'sure': t._file_of(pid, m[0])[1]}))")
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="libcuda.so.") as f:
        f.write(b"\0" * 8192)
        f.flush()
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
            out = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                                  f"--inh-caps={caps}", f"--ambient-caps={caps}", sys.executable, "-c", script,
                                  str(os.getpid()), f.name], capture_output=True, text=True, timeout=60, cwd="/")
        st = os.stat(f.name)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"files": [[st.st_dev, st.st_ino]], "sure": sure}


def test_one_scan_reads_each_process_maps_once_for_every_library(proc: Path) -> None:
    """The cuda and nccl probes each read every workload process's /proc/PID/maps at every scan (thousands of
    lines for a CUDA process): one scan now shares what it read."""
    tracker, maps = WorkloadTracker([], proc=proc), {}
    first = tracker.libraries([200], library_matcher("libcuda.so.1"), maps)
    assert first.held  # the two libcuda files it maps (no root to open them through here)
    (proc / "200" / "maps").write_text("")  # a second read would find nothing mapped
    assert tracker.libraries([200], library_matcher("libcuda.so.1"), maps) == first
    assert [m.path for m in maps[200]][:2] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05",
                                               "/usr/lib/libcudart.so.12"]
    assert tracker.libraries([200], library_matcher("libcuda.so.1")).held == set()  # without: read afresh, empty


def test_names_that_are_not_utf8_match_no_rule_and_fail_no_scan(proc: Path) -> None:
    """Any process may name itself, its delegated cgroups and the files it maps with bytes that are not UTF-8:
    reading them as text raised UnicodeDecodeError out of scan() (only OSError was caught) and mapped_files()."""
    _proc(proc, 400, "x", "/usr/bin/x", "/x")
    (proc / "400" / "comm").write_bytes(b"\xffvllm\n")
    (proc / "400" / "cgroup").write_bytes(b"0::/system.slice/vllm.service\xff\n")
    (proc / "400" / "maps").write_bytes(_maps([("/opt/\xff/libcuda.so.1", "fd:01", 1005)]).encode("latin-1"))
    tracker = WorkloadTracker(parse({"workloads": [{"name": "a", "comm": ".vllm"}]}).workloads, proc=proc)
    assert tracker.scan() == {400: 1}  # the byte reads as U+FFFD, one character
    tracker = WorkloadTracker(parse({"workloads": [{"name": "a", "cgroup": "/system.slice/vllm.service"}]}).workloads,
                              proc=proc)
    assert tracker.scan() == {100: 1, 101: 1} and tracker.workload_of(400) is None
    assert [m.path for m in tracker.mapped_files(400)] == ["/opt/\ufffd/libcuda.so.1"]


def test_a_cgroup_path_is_cut_only_where_the_kernel_ends_its_line(proc: Path) -> None:
    """``splitlines()`` also cut at U+0085 (UTF-8 ``c2 85``), which a directory name may hold: a cgroup named
    ``vllm.service\\x85x`` read as ``vllm.service``."""
    _proc(proc, 400, "x", "/usr/bin/x", "/system.slice/vllm.service\x85x")
    tracker = WorkloadTracker(parse({"workloads": [{"name": "a", "cgroup": "/system.slice/vllm.service"}]}).workloads,
                              proc=proc)
    assert tracker.scan() == {100: 1, 101: 1}
