"""`sits-observe bench collectors` runs and measures what it says (figures go to docs/performance.md)."""

from __future__ import annotations

import argparse

import numpy as np

from sits_observe.collectors import bench
from sits_observe.collectors.dcgm import DCGM_MAP, DcgmSource
from sits_observe.frame import GPU_FIELD_INDEX


def test_bench_page_has_every_mapped_field_for_every_gpu() -> None:
    page = DcgmSource("http://127.0.0.1:9400/metrics").read(bench.dcgm_page(64))
    assert [g.index for g in page.gpu.info] == list(range(64))
    for field in {f for _, f, _ in DCGM_MAP}:
        assert not np.isnan(page.gpu.values[:, GPU_FIELD_INDEX[field]]).any(), field


def test_bench_reports_ours_and_the_baseline() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = bench.run(parser.parse_args(["--samples", "3", "--pages", "2", "--dcgm-gpus", "4"]))
    nvml, dcgm = out["nvml"], out["dcgm"]
    assert nvml["gpus"] == 8 and nvml["nvml_calls_per_gpu_sample"] > 20  # the replayed baseline is the real call list
    assert nvml["ours_ms_per_gpu_sample"] > 0 and nvml["baseline_fake_calls_ms_per_gpu_sample"] > 0
    assert dcgm["gpus"] == 4 and dcgm["page_lines"] > 4 * 20
    assert set(out["targets"]) == {"nvml_overhead_ms_per_gpu_sample", "dcgm_ms_per_64_gpu_page"}
