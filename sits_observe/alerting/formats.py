"""Alert records and the bodies receivers expect: Alertmanager API v2, Alertmanager webhook v4, Slack.

The label fingerprint is Alertmanager's own (FNV-1a 64 over sorted ``name 0xff value 0xff``), so an
alert's fingerprint here equals the one Alertmanager shows.  Signed deliveries carry
``X-Sits-Timestamp``, ``X-Sits-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>`` and
``X-Sits-Delivery-Signature``, the same over ``timestamp + "." + delivery id + "." + body``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["Alert", "fingerprint", "rfc3339", "render", "sign", "KINDS", "QUIET_ANNOTATIONS"]

# annotations whose change alone is no new message: they ride on the next one (a verdict every few seconds
# must not become a chat message every few seconds, nor a restart a copy of every firing alert)
QUIET_ANNOTATIONS = frozenset({"confidence", "rca_verdict", "scheduler_decision_id"})  # ids and scores

KINDS = ("alertmanager", "webhook", "slack")
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not set"


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's label-set fingerprint, 16 hex digits."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode() + b"\xff":
                h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return f"{h:016x}"


def _strings(m: Any) -> bool:
    return isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())


def _time(t: Any) -> bool:
    """A Unix time :func:`rfc3339` can write (years 1970-9999)."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 253402300800


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Alert:
    """One alert in one state; times are the source clock (unix seconds)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    status: Literal["firing", "resolved"]
    starts_at: float
    ends_at: float | None = None
    generator_url: str = ""
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.labels)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        del d["fingerprint"]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Alert:
        """The alert :meth:`to_json` gave; ValueError or TypeError for a record of another shape (another
        version's, or damaged), also where only a field's type is off, which would fail later, in rendering."""
        a = cls(**d)
        if not (_strings(a.labels) and _strings(a.annotations) and a.status in ("firing", "resolved")
                and _time(a.starts_at) and (a.ends_at is None or _time(a.ends_at))
                and isinstance(a.generator_url, str)):
            raise ValueError("a field of the wrong type or out of range")
        return a

    def _times(self, now: float | None) -> tuple[str, str]:
        """RFC 3339 start and end; with ``now`` both are held at or before it (Alertmanager's own clock)."""
        start, end = self.starts_at, self.ends_at
        if now is not None:
            start = min(start, now)
            end = None if end is None else max(start, min(end, now))
        return rfc3339(start), _ZERO_TIME if end is None else rfc3339(end)


def _am_v2(alerts: Sequence[Alert], now: float, hold: float) -> Any:
    out = []
    for a in alerts:
        start, end = a._times(now)
        item: dict[str, Any] = {"labels": a.labels, "annotations": a.annotations, "startsAt": start,
                                "generatorURL": a.generator_url}
        if a.status == "resolved":
            item["endsAt"] = end
        elif hold:  # valid until then unless sent again: not Alertmanager's resolve_timeout, which may be shorter
            item["endsAt"] = rfc3339(now + hold)
        out.append(item)
    return out


def _common(dicts: Sequence[Mapping[str, str]]) -> dict[str, str]:
    first = dict(dicts[0])
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


def _webhook_v4(alerts: Sequence[Alert], receiver: str, now: float) -> Any:
    common = _common([a.labels for a in alerts])
    group = {k: common[k] for k in ("alertname", "slo") if k in common}
    key = ",".join(f'{k}="{v}"' for k, v in sorted(group.items()))
    return {
        "version": "4",
        "groupKey": f"{{}}:{{{key}}}",
        "truncatedAlerts": 0,
        "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": group,
        "commonLabels": common,
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": "",
        "alerts": [
            {"status": a.status, "labels": a.labels, "annotations": a.annotations,
             "startsAt": a._times(None)[0], "endsAt": a._times(None)[1], "generatorURL": a.generator_url,
             "fingerprint": a.fingerprint}
            for a in alerts
        ],
    }


def _mrkdwn(text: str) -> str:
    """``text`` as Slack shows it literally: ``&``, ``<`` and ``>`` escaped (else ``<!channel>`` in a description
    pings the channel, ``<url|x>`` becomes a link and ``p99 < 2s`` loses its text)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack(alerts: Sequence[Alert], receiver: str, now: float) -> Any:
    lines = []
    for a in alerts:
        mark = ":red_circle: *FIRING*" if a.status == "firing" else ":large_green_circle: *RESOLVED*"
        name = a.labels.get("alertname", "alert")
        rest = " ".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname")
        lines.append(_mrkdwn(f"{mark} {name} {rest}").replace("\n", " "))
        lines += [f"> {k}: " + _mrkdwn(v).replace("\n", "\n> ") for k, v in sorted(a.annotations.items())]
    return {"text": "\n".join(lines)}


_RENDER = {"webhook": _webhook_v4, "slack": _slack}


def render(kind: str, alerts: Sequence[Alert], receiver: str, now: float, hold: float = 0.0) -> bytes:
    """The JSON body for ``kind`` (``alertmanager``, ``webhook`` or ``slack``); ``now`` is the wall clock.
    ``hold`` (Alertmanager): seconds a firing alert stays valid unless sent again, its ``endsAt`` (Prometheus
    gives four re-send intervals); 0: none, so Alertmanager ends it after its own ``resolve_timeout``."""
    body = _am_v2(alerts, now, hold) if kind == "alertmanager" else _RENDER[kind](alerts, receiver, now)
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def sign(secret: bytes, timestamp: str, body: bytes, delivery: str | None = None) -> str:
    """Value of ``X-Sits-Signature`` for a body sent at ``timestamp`` (unix seconds as text); with ``delivery``,
    of ``X-Sits-Delivery-Signature``, which also covers the ``X-Sits-Delivery`` id (timestamp.delivery.body)."""
    signed = timestamp.encode() + b"." + (b"" if delivery is None else delivery.encode() + b".") + body
    return "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()
