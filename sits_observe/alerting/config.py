"""The ``alerting:`` config section: receivers, retry back-off and Alertmanager re-sends (docs/alerting.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..collectors.config import check_url
from ..section import Section, SigningKey

__all__ = ["ReceiverConfig", "BackoffConfig", "AlertingConfig", "check_unique", "check_label_names"]


def check_unique(names: Sequence[str], what: str) -> None:
    """Raise a ValidationError located at ``[i].name`` for every repeated name (the input is the name only)."""
    first: dict[str, int] = {}
    errors: list[InitErrorDetails] = []
    for i, name in enumerate(names):
        if name in first:
            errors.append(InitErrorDetails(
                type=PydanticCustomError("duplicate", "duplicate {what} name (also [{first}]); names must be unique",
                                         {"what": what, "first": first[name]}),
                loc=(i, "name"), input=name))
        first.setdefault(name, i)
    if errors:
        raise ValidationError.from_exception_data(what, errors)


def check_label_names(labels: dict[str, str]) -> dict[str, str]:
    """Prometheus label names only; raise ValueError naming the bad ones."""
    bad = [k for k in labels if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k)]
    if bad:
        raise ValueError(f"label names must match [a-zA-Z_][a-zA-Z0-9_]*, not {bad}")
    return labels


class ReceiverConfig(Section):
    """Where alerts go.  ``secret`` signs every delivery (HMAC-SHA256); it never appears in logs or the API."""

    type: Literal["alertmanager", "webhook", "slack"]
    name: str | None = Field(None, pattern=r"^[a-zA-Z_][a-zA-Z0-9_.-]{0,62}$",
                             description="label `receiver` in metrics; default: the type")
    url: str = Field(description="Alertmanager base URL, webhook URL or Slack incoming-webhook URL")
    secret: SigningKey | None = Field(None, description="HMAC-SHA256 key for the X-Sits-Signature header")
    timeout: float = Field(10.0, gt=0, le=300, description="seconds to wait for the receiver's answer")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v, "http://127.0.0.1:9093 (Alertmanager) or https://hooks.example/alerts")

    @property
    def label(self) -> str:
        return self.name or self.type


class BackoffConfig(Section):
    """Retry delay after a 5xx, 429, timeout or connection error: ``initial * multiplier**n`` up to ``max``."""

    initial: float = Field(1.0, gt=0, le=3600)
    max: float = Field(300.0, gt=0, le=86400)
    multiplier: float = Field(2.0, ge=1, le=10)
    jitter: float = Field(0.2, ge=0, le=1, description="each delay is scaled by a random factor in 1 +- jitter")

    @model_validator(mode="after")
    def _initial_within_max(self) -> BackoffConfig:
        if self.initial > self.max:
            raise ValueError(f"initial ({self.initial:g} s) is above max ({self.max:g} s); make initial <= max")
        return self


class AlertingConfig(Section):
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    backoff: BackoffConfig = Field(default_factory=BackoffConfig)
    resend_interval: float = Field(60.0, gt=0, le=3600,
                                   description="wall seconds between re-sends of firing alerts to Alertmanager")
    max_batch: int = Field(64, ge=1, le=1000, description="alerts per POST to Alertmanager")
    external_labels: dict[str, str] = Field(default_factory=dict, description="added to every alert, e.g. host")

    @field_validator("external_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_label_names(v)

    @field_validator("receivers")
    @classmethod
    def _unique(cls, v: list[ReceiverConfig]) -> list[ReceiverConfig]:
        check_unique([r.label for r in v], "receiver")
        return v
