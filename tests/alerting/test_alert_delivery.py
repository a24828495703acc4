"""Outbox and senders against a scripted loopback receiver: retries, final refusals, dedup, order, payloads."""

import base64
import json
import logging
import socket
import time
from dataclasses import replace

import pytest

from sits_observe.alerting import sender as sender_module
from sits_observe.alerting.config import AlertingConfig, ReceiverConfig
from sits_observe.alerting.dispatch import Dispatcher
from sits_observe.alerting.formats import Alert, fingerprint, render
from sits_observe.alerting.outbox import Outbox
from sits_observe.errors import AlertingError

from alert_receiver import Receiver, free_port


def _alert(name: str, status: str = "firing", **annotations: str) -> Alert:
    return Alert({"alertname": "SitsSloBurnRate", "slo": name}, dict(annotations), status, 1_700_000_000.0,
                 None if status == "firing" else 1_700_000_600.0)


def _dispatcher(tmp_path, url, kind="webhook", secret=None, **extra):
    cfg = AlertingConfig.model_validate({
        "receivers": [{"type": kind, "name": "r", "url": url, "timeout": 0.3,
                       **({"secret": secret} if secret else {})}],
        "backoff": {"initial": 0.02, "max": 0.1}, **extra})
    return Dispatcher(cfg, tmp_path)


def _wait(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred():
        time.sleep(0.02)
    return pred()


def test_retries_transient_errors_in_order_and_gives_up_on_4xx(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sits_observe.alerting")
    port = free_port()
    d = _dispatcher(tmp_path, f"http://127.0.0.1:{port}/services/T0/B0/URLTOKEN", secret="k-SECRET")
    d.start()
    for name in "abcd":
        d.notify(_alert(name))
    time.sleep(0.3)  # nobody listens yet: connection refused, retried
    rx = Receiver(port=port, script=[500, 503, 429, "hang", 400], secret="k-SECRET", hang_s=0.6)
    try:
        assert _wait(lambda: d.outbox.depth() == {})
        order = [x.body["alerts"][0]["labels"]["slo"] for x in rx.deliveries]
        # a: 500, 503, 429, hang (timeout), then 400 -> given up; b, c, d follow in order
        assert order == ["a", "a", "a", "a", "a", "b", "c", "d"]
        assert all(x.signed_ok for x in rx.deliveries)
        counts = {(s.labels[1][1]): s.value for s in d.metrics() if s.name == "sits_webhook_deliveries_total"}
        assert counts["delivered"] == 3 and counts["failed"] == 1 and counts["retried"] >= 5
        state = d.state()
        failed = state["failed"][0]
        assert failed["reason"].startswith("HTTP 400 Bad Request") and failed["status"] == "firing"
        assert state["receivers"][0]["queue_depth"] == 0
        # logs say what went wrong and where, never the URL (a Slack URL is a secret) or the key
        assert "receiver r: delivery failed (connection refused)" in caplog.text
        assert "receiver r: 1 alert(s) refused for good: HTTP 400 Bad Request" in caplog.text
        for text in (caplog.text, json.dumps(state)):
            assert "URLTOKEN" not in text and "k-SECRET" not in text
    finally:
        d.close()
        rx.close()


def test_dedup_coalesce_and_update_while_in_flight(tmp_path):
    rx = Receiver(script=["hold"])
    d = _dispatcher(tmp_path, rx.url)
    try:
        d.start()
        d.notify(_alert("a"))
        assert rx.holding.wait(10)
        d.notify(_alert("a", likely_cause="cpu_contention"))  # same status, new annotations, while in flight
        d.notify(_alert("a", likely_cause="cpu_contention"))  # identical: dropped
        d.notify(_alert("b"))
        d.notify(_alert("b", likely_cause="x"))               # still queued: updated in place
        rx.release.set()
        assert _wait(lambda: d.outbox.depth() == {})
        d.notify(_alert("a", likely_cause="cpu_contention"))  # a restarted evaluator re-announcing: dropped
        d.notify(_alert("a", "resolved"))
        assert _wait(lambda: len(rx.deliveries) == 4)
        time.sleep(0.2)
        got = [(x.body["alerts"][0]["labels"]["slo"], x.body["status"], x.body["alerts"][0]["annotations"])
               for x in rx.deliveries]
        assert got == [("a", "firing", {}), ("a", "firing", {"likely_cause": "cpu_contention"}),
                       ("b", "firing", {"likely_cause": "x"}), ("a", "resolved", {})]
        ids = [x.delivery_id for x in rx.deliveries]
        assert ids[0].split(":")[1] == "1.0" and ids[1].split(":")[1] == "1.1" and len(set(ids)) == 4
    finally:
        d.close()
        rx.close()


def test_an_update_made_while_in_flight_is_not_given_up_with_the_refused_message(tmp_path):
    """A message updated in place while its attempt was in flight moved to ``failed`` with its new content when the
    receiver refused the old one: the update (the RCA's likely cause) was never sent."""
    rx = Receiver(script=["hold"])
    rx.hold_status = 400
    d = _dispatcher(tmp_path, rx.url)
    try:
        d.start()
        d.notify(_alert("a"))
        assert rx.holding.wait(10)
        d.notify(_alert("a", likely_cause="cpu_contention"))
        rx.release.set()
        assert _wait(lambda: d.outbox.depth() == {} and d.counts[("r", "failed")] == 1)
        got = [(x.body["alerts"][0]["annotations"], x.answer) for x in rx.deliveries]
        assert got == [({}, "hold"), ({"likely_cause": "cpu_contention"}, 200)]
        assert d.counts[("r", "delivered")] == 1 and d.state()["failed"] == []  # the message was delivered
    finally:
        d.close()
        rx.close()


def test_alertmanager_batches_and_resends_firing(tmp_path):
    rx = Receiver()
    d = _dispatcher(tmp_path, f"http://127.0.0.1:{rx.port}", kind="alertmanager", resend_interval=0.2)
    try:
        for name in "abc":
            d.notify(_alert(name))
        d.notify(_alert("a", "resolved"))
        d.start()
        assert _wait(lambda: d.outbox.depth() == {})
        # one POST with a, b, c; the resolution of a waits for the next one (never twice in a batch)
        assert [[x["labels"]["slo"] for x in r.body] for r in rx.deliveries] == [["a", "b", "c"], ["a"]]
        # firing: valid for four re-send intervals ahead; resolved: when it ended (before that)
        assert rx.deliveries[0].body[0]["endsAt"] > rx.deliveries[1].body[0]["endsAt"]
        time.sleep(0.25)
        d.refresh([_alert("b"), _alert("c")])
        assert _wait(lambda: len(rx.deliveries) == 3)
        assert [x["labels"]["slo"] for x in rx.deliveries[2].body] == ["b", "c"]
    finally:
        d.close()
        rx.close()


def _on_a_test_clock(tmp_path, monkeypatch, kind: str, script: list[object]):
    """A dispatcher whose clock the test moves (re-send interval 60 s, refusals offered again every 3rd) and its
    one receiver, answering ``script``."""
    monkeypatch.setattr("sits_observe.alerting.dispatch.REFUSED_RETRY_ROUNDS", 3)
    now = [0.0]
    rx = Receiver(script=script)
    cfg = AlertingConfig.model_validate({"receivers": [{"type": kind, "name": "r",
                                                        "url": f"http://127.0.0.1:{rx.port}", "timeout": 0.3}],
                                         "backoff": {"initial": 0.02, "max": 0.1}, "resend_interval": 60})
    return Dispatcher(cfg, tmp_path, clock=lambda: now[0]), rx, now


def test_a_firing_state_alertmanager_refused_reaches_it_once_fixed(tmp_path, monkeypatch):
    """A 404 (a proxy's path, fixed without a restart here) gave the state up for good: the alert stayed unseen by
    Alertmanager until its next state change. Every REFUSED_RETRY_ROUNDS-th re-send offers it again."""
    d, rx, now = _on_a_test_clock(tmp_path, monkeypatch, "alertmanager", [404, 404])
    try:
        d.start()
        d.notify(_alert("a"))
        assert _wait(lambda: d.counts[("r", "failed")] == 1)
        answers = []
        for _ in range(6):  # re-sends 1..6: the 3rd is refused again, the 6th is taken, as is every one after
            now[0] += 60
            d.refresh([_alert("a")])
            assert _wait(lambda: d.outbox.depth() == {})
            answers.append([x.answer for x in rx.deliveries])
        assert answers[-1] == [404, 404, 200] and answers[1] == [404] and answers[2] == answers[4] == [404, 404]
        now[0] += 60
        d.refresh([_alert("a")])
        assert _wait(lambda: len(rx.deliveries) == 4)
        assert d.counts[("r", "failed")] == 2 and d.counts[("r", "delivered")] == 2
    finally:
        d.close()
        rx.close()


def test_a_firing_state_a_webhook_refused_reaches_it_once_fixed_and_only_once(tmp_path, monkeypatch):
    """Webhooks get no re-sends, so a firing state one refused with a 404 (a proxy's path, fixed there) stayed unseen
    until the alert's next state change. It is offered again at every REFUSED_RETRY_ROUNDS-th interval, like
    Alertmanager's, and once taken it is not sent again; a 400 (its content) is not offered again."""
    d, rx, now = _on_a_test_clock(tmp_path, monkeypatch, "webhook", [404, 400, 404])
    try:
        d.start()
        d.notify(_alert("a"))
        d.notify(_alert("b"))
        assert _wait(lambda: d.counts[("r", "failed")] == 2)
        seen = []
        for _ in range(9):  # intervals 1..9: a retry at 3 (a refused again), 6 (a taken), 9 (nothing left)
            now[0] += 60
            d.refresh([_alert("a"), _alert("b")])
            assert _wait(lambda: d.outbox.depth() == {})
            seen.append([(x.body["alerts"][0]["labels"]["slo"], x.answer) for x in rx.deliveries[2:]])
        assert seen[1] == [] and seen[2] == [("a", 404)] and seen[5] == seen[8] == [("a", 404), ("a", 200)]
        assert d.counts[("r", "failed")] == 3 and d.counts[("r", "delivered")] == 1
    finally:
        d.close()
        rx.close()


def test_a_firing_alert_re_announced_with_a_later_start_is_the_same_incident(tmp_path):
    box = Outbox(tmp_path / "outbox.db")
    first = _alert("a")
    assert box.enqueue(["r"], first) == 1
    box.delivered(box.head("r"))
    # killed after queuing, before recording: the restarted engine announces it again, from a later tick
    assert box.enqueue(["r"], replace(first, starts_at=first.starts_at + 300)) == 0
    assert box.enqueue(["r"], replace(first, status="resolved", ends_at=first.starts_at + 900)) == 1
    assert box.enqueue(["r"], replace(first, starts_at=first.starts_at + 3600)) == 1  # a new incident
    assert box._read("PRAGMA synchronous") == [(2,)]  # FULL: queued before the SLO state, on disk too
    box.close()


def test_outbox_survives_reopen_and_keeps_instance(tmp_path):
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["r"], _alert("a"))
    box.enqueue(["r"], _alert("a", "resolved"))
    instance = box.instance
    box.close()
    box = Outbox(tmp_path / "outbox.db")
    assert box.instance == instance
    assert [(m.alert.labels["slo"], m.alert.status) for m in box.head("r", 10)] == [("a", "firing")]
    assert box.depth() == {"r": 2}
    box.close()


def test_payload_formats():
    firing, resolved = _alert("a", summary="s"), _alert("a", "resolved", summary="s")
    v4 = json.loads(render("webhook", [firing], "r", 1.0))
    assert v4["version"] == "4" and v4["status"] == "firing" and v4["receiver"] == "r"
    assert v4["groupLabels"] == {"alertname": "SitsSloBurnRate", "slo": "a"}
    assert v4["groupKey"] == '{}:{alertname="SitsSloBurnRate",slo="a"}'
    assert v4["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z" and v4["alerts"][0]["startsAt"].endswith("Z")
    assert v4["alerts"][0]["fingerprint"] == fingerprint(firing.labels)
    am = json.loads(render("alertmanager", [resolved], "r", now=1_700_000_300.0))
    # times are held at Alertmanager's clock: a resolution stamped later than "now" would not resolve
    assert am[0]["startsAt"] == "2023-11-14T22:13:20.000Z" and am[0]["endsAt"] == "2023-11-14T22:18:20.000Z"
    slack = json.loads(render("slack", [firing, resolved], "r", 1.0))["text"]
    assert slack.splitlines()[0] == ":red_circle: *FIRING* SitsSloBurnRate slo=a"
    assert "*RESOLVED*" in slack and "> summary: s" in slack


def test_slack_text_shows_labels_and_annotations_as_written():
    """``<``, ``>`` and ``&`` went to Slack raw: ``<!channel>`` in a description pinged the whole channel,
    ``p99 < 2s`` lost its text, and a second line of an annotation fell out of its quote."""
    alert = Alert({"alertname": "SitsSloBurnRate", "slo": "a&b"},
                  {"description": "p99 < 2s & errors > 1%, <!channel>\nsee <https://x|runbook>"}, "firing", 1.0)
    assert json.loads(render("slack", [alert], "r", 1.0))["text"].splitlines() == [
        ":red_circle: *FIRING* SitsSloBurnRate slo=a&amp;b",
        "> description: p99 &lt; 2s &amp; errors &gt; 1%, &lt;!channel&gt;",
        "> see &lt;https://x|runbook&gt;"]


def test_fingerprint():
    assert fingerprint({}) == "cbf29ce484222325"  # FNV-1a 64 offset basis: Alertmanager's empty label set
    assert fingerprint({"a": "1", "b": "2"}) == fingerprint({"b": "2", "a": "1"})
    assert fingerprint({"a": "1", "b": "2"}) != fingerprint({"a": "12"})  # the separator byte keeps them apart


def test_credentials_in_the_url_go_as_basic_auth_and_never_into_logs(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sits_observe.alerting")
    rx = Receiver(script=[503])
    d = _dispatcher(tmp_path, f"http://am%40ops:pa%3Ass@127.0.0.1:{rx.port}/hook")
    d.start()
    try:
        d.notify(_alert("a"))
        assert _wait(lambda: d.outbox.depth() == {} and len(rx.deliveries) == 2)
        assert {x.authorization for x in rx.deliveries} == {"Basic " + base64.b64encode(b"am@ops:pa:ss").decode()}
        assert "pa%3Ass" not in caplog.text and "pa:ss" not in caplog.text and "receiver r:" in caplog.text
    finally:
        d.close()
        rx.close()


def test_a_sender_outlives_an_unexpected_error_and_a_receiver_down_for_days(tmp_path, monkeypatch, caplog):
    rx = Receiver()
    d = _dispatcher(tmp_path, rx.url)
    sender = d.senders["r"]
    # ~1,000 failed attempts in a row (3.5 days at the default back-off) used to overflow the delay
    assert sender._delay(5000, None) <= 0.1 and sender._delay(1, None) <= 0.02 * 1.2
    real, calls = sender_module.render, []

    def render_once_broken(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise UnicodeEncodeError("ascii", "é", 0, 1, "a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(sender_module, "render", render_once_broken)
    d.start()
    try:
        d.notify(_alert("a"))
        assert _wait(lambda: d.outbox.depth() == {}) and len(rx.deliveries) == 1
        assert sender.is_alive() and len(calls) == 2
        assert "receiver r: unexpected UnicodeEncodeError while delivering" in caplog.text
    finally:
        d.close()
        rx.close()


def test_a_failed_commit_is_rolled_back_so_later_writes_still_work(tmp_path):
    box = Outbox(tmp_path / "outbox.db")
    db = box._db
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TABLE child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(AlertingError, match="FOREIGN KEY"):
        with box._tx() as tx:
            tx.execute("INSERT INTO child VALUES (42)")  # checked only at COMMIT, which fails
    assert not db.in_transaction
    assert box.enqueue(["r"], _alert("a")) == 1 and box.depth() == {"r": 1}
    box.close()


def test_a_url_http_client_refuses_is_a_final_failure_not_retried_forever(tmp_path):
    # check_url refuses such a URL at load; a sender given one anyway must not retry it for ever
    bad = ReceiverConfig.model_construct(type="webhook", name="r", url="http://127.0.0.1:1/hook/T0KEN with space",
                                         secret=None, timeout=0.3)
    d = Dispatcher(AlertingConfig.model_validate({"receivers": [bad], "backoff": {"initial": 0.02, "max": 0.1}}),
                   tmp_path)
    d.start()
    try:
        d.notify(_alert("a"))
        assert _wait(lambda: d.outbox.depth() == {}, timeout=5)
        assert d.counts[("r", "retried")] == 0 and d.counts[("r", "failed")] == 1
        reason = d.state()["failed"][0]["reason"]
        assert reason.startswith("InvalidURL") and "T0KEN" not in reason
    finally:
        d.close()


def test_a_kept_alive_connection_the_receiver_closed_while_idle_is_replaced_at_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="sits_observe.alerting")
    rx = Receiver(idle_s=0.2)
    d = _dispatcher(tmp_path, rx.url)
    d.start()
    try:
        for name in "ab":
            d.notify(_alert(name))
            assert _wait(lambda: d.outbox.depth() == {})
            time.sleep(0.5)  # the receiver closes the idle connection
        assert [x.body["alerts"][0]["labels"]["slo"] for x in rx.deliveries] == ["a", "b"]
        assert d.counts[("r", "retried")] == 0 and "delivery failed" not in caplog.text
    finally:
        d.close()
        rx.close()


def test_close_stops_every_sender_and_closes_the_outbox_even_when_one_fails(tmp_path):
    cfg = AlertingConfig.model_validate({"receivers": [{"type": "webhook", "name": n, "url": f"http://127.0.0.1:9/{n}"}
                                                       for n in "abc"]})

    class Closing:  # the sender thread closes the connection between two reads of its socket
        def __init__(self):
            self.reads, self.socket = 0, socket.socket()

        @property
        def sock(self):
            self.reads += 1
            return self.socket if self.reads == 1 else None

    d = Dispatcher(cfg, tmp_path)
    d.senders["a"]._conn = Closing()
    d.close()
    assert all(s._halt.is_set() for s in d.senders.values())
    d.senders["a"]._conn.socket.close()

    (tmp_path / "2").mkdir()
    d = Dispatcher(cfg, tmp_path / "2")
    d.senders["b"].stop = lambda: 1 / 0  # a bug in one sender's stop
    with pytest.raises(ZeroDivisionError):
        d.close()
    assert d.senders["a"]._halt.is_set() and d.senders["c"]._halt.is_set()
    with pytest.raises(AlertingError):
        d.outbox.depth()  # closed


def test_messages_for_a_receiver_no_longer_configured_are_kept_and_shown(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sits_observe.alerting")
    box = Outbox(tmp_path / "outbox.db")
    box.enqueue(["webhook"], _alert("a"))  # queued while the receiver had its default name
    box.close()
    d = _dispatcher(tmp_path, "http://127.0.0.1:9/services/URLTOKEN")  # renamed to "r"
    d.start()
    try:
        assert d.state()["unconfigured_receivers"] == [{"name": "webhook", "queue_depth": 1}]
        depth = {s.labels: s.value for s in d.metrics() if s.name == "sits_webhook_queue_depth"}
        assert depth[(("receiver", "webhook"),)] == 1.0
        warnings = [r.getMessage() for r in caplog.records if "no longer configured" in r.getMessage()]
        assert len(warnings) == 1 and "webhook" in warnings[0] and "URLTOKEN" not in caplog.text
    finally:
        d.close()
