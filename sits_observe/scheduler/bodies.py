"""Scheduler API request bodies: the ack body's model, and validation naming each bad field and value (HTTP 400).

A value is echoed at most :data:`SHOWN_CHARS` characters long: a body may be up to 1 MiB, and an error that repeats
it whole fills the answer and the client's log."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails

from ..errors import ConfigError
from ..validation import format_errors

__all__ = ["AckBody", "SHOWN_CHARS", "clip", "parse_body", "shorten", "shown"]

SHOWN_CHARS = 80


class AckBody(BaseModel):
    """``POST /api/v1/placements/{id}/ack`` body (strict: ``"ok": "no"`` or ``1`` is a mistake, not a bool)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    step: str = Field(pattern=r"^(stage|launch|drain)$")
    ok: bool
    reason: str = Field("", max_length=500)


class _Shown(str):
    """A value's repr, cut short: echoed as it is (its repr is itself)."""

    def __repr__(self) -> str:
        return str(self)


def shorten(text: str) -> str:
    """``text`` cut to :data:`SHOWN_CHARS` characters and ``... (N characters)`` when longer."""
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"... ({len(text)} characters)"


def clip(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters and ``... (N characters)`` when longer; N counts a
    string's own characters (a 257-character one was said to have 259: its repr's quotes, after "at most 256")."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    return text[:SHOWN_CHARS] + f"... ({len(value) if isinstance(value, str) else len(text)} characters)"


def shown(value: Any) -> str:
    """``value`` as a validation error echoes it: its :func:`clip`-ped repr (pydantic and
    :func:`~sits_observe.validation.format_errors` show the repr of what they are given)."""
    return _Shown(clip(value))


def _echoed(value: Any) -> bool:
    """Whether an error echoes ``value``: a scalar or a list of numbers (a section or other list is not shown)."""
    if isinstance(value, list):
        return all(isinstance(v, (int, float)) for v in value)
    return isinstance(value, (str, int, float))


def _key(part: int | str) -> int | str:
    return part if isinstance(part, int) else shorten(part)


def _clipped(exc: ValidationError) -> ValidationError:
    """``exc`` with each value it echoes, and each field name (an unknown one can be as long), cut short."""
    errors = exc.errors(include_url=False)
    if all(len(repr(e["input"])) <= SHOWN_CHARS and all(_key(k) == k for k in e["loc"]) for e in errors):
        return exc
    return ValidationError.from_exception_data(exc.title, [InitErrorDetails(
        type=e["type"], loc=tuple(_key(k) for k in e["loc"]), ctx=e.get("ctx", {}),
        input=shown(e["input"]) if _echoed(e["input"]) else e["input"]) for e in errors])


def parse_body(model: type[BaseModel], body: Any, where: str) -> Any:
    """Validate an API body: :class:`ConfigError` (HTTP 400) naming each bad field and value (cut short)."""
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ConfigError("; ".join(format_errors(_clipped(exc), where))) from None
