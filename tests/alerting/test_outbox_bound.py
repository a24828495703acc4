"""The outbox stays bounded while a receiver is down and an alert flaps."""

from collections import Counter
from pathlib import Path

from sits_observe.alerting.config import AlertingConfig
from sits_observe.alerting.dispatch import Dispatcher
from sits_observe.alerting.formats import Alert
from sits_observe.alerting.outbox import FLAPS, PENDING_PER_ALERT, Outbox

LABELS = {"alertname": "SloBurn", "slo": "chat", "burn_tier": "page"}


def _state(k: int) -> Alert:
    """The k-th state change of a flapping alert: firing at even k, resolved at odd k."""
    start = 1000.0 + 600 * (k // 2)
    if k % 2:
        return Alert(LABELS, {"summary": "chat burns"}, "resolved", start, start + 300)
    return Alert(LABELS, {"summary": "chat burns"}, "firing", start)


def _drain(box: Outbox, receiver: str) -> list[Alert]:
    out = []
    while batch := box.head(receiver, limit=64):
        out += [m.alert for m in batch]
        box.delivered(batch)
    return out


def test_a_flapping_alert_keeps_at_most_a_few_messages_queued_and_says_how_many_cycles_were_left_out(
        tmp_path: Path) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    box = Outbox(tmp_path / "outbox.db", counts)
    for k in range(41):  # 20 resolve-and-fire cycles after the first firing, the receiver down throughout
        box.enqueue(["hook", "am"], _state(k))
        assert box.depth()["hook"] <= PENDING_PER_ALERT
    box.enqueue(["other"], _state(0))
    sent = _drain(box, "hook")
    assert [a.status for a in sent] == ["firing", "resolved", "firing"]  # still alternating, first one first
    assert sent[0].starts_at == 1000.0 and sent[-1].starts_at == 1000.0 + 600 * 20  # the first and the latest
    # the resolution tells the receiver how many cycles it did not see: 20 - the one it sees
    assert sent[1].annotations[FLAPS] == "19" and FLAPS not in sent[0].annotations | sent[2].annotations
    assert counts[("hook", "folded")] == counts[("am", "folded")] == 38 and counts[("other", "folded")] == 0
    box.close()


def test_folding_never_touches_the_message_in_flight(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["hook"], _state(0))
    (in_flight,) = box.head("hook")
    for k in range(1, 9):
        box.enqueue(["hook"], _state(k))
    box.delivered([in_flight])  # the 2xx arrives after the folds: the copy sent is the one removed
    assert [(a.status, a.starts_at) for a in _drain(box, "hook")] == [("resolved", 2800.0), ("firing", 3400.0)]
    box.close()


def test_an_alert_that_does_not_flap_loses_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    for k in range(PENDING_PER_ALERT):
        box.enqueue(["hook"], _state(k))
    assert [a.status for a in _drain(box, "hook")] == ["firing", "resolved"] * (PENDING_PER_ALERT // 2)
    box.close()


def test_the_folded_messages_show_in_the_delivery_metrics_and_the_api(tmp_path: Path) -> None:
    hook = {"type": "webhook", "name": "ops", "url": "http://127.0.0.1:9/"}
    cfg = AlertingConfig.model_validate({"receivers": [hook]})
    d = Dispatcher(cfg, tmp_path)  # not started: the receiver is as good as down
    try:
        for k in range(7):
            d.notify(_state(k))
        folded = {dict(s.labels)["outcome"]: s.value for s in d.metrics() if s.name == "sits_webhook_deliveries_total"}
        assert folded == {"delivered": 0, "retried": 0, "failed": 0, "folded": 4}
        assert d.state()["receivers"][0]["folded"] == 4 and d.state()["receivers"][0]["queue_depth"] == 3
    finally:
        d.close()


def test_an_outbox_queued_before_the_bound_is_folded_back_to_it_at_the_next_change(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """A receiver down across the upgrade: the outbox already holds every cycle (as the version before queued
    them); the next state change folds them all, not one cycle per change."""
    from sits_observe.alerting import outbox

    counts: Counter[tuple[str, str]] = Counter()
    box = Outbox(tmp_path / "outbox.db", counts)
    monkeypatch.setattr(outbox, "PENDING_PER_ALERT", 1000)  # unbounded, as before
    for k in range(20):
        box.enqueue(["hook"], _state(k))
    assert box.depth()["hook"] == 20
    monkeypatch.undo()
    box.enqueue(["hook"], _state(20))
    assert box.depth()["hook"] <= PENDING_PER_ALERT
    sent = _drain(box, "hook")
    assert [a.status for a in sent] == ["firing", "resolved", "firing"]
    assert sent[0].starts_at == 1000.0 and sent[-1].starts_at == 1000.0 + 600 * 10
    assert sent[1].annotations[FLAPS] == "9" and counts[("hook", "folded")] == 18
    box.close()
