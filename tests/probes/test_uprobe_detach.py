"""cuda probe: uprobes leave a library file once no workload process maps it (the process exited, its container
went away with the file), in the kernel too, and come back when a process maps the file again; one image's library
in several containers (overlay mounts of one layer) is one file to the kernel, attached once."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_helpers import OFF, Workload, drain, kernel_uprobes, make_source
from sits_observe.probes.program import LibraryAttacher
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
    before = set(bpf.uprobe_fds)
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


@pytest.fixture
def containers(stubs: dict, tmp_path: Path) -> Iterator[list[Path]]:
    """The library as two containers of one image see it: two overlay mounts of one lower layer."""
    image = tmp_path / "image"
    image.mkdir()
    shutil.copy(stubs["libcuda.so.1"], image / "libcuda.so.1")
    roots = []
    try:
        for k in (1, 2):
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


def test_one_image_library_in_two_containers_is_attached_once(source: ProbeSource, containers: list[Path]) -> None:
    """Two containers of one image map one real file to the kernel: its uprobes go there once and fire in both."""
    first, second = containers
    assert first.stat().st_dev != second.stat().st_dev  # each mount its own device: once the key, two attaches
    attacher = source.states["cuda"].attacher
    detached = attacher.detached
    with Workload(COMM, [first]) as one, Workload(COMM, [second]) as two:
        source.rescan()
        assert len(attacher.files) == 1
        held = kernel_uprobes(first) + kernel_uprobes(second)
        assert len(held) == 2 * attacher.probes > 0  # an uprobe and a uretprobe per symbol, once
        drain(source)
        one.run("call", 0, SYNC, 100, 5)
        two.run("call", 0, SYNC, 100, 3)  # the uprobes are on the real file: they fire in both containers
        assert _counted(source) == 8
        attached_through = one if any(f"/proc/{one.pid}/" in u.file for u in held) else two
        other = two if attached_through is one else one
        attached_through.proc.kill()
        attached_through.proc.wait()
        source.rescan()  # the other container still maps the file: it stays attached, and counts
        assert len(attacher.files) == 1 and attacher.detached == detached
        other.run("call", 0, SYNC, 100, 4)
        assert _counted(source) == 4
    source.rescan()
    assert attacher.files == {} and kernel_uprobes(first) + kernel_uprobes(second) == []
