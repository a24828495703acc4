"""cuda probe: one image's library in several containers (overlay mounts of one lower layer) is one real file
to the kernel, and is attached once, not once per container."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_helpers import OFF, Workload, drain, kernel_uprobes, make_source
from sits_observe.probes.source import ProbeSource

COMM = "sits-t-overlay"
SYNC = "cuStreamSynchronize"


@pytest.fixture(scope="module")
def source() -> Iterator[ProbeSource]:
    src, _ = make_source({
        "workloads": [{"name": "gpu", "comm": COMM}],
        "probes": {"runq": OFF, "syscalls": OFF, "block_io": OFF, "nccl": OFF, "scan_interval": 3600},
    })
    yield src
    src.close()


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


def _timed(source: ProbeSource) -> int:
    hist = drain(source).hists.get(("sync", "gpu"))
    return 0 if hist is None else hist.count


def test_one_image_library_in_two_containers_is_attached_once(source: ProbeSource, containers: list[Path]) -> None:
    first, second = containers
    assert first.stat().st_dev != second.stat().st_dev  # each mount its own device: once the key, two attaches
    attacher = source.states["cuda"].attacher
    with Workload(COMM, [first]) as one, Workload(COMM, [second]) as two:
        source.rescan()
        assert len(attacher.files) == 1
        held = kernel_uprobes(first) + kernel_uprobes(second)
        assert len(held) == 2 * attacher.probes > 0  # an uprobe and a uretprobe per symbol, once
        drain(source)
        one.run("call", 0, SYNC, 100, 5)
        two.run("call", 0, SYNC, 100, 3)  # the uprobes are on the real file: they fire in both containers
        assert _timed(source) == 8
        attached_through = one if any(f"/proc/{one.pid}/" in u.file for u in held) else two
        other = two if attached_through is one else one
        attached_through.proc.kill()
        attached_through.proc.wait()
        source.rescan()  # the other container still maps the file: it stays attached, and counts
        assert len(attacher.files) == 1 and attacher.detached == 0
        other.run("call", 0, SYNC, 100, 4)
        assert _timed(source) == 4
    source.rescan()
    assert attacher.files == {} and kernel_uprobes(first) + kernel_uprobes(second) == []
