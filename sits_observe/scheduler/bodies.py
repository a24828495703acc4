"""Scheduler API request bodies: the ack body's model, and validation naming each bad field and value (HTTP 400)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..config import validate
from ..errors import ConfigError

__all__ = ["AckBody", "parse_body"]


class AckBody(BaseModel):
    """``POST /api/v1/placements/{id}/ack`` body."""

    model_config = ConfigDict(extra="forbid")
    step: str = Field(pattern=r"^(stage|launch|drain)$")
    ok: bool
    reason: str = Field("", max_length=500)


def parse_body(model: type[BaseModel], body: Any, where: str) -> Any:
    """Validate an API body: :class:`ConfigError` (HTTP 400) naming each bad field and value."""
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: body must be a JSON object, got {type(body).__name__}")
    return validate(model, body, where, sep="; ")
