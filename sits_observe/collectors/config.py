"""Config section ``servers:`` (inference servers to scrape) and the URL helpers shared with ``gpu.dcgm_url`` and
the alert receivers: the URL check, basic auth from a URL's ``user:password@`` and the URL without it."""

from __future__ import annotations

import base64
import re
from typing import Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import Field, field_validator

from ..section import Section

__all__ = ["ServerConfig", "basic_auth", "check_url", "redact", "redirect_target", "shown_url"]

_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def check_url(url: str, example: str = "http://127.0.0.1:8000/metrics") -> str:
    """Accept an absolute http(s) URL with a host; raise ValueError with the fix (and ``example``, a URL of the
    kind the field wants) otherwise."""
    parts = urlsplit(url)
    if _misplaced_at(url):
        raise ValueError("has '@' after the host part: percent-encode '/', '?', '#' and '@' in a user name or "
                         "password (%2F, %3F, %23, %40)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, e.g. {example}")
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("has a port that is not a number in 1-65535; fix the part after the host's ':'")
    if not url.isascii():
        raise ValueError("has characters outside ASCII; percent-encode them (e.g. %C3%A9 for é)")
    if _SPACE_OR_CONTROL.search(url):  # http.client refuses such a URL at every request
        raise ValueError("has a space or control character; percent-encode it (e.g. %20 for a space)")
    return url


def redact(url: str) -> str:
    """The URL without ``user:password@``, for messages (also one whose port does not parse)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _misplaced_at(url: str) -> bool:
    """A password cut short: "http://u:pa/ss@host/" ('/', '?' or '#' in it ends the host part early, and the
    rest of the password would be sent, and shown, as part of the path).  '@' further on ("?to=a@b", a Teams
    webhook's path) and a host:port before the '/' are fine."""
    rest = url.partition("//")[2]
    if "@" not in rest:
        return False
    head = rest.partition("@")[0]
    end = min((head.index(c) for c in "/?#" if c in head), default=-1)
    if end < 0 or ":" not in head[:end]:
        return False
    return not head[:end].rpartition(":")[2].isdigit()


def shown_url(url: str) -> str:
    """The URL for messages and logs: without ``user:password@`` and with any query hidden (either may carry a
    credential); one with '@' past its host part (a password not split off) shows only its scheme."""
    if _misplaced_at(url):
        return url.partition("//")[0] + "//<hidden>"
    parts = urlsplit(redact(url))
    return urlunsplit(parts._replace(query="<hidden>" if parts.query else "", fragment=""))


def redirect_target(location: str | None) -> str:
    """Where a redirect's ``Location`` points, for messages: without ``user:password@``, query or fragment."""
    parts = urlsplit(redact(location or "?"))._replace(query="", fragment="")
    return urlunsplit(parts)[:200]


def basic_auth(url: str) -> str | None:
    """The ``Authorization`` header value for a ``user:password@`` in ``url``; None without one."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return f"Basic {base64.b64encode(token).decode()}"


class ServerConfig(Section):
    """One inference server whose /metrics page is read every tick."""

    kind: Literal["vllm", "triton"]
    url: str = Field(description="the server's Prometheus page, e.g. http://127.0.0.1:8000/metrics")
    workload: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_.-]{0,62}$",
                          description="label `workload` for everything this server reports")
    model: str | None = Field(None, description="only series whose model label (vLLM model_name, Triton model) is this")
    timeout: float = Field(2.0, gt=0, le=30, description="seconds to wait for the page")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v)
