"""Samples of the sources and subsystems on /metrics: a malformed one fails its own source, never the scrape; one
that disagrees with its family (labels, kind, a series given twice, a name rendered elsewhere) is left out, never
merged into a wrong series or a second HELP line that promtool refuses."""

import subprocess

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sits_observe.clock import WallClock
from sits_observe.config import parse
from sits_observe.daemon import Daemon
from sits_observe.export.http import create_app
from sits_observe.export.prometheus import samples_to_families
from sits_observe.frame import Frame, GpuFrame, GpuInfo, Sample

GOOD = Sample("sits_good_ratio", "gauge", "A fine sample.", (("part", "a"),), 0.5)


class Provider:
    def __init__(self, samples: list[object]) -> None:
        self.samples = samples

    def metrics(self) -> list[object]:
        return self.samples


class Source:
    """A source writing the samples it is given, and one GPU."""

    name = "writer"

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def collect(self, frame: Frame) -> None:
        frame.gpu = GpuFrame.empty((GpuInfo(0, "GPU-0", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),))
        frame.gpu.set(0, "utilization_ratio", 0.5)
        frame.samples.extend(self.samples)


def _daemon(tmp_path, samples=(), providers=()) -> tuple[Daemon, str]:
    daemon = Daemon(config=parse({"state_dir": str(tmp_path)}, env={}), clock=WallClock(1.0))
    daemon.sources.append(Source(list(samples)))
    daemon.extra_providers.extend(providers)
    client = create_app(daemon, ui=False).test_client()
    daemon.tick()
    r = client.get("/metrics")
    assert r.status_code == 200, r.data[:300]
    return daemon, r.data.decode()


def _promtool_clean(body: str) -> None:
    res = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


def _values(body: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(body)
            for s in f.samples if s.name == name}


def test_a_provider_giving_a_malformed_sample_fails_alone_and_the_scrape_goes_on(tmp_path):
    """A sample valued None (or of labels None, or help None) from one provider answered every scrape with a 500."""
    bad = [Sample("sits_bad_ratio", "gauge", "No number.", (), None),  # type: ignore[arg-type]
           Sample("sits_bad_ratio", "gauge", "No labels.", None, 1.0),  # type: ignore[arg-type]
           Sample("sits_bad_ratio", "gauge", None, (), 1.0), None]  # type: ignore[arg-type]
    providers = [(f"bad{i}", Provider([GOOD, s])) for i, s in enumerate(bad)] + [("good", Provider([GOOD]))]
    daemon, body = _daemon(tmp_path, providers=providers)
    _promtool_clean(body)
    assert _values(body, "sits_good_ratio") == {(("part", "a"),): 0.5}  # the good provider's: once, as given
    assert [daemon.health[f"bad{i}"].errors for i in range(len(bad))] == [1] * len(bad)  # in the next scrape's
    assert "good" not in daemon.health and "sits_bad_ratio" not in body


def test_a_source_writing_a_sample_the_exposition_cannot_render_fails_its_tick_not_every_scrape(tmp_path):
    """The store took a sample of labels None, or a label value not a string: each scrape raised until the source
    stopped writing it."""
    for i, sample in enumerate([Sample("sits_x_ratio", "gauge", "h", None, 1.0),  # type: ignore[arg-type]
                                Sample("sits_x_ratio", "gauge", "h", (("gpu", 0),), 1.0),  # type: ignore[arg-type]
                                Sample("sits_x_ratio", "histogram", "h", (), 1.0)]):  # type: ignore[arg-type]
        daemon, body = _daemon(tmp_path / str(i), samples=[sample])
        _promtool_clean(body)
        assert daemon.health["writer"].errors == 1 and "malformed data" in daemon.health["writer"].last_error
        assert _values(body, "sits_source_errors_total")[(("source", "writer"),)] == 1.0


def test_a_sample_named_as_a_family_rendered_elsewhere_is_left_out(tmp_path):
    """A second HELP and TYPE of sits_gpu_healthy (or of the stage histogram): promtool refuses the page."""
    clash = [Sample("sits_gpu_healthy", "gauge", "Another health.", (), 1.0),
             Sample("sits_stage_latency_seconds_count", "gauge", "A count.", (), 3.0),
             Sample("sits_gpu_xid_errors", "counter", "Written as sits_gpu_xid_errors_total.", (), 1.0)]
    _, body = _daemon(tmp_path, providers=[("clash", Provider(clash + [GOOD]))])
    _promtool_clean(body)
    assert body.count("# HELP sits_gpu_healthy ") == 1 and "Another health" not in body and "A count" not in body
    assert "Written as" not in body and _values(body, "sits_good_ratio") == {(("part", "a"),): 0.5}


def test_samples_disagreeing_with_their_family_are_left_out_not_relabelled():
    """Label names came from a name's first sample: a later one of other labels was exported with those labels
    empty (two series made one), a counter as a gauge of the gauge's name, a repeated series twice."""
    samples = [Sample("x", "gauge", "h", (("a", "1"),), 1.0),
               Sample("x", "gauge", "h", (("b", "2"),), 2.0),  # other label names
               Sample("x", "counter", "h", (("a", "3"),), 3.0),  # written as x_total: a family of its own
               Sample("x", "gauge", "h", (("a", "1"),), 4.0),  # the first's series again
               Sample("x", "gauge", "h", (("a", "5"),), 5.0),  # fine
               Sample("y", "gauge", "h", (("a", "1"), ("b", "2")), 6.0),
               Sample("y", "gauge", "h", (("b", "3"), ("a", "4")), 7.0),  # same names, other order: fine
               Sample("z_total", "gauge", "h", (), 8.0),
               Sample("z", "counter", "h", (), 9.0),  # written as z_total: a second family of that name
               Sample("w", "gauge", "h", (("a", "1"), ("a", "2")), 1.0)]  # a label twice
    left_out = []
    fams = samples_to_families(samples, on_conflict=lambda name, why: left_out.append(name))
    got = {(f.name, f.type): sorted((tuple(sorted(s.labels.items())), s.value) for s in f.samples) for f in fams}
    assert got == {("x", "gauge"): [((("a", "1"),), 1.0), ((("a", "5"),), 5.0)],
                   ("x", "counter"): [((("a", "3"),), 3.0)],
                   ("y", "gauge"): [((("a", "1"), ("b", "2")), 6.0), ((("a", "4"), ("b", "3")), 7.0)],
                   ("z_total", "gauge"): [((), 8.0)]}
    assert left_out == ["x", "x", "z", "w"]


def test_well_formed_samples_pass_the_store_check_fast():
    from sits_observe.store.check import malformed_samples

    fine = [Sample("a", "gauge", "h", (("k", str(i)),), float(i)) for i in range(100)]
    assert malformed_samples(fine) is None
    assert malformed_samples([*fine, Sample("a", "gauge", "h", (("k", ["x"]),), 1.0)]) is not None  # type: ignore
    assert malformed_samples([Sample("", "gauge", "h", (), 1.0)]) is not None
    assert malformed_samples([Sample("a", "gauge", "h", (), np.float64(1.0))]) is None
