"""Fetch and read a Prometheus text page (dcgm-exporter, vLLM, Triton).

Label sets are parsed by prometheus_client's parser, once per distinct set: exporters repeat the same
label set on every metric of a GPU or model, so a page is split into (name, label set, value) by one
regular expression and the parsed labels come from a bounded cache.  prometheus_client's full parser
takes about 120 ms per 64-GPU dcgm-exporter page on a 2-core VM; this reads it in about 4 ms
(``sits-observe bench collectors``).  A line that is neither a comment nor a sample is an error.
"""

from __future__ import annotations

import http.client
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from ..errors import CollectorError
from .config import basic_auth, redact

__all__ = ["Series", "PageParser", "fetch_page", "redact", "MAX_PAGE_BYTES"]

Series = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> [(labels, value)]
_CACHE_MAX = 8192
MAX_PAGE_BYTES = 32 << 20  # a 64-GPU dcgm-exporter page is about 0.6 MiB
_CHUNK = 1 << 16
# Every line: blank, a comment, or a sample (name, label block up to the line's last "}", value, and an
# optional timestamp).
_LINE = re.compile(r"^(?:[ \t]*(?:#.*)?|[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?)[ \t\r]*$",
                   re.M)


def fetch_page(url: str, timeout: float) -> str:
    """GET ``url`` within ``timeout`` seconds in all; CollectorError naming the (redacted) URL and the reason.

    ``user:password@`` in the URL goes as HTTP basic auth (urllib would read it as part of the host), and
    not on to where a redirect points.  The body is read in chunks, each read given what is left of the
    timeout (a server trickling bytes cannot hold the tick), and at most :data:`MAX_PAGE_BYTES` of it.
    """
    deadline = time.monotonic() + timeout
    auth = basic_auth(url)
    url = redact(url)
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    if auth is not None:
        req.add_unredirected_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if not isinstance(resp, http.client.HTTPResponse):  # urllib follows a redirect to ftp:// too
                raise CollectorError(f"{url}: redirected to a URL that is not http(s): {redact(resp.geturl())}")
            return _read_body(resp, deadline, url, timeout).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise CollectorError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        # the reason, never a ValueError's text: http.client quotes the URL in it
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else (
            exc if isinstance(exc, OSError) else type(exc).__name__)
        raise CollectorError(f"{url}: cannot fetch the metrics page: {reason}") from exc


def _read_body(resp: http.client.HTTPResponse, deadline: float, url: str, timeout: float) -> bytearray:
    sock = resp.fp.raw._sock  # noqa: SLF001 (http.client offers no public handle on the response's socket)
    body = bytearray()
    while not resp.isclosed():
        left = deadline - time.monotonic()
        if left <= 0:
            raise _too_slow(url, timeout)
        sock.settimeout(left)
        try:
            chunk = resp.read1(_CHUNK)
        except TimeoutError as exc:
            raise _too_slow(url, timeout) from exc
        if not chunk:
            break
        body += chunk
        if len(body) > MAX_PAGE_BYTES:
            raise CollectorError(f"{url}: the metrics page is larger than {MAX_PAGE_BYTES >> 20} MiB; "
                                 "not read (is this a Prometheus /metrics URL?)")
    return body


def _too_slow(url: str, timeout: float) -> CollectorError:
    return CollectorError(f"{url}: the metrics page did not arrive within the {timeout:g} s timeout")


class PageParser:
    """Reads pages of one exporter; keeps the parsed label sets between pages."""

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, str]] = {}

    def _parse_labels(self, block: str) -> dict[str, str]:
        family = next(text_string_to_metric_families("m{" + block + "} 0\n"))
        if len(self._labels) >= _CACHE_MAX:
            self._labels.clear()
        labels = self._labels[block] = family.samples[0].labels
        return labels

    def parse(self, text: str, wanted: Callable[[str], bool], source: str = "page") -> Series:
        """Samples whose name passes ``wanted``; CollectorError naming the line when one is malformed."""
        out: Series = {}
        cache = self._labels
        expect = 0  # where the next line starts; a match elsewhere means a line matched nothing
        for m in _LINE.finditer(text):
            if m.start() != expect:
                raise _malformed(text, expect, source)
            expect = m.end() + 1
            name, block, value = m.groups()
            if name is None or not wanted(name):
                continue
            try:
                labels = cache.get(block) if block else {}
                if labels is None:
                    labels = self._parse_labels(block)
                out.setdefault(name, []).append((labels, float(value)))
            except (ValueError, StopIteration) as exc:
                raise _malformed(text, m.start(), source) from exc
        if expect < len(text):
            raise _malformed(text, expect, source)
        return out


def _malformed(text: str, pos: int, source: str) -> CollectorError:
    end = text.find("\n", pos)
    line = text[pos:] if end < 0 else text[pos:end]
    return CollectorError(f"{source}: line {text.count(chr(10), 0, pos) + 1}: not Prometheus text format: {line[:120]!r}")
