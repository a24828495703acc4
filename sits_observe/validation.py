"""Validation errors as config messages: one ``source: path: message, got value`` line per problem, secrets never
echoed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from .errors import ConfigError

M = TypeVar("M", bound=BaseModel)

__all__ = ["ELSEWHERE", "elsewhere", "format_errors", "url_origin", "validate"]

# validation context of a config read on another machine (`slo rules` on a CI box): its listen host need not
# resolve here, nor its command exist
ELSEWHERE = {"this_host": False}


def elsewhere(info: Any) -> bool:
    """Whether a validator's ``info`` says the config is read on another machine than the one it runs on."""
    return bool(info.context) and info.context.get("this_host") is False


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not part.startswith("function-") and part not in ("function-after",):
            out += f".{part}" if out else part
    return out or "(top level)"


def _shown(value: Any) -> bool:
    """Whether a value may be echoed: not a section (given, or a default one) or a list of them (those may hold
    secrets)."""
    return not isinstance(value, (dict, BaseModel)) and not (isinstance(value, list) and not all(
        isinstance(v, (int, float)) for v in value))


def url_origin(url: str) -> str | None:
    """``scheme://host[:port]`` of a URL, for a config error: its path and query may be a credential (a Slack-style
    webhook's path is its token), as ``user:password@`` is; None when the host cannot be told apart from them (no
    ``//host``, an '@' past the host part: a password cut short by a '/' in it)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not even a URL's shape ("http://[bad")
        return None
    host, rest = parts.netloc.rpartition("@")[2], url.partition("//")[2].removeprefix(parts.netloc)
    if not host or "@" in rest:
        return None
    return f"{parts.scheme}://{host}" + ("/<hidden>" if rest else "")


# a strict section's refusals of what a lax one converts: say how to write it (configs that loaded before shards
# were strict gave "Input should be a valid integer, got 80000000000.0" and nothing more)
_STRICT = {"int_type": " (written as a plain integer: no quotes, no fraction or exponent, e.g. 80000000000)",
           "float_type": " (written as a number, without quotes)", "bool_type": " (written as true or false)"}


def format_errors(exc: ValidationError, source: str, origins: Mapping[str, str] | None = None) -> list[str]:
    """One line per problem: ``FILE: path: message, got value`` (secrets are never echoed); a top-level field in
    ``origins`` (field -> environment variable) names the variable instead of the file."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _loc(loc)
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        # a receiver's URL (Slack's path is its secret) also where the list itself was given as one; a command's
        # arguments, which may hold credentials (only argv[0] is ever named), also where given as one string
        hidden = ("token" in path or "secret" in path or path == "alerting.receivers"
                  or (path.startswith("scheduler.command.argv") and path != "scheduler.command.argv[0]")
                  or (path.startswith("alerting.") and path.endswith(".url")) or not _shown(value))
        if path == "scheduler.command.argv" and isinstance(value, str):
            msg += " (write it as a list: [program, argument, ...])"
        if isinstance(value, str) and (path.endswith(("url", "endpoint")) or "://" in value):  # also a URL
            value = url_origin(value)  # given where a list or section belongs too
            hidden = hidden or value is None
        got = "" if err["type"] == "missing" or hidden else f", got {value!r}"
        if err["type"] == "model_type":  # a scalar or a list where a section belongs
            msg, got = "must be a mapping of settings (key: value)", f", got {type(value).__name__}"
        if err["type"] == "extra_forbidden":
            msg, got = "unknown field (check the spelling against docs/config.md)", ""
        if err["type"] in _STRICT and isinstance(value, (str, float)):  # a strict section (scheduler shards)
            got += _STRICT[err["type"]]
        origin = (origins or {}).get(loc[0]) if loc else None
        lines.append(f"{origin or source}: {path}: {msg}{got}")
    return lines


def validate(model: type[M], data: Any, source: str, sep: str = "\n", origins: Mapping[str, str] | None = None,
             this_host: bool = True) -> M:
    """``model.model_validate(data)`` with every problem as ``source: path: message, got value``; ``this_host``
    False skips the checks of what only the host that runs the config has (see :data:`ELSEWHERE`)."""
    try:
        return model.model_validate(data, context=None if this_host else ELSEWHERE)
    except ValidationError as exc:
        raise ConfigError(sep.join(format_errors(exc, source, origins))) from None
