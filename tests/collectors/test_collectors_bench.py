"""`sits-observe bench collectors` runs and measures what it says (figures go to docs/performance.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from pytest import approx

from sits_observe.collectors import bench
from sits_observe.collectors.dcgm import DCGM_MAP, DcgmSource
from sits_observe.collectors.host import HostSource
from sits_observe.frame import GPU_FIELD_INDEX, Frame, numa_cpu_by_node


def test_bench_page_has_every_mapped_field_for_every_gpu() -> None:
    page = DcgmSource("http://127.0.0.1:9400/metrics").read(bench.dcgm_page(64))
    assert [g.index for g in page.gpu.info] == list(range(64))
    for field in {f for _, f, _ in DCGM_MAP}:
        assert not np.isnan(page.gpu.values[:, GPU_FIELD_INDEX[field]]).any(), field


def test_bench_reports_ours_and_the_baseline() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = bench.run(parser.parse_args(["--samples", "3", "--pages", "2", "--dcgm-gpus", "4", "--host-cpus", "16",
                                       "--host-ticks", "3"]))
    nvml, dcgm = out["nvml"], out["dcgm"]
    assert nvml["gpus"] == 8 and nvml["nvml_calls_per_gpu_sample"] > 20  # the replayed baseline is the real call list
    assert nvml["ours_ms_per_gpu_sample"] > 0 and nvml["baseline_fake_calls_ms_per_gpu_sample"] > 0
    assert dcgm["gpus"] == 4 and dcgm["page_lines"] > 4 * 20
    replicas = out["replicas"]  # real listening processes joined: only replica 1 (GPUs 2, 3) has work
    assert replicas["gpus_with_work"] == 2 and replicas["refresh_round_ms"] > 0
    assert replicas["tick_ms_with_join"] > 0 and replicas["baseline_tick_ms_without_join"] > 0
    host = out["host"]
    assert host["written"]["cpus"] == 16 and host["written"]["ours_ms_per_tick"] > 0
    assert host["this_machine"]["baseline_read_files_ms_per_tick"] > 0
    assert set(out["targets"]) == {"nvml_overhead_ms_per_gpu_sample", "dcgm_ms_per_64_gpu_page"}


def test_bench_host_snapshots_are_a_real_workload(tmp_path: Path) -> None:
    """The written large host parses to the busy share its snapshots encode, on every NUMA node."""
    roots = [tmp_path / "t1", tmp_path / "t2"]
    for k, root in enumerate(roots):
        bench._write_host(root, 16, k + 1)
    src = HostSource(roots[0] / "proc", roots[0] / "sys")
    src.collect(Frame(0.0, 1.0))
    src.proc = roots[1] / "proc"
    f = Frame(1.0, 1.0)
    src.collect(f)
    share = (1000 + 500) / (1000 + 500 + 400)  # per CPU: +1000 user, +500 system, +400 idle between snapshots
    assert f.host["cpu_utilization_ratio"] == approx(share)
    assert numa_cpu_by_node(f.samples) == approx(dict.fromkeys(range(8), share))


def test_one_process_per_gpu_still_belongs_to_a_workload(caplog) -> None:
    """With --processes 1 every fake process had an even pid, outside the bench's workload: the run measured no
    attribution and logged the daemon's "no process on any GPU belongs to a configured workload" warning."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with caplog.at_level("WARNING", logger="sits_observe"):
        bench._nvml(parser.parse_args(["--samples", "4", "--processes", "1"]))
    assert not [r.getMessage() for r in caplog.records if "configured workload" in r.getMessage()]
