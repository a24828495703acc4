"""gpu.backend: nvml on a machine without a driver, or whose driver lists no GPU: everything else is served."""

import logging

from sits_observe.config import parse
from sits_observe.export.http import create_app
from sits_observe.wiring import build_daemon


def test_daemon_without_driver_says_so_once_and_serves(tmp_path, caplog):
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "nvml"}, "rca": {"enabled": False}}, env={})
    with caplog.at_level(logging.WARNING):
        daemon = build_daemon(cfg)
        for _ in range(3):
            daemon.tick()
    lines = [r.getMessage() for r in caplog.records if "NVIDIA driver not available" in r.getMessage()]
    assert len(lines) == 1 and "NVML GPU metrics are off" in lines[0]
    assert all(s.name != "nvml" for s in daemon.sources) and daemon.topology is None
    client = create_app(daemon, ui=False).test_client()
    body = client.get("/metrics").data.decode()
    assert "sits_build_info" in body and "sits_store_ticks_total 3.0" in body
    assert client.get("/api/v1/status").status_code == 200
    assert client.get("/api/v1/topology").status_code == 404


def test_nvml_that_sees_no_gpu_leaves_the_daemon_running(tmp_path, monkeypatch):
    """Every GPU bound to vfio, or a container with NVIDIA_VISIBLE_DEVICES=none: NVML starts and lists none. The
    scheduler's build raised on the empty link matrix and the daemon did not start."""
    import sys

    import numpy as np
    from sits_observe.collectors.nvml_fake import FakeNvml

    from sits_observe.topology import Topology

    empty = FakeNvml(Topology("empty", (), (), np.zeros((0, 0)), np.zeros((0, 0), dtype=np.int64)))
    monkeypatch.setitem(sys.modules, "pynvml", empty)
    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "nvml"}, "rca": {"enabled": False}}, env={})
    daemon = build_daemon(cfg)
    try:
        for _ in range(3):
            daemon.tick()
        assert daemon.topology is not None and daemon.topology.n == 0
        client = create_app(daemon, ui=False).test_client()
        assert client.get("/metrics").status_code == 200 and client.get("/api/v1/shards").status_code == 200
    finally:
        daemon.close()
