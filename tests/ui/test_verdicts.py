"""The UI's verdict log: polls the classifier's newest verdicts, keeps each once, numbered, bounded."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sits_observe.ui.verdicts import VerdictLog


class Rca:
    """Keeps its newest ``memory`` verdicts, like the classifier's in-memory log."""

    def __init__(self, memory: int = 3) -> None:
        self.made: list[dict[str, Any]] = []
        self.memory = memory

    def add(self, ts: float, cause: str) -> None:
        self.made.append({"id": f"v{len(self.made)}", "ts": ts, "cause": cause, "confidence": 0.9})

    def verdicts_state(self, limit: int) -> dict[str, Any]:
        return {"verdicts": self.made[::-1][: min(limit, self.memory)]}


def test_polls_keep_every_verdict_once_in_order() -> None:
    rca = Rca()
    ctx = SimpleNamespace(part=lambda name: rca if name == "rca" else None)
    log = VerdictLog(keep=5)
    assert log.latest() is None and log.after(0, 0) == []
    for t in range(3):
        rca.add(t, "healthy")
    log.refresh(ctx)  # type: ignore[arg-type]
    log.refresh(ctx)  # type: ignore[arg-type]
    assert [(n, v["id"]) for n, v in log.after(0, 0)] == [(1, "v0"), (2, "v1"), (3, "v2")]
    for t in range(3, 5):
        rca.add(t, "gpu_memory_pressure")
    log.refresh(ctx)  # type: ignore[arg-type]
    assert [v["id"] for _, v in log.after(3, 0)] == ["v3", "v4"]
    assert [v["id"] for _, v in log.after(0, 4)] == ["v4"] and log.latest()["id"] == "v4"
    for t in range(5, 8):
        rca.add(t, "healthy")
    log.refresh(ctx)  # type: ignore[arg-type]
    assert [v["id"] for _, v in log.after(0, 0)] == ["v3", "v4", "v5", "v6", "v7"]  # bounded at 5
    rca.made.append(rca.made[3])  # a verdict already kept is not added twice
    log.refresh(ctx)  # type: ignore[arg-type]
    assert len(log.after(0, 0)) == 5


def test_no_classifier_no_verdicts() -> None:
    log = VerdictLog()
    log.refresh(SimpleNamespace(part=lambda name: None))  # type: ignore[arg-type]
    assert log.latest() is None


def test_a_burst_of_verdicts_between_polls_is_read_whole() -> None:
    rca = Rca(memory=200)
    ctx = SimpleNamespace(part=lambda name: rca if name == "rca" else None)
    log = VerdictLog()
    for t in range(40):  # more than one small poll returns: the log asks for the classifier's whole memory
        rca.add(t, "cpu_contention")
    log.refresh(ctx)  # type: ignore[arg-type]
    assert [n for n, _ in log.after(0, 0)] == list(range(1, 41))


def test_a_verdict_of_the_fallback_network_says_so_on_hover() -> None:
    from sits_observe.ui.pages.causes import verdict_trace

    base = {"cause": "scheduler_stall", "confidence": 0.95, "ts": 1000.0, "trigger": "slo_burn", "gpus": [3],
            "stages": ["decode"]}
    text = verdict_trace([base | {"network": "main"}, base | {"network": "fallback"}, base])["text"]
    assert ["fallback network" in t for t in text] == [False, True, False]
    assert all("trigger slo_burn" in t and "GPUs 3" in t for t in text)
