"""/metrics is valid Prometheus text (real promtool) and histograms are cumulative and exact."""

import subprocess

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.clock import WallClock
from sits_observe.frame import GPU_FIELDS, GpuFrame, GpuInfo, Sample
from sits_observe.export.http import create_app
from sits_observe.topology import preset


class Everything:
    """A source filling every part of a Frame."""

    name = "everything"

    def __init__(self, layout):
        self.layout = layout
        self.info = tuple(GpuInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"00000000:{i:02X}:00.0") for i in range(8))

    def collect(self, frame):
        frame.add_values("e2e", "chat", np.array([0.001, 0.5, 0.50331648, 0.6, 100.0]), self.layout)
        frame.add_values("queue", "chat", np.array([0.0001]), self.layout)
        g = GpuFrame.empty(self.info)
        g.values[:] = 1.0
        g.set(3, "throttle_reasons", 0x4 | 0x40)
        g.set(5, "power_watts", float("nan"))
        g.healthy[7] = False
        frame.gpu = g
        frame.host.update(cpu_utilization_ratio=0.5, memory_used_ratio=0.25)
        frame.workload_gauges[("queue_depth", "chat")] = 4
        frame.add_counter("requests_total", "chat", 5)
        frame.samples.append(Sample("sits_gpu_nvlink_link_up", "gauge", "NVLink link state.",
                                    (("gpu", "0"), ("link", "1")), 1.0))


def _scrape(tmp_path):
    cfg = parse({"state_dir": str(tmp_path)}, env={})
    daemon = Daemon(config=cfg, clock=WallClock(1.0), topology=preset("pcie-8"))
    daemon.sources.append(Everything(daemon.layout))
    client = create_app(daemon, ui=False).test_client()
    daemon.tick()
    daemon.tick()
    return daemon, client.get("/metrics").data.decode()


def test_promtool_check_metrics_is_clean(tmp_path):
    _, body = _scrape(tmp_path)
    res = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == ""


def test_histogram_is_cumulative_and_exact(tmp_path):
    daemon, body = _scrape(tmp_path)
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    hist = fams["sits_stage_latency_seconds"]
    buckets = {s.labels["le"]: s.value for s in hist.samples
               if s.name.endswith("_bucket") and s.labels["stage"] == "e2e"}
    # a value exactly on an edge counts in that edge's bucket (le is inclusive)
    assert buckets["0.50331648"] == 6.0 and buckets["+Inf"] == 10.0
    values = list(buckets.values())
    assert values == sorted(values)
    count = next(s.value for s in hist.samples if s.name.endswith("_count") and s.labels["stage"] == "e2e")
    total = next(s.value for s in hist.samples if s.name.endswith("_sum") and s.labels["stage"] == "e2e")
    assert count == 10.0 and abs(total - 2 * (0.001 + 0.5 + 0.50331648 + 0.6 + 100.0)) < 1e-9


def test_gpu_labels_reasons_links_and_gaps(tmp_path):
    _, body = _scrape(tmp_path)
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    reasons = {s.labels["reason"] for s in fams["sits_gpu_throttle_reasons"].samples if s.labels["gpu"] == "3"}
    assert reasons == {"sw_power_cap", "hw_thermal_slowdown"}
    assert len(fams["sits_gpu_power_watts"].samples) == 7  # GPU 5 unsupported: omitted, not zero
    assert {s.labels["gpu"] for s in fams["sits_gpu_healthy"].samples if s.value == 0} == {"7"}
    assert set(fams["sits_gpu_utilization_ratio"].samples[0].labels) == {"gpu", "uuid", "model", "pci_bus_id"}
    links = fams["sits_gpu_link_bandwidth_bytes_per_second"].samples
    assert len(links) == 56 and {s.labels["link"] for s in links} == {"nvlink", "pcie_host_bridge", "numa_interconnect"}
    assert "sits_workload_requests_total" in body and 'sits_workload_queue_depth{workload="chat"} 4.0' in body
    exported = {f.name for f in fams.values()}
    assert all(f"sits_gpu_{f.name.removesuffix('_total')}" in exported for f in GPU_FIELDS
               if f.name != "throttle_reasons")


def test_every_le_label_reads_back_as_its_edge_so_no_observation_sits_above_its_bucket(tmp_path):
    """le was written with 9 significant digits: 2.550136832 s became le="2.55013683", below a 2.550136831 s
    observation the bucket counts (4 default edges, 79 of the kernel's 592); the SLO rules read the same text."""
    from sits_observe.slo.rules import le_label

    daemon, text = _scrape(tmp_path)
    les = [s.labels["le"] for fam in text_string_to_metric_families(text) if fam.name == "sits_stage_latency_seconds"
           for s in fam.samples if s.name.endswith("_bucket") and s.labels["stage"] == "e2e"]
    uppers = list(daemon.layout.uppers())
    assert [float(le) for le in les] == uppers and les[:-1] == [le_label(e) for e in uppers[:-1]]
    assert "2.550136832" in les
