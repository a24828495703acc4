"""The Splitwise service-time curves and the Azure trace replay."""

from __future__ import annotations

import numpy as np
import pytest

from sits_observe.errors import ConfigError
from sits_observe.sim.perf import MAX_BATCH, PerfModel, hardware_for
from sits_observe.sim.trace import Trace


@pytest.mark.parametrize(
    ("hardware", "batch", "ms"),
    [
        # means of the five measured repeats in perf_model.csv (llama2-70b, TP2, prompt 512)
        ("h100-80gb", 1, 37.14),
        ("h100-80gb", 16, 41.97),
        ("h100-80gb", 32, 52.26),
        ("h100-80gb-pcap", 8, 40.38),
    ],
)
def test_decode_time_is_the_measured_token_time(hardware, batch, ms):
    assert PerfModel("llama2-70b", hardware, 2).decode_s(batch) * 1e3 == pytest.approx(ms, rel=0.01)


def test_prefill_follows_prompt_size_and_batch():
    p = PerfModel("llama2-70b", "h100-80gb", 2)
    assert p.prefill_s(1, 512) * 1e3 == pytest.approx(84.41, rel=0.01)
    assert p.prefill_s(1, 8192) * 1e3 == pytest.approx(1339.16, rel=0.01)
    assert p.prefill_s(8, 8 * 512) * 1e3 == pytest.approx(605.72, rel=0.01)  # measured batch of 8
    grid = [p.prefill_s(1, t) for t in (64, 128, 1000, 4096, 8192, 14000)]
    assert grid == sorted(grid)  # beyond the table it keeps growing


def test_failed_batch_64_row_is_dropped_and_decode_extends_past_the_table():
    # the TP2 batch-64 rows (prompt 360 ms, token 42 ms) fall below batch 32: a failed run
    p = PerfModel("llama2-70b", "h100-80gb", 2)
    table = p.decode_table
    assert table[0] == 0.0 and len(table) == MAX_BATCH + 1
    assert all(b >= a for a, b in zip(table[1:], table[2:]))
    assert p.decode_s(64) > p.decode_s(32) > p.decode_s(16)
    assert p.prefill_s(64, 64 * 512) > p.prefill_s(32, 32 * 512)


def test_power_comes_from_the_a100_fraction_of_tdp():
    p = PerfModel("llama2-70b", "h100-80gb", 2)
    assert 0.7 < p.power_fraction(1) < p.power_fraction(16) <= 0.8
    assert p.prefill_power_fraction == 1.0
    assert hardware_for("NVIDIA H100 PCIe") == "h100-80gb-pcap"
    assert hardware_for("NVIDIA H100 80GB HBM3") == "h100-80gb"


def test_unknown_model_is_a_config_error():
    with pytest.raises(ConfigError, match="choose one of llama2-70b"):
        PerfModel("gpt-17", "h100-80gb", 2)


def test_trace_window_loops_and_keeps_order():
    tr = Trace.load("conv")
    assert len(tr.offsets) == 19366 and len(tr.offsets) / tr.period == pytest.approx(5.53, rel=0.01)  # requests/s
    taus, prompt, output = tr.window(tr.period - 5.0, tr.period + 5.0)  # across the loop point
    assert np.all(np.diff(taus) >= 0) and (taus >= tr.period).any() and (taus < tr.period).any()
    first = tr.window(0.0, 5.0)
    assert np.allclose(taus[taus >= tr.period] - tr.period, first[0])
    assert (prompt >= 1).all() and (output >= 1).all()
    whole = tr.window(0.0, 3 * tr.period)
    assert len(whole[0]) == 3 * len(tr.offsets)


def test_trace_path_override_and_its_errors(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,100,10\n"
                    "2023-11-16 18:00:02.5,200,20\n")
    tr = Trace.load("conv", str(good))
    assert list(tr.offsets) == [0.0, 2.5] and list(tr.prompt) == [100, 200]
    with pytest.raises(ConfigError, match=r"sim.trace_path: cannot read trace file .*missing.csv.*conv, code"):
        Trace.load("conv", str(tmp_path / "missing.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_text("when,prompt\n1,2\n")
    with pytest.raises(ConfigError, match="header must start with TIMESTAMP,ContextTokens,GeneratedTokens"):
        Trace.load("conv", str(bad))
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,x,10\n2023-11-16 18:00:01.0,1,1\n")
    with pytest.raises(ConfigError, match="line 2: expected timestamp,int,int"):
        Trace.load("conv", str(bad))
    with pytest.raises(ConfigError, match="unknown trace 'chat'; choose one of conv, code"):
        Trace.load("chat")
    # requests that span no time (or NaT, or 1 ns apart): every tick then failed, or the first never ended
    for stamps in (["2023-11-16 18:00:00", "2023-11-16 18:00:00"], ["NaT", "2023-11-16 18:00:00"],
                   ["2023-11-16 18:00:00.000000000", "2023-11-16 18:00:00.000000001"]):
        bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},1,1\n" for t in stamps))
        with pytest.raises(ConfigError, match="line 2: expected timestamp|a trace must span at least 1 s"):
            Trace.load("conv", str(bad))
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:10,1,1\n2023-11-16 18:00:00,1,1\n"
                   "2023-11-16 18:00:05,1,1\n")  # the earliest request is not on the first row: it spans 10 s
    assert list(Trace.load("conv", str(bad)).offsets) == [0.0, 5.0, 10.0]
    with pytest.raises(ConfigError, match="sim.trace_path: trace file /dev/zero is not a regular file"):
        Trace.load("conv", "/dev/zero")  # it would never end (a FIFO never answer)


@pytest.mark.parametrize(("rows", "says"), [
    # Unix seconds: numpy read each as a year, and the offsets overflowed (one request per ~year replayed)
    (["1700000000,100,10", "1700000001,100,10"], "line 2: expected timestamp,int,int (a timestamp as 2023-11-16"),
    (["2300-01-01 00:00:00,100,10", "2300-01-01 00:00:05,100,10"], "line 2: expected timestamp,int,int"),
    (["2023-11-16 18:00:00,-5,10", "2023-11-16 18:00:05,100,10"], "line 2: ContextTokens must be 0 to 10,000,000"),
    (["2023-11-16 18:00:00,100,10", "2023-11-16 18:00:05,100,99999999999999999999"],
     "line 3: GeneratedTokens must be 0 to 10,000,000 tokens, got 99999999999999999999"),
])
def test_trace_values_that_would_replay_wrong_are_refused(tmp_path, rows, says):
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(r + "\n" for r in rows))
    with pytest.raises(ConfigError) as err:
        Trace.load("conv", str(bad))
    assert str(err.value).startswith(f"sim.trace_path: {bad}: {says}")
