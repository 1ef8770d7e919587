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

**Tool-call round trips** (``tracing: fs.read round trip``): sequential v1 ``fs.read`` calls through
a real ``smith-fast serve``, p50 and the server's CPU per call (all its threads, the exporter's
included), with tracing

* ``off``: not granted by the session, the service without an SDK;
* ``off, SDK set up``: not granted, the service exporting over OTLP (what other sessions cost);
* ``granted, no SDK``: granted, the service without an SDK (the API's no-op tracer);
* ``granted, OTLP``: granted, the service exporting every span over OTLP/HTTP in batches to a
  local receiver (``harness/otlp_sink.py``, which decodes every request as a collector would).

The summary gives each against ``off``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

from smith_fast import tracing
from smith_fast.pb import smith_pb2 as pb

from ._summary import print_summary
from .report.drivers import Session, cpu_seconds_of, round_trips, tool_call_request_ids
from .report.stats import percentile

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


# ---- end to end: tool-call round trips through a real service ------------------------------------

RT_CALLS = 2000
RT_MODES = {  # mode: (server exports over OTLP, session grants tracing)
    "off": (False, False),
    "off, SDK set up": (True, False),
    "granted, no SDK": (False, True),
    "granted, OTLP": (True, True),
}
_round_trips: dict[str, tuple[float, float]] = {}  # mode -> (p50 µs, server CPU µs per call)


@pytest.fixture(scope="module")
def rt_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool | str, Any]]:
    from harness.otlp_sink import OtlpSink
    from harness.server import ServerProcess

    plain_dir, otlp_dir = tmp_path_factory.mktemp("rt-plain"), tmp_path_factory.mktemp("rt-otlp")
    for root in (plain_dir, otlp_dir):
        (root / "small.txt").write_text("hello, smith-fast\n" * 4)
    with OtlpSink(keep=False) as sink:
        plain = ServerProcess(plain_dir).start()
        otlp = ServerProcess(otlp_dir, env=sink.env()).start()
        try:
            yield {False: plain, True: otlp, "sink": sink}
        finally:
            plain.stop()
            otlp.stop()


@pytest.fixture(scope="module", autouse=True)
def rt_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _round_trip_lines())


def _round_trip_lines() -> Iterator[str]:
    if "off" not in _round_trips:
        return
    base_p50, base_cpu = _round_trips["off"]
    yield ""
    yield f"tracing, fs.read round trip ({RT_CALLS} sequential calls), against 'off':"
    for mode, (p50, cpu) in _round_trips.items():
        yield f"  {mode:18} p50 {p50:7.1f} µs ({p50 / base_p50:5.2f}x)   server CPU {cpu:7.1f} µs/call ({cpu / base_cpu:5.2f}x)"


@pytest.mark.parametrize("rt_mode", list(RT_MODES))
def test_tool_call_round_trip(benchmark: Any, rt_servers: dict[Any, Any], rt_mode: str) -> None:
    exported, granted = RT_MODES[rt_mode]
    server = rt_servers[exported]
    caps = (pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_TRACING) if granted else (pb.CAPABILITY_SHELL_EXEC,)
    benchmark.group = f"tracing: fs.read round trip x {RT_CALLS}"
    sink = rt_servers["sink"]
    spans_before = sink.span_count
    with Session(server.sock_path, "v1", capabilities=caps) as session:
        rid = tool_call_request_ids(1)[0]
        unit = session.wire.tool_call(rid, "fs.read", b'{"path":"small.txt"}')
        round_trips(session, unit, rid, 200)  # warm-up
        times: list[float] = []
        calls = 0
        cpu = cpu_seconds_of(server.pid)

        def run() -> None:
            nonlocal calls
            times.extend(round_trips(session, unit, rid, RT_CALLS))
            calls += RT_CALLS

        benchmark.pedantic(run, rounds=3, iterations=1)
        cpu_us = (cpu_seconds_of(server.pid) - cpu) / calls * 1e6
    times.sort()
    p50 = percentile(times, 0.50) * 1e6
    benchmark.extra_info.update({"p50_us": round(p50, 1), "server_cpu_us_per_call": round(cpu_us, 1)})
    _round_trips[rt_mode] = (p50, cpu_us)
    if exported and granted:  # every call's span did reach the receiver
        end = time.monotonic() + 10
        while sink.span_count < spans_before + calls and time.monotonic() < end:
            time.sleep(0.05)
        assert sink.span_count >= spans_before + calls, (sink.span_count, spans_before + calls)
