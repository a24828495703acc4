"""Host CPU (all CPUs and per NUMA node) and memory from /proc and /sys: exact values on written files,
sane values from this machine's kernel, a clear error for unreadable files, and the daemon on a GPU-less
host exporting them (real promtool)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from sits_observe.collectors.host import HostSource
from sits_observe.config import parse
from sits_observe.errors import CollectorError
from sits_observe.export.http import create_app
from sits_observe.frame import Frame, numa_cpu_by_node
from sits_observe.wiring import build_daemon

MEMINFO = "MemTotal:       1000000 kB\nMemFree:         100000 kB\nMemAvailable:    250000 kB\n"


def _stat(rows: list[tuple[int, int, int, int, int]]) -> str:
    """/proc/stat with one line per CPU: user, system, idle, iowait, steal jiffies."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {u} 0 {s} {idle} {io} 0 0 {st} 0 0" for i, (u, s, idle, io, st) in enumerate(rows)]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 42", ""])


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (proc / "meminfo").write_text(MEMINFO)
    for node, cpus in ((0, "0-1"), (1, "2-3")):
        d = sys_root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return proc, sys_root


def test_busy_shares_per_host_and_numa_node_and_memory(roots: tuple[Path, Path]) -> None:
    proc, sys_root = roots
    src = HostSource(proc, sys_root)
    (proc / "stat").write_text(_stat([(100, 0, 100, 0, 0)] * 4))
    first = Frame(1.0, 1.0)
    src.collect(first)
    assert first.host == {"memory_total_bytes": 1024e6, "memory_used_bytes": 750e3 * 1024, "memory_used_ratio": 0.75}
    assert numa_cpu_by_node(first.samples) == {}  # no interval yet
    # +100 jiffies each: CPU0 all user, CPU1 half system half iowait, CPU2 all idle, CPU3 a quarter steal
    (proc / "stat").write_text(_stat([(200, 0, 100, 0, 0), (100, 50, 100, 50, 0), (100, 0, 200, 0, 0),
                                      (100, 0, 175, 0, 25)]))
    f = Frame(2.0, 1.0)
    src.collect(f)
    assert f.host["cpu_utilization_ratio"] == pytest.approx((100 + 50 + 0 + 25) / 400)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 150 / 200, 1: 25 / 200})


def test_without_numa_directory_the_host_is_one_node(roots: tuple[Path, Path], tmp_path: Path) -> None:
    proc, _ = roots
    src = HostSource(proc, tmp_path / "no-sys")
    for user, idle in ((100, 100), (160, 140)):  # +60 busy, +40 idle on each CPU
        (proc / "stat").write_text(_stat([(user, 0, idle, 0, 0)] * 2))
        f = Frame(1.0, 1.0)
        src.collect(f)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 0.6})


def test_a_cpu_going_offline_between_reads_is_left_out(roots: tuple[Path, Path]) -> None:
    proc, sys_root = roots
    src = HostSource(proc, sys_root)
    (proc / "stat").write_text(_stat([(100, 0, 100, 0, 0)] * 4))
    src.collect(Frame(1.0, 1.0))
    lines = _stat([(150, 0, 150, 0, 0)] * 4).splitlines()
    (proc / "stat").write_text("\n".join(line for line in lines if not line.startswith("cpu3 ")))
    f = Frame(2.0, 1.0)
    src.collect(f)
    assert f.host["cpu_utilization_ratio"] == pytest.approx(0.5)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 0.5, 1: 0.5})


def test_a_cpu_coming_online_joins_its_node(roots: tuple[Path, Path]) -> None:
    proc, sys_root = roots
    (sys_root / "devices/system/node/node1/cpulist").write_text("2\n")  # CPU 3 offline at start
    src = HostSource(proc, sys_root)
    (proc / "stat").write_text(_stat([(100, 0, 100, 0, 0)] * 3))
    src.collect(Frame(1.0, 1.0))
    (sys_root / "devices/system/node/node1/cpulist").write_text("2-3\n")
    (proc / "stat").write_text(_stat([(150, 0, 150, 0, 0)] * 3 + [(7, 0, 7, 0, 0)]))
    src.collect(Frame(2.0, 1.0))  # CPU 3 has no interval yet
    (proc / "stat").write_text(_stat([(200, 0, 200, 0, 0)] * 3 + [(107, 0, 7, 0, 0)]))
    f = Frame(3.0, 1.0)
    src.collect(f)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 0.5, 1: (50 + 100) / 200})


def test_counters_going_backwards_count_as_no_time(roots: tuple[Path, Path]) -> None:
    proc, sys_root = roots
    src = HostSource(proc, sys_root)
    (proc / "stat").write_text(_stat([(100, 0, 100, 0, 0)] * 3 + [(900, 0, 100, 0, 0)]))
    src.collect(Frame(1.0, 1.0))
    (proc / "stat").write_text(_stat([(150, 0, 150, 0, 0)] * 3 + [(20, 0, 120, 0, 0)]))  # CPU 3's user count fell
    f = Frame(2.0, 1.0)
    src.collect(f)
    # CPU 3's interval (busy -880, total -860 jiffies) counts as none; unclipped the host would read 1.3
    assert f.host["cpu_utilization_ratio"] == pytest.approx(0.5)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 0.5, 1: 0.5})


@pytest.mark.parametrize(("broken", "says"), [
    ("stat", "proc/stat"), ("meminfo", "proc/meminfo"), ("stat-empty", "has no per-CPU lines of at least 5 jiffy counts"),
    ("meminfo-empty", "lacks MemTotal/MemAvailable"),
    ("stat-uneven", "all alike"), ("stat-words", "not jiffy counts")])
def test_unreadable_or_foreign_files_name_the_file(roots: tuple[Path, Path], broken: str, says: str) -> None:
    proc, sys_root = roots
    (proc / "stat").write_text(_stat([(1, 1, 1, 1, 0)]))
    name, _, how = broken.partition("-")
    bad = {"empty": "nothing useful\n",
           # 10 + 8 fields: reshaping 18 numbers into two rows of 9 would go unnoticed
           "uneven": "cpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8\n",
           "words": "cpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 four 5 6 7 8 9 10\n"}
    if how:
        (proc / name).write_text(bad[how])
    else:
        (proc / name).unlink()
    with pytest.raises(CollectorError, match=says):
        HostSource(proc, sys_root).collect(Frame(1.0, 1.0))


def test_this_machines_kernel() -> None:
    src = HostSource()
    frames = [Frame(float(t), 1.0) for t in range(2)]
    for f in frames:
        src.collect(f)
        time.sleep(0.1)  # /proc/stat counts in 10 ms jiffies: let some pass between the reads
    f = frames[1]
    assert 0.0 <= f.host["cpu_utilization_ratio"] <= 1.0
    assert 0.0 < f.host["memory_used_ratio"] < 1.0 and f.host["memory_total_bytes"] > 2**30
    nodes = numa_cpu_by_node(f.samples)
    assert 0 in nodes and all(0.0 <= v <= 1.0 for v in nodes.values())


def test_gpu_less_daemon_exports_host_gauges(tmp_path: Path) -> None:
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}, "rca": {"enabled": False}}, env={})
    daemon = build_daemon(cfg)
    try:
        for _ in range(2):
            daemon.tick()
            time.sleep(0.1)  # /proc/stat counts in 10 ms jiffies: let some pass between the reads
        body = create_app(daemon, ui=False).test_client().get("/metrics").data.decode()
    finally:
        daemon.close()
    assert "sits_host_cpu_utilization_ratio " in body and "sits_host_memory_used_ratio " in body
    assert 'sits_host_numa_cpu_utilization_ratio{numa_node="0"}' in body
    res = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_failed_read_of_the_numa_map_is_retried(roots: tuple[Path, Path]) -> None:
    proc, sys_root = roots
    cpulist = sys_root / "devices/system/node/node1/cpulist"
    cpulist.unlink()
    cpulist.mkdir()  # unreadable once (as root, a file's mode would not stop the read)
    src = HostSource(proc, sys_root)
    (proc / "stat").write_text(_stat([(100, 0, 100, 0, 0)] * 4))
    with pytest.raises(CollectorError, match="node1/cpulist"):
        src.collect(Frame(1.0, 1.0))
    cpulist.rmdir()
    cpulist.write_text("2-3\n")
    (proc / "stat").write_text(_stat([(150, 0, 150, 0, 0)] * 4))
    f = Frame(2.0, 1.0)
    src.collect(f)
    assert f.host["cpu_utilization_ratio"] == pytest.approx(0.5)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 0.5, 1: 0.5})  # were missing until a CPU hotplug


def test_a_failed_read_of_the_numa_map_keeps_the_all_cpu_value(roots: tuple[Path, Path]) -> None:
    proc, sys_root = roots
    src = HostSource(proc, sys_root)
    (proc / "stat").write_text(_stat([(100, 0, 100, 0, 0)] * 3))  # CPU 3 offline at start
    src.collect(Frame(1.0, 1.0))
    cpulist = sys_root / "devices/system/node/node1/cpulist"
    cpulist.unlink()
    cpulist.mkdir()
    (proc / "stat").write_text(_stat([(150, 0, 150, 0, 0)] * 4))  # it comes online: the map is read again, and fails
    f = Frame(2.0, 1.0)
    with pytest.raises(CollectorError, match="node1/cpulist"):
        src.collect(f)
    assert f.host["cpu_utilization_ratio"] == pytest.approx(0.5)
    cpulist.rmdir()
    cpulist.write_text("2-3\n")
    (proc / "stat").write_text(_stat([(200, 0, 200, 0, 0)] * 4))
    f = Frame(3.0, 1.0)
    src.collect(f)
    assert numa_cpu_by_node(f.samples) == pytest.approx({0: 0.5, 1: 0.5})
