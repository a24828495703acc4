"""block_io probe: O_DIRECT reads of a file on a block device are timed, one sample per request."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_helpers import OFF, Workload, drain, make_source
from sits_observe.probes.source import ProbeSource

READS = 32


@pytest.fixture(scope="module")
def source() -> Iterator[ProbeSource]:
    src, _ = make_source({
        "workloads": [{"name": "reader", "comm": "sits-t-reader"}],
        "probes": {"runq": OFF, "syscalls": OFF, "cuda": OFF, "nccl": OFF, "scan_interval": 3600,
                   "block_io": {"unattributed": "host"}},
    })
    yield src
    src.close()


def _direct_file(tmp_path: Path) -> Path:
    """A file written and synced beforehand, or skip where this machine cannot produce block IO."""
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(READS * 4096))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            pytest.skip(f"{tmp_path} is on a filesystem without O_DIRECT (tmpfs?): no block IO to time")
        raise
    os.close(fd)
    if os.major(os.stat(path).st_dev) == 0:
        pytest.skip(f"{tmp_path} is on a filesystem with no block device (tmpfs, overlay): no block IO to time")
    return path


def test_direct_reads_are_timed_per_request(source: ProbeSource, tmp_path: Path) -> None:
    path = _direct_file(tmp_path)
    with Workload("sits-t-reader") as reader:
        source.rescan()
        drain(source)
        reader.run("pread_direct", str(path), READS)
        frame = drain(source)
    h = frame.hists[("block_io", "reader")]
    assert h.count == READS
    assert h.sum > 0
    # IO from other tasks (journal, writeback) lands under the unattributed label, never under "reader"
    assert {w for s, w in frame.hists} <= {"reader", "host"}
