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


def _direct_file(tmp_path: Path, reads: int = READS, name: str = "data.bin") -> Path:
    """A file of ``reads`` 4 KiB blocks written and synced beforehand, or skip where this machine cannot produce
    block IO."""
    path = tmp_path / name
    path.write_bytes(os.urandom(reads * 4096))
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


def test_no_reader_is_charged_with_the_others_requests_and_skips_are_counted(tmp_path: Path) -> None:
    """Two readers keeping the disk busy: a request dispatched from the other reader's context (its submission ran
    the I/O scheduler's queue) was charged to that reader (up to +8 in 2 x 3000 reads), one dispatched by a kworker
    to no workload; requests are now charged to the task that inserted them. And a completion whose program the
    kernel skipped (its recursion guard: another BPF tracing program was running on that CPU) went untimed without
    a trace: sits_probe_missed_events_total now counts the kernel's recursion_misses of the probe's programs."""
    n = 3000
    src, _ = make_source({
        "workloads": [{"name": "r1", "comm": "sits-t-rd1"}, {"name": "r2", "comm": "sits-t-rd2"}],
        "probes": {"runq": OFF, "syscalls": OFF, "cuda": OFF, "nccl": OFF, "scan_interval": 3600,
                   "block_io": {"unattributed": None}},
    })
    try:
        files = [_direct_file(tmp_path, n, f"{k}.bin") for k in ("r1", "r2")]
        with Workload("sits-t-rd1") as a, Workload("sits-t-rd2") as b:
            src.rescan()
            drain(src)
            for w, path in ((a, files[0]), (b, files[1])):
                w.send("pread_direct", str(path), n)
            a.expect("ok")
            b.expect("ok")
            frame = drain(src)
        counts = [frame.hists[("block_io", w)].count for w in ("r1", "r2")]
        assert max(counts) <= n and min(counts) > 0.9 * n, counts
        (missed,) = [s.value for s in src.metrics() if s.name == "sits_probe_missed_events_total"]
        fds = [fn.fd for fn in src.states["block_io"].program.bpf.funcs.values()]
        kernel = sum(int(line.split()[1]) for fd in fds for line in Path(f"/proc/self/fdinfo/{fd}").read_text()
                     .splitlines() if line.startswith("recursion_misses:"))
        assert len(fds) == 3 and missed == kernel  # issue, complete, insert
    finally:
        src.close()
