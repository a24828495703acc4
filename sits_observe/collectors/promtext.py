"""Fetch and read a Prometheus text page (dcgm-exporter, vLLM, Triton).

Label sets are parsed by prometheus_client's parser, once per distinct set: exporters repeat the same
label set on every metric of a GPU or model, so a page is split into (name, label set, value) with string
operations and the parsed labels come from a bounded cache.  The full parser costs about 100 ms per
64-GPU dcgm-exporter page on a 2-core VM; this reads it in a few ms (``sits-observe bench collectors``).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

from ..errors import CollectorError

__all__ = ["Series", "PageParser", "fetch_page", "redact"]

Series = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> [(labels, value)]
_CACHE_MAX = 8192


def redact(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))


def fetch_page(url: str, timeout: float) -> str:
    """GET ``url``; CollectorError naming the (redacted) URL and the reason."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise CollectorError(f"{redact(url)}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CollectorError(f"{redact(url)}: cannot fetch the metrics page: {reason}") from exc


class PageParser:
    """Reads pages of one exporter; keeps the parsed label sets between pages."""

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, str]] = {}

    def _parse_labels(self, block: str) -> dict[str, str]:
        labels = self._labels.get(block)
        if labels is None:
            family = next(text_string_to_metric_families("m{" + block + "} 0\n"))
            labels = family.samples[0].labels
            if len(self._labels) >= _CACHE_MAX:
                self._labels.clear()
            self._labels[block] = labels
        return labels

    def parse(self, text: str, wanted: Callable[[str], bool], source: str = "page") -> Series:
        """Samples whose name passes ``wanted``; CollectorError naming the line when one is malformed."""
        out: Series = {}
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line or line[0] == "#":
                continue
            brace = line.find("{")
            name = line[:brace] if brace >= 0 else line.split(None, 1)[0]
            if not wanted(name):
                continue
            try:
                if brace >= 0:
                    end = line.rindex("}")
                    labels, rest = self._parse_labels(line[brace + 1:end]), line[end + 1:]
                else:
                    labels, rest = {}, line[len(name):]
                value = float(rest.split()[0])
            except (ValueError, IndexError, StopIteration) as exc:
                raise CollectorError(f"{source}: line {lineno}: not Prometheus text format: {line[:120]!r}") from exc
            out.setdefault(name, []).append((labels, value))
        return out
