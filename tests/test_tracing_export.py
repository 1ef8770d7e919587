"""Tracing end to end: a real ``smith-fast serve`` exports its spans over OTLP/HTTP to a receiver.

The service is configured only through the standard ``OTEL_*`` variables; the receiver
(``harness/otlp_sink.py``) decodes what arrives with the official OTLP protobuf messages. A v1 peer
grants ``CAPABILITY_TRACING`` and passes its own ``traceparent``: every span must continue that
trace, the command spans must hang under the session span with their attributes, and the child
process must see the trace in its environment.
"""

from __future__ import annotations

import pathlib

from smith_fast.pb import smith_pb2 as pb

from harness.otlp_sink import OtlpSink, ReceivedSpan
from .peers import V1Peer, kind, terminal
from harness.server import ServerProcess, wait_until
from .test_tracing import CALLER, CALLER_SPAN, CALLER_TRACE



def _named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def test_spans_reach_an_otlp_receiver(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    with OtlpSink() as sink:
        srv = ServerProcess(tmp_path, env={**sink.env(), "OTEL_SERVICE_NAME": "smith-e2e"}).start()
        try:
            peer = V1Peer(srv.unix)
            peer.handshake((pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_TRACING), traceparent=CALLER)
            peer.command(tool_call=pb.ToolCallCommand(request_id="t1", tool="fs.read", args=b'{"path":"a.txt"}'))
            peer.until(terminal("t1"))
            peer.command(shell_exec=pb.ShellExecCommand(request_id="s1", command='echo "$TRACEPARENT $SMITH_TRACE_ID"'))
            envs = peer.until(terminal("s1"))
            out = "".join(e.event.shell_output.stdout for e in envs if kind(e) == "shell_output").split()
            peer.close()  # ends the session span
            assert wait_until(lambda: _named(sink.spans, "smith.session"), 10), [s.name for s in sink.spans]
        finally:
            assert srv.stop() == 0
    (session,) = _named(sink.spans, "smith.session")
    (tool,) = _named(sink.spans, "smith.tool_call")
    (shell,) = _named(sink.spans, "smith.shell_exec")
    assert {s.trace_id for s in (session, tool, shell)} == {CALLER_TRACE}
    assert session.parent_span_id == CALLER_SPAN
    assert tool.parent_span_id == shell.parent_span_id == session.span_id
    assert session.resource["service.name"] == "smith-e2e"
    assert session.attributes["smith.protocol_version"] == 1
    assert tool.attributes["smith.tool"] == "fs.read" and tool.attributes["smith.request_id"] == "t1"
    assert shell.attributes["smith.exit_code"] == 0
    assert shell.attributes["smith.shell.command"] == 'echo "$TRACEPARENT $SMITH_TRACE_ID"'
    # the child continues the command's span
    traceparent, trace_id = out
    assert traceparent == f"00-{CALLER_TRACE:032x}-{shell.span_id:016x}-01" and trace_id == f"{CALLER_TRACE:032x}"


def test_without_the_capability_nothing_is_exported(tmp_path: pathlib.Path) -> None:
    with OtlpSink() as sink:
        srv = ServerProcess(tmp_path, env=sink.env()).start()
        try:
            peer = V1Peer(srv.unix)
            peer.handshake((pb.CAPABILITY_SHELL_EXEC,), traceparent=CALLER)
            peer.command(shell_exec=pb.ShellExecCommand(request_id="s1", command="true"))
            peer.until(terminal("s1"))
            peer.close()
        finally:
            assert srv.stop() == 0  # SIGTERM flushes the exporter: anything recorded has arrived
    assert sink.span_count == 0
