"""The SLOs page's table of firing alerts shows what the classifier attached to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sits_observe.rca.config import RcaConfig
from sits_observe.rca.engine import RcaEngine
from sits_observe.rca.verdict import Verdict
from sits_observe.ui.pages.slos import alerts_table


def _cells(tree: Any) -> list[str]:
    """The text of every table cell, in order."""
    if isinstance(tree, (list, tuple)):
        return [c for t in tree for c in _cells(t)]
    if getattr(tree, "_type", None) == "Td":
        return [str(tree.children)]
    children = getattr(tree, "children", None)
    return _cells(children) if children is not None and not isinstance(children, str) else []


def test_a_firing_alert_shows_the_likely_cause_and_confidence_the_classifier_attached(tmp_path: Path) -> None:
    notes: dict[str, str] = {}
    engine = RcaEngine(RcaConfig(model=str(tmp_path / "absent.pt")), tmp_path,
                       annotate=lambda slo, a: notes.update(a))  # the annotations an alert gets, as the daemon wires it
    engine.record(Verdict("thermal_throttling", 0.9712, 1000.0), ["chat-latency"])
    engine.close()
    alert = {"labels": {"slo": "chat-latency", "burn_tier": "fast_page", "severity": "page"},
             "annotations": notes, "starts_at": 3723.0}
    assert _cells(alerts_table([alert])) == ["chat-latency", "fast_page", "page", "01:02:03",
                                             "thermal_throttling (0.97)"]
