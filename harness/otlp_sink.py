"""A minimal OTLP/HTTP trace receiver: what an OpenTelemetry collector does with ``POST /v1/traces``.

It decodes each ``ExportTraceServiceRequest`` with the official protobuf messages
(``opentelemetry-proto``), keeps the spans with their resource attributes, and answers 200 with an
empty ``ExportTraceServiceResponse``, as a collector does. Used by ``tests/test_tracing_export.py``
and ``bench/bench_tracing.py``.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    attributes: dict[str, Any]
    resource: dict[str, Any]


class OtlpSink:
    """``with OtlpSink() as sink:`` serves on ``sink.endpoint`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.span_count = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                sink._receive(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # stderr stays for the test's own output

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _receive(self, request: ExportTraceServiceRequest) -> None:
        received = []
        count = 0
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                count += len(ss.spans)
                if not self.keep:
                    continue
                for s in ss.spans:
                    received.append(ReceivedSpan(
                        s.name, int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"),
                        int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else None,
                        {a.key: _value(a.value) for a in s.attributes}, resource,
                    ))  # fmt: skip
        with self._lock:
            self.requests += 1
            self.span_count += count
            self.spans += received

    def env(self) -> dict[str, str]:
        """The ``OTEL_*`` variables that make a ``smith-fast serve`` export here (50 ms batches)."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
