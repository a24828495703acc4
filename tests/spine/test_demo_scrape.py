"""`sits-observe demo` during the mixed scenario: a clean promtool scrape with every request stage and 8 GPUs."""

import json
import os
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from sits_observe.frame import REQUEST_STAGES

def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_demo_scrape_during_mixed_is_clean(tmp_path, free_port, wait_ready):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sits_observe", "demo", "--scenario", "mixed", "--speed", "200",
                             "--duration", "120", "--listen", f"127.0.0.1:{port}"],
                            env={**os.environ, "SITS_STATE_DIR": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(port, proc)
        # run into the first injected fault (mixed starts its first fault 10 simulated minutes in)
        deadline = time.monotonic() + 90
        while json.loads(_get(f"http://127.0.0.1:{port}/api/v1/status"))["ticks"] < 900:
            assert time.monotonic() < deadline, "demo too slow to reach the first fault"
            time.sleep(0.5)
        body = _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    res = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    stages = {s.labels["stage"] for s in fams["sits_stage_latency_seconds"].samples if s.value > 0}
    assert set(REQUEST_STAGES) <= stages
    assert {s.labels["gpu"] for s in fams["sits_gpu_utilization_ratio"].samples} == {str(i) for i in range(8)}
    assert len(fams["sits_gpu_link_bandwidth_bytes_per_second"].samples) == 56
