"""Fetch and read a Prometheus text page (dcgm-exporter, vLLM, Triton).

Label sets are parsed by prometheus_client's parser, once per distinct set: exporters repeat the same
label set on every metric of a GPU or model, so a page is split into (name, label set, value) by one
regular expression and the parsed labels come from a bounded cache.  prometheus_client's full parser
takes about 120 ms per 64-GPU dcgm-exporter page on a 2-core VM; this reads it in about 4 ms
(``sits-observe bench collectors``).  A line that is neither a comment nor a sample is an error.
"""

from __future__ import annotations

import http.client
import io
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from ..errors import CollectorError
from .config import basic_auth, redact, shown_url
from .resolve import LookupTimedOut, resolve

__all__ = ["Series", "PageParser", "fetch_page", "too_slow", "MAX_PAGE_BYTES", "MAX_SAMPLES"]

Series = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> [(labels, value)]
_CACHE_MAX = 8192
_CACHED_BLOCK = 1024  # longer label sets are parsed each time, not kept: the cache stays under ~10 MiB
MAX_LABEL_BLOCK = 4096  # a real label set is a few hundred bytes; a longer one is refused (its parse is slow)
MAX_PAGE_BYTES = 32 << 20  # a 64-GPU dcgm-exporter page is about 0.6 MiB
# samples of the wanted metrics one page may give (a 64-GPU dcgm-exporter page gives about 2000, a vLLM server a
# few hundred): past it a label of unbounded values is feeding the page, and reading it would cost the tick
# seconds and each source's counters hundreds of MiB
MAX_SAMPLES = 20_000
_CHUNK = 1 << 16
# Every line: blank, a comment, or a sample: name, label block, value, an optional timestamp (integer
# milliseconds, or OpenMetrics' float seconds) and an optional exemplar (" # {labels} value [timestamp]",
# ignored).  The label block runs to the line's last "}" (fast); where it holds a "}" itself (an exemplar's
# labels, or a "}" in a quoted value), the line is read again with _SAMPLE, whose block ends at the first
# "}" outside a quoted value.
_TAIL = r'[ \t]+(\S+)(?:[ \t]+-?[0-9.]+(?:[eE][+-]?[0-9]+)?)?(?:[ \t]+#[ \t].*)?[ \t\r]*$'
_LINE = re.compile(r"^(?:[ \t]*(?:#.*)?[ \t\r]*$|[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?" + _TAIL + ")", re.M)
_SAMPLE = re.compile(r'[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^"}]*(?:"[^"\\]*(?:\\.[^"\\]*)*"[^"}]*)*)\})?' + _TAIL,
                     re.M)


def fetch_page(url: str, timeout: float) -> str:
    """GET ``url`` within ``timeout`` seconds in all; CollectorError naming the URL (shown) and the reason.

    ``user:password@`` in the URL goes as HTTP basic auth (urllib would read it as part of the host), and
    not on to where a redirect points; messages show the URL without it and without its query.  A redirect
    is followed to http(s) only, its own body not read.  Every wait (looking the host name up, connecting to each of its
    addresses in turn, the TLS handshake, sending, each read of the status line, headers and body, and the
    same again after a redirect) is given what is left of the one timeout, so neither a server trickling
    bytes nor a DNS resolver that does not answer can hold the tick (see :mod:`.resolve`); at most
    :data:`MAX_PAGE_BYTES` of the body is read.
    """
    deadline = _Deadline(timeout)
    auth = basic_auth(url)
    shown = shown_url(url)
    req = urllib.request.Request(redact(url), headers={"Accept": "text/plain;version=0.0.4"})
    if auth is not None:
        req.add_unredirected_header("Authorization", auth)
    opener = urllib.request.OpenerDirector()  # http(s) only: no ftp:// or file:// a redirect could point to
    for handler in (_Handler(deadline), _Redirects(), urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return _read_body(resp, shown).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise CollectorError(f"{shown}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        # the reason, never a ValueError's text: http.client quotes the URL in it
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else (
            exc if isinstance(exc, OSError) else type(exc).__name__)
        if isinstance(reason, TimeoutError):  # every socket timeout is what was left of the deadline
            raise too_slow(shown, timeout) from exc
        if isinstance(reason, LookupTimedOut):
            raise CollectorError(f"{shown}: the host name {reason.host!r} did not resolve within the {timeout:g} s "
                                 "timeout (is the DNS resolver answering?)") from exc
        raise CollectorError(f"{shown}: cannot fetch the metrics page: {reason}") from exc


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect to http(s) only, and without reading the redirect's own body (urllib reads all of it,
    however large, before following)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise urllib.error.HTTPError(req.full_url, code, f"redirect to {shown_url(newurl)}, not http(s)",
                                         headers, None)
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any) -> Any:
        fp.close()  # urllib's own would read it to its end first
        return super().http_error_302(req, _Unread(), code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Unread(io.BytesIO):
    """A redirect's body, closed unread."""


def _read_body(resp: http.client.HTTPResponse, url: str) -> bytearray:
    body = bytearray()
    while not resp.isclosed():
        chunk = resp.read1(_CHUNK)  # a TimeoutError when the deadline passes: fetch_page says so
        if not chunk:
            break
        body += chunk
        if len(body) > MAX_PAGE_BYTES:
            raise CollectorError(f"{url}: the metrics page is larger than {MAX_PAGE_BYTES >> 20} MiB; "
                                 "not read (is this a Prometheus /metrics URL?)")
    return body


class _Deadline:
    """When one request must be over; :meth:`left` is the timeout for the next wait on the server."""

    def __init__(self, timeout: float) -> None:
        self.end = time.monotonic() + timeout

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class _Reader(io.RawIOBase):
    """A response's socket file whose every read is given what is left of the deadline as its timeout."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._raw, self._sock, self._deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int | None:
        self._sock.settimeout(self._deadline.left())
        return self._raw.readinto(buf)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()  # lets the socket go once the connection has closed it too
        super().close()


class _Connection(http.client.HTTPConnection):
    """An HTTP connection bounded by one deadline: the host name lookup, connecting, sending and every read of
    the response."""

    deadline: _Deadline

    def connect(self) -> None:
        self._create_connection = self._open  # http.client's hook; socket.create_connection's lookup has no timeout
        super().connect()
        self.sock.settimeout(self.deadline.left())  # sending; and ssl gives a TLS handshake this in all

    def _open(self, address: tuple[str, int], _timeout: float | None,
              source_address: tuple[str, int] | None) -> socket.socket:
        """socket.create_connection, with the lookup and each address's connect given what is left of the deadline.

        Only the socket goes to the looked-up address: HTTPSConnection checks the certificate against, and sends
        as SNI, the host name itself."""
        host, port = address
        error = OSError(f"no address to connect to for {host!r}")
        for family, kind, proto, _, addr in resolve(host, port, self.deadline.left()):
            left = self.deadline.left()  # a TimeoutError once the deadline has passed: no next address then
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(left)
                if source_address:
                    sock.bind(source_address)
                sock.connect(addr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error

    def response_class(self, sock: socket.socket, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
        # http.client makes each response (a proxy's CONNECT answer too) by calling this
        resp = http.client.HTTPResponse(sock, *args, **kwargs)
        resp.fp = io.BufferedReader(_Reader(resp.fp.detach(), sock, self.deadline))
        return resp


class _HTTPSConnection(http.client.HTTPSConnection, _Connection):
    """_Connection sits between HTTPSConnection and HTTPConnection in the MRO: HTTPSConnection.connect
    connects through _Connection.connect, then does the TLS handshake in what is left."""


class _Handler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """Opens http and https URLs (the first and any redirected request) with connections sharing a deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection(_Connection), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection(_HTTPSConnection), req)

    def _connection(self, cls: type[_Connection]) -> Callable[..., _Connection]:
        def connection(host: str, **kwargs: Any) -> _Connection:
            conn = cls(host, **kwargs)
            conn.deadline = self._deadline
            return conn
        return connection


def too_slow(url: str, timeout: float) -> CollectorError:
    """The error of a page that did not arrive within ``timeout`` seconds (also :mod:`.pagefetch`'s)."""
    return CollectorError(f"{url}: the metrics page did not arrive within the {timeout:g} s timeout")


class PageParser:
    """Reads pages of one exporter; keeps the parsed label sets between pages."""

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, str]] = {}

    def _parse_labels(self, block: str) -> dict[str, str]:
        if len(block) > MAX_LABEL_BLOCK:
            raise _TooLong(f"a label set of {len(block)} bytes; at most {MAX_LABEL_BLOCK}")
        labels: dict[str, str] = next(text_string_to_metric_families("m{" + block + "} 0\n")).samples[0].labels
        if len(block) <= _CACHED_BLOCK:
            if len(self._labels) >= _CACHE_MAX:
                self._labels.clear()
            self._labels[block] = labels
        return labels

    def parse(self, text: str, wanted: Callable[[str], bool], source: str = "page") -> Series:
        """Samples whose name passes ``wanted``; CollectorError naming the line when one is malformed."""
        out: Series = {}
        cache = self._labels
        kept = 0
        expect = 0  # where the next line starts; a match elsewhere means a line matched nothing
        for m in _LINE.finditer(text):
            if m.start() != expect:
                raise _malformed(text, expect, source)
            expect = m.end() + 1
            name, block, value = m.groups()
            if name is None or not wanted(name):
                continue
            if block and "}" in block:  # the block ran on into an exemplar (or a value holds a "}")
                exact = _SAMPLE.match(text, m.start(), m.end())
                if exact is None:
                    raise _malformed(text, m.start(), source)
                name, block, value = exact.groups()
            try:
                labels = cache.get(block) if block else {}
                if labels is None:
                    labels = self._parse_labels(block)
                if "_" in value:  # Python's float() takes 1_000; the text format, and Prometheus, do not
                    raise ValueError(f"{value!r} is not a number")
                out.setdefault(name, []).append((labels, float(value)))
            except (ValueError, StopIteration) as exc:
                raise _malformed(text, m.start(), source, exc) from exc
            kept += 1
            if kept > MAX_SAMPLES:
                raise CollectorError(f"{source}: more than {MAX_SAMPLES} samples of the metrics read; page refused "
                                     f"(a label with unbounded values? the last was {name})")
        if expect < len(text):
            raise _malformed(text, expect, source)
        return out


class _TooLong(ValueError):
    """A label block past :data:`MAX_LABEL_BLOCK`."""


def _malformed(text: str, pos: int, source: str, why: Exception | None = None) -> CollectorError:
    end = text.find("\n", pos)
    line = text[pos:] if end < 0 else text[pos:end]
    what = str(why) if isinstance(why, _TooLong) else "not Prometheus text format"
    return CollectorError(f"{source}: line {text.count(chr(10), 0, pos) + 1}: {what}: {line[:120]!r}")
