"""DcgmSource on values the store cannot take: each is left out for its GPU only."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from sits_observe.collectors.dcgm import DcgmSource
from sits_observe.frame import GPU_FIELD_INDEX, Frame
from sits_observe.store.check import malformed

LABELS = 'gpu="{g}",UUID="GPU-{g}",modelName="H100",pci_bus_id="00000000:0{g}:00.0"'


def _page(power1: str) -> str:
    return "".join(f"DCGM_FI_DEV_GPU_UTIL{{{LABELS.format(g=g)}}} 50\n"
                   f"DCGM_FI_DEV_POWER_USAGE{{{LABELS.format(g=g)}}} {power}\n"
                   for g, power in ((0, "300"), (1, power1)))


@pytest.mark.parametrize("bad", ["+Inf", "-Inf", "1e400"])
def test_an_infinite_value_is_left_out_for_that_gpu_only(bad: str, caplog: pytest.LogCaptureFixture) -> None:
    """It was stored as is, and the store refused the whole GPU frame every sample: every GPU lost its fields."""
    src = DcgmSource("http://127.0.0.1:1/metrics")
    with caplog.at_level(logging.WARNING, logger="sits_observe.collectors.dcgm"):
        gpu = src.read(_page(bad)).gpu
        src.read(_page(bad))  # said once
    frame = Frame(0.0, 1.0)
    frame.gpu = gpu
    assert malformed(frame, 20) is None
    power, util = gpu.values[:, GPU_FIELD_INDEX["power_watts"]], gpu.values[:, GPU_FIELD_INDEX["utilization_ratio"]]
    assert power[0] == 300.0 and np.isnan(power[1]) and list(util) == [0.5, 0.5]
    assert [r.getMessage() for r in caplog.records] == [
        "dcgm: http://127.0.0.1:1/metrics: an infinite value for GPU 1 power_watts; left out (said once per field)"]


def test_a_nan_value_is_left_out_without_a_word(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sits_observe.collectors.dcgm"):
        gpu = DcgmSource("http://127.0.0.1:1/metrics").read(_page("NaN")).gpu
    assert np.isnan(gpu.values[1, GPU_FIELD_INDEX["power_watts"]]) and not caplog.records
