"""What a receiver's answer says, and what of the receiver it may show: the secrets to hide in a reason, a
failure's description without its text (which could quote the URL), a ``Retry-After`` in seconds."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote, urlsplit

__all__ = ["echoes", "describe", "refusal_may_lift", "retry_after"]


def echoes(url: str, path: str, secret: str, auth: str | None = None) -> list[str]:
    """What of a receiver's URL and secret its answer may echo, longest first: the URL, its parts and the
    password (also decoded), each also without a leading slash, with JSON's escaped slashes (``hooks\\/<token>``)
    and percent-encoded, every piece of 8 or more characters of its path and query (a token alone: "The route
    hooks/<token> could not be found"), and the credentials of the ``auth`` header (``Basic <base64>``), which
    a page that quotes the request's headers shows."""
    parts = urlsplit(url)
    password = parts.password or ""
    whole = {url, parts.netloc, parts.path, parts.query, path, secret, password, unquote(password),
             *(auth.split()[-1:] if auth else ())}
    pieces = {p for x in (parts.path, parts.query) for p in re.split(r"[/&=;]", x) if len(p) >= 8}
    out = {v for x in whole | pieces for v in (x, x.lstrip("/"), x.replace("/", "\\/"), quote(x, safe=""), quote(x))}
    return sorted((v for v in out if len(v) > 1), key=len, reverse=True)


def describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__


# refusals that a fix on the receiver's side, not a new alert, can lift: credentials, a proxy's path or method
LIFTABLE = (401, 403, 404, 405, 407, 421)


def refusal_may_lift(row: tuple[str] | None) -> bool:
    """Whether the newest refusal of an alert (its ``failed`` row's reason, ``HTTP <status> ...`` as the sender
    writes it; None: no row) is one a fix on the receiver's side can lift (:data:`LIFTABLE`)."""
    m = re.match(r"HTTP (\d{3})\b", row[0]) if row else None
    return bool(m) and int(m.group(1)) in LIFTABLE


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait by a ``Retry-After`` header: delay-seconds or an HTTP date (RFC 9110 allows both; a date
    is taken against the wall clock ``now``, default the current time); None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT: a zone-less one ("-0000") is taken as such
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) or seconds > 0 else None
