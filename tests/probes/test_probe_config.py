"""The probes: config section: defaults, per-stage overrides, one-line errors."""

from __future__ import annotations

import pytest

from sits_observe.config import parse
from sits_observe.errors import ConfigError
from sits_observe.probes.config import CUDA_STAGES


def test_defaults_time_every_device_stage_but_launch() -> None:
    cfg = parse({}).probes
    assert cfg.enabled and cfg.runq.enabled and cfg.block_io.unattributed == "host"
    assert set(cfg.cuda.timed()) == {"h2d", "d2h", "sync", "alloc"}
    assert cfg.cuda.library == "libcuda.so.1" and cfg.nccl.library == "libnccl.so.2"
    assert cfg.nccl.timed() == {"collective": ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast")}
    assert "cuStreamSynchronize" in cfg.cuda.timed()["sync"] and "cuMemcpyHtoDAsync_v2" in cfg.cuda.timed()["h2d"]


@pytest.mark.parametrize("stages, timed", [
    ({"launch": {"enabled": True}}, {"launch", "h2d", "d2h", "sync", "alloc"}),
    ({"alloc": {"enabled": False}, "sync": {"symbols": ["mySync"]}}, {"h2d", "d2h", "sync"}),
])
def test_stage_overrides_keep_the_other_defaults(stages: dict, timed: set) -> None:
    cuda = parse({"probes": {"cuda": {"stages": stages}}}).probes.cuda
    assert set(cuda.timed()) == timed
    assert cuda.timed()["h2d"] == CUDA_STAGES["h2d"][1]
    if "sync" in stages:
        assert cuda.timed()["sync"] == ("mySync",)


@pytest.mark.parametrize("data, message", [
    ({"cuda": {"stages": {"collective": {}}}},
     "probes.cuda.stages: unknown stage 'collective'; stages here are launch, h2d, d2h, sync, alloc"),
    ({"nccl": {"library": "lib/libnccl.so"}},
     "probes.nccl.library: must be a file name (libcuda.so.1) or an absolute path"),
    ({"cuda": {"stages": {"sync": {"symbols": []}}}}, "probes.cuda.stages.sync.symbols"),
    ({"scan_interval": 0}, "probes.scan_interval"),
    ({"runq": {"enable": True}}, "probes.runq.enable: unknown field"),
])
def test_bad_values_are_one_line_errors(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse({"probes": data}, source="host.yaml")
    assert str(err.value).startswith(f"host.yaml: {message}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("probes", [{}, {"block_io": {"unattributed": "batch"}}])
def test_a_workload_named_as_the_unattributed_block_io_label_is_refused(probes: dict) -> None:
    """Its block IO and the host's unattributed IO were one series, with no word said."""
    name = probes.get("block_io", {}).get("unattributed", "host")
    with pytest.raises(ConfigError) as err:
        parse({"workloads": [{"name": name, "comm": "x"}], "probes": probes}, source="host.yaml")
    assert str(err.value) == (f"host.yaml: probes: block_io.unattributed: {name!r} is also a workload's name; its "
                              "block IO would be mixed with the host's: name one of them otherwise")
    parse({"workloads": [{"name": name, "comm": "x"}], "probes": {"block_io": {"unattributed": "other"}}})
    block_io = probes.get("block_io", {})
    for off in ({"enabled": False}, {"block_io": {**block_io, "enabled": False}}):  # no block IO timed: no mix
        parse({"workloads": [{"name": name, "comm": "x"}], "probes": {**probes, **off}})
