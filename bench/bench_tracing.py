"""Tracing: what one command span costs, from not granted to exported by the SDK.

Run: ``.venv/bin/pytest bench/bench_tracing.py --benchmark-only -p no:cacheprovider``.

Each call starts and ends 1,000 command spans the way a session does (kind, request id, two
attributes at start, exit code and byte counts at end), under a session span:

* ``not granted``: the session holds ``tracing.NOOP``;
* ``api only``: granted, but no SDK set up (the OpenTelemetry API's no-op tracer), with a caller's
  traceparent so the spans carry a valid context;
* ``sdk simple``/``sdk batch``: the real SDK with a Simple or Batch span processor feeding an
  exporter that drops the spans (the cost of recording and processing, not of a network).

``child env + log fields`` is the per-command cost of handing the trace to a child and to logs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

from smith_fast import tracing

N = 1000
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Discard(SpanExporter):
    """Counts the spans it is handed, and drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@pytest.fixture(params=["not granted", "api only", "sdk simple", "sdk batch"])
def mode(request: pytest.FixtureRequest) -> Iterator[tuple[str, tracing.SpanHandle, Discard | None]]:
    exporter: Discard | None = None
    provider = None
    if request.param.startswith("sdk"):
        exporter = Discard()
        provider = TracerProvider()
        processor = SimpleSpanProcessor(exporter) if request.param == "sdk simple" else BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
    tracing.use_tracer_provider(provider)
    session = tracing.NOOP if request.param == "not granted" else tracing.session_span("unix:/tmp/bench.sock", 1, CALLER)
    yield request.param, session, exporter
    session.end()
    tracing.use_tracer_provider(None)
    if provider is not None:
        provider.shutdown()


def test_command_span(benchmark, mode: tuple[str, tracing.SpanHandle, Discard | None]) -> None:  # type: ignore[no-untyped-def]
    name, session, exporter = mode
    benchmark.group = f"tracing: command span start+end x {N}"
    benchmark.extra_info["spans"] = N

    def run() -> None:
        for i in range(N):
            span = session.command_span("shell_exec", "request-id", {tracing.ATTR_COMMAND: "ls -l", "smith.attempt": i})
            span.end({tracing.ATTR_EXIT_CODE: 0, tracing.ATTR_BYTES_STDOUT: 1234, tracing.ATTR_BYTES_STDERR: 0})

    benchmark(run)
    if exporter is not None and name == "sdk simple":
        assert exporter.spans >= N


def test_command_span_baseline(benchmark) -> None:  # type: ignore[no-untyped-def]
    """The same loop building the same attribute dicts, with no tracing call: what NOOP adds is the rest."""
    benchmark.group = f"tracing: command span start+end x {N}"

    def run() -> None:
        for i in range(N):
            start = {tracing.ATTR_COMMAND: "ls -l", "smith.attempt": i}
            end = {tracing.ATTR_EXIT_CODE: 0, tracing.ATTR_BYTES_STDOUT: 1234, tracing.ATTR_BYTES_STDERR: 0}
        del start, end

    benchmark(run)


def test_child_env_and_log_fields(benchmark, mode: tuple[str, tracing.SpanHandle, Discard | None]) -> None:  # type: ignore[no-untyped-def]
    name, session, _ = mode
    benchmark.group = f"tracing: child_env + log_fields x {N}"
    span = session.command_span("shell_exec", "request-id")

    def run() -> None:
        for _ in range(N):
            span.child_env()
            span.log_fields()

    benchmark(run)
    assert bool(span.child_env()) == (name != "not granted")
    span.end()
