"""An OTLP/HTTP trace endpoint for the scheduler tests: it decodes the real protobuf the exporter sends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


class Receiver:
    """An OTLP/HTTP trace endpoint on a free loopback port keeping every decoded request it accepts.

    ``refuse(span)`` true for any span of a request answers it 400 Bad Request, as a collector does for a
    value it cannot take; ``deny`` (a status code) answers every request so, as one without the right token
    does (such requests are counted in ``refused``, not kept); ``redirect`` (a URL) answers every request
    308 to it, as an ingress moving http to https does.  ``reject(span)`` true takes the request, keeping the
    other spans, and answers 200 with their count in ``partial_success``."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.refused = 0
        self.refuse: Callable[[Any], bool] = lambda span: False
        self.reject: Callable[[Any], bool] = lambda span: False
        self.deny: int | None = None
        self.redirect: str | None = None
        self.got = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                spans = [span for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans]
                if outer.redirect or outer.deny or any(outer.refuse(span) for span in spans):
                    outer.refused += 1
                    self.send_response(308 if outer.redirect else outer.deny or 400)
                    if outer.redirect:
                        self.send_header("Location", outer.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = ExportTraceServiceResponse()
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        kept = [span for span in ss.spans if not outer.reject(span)]
                        answer.partial_success.rejected_spans += len(ss.spans) - len(kept)
                        del ss.spans[:]
                        ss.spans.extend(kept)
                if answer.partial_success.rejected_spans:
                    answer.partial_success.error_message = "span attribute value too long"
                outer.requests.append(req)
                outer.got.set()
                out = answer.SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                res = {a.key: value(a.value) for a in rs.resource.attributes}
                out += [(res, span) for ss in rs.scope_spans for span in ss.spans]
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind)


def attributes(span: Any) -> dict[str, Any]:
    """A decoded span's (or event's, or link's) attributes as plain values."""
    return {a.key: value(a.value) for a in span.attributes}
