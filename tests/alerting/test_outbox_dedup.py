"""The outbox's deduplication: what it drops as a copy, and what it must not."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sits_observe.alerting.formats import Alert
from sits_observe.alerting.outbox import FAILED_KEPT, Outbox

LABELS = {"alertname": "SloBurn", "slo": "chat", "burn_tier": "page"}


def _alert(status: str = "firing", **notes: str) -> Alert:
    return Alert(LABELS, {"summary": "chat burns", **notes}, status, 1000.0)


def test_a_message_refused_for_good_is_sent_again_when_the_alert_is_announced_again(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    assert box.enqueue(["hook"], _alert()) == 1
    (msg,) = box.head("hook")
    box.failed([msg.id], "HTTP 401 Unauthorized")  # a rotated token: the page never reached anyone
    assert box.enqueue(["hook"], _alert()) == 1  # fixed and restarted: announced again, and queued
    assert [m.alert.status for m in box.head("hook")] == ["firing"]
    box.close()


def test_a_failed_message_with_a_newer_one_pending_keeps_that_ones_dedup(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["hook"], _alert())
    box.enqueue(["hook"], _alert("resolved"))
    first = box.head("hook")[0]
    box.failed([first.id], "HTTP 400")
    assert box.enqueue(["hook"], _alert("resolved")) == 0  # the pending resolution is this state already
    box.close()


def test_a_change_of_quiet_annotations_alone_is_no_new_message(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    assert box.enqueue(["hook"], _alert(likely_cause="thermal_throttling", confidence="0.93")) == 1
    box.delivered(box.head("hook"))
    # a restart announces the firing alert again with a newer verdict's confidence: a copy
    assert box.enqueue(["hook"], _alert(likely_cause="thermal_throttling", confidence="0.97",
                                        rca_verdict="v2")) == 0
    assert box.enqueue(["hook"], _alert(likely_cause="scheduler_stall", confidence="0.97")) == 1  # a loud one
    box.close()


@pytest.mark.parametrize("edit", [
    lambda a: {"labels": 3},
    # an alert is made of these, so they passed; they failed in rendering, and the sender retried the head forever
    lambda a: a | {"starts_at": "2026-12-01T10:00:00Z"},  # another version's time format
    lambda a: a | {"annotations": ["summary"]},
    lambda a: a | {"status": "resolved", "ends_at": "x"},
    lambda a: a | {"labels": {"slo": 7}},
    lambda a: a | {"starts_at": 1e300},
])
def test_a_message_that_cannot_be_read_back_moves_aside_and_the_queue_goes_on(
        tmp_path: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    import json
    import sqlite3

    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["hook"], _alert())
    with sqlite3.connect(tmp_path / "outbox.db") as db:  # another version's row, or a damaged one
        db.execute("UPDATE outbox SET alert=?", (json.dumps(edit(_alert().to_json())),))
    box.enqueue(["hook"], Alert({"alertname": "Other"}, {}, "firing", 1000.0))
    assert [m.alert.labels["alertname"] for m in box.head("hook")] == ["Other"]  # the bad one moved aside
    (failure,) = box.recent_failures()
    assert failure["reason"].startswith("unreadable message")
    box.close()


def test_a_state_refused_for_good_is_not_offered_again_at_every_resend(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["am"], _alert())
    (msg,) = box.head("am")
    box.failed([msg.id], "HTTP 400 Bad Request: invalid label value")
    assert box.enqueue(["am"], _alert(), refresh=True) == 0  # it was refused again at each re-send interval
    assert box.enqueue(["am"], _alert()) == 1  # announced again (a restart once fixed): sent again
    box.delivered(box.head("am"))
    assert box.enqueue(["am"], _alert(), refresh=True) == 1  # and re-sent from then on
    box.close()


def test_a_refused_firing_state_is_offered_again_at_a_retry_refresh_only(tmp_path: Path) -> None:
    """A proxy's 404 in front of Alertmanager, fixed later: the firing alert stayed unseen until its next change."""
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["am"], _alert())
    box.failed([box.head("am")[0].id], "HTTP 404 Not Found")
    assert box.enqueue(["am"], _alert(), refresh=True) == 0
    assert box.enqueue(["am"], _alert(), refresh=True, retry_refused=True) == 1
    assert box.enqueue(["am"], _alert(), refresh=True, retry_refused=True) == 0  # pending: not twice
    box.failed([box.head("am")[0].id], "HTTP 404 Not Found")  # refused again: back to the retries alone
    assert box.enqueue(["am"], _alert(), refresh=True) == 0
    assert box.enqueue(["am"], _alert(), refresh=True, retry_refused=True) == 1
    box.delivered(box.head("am"))  # taken: re-sent at every interval from then on
    assert box.enqueue(["am"], _alert(), refresh=True) == 1
    box.delivered(box.head("am"))
    assert box.enqueue(["am"], _alert()) == 0  # the same state announced again is no new message
    # never refused, never queued (another receiver's alert): a retry offers nothing
    assert box.enqueue(["other"], _alert(), refresh=True, retry_refused=True) == 0
    box.close()


def test_a_webhook_gets_a_refused_state_again_at_a_retry_and_no_re_sends(tmp_path: Path) -> None:
    """A webhook behind a proxy that answered 404 (fixed there later) never saw the firing alert until its next
    change; it is offered again at a retry like Alertmanager, but a state it took is not sent again."""
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["hook"], _alert())
    box.failed([box.head("hook")[0].id], "HTTP 404 Not Found")
    assert box.enqueue(["hook"], _alert(), refresh=True, retry_refused=False, resend=False) == 0
    assert box.enqueue(["hook"], _alert(), refresh=True, retry_refused=True, resend=False) == 1
    box.delivered(box.head("hook"))
    assert box.enqueue(["hook"], _alert(), refresh=True, retry_refused=True, resend=False) == 0  # taken: no re-sends
    assert box.enqueue(["hook"], _alert()) == 0  # and the same state announced again is no new message
    box.close()


@pytest.mark.parametrize(("reason", "offered"), [
    ("HTTP 404 Not Found", 1), ("HTTP 403", 1), ("HTTP 401 Unauthorized: no token", 1),
    ("HTTP 400 Bad Request: invalid label value", 0), ("HTTP 413 Payload Too Large", 0),
    ("HTTP 422 Unprocessable Entity", 0), ("InvalidURL: http.client refuses this receiver's url", 0),
])
def test_only_a_refusal_a_fix_on_the_receivers_side_can_lift_is_retried(tmp_path: Path, reason: str,
                                                                        offered: int) -> None:
    """A 400 for the alert's content is refused again at every retry (a batch split, lines logged) for nothing."""
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["am"], _alert())
    box.failed([box.head("am")[0].id], reason)
    assert box.enqueue(["am"], _alert(), refresh=True, retry_refused=True) == offered
    box.close()


def test_refusals_are_kept_by_count_not_by_id(tmp_path: Path) -> None:
    """``failed`` was pruned to ids within FAILED_KEPT of the newest; re-sends use ids up, so a refusal 1,000
    messages old (15 minutes of re-sends of 70 alerts) went with the next refusal, and its retry with it."""
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["am"], _alert())
    box.failed([box.head("am")[0].id], "HTTP 404 Not Found")
    for k in range(FAILED_KEPT + 5):  # other alerts queued and delivered: ids used up
        box.enqueue(["am"], Alert({"alertname": "Other", "k": str(k)}, {}, "firing", 1000.0))
        box.delivered(box.head("am"))
    box.enqueue(["hook"], _alert())
    box.failed([box.head("hook")[0].id], "HTTP 400 Bad Request")  # another refusal prunes
    assert len(box.recent_failures()) == 2
    assert box.enqueue(["am"], _alert(), refresh=True, retry_refused=True) == 1
    box.close()


def test_a_refusal_is_kept_by_when_it_came_not_when_its_message_was_queued(tmp_path: Path) -> None:
    """Alertmanager down for hours: its message, queued first, is refused after a webhook refused 1,000 messages
    queued later; kept by queue id it was pruned as it was refused, and with it its retry and its API entry."""
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["am"], _alert())
    (held,) = box.head("am")
    for k in range(FAILED_KEPT):
        box.enqueue(["hook"], Alert({"alertname": "Other", "k": str(k)}, {}, "firing", 1000.0))
        box.failed([box.head("hook")[0].id], "HTTP 400 Bad Request")
    box.failed([held.id], "HTTP 404 Not Found")
    assert box.recent_failures(1)[0]["receiver"] == "am"
    assert box.enqueue(["am"], _alert(), refresh=True, retry_refused=True) == 1
    box.close()
