"""The whole loop, seen only from outside the daemon: the `mixed` scenario's faults burn an SLO, the alert
reaches a webhook (directly and through a real Alertmanager) naming the likely cause, the scheduler's
re-shard arrives as a `shard.reshard` span at an OTLP receiver, and the UI, in headless Chromium, draws
the topology and stage heatmaps and lists that decision.  Screenshots go to tests/artifacts/e2e/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_servers import ARTIFACTS, Stack, get_json, otlp_spans, wait_for
from PIL import Image, ImageStat

from sits_observe.ui.browser import chromium, load_page, screenshot

LOOP_TIMEOUT = 200.0  # wall seconds for a fault to burn, be classified and moved
SPAN_ATTRIBUTES = {"shard.id", "shard.strategy", "target.node", "target.gpus", "source.gpus", "decision.score",
                   "decision.trigger", "rca.cause", "rca.confidence", "node.load.cpu"}


def _alerts(bodies: list[bytes]) -> list[dict[str, Any]]:
    """Alerts of Alertmanager webhook payloads (version 4)."""
    out = []
    for body in bodies:
        payload = json.loads(body)
        assert payload.get("version") == "4", payload
        out += payload["alerts"]
    return out


def test_alert_arrives_with_a_likely_cause(stack: Stack) -> None:
    def classified() -> list[dict[str, Any]]:
        stack.check_alive()
        return [a for a in _alerts(stack.capture.bodies("/webhook"))
                if a["status"] == "firing" and a["annotations"].get("likely_cause")]

    alert = wait_for("a firing alert with annotations.likely_cause at the webhook", classified, LOOP_TIMEOUT)[0]
    assert alert["labels"]["alertname"] and alert["labels"]["slo"] and alert["labels"]["burn_tier"]
    assert alert["annotations"]["likely_cause"] not in ("", "healthy")
    # the same alert went through the real Alertmanager, which notified its own webhook receiver
    via_am = wait_for("Alertmanager's notification", lambda: [
        a for a in _alerts(stack.capture.bodies("/alertmanager")) if a["labels"].get("slo") == alert["labels"]["slo"]],
        60)
    assert via_am[0]["labels"]["burn_tier"]
    in_am = get_json(f"{stack.alertmanager}/api/v2/alerts")
    assert any(a["labels"].get("slo") == alert["labels"]["slo"] for a in in_am)


@pytest.fixture(scope="module")
def reshard_span(stack: Stack) -> dict[str, Any]:
    def spans() -> list[dict[str, Any]]:
        stack.check_alive()
        return [s for s in otlp_spans(stack.capture.bodies("/v1/traces"))
                if s["name"] == "shard.reshard" and s["attributes"].get("decision.action") == "migrate"]

    return wait_for("a shard.reshard span of a migration at the OTLP receiver", spans, LOOP_TIMEOUT)[0]


def test_reshard_span_arrives_over_otlp(reshard_span: dict[str, Any]) -> None:
    attrs = reshard_span["attributes"]
    assert SPAN_ATTRIBUTES <= set(attrs), SPAN_ATTRIBUTES - set(attrs)
    assert attrs["target.gpus"] and attrs["source.gpus"] and set(attrs["target.gpus"]) != set(attrs["source.gpus"])
    assert "candidate.scored" in reshard_span["events"]
    assert reshard_span["resource"]["service.name"] == "sits-observe"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    d = chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield d
    d.quit()


def _non_blank(path: Path) -> None:
    """A real render: many colours, and enough contrast that it is not one flat colour."""
    with Image.open(path) as img:
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        spread = ImageStat.Stat(rgb).stddev
    assert len(colours) > 200, f"{path.name}: only {len(colours)} colours"
    assert max(spread) > 20, f"{path.name}: flat image (stddev {spread})"


@pytest.mark.parametrize(("page", "graphs", "heatmaps"), [("topology", 2, 2), ("stages", 2, 2)])
def test_ui_pages_render_heatmaps(stack: Stack, browser: Any, page: str, graphs: int, heatmaps: int) -> None:
    load_page(browser, f"{stack.daemon}/{page}", graphs)
    drawn = browser.execute_script("return document.querySelectorAll('#page .heatmaplayer .hm image').length;")
    assert drawn >= heatmaps
    shot = ARTIFACTS / f"{page}.png"
    size = screenshot(browser, shot)
    assert size["width"] >= 1000 and size["height"] >= 600
    _non_blank(shot)


def test_decision_appears_in_the_ui_log(stack: Stack, browser: Any, reshard_span: dict[str, Any]) -> None:
    load_page(browser, f"{stack.daemon}/causes", 1)
    row = f'#causes-decisions tr.decision[data-span="{reshard_span["span_id"]}"]'

    def listed() -> str | None:
        stack.check_alive()
        return browser.execute_script(f"const r = document.querySelector('{row}'); return r && r.innerText;")

    text = wait_for(f"decision span {reshard_span['span_id']} in the UI's decision log", listed, 30)
    attrs = reshard_span["attributes"]
    assert attrs["shard.id"] in text and "migrate" in text
    assert ",".join(str(g) for g in attrs["target.gpus"]) in text
    screenshot(browser, ARTIFACTS / "causes.png")
