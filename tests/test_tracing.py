"""OpenTelemetry helpers: span structure, attributes, trace-context continuation, child env, setup.

Spans are recorded by the real SDK into its ``InMemorySpanExporter``; the provider is handed to
smith-fast with ``use_tracer_provider`` so the process-wide provider is never touched.
``setup_from_env`` changes that global, so it is exercised in child processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry import trace as otel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from smith_fast import tracing

from harness.server import ROOT

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, object]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_session_and_command_spans_form_a_tree(spans: InMemorySpanExporter) -> None:
    session = tracing.session_span("unix:/tmp/s.sock", 1)
    assert session.recording
    shell = session.command_span("shell_exec", "r1", {tracing.ATTR_COMMAND: "ls -l"})
    tool = tracing.command_span("tool_call", "r2", {tracing.ATTR_TOOL: "fs.read"}, session=session)
    tool.end()
    shell.end({tracing.ATTR_EXIT_CODE: 3, tracing.ATTR_BYTES_STDOUT: 120, tracing.ATTR_BYTES_STDERR: 0})
    shell.end({tracing.ATTR_EXIT_CODE: 99})  # a second end changes nothing
    session.end()
    got = by_name(spans)
    assert set(got) == {"smith.session", "smith.shell_exec", "smith.tool_call"}
    root, sh, tc = got["smith.session"], got["smith.shell_exec"], got["smith.tool_call"]
    assert root.parent is None and root.kind is SpanKind.SERVER  # type: ignore[attr-defined]
    assert dict(root.attributes) == {"smith.peer": "unix:/tmp/s.sock", "smith.protocol_version": 1}  # type: ignore[attr-defined]
    for child in (sh, tc):
        assert child.parent.span_id == root.context.span_id  # type: ignore[attr-defined]
        assert child.context.trace_id == root.context.trace_id  # type: ignore[attr-defined]
        assert child.kind is SpanKind.INTERNAL  # type: ignore[attr-defined]
    assert dict(sh.attributes) == {  # type: ignore[attr-defined]
        "smith.command": "shell_exec", "smith.request_id": "r1", "smith.shell.command": "ls -l",
        "smith.exit_code": 3, "smith.bytes.stdout": 120, "smith.bytes.stderr": 0,
    }  # fmt: skip
    assert dict(tc.attributes) == {"smith.command": "tool_call", "smith.request_id": "r2", "smith.tool": "fs.read"}  # type: ignore[attr-defined]


def test_hook_decisions_failures_and_exceptions(spans: InMemorySpanExporter) -> None:
    session = tracing.session_span("p", 0)
    hook = session.command_span("hook_load", "r1")
    hook.hook_decision("js", "block", "rm -rf is not allowed")
    hook.end()
    failed = session.command_span("tool_call", "r2")
    failed.fail("ERROR_CODE_EXECUTION_TIMEOUT", "timed out after 5 ms")
    failed.end()
    with pytest.raises(RuntimeError, match="boom"):
        with session.command_span("shell_exec", "r3"):
            raise RuntimeError("boom")
    session.end()
    got = by_name(spans)
    h = got["smith.hook_load"]
    assert h.attributes["smith.hook.decision"] == "block"  # type: ignore[attr-defined]
    (event,) = h.events  # type: ignore[attr-defined]
    assert event.name == "hook" and dict(event.attributes) == {
        "smith.hook.type": "js", "smith.hook.decision": "block", "smith.hook.reason": "rm -rf is not allowed",
    }  # fmt: skip
    f = got["smith.tool_call"]
    assert f.status.status_code is StatusCode.ERROR and f.status.description == "timed out after 5 ms"  # type: ignore[attr-defined]
    assert f.attributes["smith.error_code"] == "ERROR_CODE_EXECUTION_TIMEOUT"  # type: ignore[attr-defined]
    s = got["smith.shell_exec"]
    assert s.status.status_code is StatusCode.ERROR and "boom" in s.status.description  # type: ignore[attr-defined]
    assert [e.name for e in s.events] == ["exception"]  # type: ignore[attr-defined]


def test_a_traceparent_in_client_info_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    client_info = {"client": "x", "TraceParent": CALLER, "tracestate": "vendor=abc"}
    session = tracing.session_span("p", 1, client_info)
    command = session.command_span("shell_exec", "r1")
    command.end()
    session.end()
    got = by_name(spans)
    root = got["smith.session"]
    assert root.context.trace_id == CALLER_TRACE  # type: ignore[attr-defined]
    assert root.parent.span_id == CALLER_SPAN and root.parent.is_remote  # type: ignore[attr-defined]
    assert root.context.trace_state.get("vendor") == "abc"  # type: ignore[attr-defined]
    assert got["smith.shell_exec"].context.trace_id == CALLER_TRACE  # type: ignore[attr-defined]
    assert tracing.traceparent_from(client_info) == (CALLER, "vendor=abc")
    assert session.trace_id == f"{CALLER_TRACE:032x}"


def test_a_request_context_traceparent_wins_and_links_the_session(spans: InMemorySpanExporter) -> None:
    session = tracing.session_span("p", 1)
    command = session.command_span("plan", "r1", None, {"traceparent": CALLER, "goal": "g"})
    command.end()
    session.end()
    got = by_name(spans)
    plan, root = got["smith.plan"], got["smith.session"]
    assert plan.context.trace_id == CALLER_TRACE and plan.parent.span_id == CALLER_SPAN  # type: ignore[attr-defined]
    assert [link.context.span_id for link in plan.links] == [root.context.span_id]  # type: ignore[attr-defined]
    assert root.context.trace_id != CALLER_TRACE  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "bad",
    [
        "garbage",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
        {"nothing": "here"},
    ],
)
def test_an_invalid_traceparent_starts_a_new_trace(spans: InMemorySpanExporter, bad: object) -> None:
    tracing.session_span("p", 1, bad).end()  # type: ignore[arg-type]
    (root,) = spans.get_finished_spans()
    assert root.parent is None and root.context.trace_id not in (0, CALLER_TRACE)


def test_child_env_reaches_a_real_child_and_parses_back(spans: InMemorySpanExporter) -> None:
    session = tracing.session_span("p", 1, {"traceparent": CALLER, "tracestate": "k=v"})
    command = session.command_span("shell_exec", "r1")
    env = tracing.child_env(command)
    assert env == command.child_env() and set(env) == {"TRACEPARENT", "SMITH_TRACE_ID", "TRACESTATE"}
    printed = subprocess.run(
        [sys.executable, "-c", "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('TRACEPARENT', 'TRACESTATE', 'SMITH_TRACE_ID')}))"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    seen = json.loads(printed.stdout)
    ctx = TraceContextTextMapPropagator().extract({"traceparent": seen["TRACEPARENT"], "tracestate": seen["TRACESTATE"]})
    parent = otel.get_current_span(ctx).get_span_context()
    mine = command.span.get_span_context()
    assert (parent.trace_id, parent.span_id) == (mine.trace_id, mine.span_id) == (CALLER_TRACE, mine.span_id)
    assert parent.trace_state.get("k") == "v"
    assert seen["SMITH_TRACE_ID"] == f"{CALLER_TRACE:032x}"
    fields = tracing.log_fields(command)
    assert fields == {"trace_id": f"{CALLER_TRACE:032x}", "span_id": f"{mine.span_id:016x}"}
    assert tracing.log_fields(command.span) == fields and tracing.child_env(command.span) == env
    command.end()
    session.end()


@pytest.fixture
def api_only() -> Iterator[None]:
    tracing.use_tracer_provider(otel.NoOpTracerProvider())  # what the API gives without an SDK
    yield
    tracing.use_tracer_provider(None)


def test_without_an_sdk_the_callers_trace_still_flows_through(api_only: None) -> None:
    """No SDK: spans are not recorded, but a caller's context still reaches children and logs."""
    session = tracing.session_span("p", 1, CALLER)
    command = session.command_span("shell_exec", "r1")
    assert not command.recording
    assert command.child_env() == {"TRACEPARENT": CALLER, "SMITH_TRACE_ID": f"{CALLER_TRACE:032x}"}
    assert command.log_fields() == {"trace_id": f"{CALLER_TRACE:032x}", "span_id": f"{CALLER_SPAN:016x}"}
    fresh = tracing.session_span("p", 1)  # no caller, no SDK: no trace to hand on
    assert fresh.child_env() == {} and fresh.log_fields() == {} and fresh.traceparent is None
    command.end()
    session.end()


def test_noop_handle_records_nothing(spans: InMemorySpanExporter) -> None:
    noop = tracing.NOOP
    assert noop.command_span("shell_exec", "r1", {"a": 1}, CALLER) is noop
    assert tracing.command_span("tool_call", "r2", session=noop) is noop
    noop.set("a", 1)
    noop.set_attributes({"a": 1})
    noop.add_event("e")
    noop.hook_decision("js", "allow")
    noop.fail("ERROR_CODE_INTERNAL_ERROR")
    noop.end({"a": 1})
    assert noop.child_env() == {} and noop.log_fields() == {} and tracing.child_env(noop) == {}
    assert not noop.recording and noop.traceparent is None and noop.trace_id is None
    with pytest.raises(ValueError):
        with noop:
            raise ValueError("not swallowed")
    assert spans.get_finished_spans() == ()


async def test_spans_cross_awaits_and_tasks(spans: InMemorySpanExporter) -> None:
    session = tracing.session_span("p", 1)

    async def request(rid: str, delay: float) -> None:
        span = session.command_span("shell_exec", rid)
        await asyncio.sleep(delay)
        span.end({tracing.ATTR_EXIT_CODE: 0})

    await asyncio.gather(request("a", 0.02), request("b", 0.01))
    session.end()
    root = by_name(spans)["smith.session"]
    children = [s for s in spans.get_finished_spans() if s.name == "smith.shell_exec"]
    assert [s.attributes["smith.request_id"] for s in children] == ["b", "a"]
    assert all(s.parent.span_id == root.context.span_id for s in children)  # type: ignore[attr-defined]
    assert otel.get_current_span() is otel.INVALID_SPAN  # nothing leaked into the ambient context


_SETUP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from smith_fast import tracing
    from smith_fast.logs import configure
    configure("info")
    ok = tracing.setup_from_env()
    span = tracing.session_span("peer", 1)
    recording = span.recording
    span.command_span("tool_call", "r1", {"smith.tool": "fs.read"}).end()
    span.end()
    tracing.shutdown()
    print(json.dumps({"ok": ok, "configured": tracing.configured(), "recording": recording}))
    """
)


def run_setup(env: dict[str, str]) -> tuple[dict[str, object], str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", _SETUP_SCRIPT], env={**base, **env}, capture_output=True, text=True,
                            timeout=60, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # spans never go to stdout (the stdio protocol channel)
    return json.loads(lines[0]), result.stderr


def test_setup_from_env_console_exporter_writes_spans_to_stderr() -> None:
    out, err = run_setup({"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"})
    assert out == {"ok": True, "configured": True, "recording": True}
    assert '"name": "smith.session"' in err and '"name": "smith.tool_call"' in err
    assert '"service.name": "smith-fast"' in err and '"deployment.environment": "test"' in err
    out, err = run_setup({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "custom"})
    assert out["ok"] and '"service.name": "custom"' in err


@pytest.mark.parametrize(
    ("env", "warning"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, None),
        ({"OTEL_TRACES_EXPORTER": "no_such_exporter"}, "unknown or uninstalled trace exporter"),
    ],
)
def test_setup_from_env_stays_a_noop_unless_asked(env: dict[str, str], warning: str | None) -> None:
    out, err = run_setup(env)
    assert out == {"ok": False, "configured": False, "recording": False}
    assert '"name": "smith.session"' not in err
    if warning:
        assert warning in err
