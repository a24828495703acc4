"""What a receiver's answer says, and what of the receiver it may show: the secrets to hide in a reason, a
failure's description without its text (which could quote the URL), a ``Retry-After`` in seconds."""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

__all__ = ["echoes", "describe", "retry_after"]


def echoes(url: str, path: str, secret: str) -> list[str]:
    """What of a receiver's URL and secret its answer may echo, longest first: the URL, its parts and the
    password, each also without a leading slash, with JSON's escaped slashes (``hooks\\/<token>``) and
    percent-encoded, and every piece of 8 or more characters of its path and query (a token alone: "The route
    hooks/<token> could not be found")."""
    parts = urlsplit(url)
    whole = {url, parts.netloc, parts.path, parts.query, path, secret, parts.password or ""}
    pieces = {p for x in (parts.path, parts.query) for p in re.split(r"[/&=;]", x) if len(p) >= 8}
    out = {v for x in whole | pieces for v in (x, x.lstrip("/"), x.replace("/", "\\/"), quote(x, safe=""), quote(x))}
    return sorted((v for v in out if len(v) > 1), key=len, reverse=True)


def describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__


def retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
