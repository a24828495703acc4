"""cuda probe: uprobes leave a library file once no workload process maps it (the process exited, its container
went away with the file), in the kernel too, and come back when a process maps the file again.  A file is its
device and inode as the process sees them: one image's library in two containers (overlay mounts of one layer) is
attached once per container, a copy-up or another metadata change keeps it attached, two filesystems built from
one tree are two files, and a deleted mapping keeps only its own file attached."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcc
import pytest

from probe_helpers import OFF, Workload, drain, kernel_uprobes, make_source
from sits_observe.probes.uprobes import LibraryAttacher
from sits_observe.probes.source import ProbeSource

COMM = "sits-t-churn"
SYNC = "cuStreamSynchronize"
GONE = "not attached: no workload process maps libcuda.so.1 (yet)"


@pytest.fixture(scope="module")
def source() -> Iterator[ProbeSource]:
    src, _ = make_source({
        "workloads": [{"name": "gpu", "comm": COMM}],
        "probes": {"runq": OFF, "syscalls": OFF, "block_io": OFF, "nccl": OFF, "scan_interval": 3600},
    })
    yield src
    src.close()


def _counted(source: ProbeSource) -> int:
    hist = drain(source).hists.get(("sync", "gpu"))
    return 0 if hist is None else hist.count


def _timed(source: ProbeSource, wl: Workload, n: int) -> int:
    """Calls the library's SYNC ``n`` times in ``wl``; returns how many calls the probe timed."""
    drain(source)
    wl.run("call", 0, SYNC, 100, n)
    return _counted(source)


def _metric(source: ProbeSource, name: str) -> float:
    return next(s.value for s in source.metrics() if s.name == name and s.labels == (("probe", "cuda"),))


def _detached_said(caplog: pytest.LogCaptureFixture, lib: Path) -> list[tuple[int, str]]:
    said = f"probe cuda: detached from {lib}:"
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith(said)]


def _copy(stub: Path, to: Path) -> Path:
    """A new file at ``to`` (a new inode, as an upgrade or a new container image brings), a copy of ``stub``."""
    shutil.copy(stub, to.parent / "next")
    return (to.parent / "next").replace(to)


def test_a_library_is_detached_when_its_process_exits_and_attached_again_when_another_maps_it(
        source: ProbeSource, stubs: dict, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sits_observe.probes")
    lib = stubs["libcuda.so.1"]
    attacher = source.states["cuda"].attacher
    with Workload(COMM, [lib]) as wl:
        source.rescan()
        assert _timed(source, wl, 5) == 5
        first = kernel_uprobes(lib)
        assert len(first) == 2 * attacher.probes > 0  # an uprobe and a uretprobe per symbol
        assert {u.file for u in first} == {f"/proc/{wl.pid}/root{lib}"}
    source.rescan()  # the process exited: no process maps the library
    assert kernel_uprobes(lib) == []  # the perf events, and the uprobes with them, are gone from the kernel
    assert attacher.files == {} and attacher.probes == 0 and attacher.missing == {}
    assert _metric(source, "sits_probe_detached_files_total") == 1.0  # the module's first test: its first file
    assert _metric(source, "sits_probe_attached") == 0.0 and source.states["cuda"].problem == GONE
    source.rescan()
    assert _detached_said(caplog, lib) == [
        (logging.INFO, f"probe cuda: detached from {lib}: no workload process maps it any more")]

    with Workload(COMM, [lib]) as wl:
        source.rescan()
        assert _timed(source, wl, 3) == 3
        again = kernel_uprobes(lib)
        assert {u.file for u in again} == {f"/proc/{wl.pid}/root{lib}"}
        assert sorted((u.kind, u.offset) for u in again) == sorted((u.kind, u.offset) for u in first)
    assert _metric(source, "sits_probe_attached") == 1.0 and source.states["cuda"].problem is None


def test_a_library_deleted_with_its_container_is_detached_without_the_file(
        source: ProbeSource, stubs: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sits_observe.probes")
    lib = _copy(stubs["libcuda.so.1"], tmp_path / "libcuda.so.1")  # the copy a container brought
    with Workload(COMM, [lib]) as wl:
        source.rescan()
        assert _timed(source, wl, 4) == 4 and kernel_uprobes(lib)
        wl.proc.kill()
        wl.proc.wait()
    lib.unlink()
    source.rescan()
    assert kernel_uprobes(lib) == [] and source.states["cuda"].attacher.files == {}
    assert _detached_said(caplog, lib) == [
        (logging.INFO, f"probe cuda: detached from {lib}: no workload process maps it any more")]
    assert not [r for r in caplog.records if "detach failed" in r.getMessage()]


def test_a_library_replaced_while_mapped_stays_attached_until_no_process_maps_it(
        source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    """As after a driver upgrade: the running process maps the old file, deleted; no path opens it any more."""
    lib = _copy(stubs["libcuda.so.1"], tmp_path / "libcuda.so.1")
    with Workload(COMM, [lib]) as wl:
        source.rescan()
        _copy(stubs["libcuda.so.1"], lib)
        source.rescan()
        assert _timed(source, wl, 4) == 4 and kernel_uprobes(lib)
    source.rescan()
    assert kernel_uprobes(lib) == [] and source.states["cuda"].attacher.files == {}


def test_two_files_attached_through_one_path_are_detached_each_on_its_own(
        source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    """bcc names a probe after the path and address it was attached through, so a file attached through the
    /proc/PID/root/... of a reused pid takes the names of a file still attached; both still detach."""
    bpf = source.states["cuda"].program.bpf
    attacher = LibraryAttacher(bpf, {"sync": (SYNC,)})
    lib = _copy(stubs["libcuda.so.1"], tmp_path / "libcuda.so.1")
    first = (lib.stat().st_dev, lib.stat().st_ino)
    before, open_probes = set(bpf.uprobe_fds), bcc._num_open_probes  # bcc's count, for its quota (BCC_PROBE_LIMIT)
    assert attacher.attach(first, str(lib), str(lib)) is None
    names = bpf.uprobe_fds.keys() - before
    _copy(stubs["libcuda.so.1"], lib)
    second = (lib.stat().st_dev, lib.stat().st_ino)
    assert attacher.attach(second, str(lib), str(lib)) is None
    assert len(kernel_uprobes(lib)) == 4 and len(names) == 2
    assert attacher.release({second: (str(lib), str(lib))}) == [(str(lib), None)]
    assert {u.fd for u in kernel_uprobes(lib)} == {bpf.uprobe_fds[ev] for ev in names}  # the second file's
    assert attacher.release({}) == [(str(lib), None)]
    assert kernel_uprobes(lib) == [] and not names & bpf.uprobe_fds.keys()
    assert bcc._num_open_probes == open_probes  # the first file's probes, closed behind bcc's back, counted out


@contextmanager
def _containers(stubs: dict, tmp_path: Path, n: int) -> Iterator[list[Path]]:
    """The library as ``n`` containers of one image see it: overlay mounts of one lower layer (image/), each with
    its own upper layer (upper1/, ...)."""
    image = tmp_path / "image"
    image.mkdir()
    shutil.copy(stubs["libcuda.so.1"], image / "libcuda.so.1")
    roots = []
    try:
        for k in range(1, n + 1):
            upper, work, root = (tmp_path / f"{part}{k}" for part in ("upper", "work", "root"))
            for d in (upper, work, root):
                d.mkdir()
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={image},upperdir={upper},workdir={work}", str(root)], check=True)
            roots.append(root)
        yield [root / "libcuda.so.1" for root in roots]
    finally:
        for root in roots:
            subprocess.run(["umount", "-l", str(root)], check=False)


def test_one_image_library_in_two_containers_is_attached_once_per_container(
        source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    """Each container's overlay mount is its own device: the library is two files here, though one real file to
    the kernel, whose uprobes then fire twice for every call; the nesting check counts each call once."""
    attacher = source.states["cuda"].attacher
    detached = attacher.detached
    with _containers(stubs, tmp_path, 2) as (first, second), \
            Workload(COMM, [first]) as one, Workload(COMM, [second]) as two:
        assert first.stat().st_dev != second.stat().st_dev  # each overlay mount a device of its own
        source.rescan()
        assert len(attacher.files) == 2
        per_file = attacher.probes  # an uprobe and a uretprobe per symbol, for each of the two files
        assert len(kernel_uprobes(first)) == len(kernel_uprobes(second)) == per_file > 0
        drain(source)
        one.run("call", 0, SYNC, 100, 5)
        two.run("call", 0, SYNC, 100, 3)
        assert _counted(source) == 8  # not 16
        one.proc.kill()
        one.proc.wait()
        source.rescan()  # the first container's file is detached; the second's stays, and counts
        assert attacher.detached == detached + 1 and list(attacher.files.values()) == [str(second)]
        assert kernel_uprobes(first) == [] and len(kernel_uprobes(second)) == per_file
        assert _timed(source, two, 4) == 4
        two.proc.kill()
        two.proc.wait()
        source.rescan()
        assert attacher.files == {} and kernel_uprobes(second) == []


def test_a_container_going_away_mid_call_leaves_the_other_containers_threads_timed(
        source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    """Each entry and return traps once per container of the image. The first container's probes were detached
    while the second's thread was in a call: two entries, one return, so a count of entries never came back
    to 0 and no call of that thread was timed again for 10 minutes. Entries and returns are paired by the
    stack pointer now."""
    with _containers(stubs, tmp_path, 2) as (first, second), \
            Workload(COMM, [first]) as one, Workload(COMM, [second]) as two:
        source.rescan()
        assert _timed(source, two, 5) == 5
        two.send("call", 0, SYNC, 1_500_000, 1)  # in a 1.5 s call ...
        time.sleep(0.5)
        one.proc.kill()
        one.proc.wait()
        source.rescan()  # ... when the first container's file is detached
        two.expect("ok")
        assert _counted(source) == 1
        assert _timed(source, two, 20) == 20
    source.rescan()


def test_a_call_whose_return_was_missed_costs_only_that_call(source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    """The file's probes go and come back while a thread is in a call: its return is never seen. The thread's next
    call, from the same frame (the same stack pointer), was taken for another trap of the lost one, and its return
    recorded the time since the lost call began (a 100 us call as 4 s)."""
    lib = _copy(stubs["libcuda.so.1"], tmp_path / "libcuda.so.1")
    attacher = source.states["cuda"].attacher
    with Workload(COMM, [lib]) as wl:
        source.rescan()
        assert _timed(source, wl, 3) == 3
        wl.send("call", 0, SYNC, 1_500_000, 1)  # in a 1.5 s call ...
        time.sleep(0.5)
        attacher.release({})  # ... the file's probes go (its last mapping elsewhere went) ...
        source.rescan()  # ... and come back: this process still maps it
        wl.expect("ok")
        assert _counted(source) == 0
        time.sleep(1.5)
        drain(source)
        wl.run("call", 0, SYNC, 100, 3)
        hist = drain(source).hists[("sync", "gpu")]
        assert hist.count == 3 and hist.sum < 0.1, (hist.count, hist.sum)
    source.rescan()


def test_a_library_copied_up_in_its_container_stays_attached(
        source: ProbeSource, stubs: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A metadata change inside the container (chmod) copies the file up to the container's own layer, with a new
    ctime; the running process still maps the lower file, where its uprobes are, and the file keeps its device
    and inode number."""
    caplog.set_level(logging.INFO, "sits_observe.probes")
    attacher = source.states["cuda"].attacher
    with _containers(stubs, tmp_path, 1) as (lib,):
        with Workload(COMM, [lib]) as wl:
            source.rescan()
            assert _timed(source, wl, 5) == 5
            attached, held = dict(attacher.files), kernel_uprobes(lib)
            lib.chmod(0o755)
            assert (tmp_path / "upper1" / "libcuda.so.1").exists()  # copied up
            source.rescan()
            assert attacher.files == attached and kernel_uprobes(lib) == held
            assert _timed(source, wl, 5) == 5
            assert _detached_said(caplog, lib) == []
        source.rescan()
        assert attacher.files == {} and kernel_uprobes(lib) == []


def test_a_metadata_change_on_the_host_keeps_a_library_attached(
        source: ProbeSource, stubs: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A new link and a chmod change the file's ctime, not the file: no detach and attach again."""
    caplog.set_level(logging.INFO, "sits_observe.probes")
    lib = _copy(stubs["libcuda.so.1"], tmp_path / "libcuda.so.1")
    attacher = source.states["cuda"].attacher
    with Workload(COMM, [lib]) as wl:
        source.rescan()
        held = kernel_uprobes(lib)
        os.link(lib, tmp_path / "hardlink")
        lib.chmod(0o700)
        source.rescan()
        assert held and kernel_uprobes(lib) == held and _timed(source, wl, 3) == 3
        assert _detached_said(caplog, lib) == []
    source.rescan()
    assert attacher.files == {}


def test_a_deleted_mapping_keeps_only_its_own_file_attached(source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    """A process maps the library's old file, replaced since (a driver upgrade): that file stays attached, while
    the new file at the same path is detached once the process that mapped it exits."""
    lib = _copy(stubs["libcuda.so.1"], tmp_path / "libcuda.so.1")
    attacher = source.states["cuda"].attacher
    with Workload(COMM, [lib]) as old:
        source.rescan()
        _copy(stubs["libcuda.so.1"], lib)
        with Workload(COMM, [lib]) as new:
            source.rescan()
            new_file = f"/proc/{new.pid}/root{lib}"
            assert len(attacher.files) == 2 and kernel_uprobes(new_file)
        source.rescan()  # nothing maps the new file; the old one, of the same name, is still mapped (deleted)
        assert kernel_uprobes(new_file) == [] and len(attacher.files) == 1
        assert kernel_uprobes(f"/proc/{old.pid}/root{lib}") and _timed(source, old, 3) == 3
    source.rescan()
    assert attacher.files == {} and kernel_uprobes(lib) == []


@contextmanager
def _images(stubs: dict, tmp_path: Path, n: int) -> Iterator[list[Path]]:
    """``n`` ext4 images built from one tree at one (fake) time, mounted read-only from loop devices: the library
    in each has the same inode number, size and times, on a device of its own."""
    assert shutil.which("mkfs.ext4"), "this test needs mkfs.ext4 (e2fsprogs) to build its images"
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(stubs["libcuda.so.1"], tree / "libcuda.so.1")
    roots = []
    try:
        for k in range(1, n + 1):
            image, root = tmp_path / f"image{k}.ext4", tmp_path / f"fs{k}"
            root.mkdir()
            subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(tree), str(image), "8M"], check=True,
                           env={**os.environ, "E2FSPROGS_FAKE_TIME": "1700000000"})
            mount = subprocess.run(["mount", "-o", "loop,ro", str(image), str(root)], capture_output=True, text=True)
            assert mount.returncode == 0, f"this test needs loop devices: mount -o loop: {mount.stderr.strip()}"
            roots.append(root)
        yield [root / "libcuda.so.1" for root in roots]
    finally:
        for root in roots:  # lazily: a file's uprobes hold its mount until they are detached
            subprocess.run(["umount", "-l", str(root)], check=False)


def test_two_filesystems_built_from_one_tree_are_two_files(source: ProbeSource, stubs: dict, tmp_path: Path) -> None:
    attacher = source.states["cuda"].attacher
    with _images(stubs, tmp_path, 2) as (first, second):
        a, b = first.stat(), second.stat()
        assert (a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns) == (b.st_ino, b.st_size, b.st_mtime_ns,
                                                                       b.st_ctime_ns)
        with Workload(COMM, [first]) as one, Workload(COMM, [second]) as two:
            source.rescan()
            assert len(attacher.files) == 2 and kernel_uprobes(first) and kernel_uprobes(second)
            drain(source)
            one.run("call", 0, SYNC, 100, 5)
            two.run("call", 0, SYNC, 100, 3)
            assert _counted(source) == 8
        source.rescan()
        assert attacher.files == {} and kernel_uprobes(first) + kernel_uprobes(second) == []
