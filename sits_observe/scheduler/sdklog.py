"""The OpenTelemetry SDK exporters' own log lines, held back: while a collector is down the OTLP/HTTP exporter logs a
warning at each of its retries and an error at each failed export (about 30 lines a minute, for as long as the
outage lasts), the gRPC one the same. :class:`~.span_outbox.SpanSender` logs one line per outage instead and names
the cause: the OTLP/HTTP session's last error (``Connection refused``), else the first line the exporter would have
logged in the failed export.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["SDK_LOGGERS", "ExporterLines", "recording_session", "cause"]

SDK_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
               "opentelemetry.exporter.otlp.proto.grpc.exporter")


class ExporterLines(logging.Filter):
    """Keeps each thread's first SDK exporter warning or error since :meth:`reset` (an export runs on the caller's
    thread) and drops the record.  A debug or info line passes (logged only when asked for): it is neither the
    noise held back nor a cause (the gRPC exporter's ``Reinitializing gRPC channel ... due to UNAVAILABLE error``
    comes before the line that says why)."""

    def __init__(self) -> None:
        super().__init__()
        self._first = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if getattr(self._first, "line", None) is None:
            self._first.line = " ".join(record.getMessage().split())  # one line: a traceback's newlines go
        return False

    def reset(self) -> None:
        self._first.line = None

    def first(self) -> str | None:
        """The first line held back on this thread since :meth:`reset`, cut to 300 characters."""
        line: str | None = getattr(self._first, "line", None)
        return None if line is None else line[:300]

    @classmethod
    def installed(cls) -> ExporterLines:
        """The one filter on the SDK exporters' loggers (added at the first call), first: the gRPC exporter's own
        ``DuplicateFilter`` drops a line the same as the one before it within 20 s, so the cause of a new outage would
        go unseen after an outage just ended."""
        logger = logging.getLogger(SDK_LOGGERS[0])
        mine = next((f for f in logger.filters if isinstance(f, cls)), None) or cls()
        for name in SDK_LOGGERS:
            if mine not in logging.getLogger(name).filters:
                logging.getLogger(name).filters.insert(0, mine)
        return mine


def cause(exc: BaseException) -> str:
    """The innermost exception of ``exc``'s chain in a few words (``Connection refused``, ``ReadTimeoutError: ...``)."""
    while (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]


def recording_session() -> Any:
    """A ``requests.Session`` whose ``error`` is the cause of its last failed request (None after a request that got
    an answer): the SDK's exporter says only that its retries ran out."""
    import requests

    class Recording(requests.Session):
        error: str | None = None

        def send(self, request: Any, **kwargs: Any) -> Any:
            try:
                answer = super().send(request, **kwargs)
            except requests.RequestException as exc:
                self.error = cause(exc)
                raise
            self.error = None
            return answer

    return Recording()
