"""A URL field's error gives an example of the URL that field wants (it suggested a vLLM page for every one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sits_observe.config import parse
from sits_observe.errors import ConfigError


@pytest.mark.parametrize(("data", "example"), [
    ({"otlp": {"endpoint": "garbage"}}, "e.g. http://127.0.0.1:4318"),
    ({"scheduler": {"webhook": {"url": "nope"}}}, "e.g. https://orchestrator.example/reshard"),
    ({"gpu": {"dcgm_url": "x"}}, "e.g. http://127.0.0.1:9400/metrics"),
    ({"alerting": {"receivers": [{"name": "a", "type": "webhook", "url": "nope"}]}}, "e.g. http://127.0.0.1:9093"),
    ({"servers": [{"name": "s", "kind": "vllm", "url": "nope"}]}, "e.g. http://127.0.0.1:8000/metrics"),
])
def test_a_bad_url_is_answered_with_an_example_of_its_kind(data: dict, example: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(data, env={}, this_host=False)
    assert example in str(err.value), err.value


def test_a_bad_otlp_endpoint_from_the_environment_gets_the_collectors_example() -> None:
    from sits_observe.scheduler.config import OtlpConfig
    from sits_observe.scheduler.tracing import make_exporter

    with pytest.raises(ConfigError) as err:
        make_exporter(OtlpConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})
    assert "e.g. http://127.0.0.1:4318" in str(err.value), err.value


def test_a_grpc_endpoint_without_a_scheme_from_the_environment_is_taken() -> None:
    """The OTLP spec's gRPC form (host:port, TLS unless OTEL_EXPORTER_OTLP_INSECURE=true), which the gRPC exporter
    takes and which exported spans before: refused at start, it stopped such a daemon with exit 2."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    from sits_observe.scheduler.config import OtlpConfig
    from sits_observe.scheduler.tracing import make_exporter

    exporter = make_exporter(OtlpConfig(protocol="grpc"), {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"})
    try:
        assert isinstance(exporter, OTLPSpanExporter)
    finally:
        exporter.shutdown()
    for bad in ("collector", "collector:4317/v1", "user:pw@collector:4317", "collector:99999"):
        with pytest.raises(ConfigError, match="must be an http"):
            make_exporter(OtlpConfig(protocol="grpc"), {"OTEL_EXPORTER_OTLP_ENDPOINT": bad})
    with pytest.raises(ConfigError, match="must be an http"):  # http/protobuf: no request could reach it
        make_exporter(OtlpConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"})


@pytest.mark.parametrize("bad", [" collector:4317", "col lector:4317", "coll\x00ector:4317", "collector:0"])
def test_a_grpc_host_port_no_channel_could_reach_is_refused(bad: str) -> None:
    """A space or control character (urlsplit drops a leading one and takes the others into the host name) or port
    0 was taken as a bare host:port: the exporter was built, and every export failed, quietly, for the daemon's
    life."""
    from sits_observe.scheduler.config import OtlpConfig
    from sits_observe.scheduler.tracing import make_exporter

    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        make_exporter(OtlpConfig(protocol="grpc"), {"OTEL_EXPORTER_OTLP_ENDPOINT": bad})


def test_check_config_refuses_the_otlp_endpoint_run_would_refuse(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
    res = subprocess.run([sys.executable, "-m", "sits_observe", "check-config", str(cfg)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL" in res.stderr


@pytest.mark.parametrize("text", ["scheduler: {enabled: false}\n", "gpu: {backend: none}\n"])
def test_check_config_takes_the_otlp_endpoint_a_daemon_without_a_scheduler_ignores(tmp_path: Path, text: str) -> None:
    """Such a daemon never reads OTEL_EXPORTER_OTLP_ENDPOINT (a value set host-wide for other programs): `run`
    starts, so check-config must not say exit 2."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text + "rca: {enabled: false}\n")
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
    res = subprocess.run([sys.executable, "-m", "sits_observe", "check-config", str(cfg)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_a_demo_that_cannot_start_leaves_no_state_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SITS_STATE_DIR"}
    env["TMPDIR"] = str(tmp_path)  # where the demo makes its state directory
    res = subprocess.run([sys.executable, "-m", "sits_observe", "demo", "--topology", "nope", "--duration", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "nope" in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []
