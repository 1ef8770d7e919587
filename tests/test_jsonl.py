"""Tests of the v0 JSON Lines codec: shapes byte for byte, round trips, errors, line splitting.

The codec is pure Python (no twin); every codec test runs on both JSON backends, and the parity
tests assert the two give the same bytes, the same messages and the same errors.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast.errors import EncodeError, FrameTooLarge, ProtocolError
from smith_fast.jsonl import DEFAULT_MAX_LINE_SIZE, MAX_NESTING, JsonlCodec, LineDecoder
from smith_fast.pb import smith_pb2 as pb
from smith_fast.jsonl._fields import COMMANDS_BY_ONEOF, V1_ONLY_COMMANDS, V1_ONLY_EVENTS

BACKENDS = ["json", "orjson"]
CODECS = {name: JsonlCodec(name) for name in BACKENDS}
RID = "6f1c2a4e-9b3d-4c8a-8e2f-0a1b2c3d4e5f"
RID2 = "0d8e2b7a-1c4f-4e6b-9a3d-5f7e8c9b0a1d"
RID3 = "a3b1c2d4-e5f6-4789-8abc-def012345678"
HYPOTHESIS = settings(max_examples=200, deadline=None)


@pytest.fixture(params=BACKENDS)
def codec(request: pytest.FixtureRequest) -> JsonlCodec:
    return CODECS[request.param]


def cmd(**kw: Any) -> pb.Command:
    return pb.Command(**kw)


def ev(**kw: Any) -> pb.Event:
    return pb.Event(**kw)


def protocol_error(fn: Any, line: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(line)
    return info.value


# --- golden lines, written by hand from PROTOCOL.md, "v0: JSON lines" ------------------------

GOLDEN_COMMANDS: list[tuple[str, pb.Command, bytes]] = [
    ("shutdown", cmd(shutdown=pb.ShutdownCommand()), b'{"type":"Shutdown"}\n'),
    (
        "handshake",
        cmd(handshake=pb.HandshakeCommand(version=0, capabilities=[pb.CAPABILITY_SHELL_EXEC, 2])),
        b'{"type":"Handshake","data":{"version":0,"capabilities":["shell_exec","hooks_js"]}}\n',
    ),
    (
        "handshake_all_capabilities",
        cmd(handshake=pb.HandshakeCommand(version=1, capabilities=[1, 2, 3, 4, 5, 6])),
        b'{"type":"Handshake","data":{"version":1,"capabilities":'
        b'["shell_exec","hooks_js","hooks_rust","replay","nats","tracing"]}}\n',
    ),
    (
        "plan",
        cmd(plan=pb.PlanCommand(request_id=RID, goal="r\u00e9sum\u00e9 \u2713", context={"cwd": "/tmp"})),
        b'{"type":"Plan","data":{"request_id":"' + RID.encode() + b'","goal":"r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93",'
        b'"context":{"cwd":"/tmp"}}}\n',
    ),
    (
        "plan_empty_context",
        cmd(plan=pb.PlanCommand(request_id=RID, goal="g")),
        b'{"type":"Plan","data":{"request_id":"' + RID.encode() + b'","goal":"g","context":{}}}\n',
    ),
    (
        "tool_call",
        cmd(tool_call=pb.ToolCallCommand(request_id=RID, tool="read_file", args=b'{"path":"/tmp/x","n":[1,2.5]}')),
        b'{"type":"ToolCall","data":{"request_id":"' + RID.encode() + b'","tool":"read_file",'
        b'"args":{"path":"/tmp/x","n":[1,2.5]},"timeout_ms":null}}\n',
    ),
    (
        "tool_call_timeout",
        cmd(tool_call=pb.ToolCallCommand(request_id=RID, tool="t", args=b"[]", timeout_ms=2**64 - 1)),
        b'{"type":"ToolCall","data":{"request_id":"' + RID.encode() + b'","tool":"t","args":[],'
        b'"timeout_ms":18446744073709551615}}\n',
    ),
    (
        "hook_load",
        cmd(hook_load=pb.HookLoadCommand(request_id=RID, hook_type="js", script='export default () => "\\n"')),
        b'{"type":"HookLoad","data":{"request_id":"' + RID.encode() + b'","hook_type":"js",'
        b'"script":"export default () => \\"\\\\n\\""}}\n',
    ),
    (
        "shell_exec_minimal",
        cmd(shell_exec=pb.ShellExecCommand(request_id=RID, command="ls -la")),
        b'{"type":"ShellExec","data":{"request_id":"' + RID.encode() + b'","command":"ls -la","shell":null,'
        b'"cwd":null,"env":{},"timeout_ms":null}}\n',
    ),
    (
        "shell_exec_full",
        cmd(
            shell_exec=pb.ShellExecCommand(
                request_id=RID, command="echo $A", shell="/bin/sh", cwd="/w", env={"A": "1"}, timeout_ms=5000
            )
        ),
        b'{"type":"ShellExec","data":{"request_id":"' + RID.encode() + b'","command":"echo $A","shell":"/bin/sh",'
        b'"cwd":"/w","env":{"A":"1"},"timeout_ms":5000}}\n',
    ),
    # process control (PROTOCOL.md, "Process control"): new variants, and ShellExec keys left out unless set
    (
        "shell_exec_pty",
        cmd(shell_exec=pb.ShellExecCommand(request_id=RID, command="vi", open_stdin=True, pty=pb.PtyRequest(rows=24, cols=80, term="xterm"))),
        b'{"type":"ShellExec","data":{"request_id":"' + RID.encode() + b'","command":"vi","shell":null,"cwd":null,'
        b'"env":{},"timeout_ms":null,"open_stdin":true,"pty":{"rows":24,"cols":80,"term":"xterm"}}}\n',
    ),
    ("cancel", cmd(cancel=pb.CancelCommand(request_id=RID)), b'{"type":"Cancel","data":{"request_id":"' + RID.encode() + b'"}}\n'),
    (
        "stdin",
        cmd(stdin=pb.StdinCommand(request_id=RID, data="h\u00e9\n".encode(), eof=True)),
        b'{"type":"Stdin","data":{"request_id":"' + RID.encode() + b'","data":"h\xc3\xa9\\n","eof":true}}\n',
    ),
    (
        "resize",
        cmd(resize=pb.ResizeCommand(request_id=RID, rows=40, cols=120)),
        b'{"type":"Resize","data":{"request_id":"' + RID.encode() + b'","rows":40,"cols":120}}\n',
    ),
    # background processes (PROTOCOL.md, "Background processes")
    (
        "shell_exec_background",
        cmd(shell_exec=pb.ShellExecCommand(request_id=RID, command="make", background=True)),
        b'{"type":"ShellExec","data":{"request_id":"' + RID.encode() + b'","command":"make","shell":null,"cwd":null,'
        b'"env":{},"timeout_ms":null,"background":true}}\n',
    ),
    (
        "list_processes",
        cmd(list_processes=pb.ListProcessesCommand(request_id=RID)),
        b'{"type":"ListProcesses","data":{"request_id":"' + RID.encode() + b'"}}\n',
    ),
    (
        "attach",
        cmd(attach=pb.AttachCommand(request_id=RID, process_id=RID2, from_offset=4096)),
        b'{"type":"Attach","data":{"request_id":"' + RID.encode() + b'","process_id":"' + RID2.encode() + b'","from_offset":4096}}\n',
    ),
]

R = RID.encode()
GOLDEN_EVENTS: list[tuple[str, pb.Event, bytes]] = [
    (
        "ready",
        ev(ready=pb.ReadyEvent(version=0, capabilities=[pb.CAPABILITY_SHELL_EXEC], service_id=RID2)),
        b'{"type":"Ready","data":{"version":0,"capabilities":["shell_exec"],"service_id":"' + RID2.encode() + b'"}}\n',
    ),
    (
        "state_change",
        ev(state_change=pb.StateChangeEvent(request_id=RID, state=pb.SERVICE_STATE_PROCESSING, timestamp=1700)),
        b'{"type":"StateChange","data":{"request_id":"' + R + b'","state":"Processing","timestamp":1700}}\n',
    ),
    (
        "state_change_no_request",
        ev(state_change=pb.StateChangeEvent(state=pb.SERVICE_STATE_SHUTTING, timestamp=0)),
        b'{"type":"StateChange","data":{"request_id":null,"state":"Shutting","timestamp":0}}\n',
    ),
    (
        "log",
        ev(log=pb.LogEvent(level=pb.LOG_LEVEL_WARN, message="disk \u2248 full", timestamp=5)),
        b'{"type":"Log","data":{"level":"Warn","message":"disk \xe2\x89\x88 full","timestamp":5,"request_id":null}}\n',
    ),
    (
        "token_usage",
        ev(token_usage=pb.TokenUsageEvent(request_id=RID, tokens_used=10, tokens_remaining=90)),
        b'{"type":"TokenUsage","data":{"request_id":"' + R + b'","tokens_used":10,"tokens_remaining":90}}\n',
    ),
    (
        "token_usage_no_remaining",
        ev(token_usage=pb.TokenUsageEvent(request_id=RID, tokens_used=10)),
        b'{"type":"TokenUsage","data":{"request_id":"' + R + b'","tokens_used":10,"tokens_remaining":null}}\n',
    ),
    (
        "shell_output_nulls",
        ev(shell_output=pb.ShellOutputEvent(request_id=RID, stdout="line\n")),
        b'{"type":"ShellOutput","data":{"request_id":"' + R + b'","stdout":"line\\n","stderr":null,'
        b'"exit_code":null,"finished":false}}\n',
    ),
    (
        "shell_output_final",
        ev(shell_output=pb.ShellOutputEvent(request_id=RID, stderr="\t\x01", exit_code=-9, finished=True)),
        b'{"type":"ShellOutput","data":{"request_id":"' + R + b'","stdout":null,"stderr":"\\t\\u0001",'
        b'"exit_code":-9,"finished":true}}\n',
    ),
    (
        "tool_result",
        ev(tool_result=pb.ToolResultEvent(request_id=RID, success=True, result=b'{"lines":3}')),
        b'{"type":"ToolResult","data":{"request_id":"' + R + b'","success":true,"result":{"lines":3},"error":null}}\n',
    ),
    (
        "tool_result_error",
        ev(tool_result=pb.ToolResultEvent(request_id=RID, success=False, result=b"null", error="boom")),
        b'{"type":"ToolResult","data":{"request_id":"' + R + b'","success":false,"result":null,"error":"boom"}}\n',
    ),
    (
        "hook_allow",
        ev(hook_result=pb.HookResultEvent(request_id=RID, action=pb.HookAction(type=1, allowed_data=b'{"a":1}'))),
        b'{"type":"HookResult","data":{"request_id":"' + R + b'","action":{"type":"Allow","data":{"a":1}}}}\n',
    ),
    (
        "hook_block",
        ev(hook_result=pb.HookResultEvent(request_id=RID, action=pb.HookAction(type=2, block_reason="no rm -rf"))),
        b'{"type":"HookResult","data":{"request_id":"' + R + b'","action":{"type":"Block","data":'
        b'{"reason":"no rm -rf"}}}}\n',
    ),
    (
        "hook_transform",
        ev(hook_result=pb.HookResultEvent(request_id=RID, action=pb.HookAction(type=3, transformed_data=b'"x"'))),
        b'{"type":"HookResult","data":{"request_id":"' + R + b'","action":{"type":"Transform","data":"x"}}}\n',
    ),
    (
        "graph_delta",
        ev(
            graph_delta=pb.GraphDeltaEvent(
                request_id=RID,
                nodes_added=[pb.GraphNode(id=RID2, label="plan", node_type="task", metadata={"k": "v"})],
                edges_added=[
                    pb.GraphEdge(**{"id": RID3, "from": RID2, "to": RID, "label": "then", "edge_type": "seq"}),
                    pb.GraphEdge(**{"id": RID3, "from": RID, "to": RID2, "edge_type": "dep"}),
                ],
                nodes_removed=[RID3],
                edges_removed=[RID2, RID],
            )
        ),
        b'{"type":"GraphDelta","data":{"request_id":"' + R + b'","nodes_added":[{"id":"' + RID2.encode()
        + b'","label":"plan","node_type":"task","metadata":{"k":"v"}}],"edges_added":[{"id":"' + RID3.encode()
        + b'","from":"' + RID2.encode() + b'","to":"' + R + b'","label":"then","edge_type":"seq"},{"id":"'
        + RID3.encode() + b'","from":"' + R + b'","to":"' + RID2.encode() + b'","label":null,"edge_type":"dep"}],'
        b'"nodes_removed":["' + RID3.encode() + b'"],"edges_removed":["' + RID2.encode() + b'","' + R + b'"]}}\n',
    ),
    (
        "graph_delta_empty",
        ev(graph_delta=pb.GraphDeltaEvent()),
        b'{"type":"GraphDelta","data":{"request_id":null,"nodes_added":[],"edges_added":[],'
        b'"nodes_removed":[],"edges_removed":[]}}\n',
    ),
    (
        "error",
        ev(error=pb.ErrorEvent(request_id=RID, error_code=4, message="slow", timestamp=9)),  # EXECUTION_TIMEOUT
        b'{"type":"Error","data":{"request_id":"' + R + b'","error_code":"EXECUTION_TIMEOUT","message":"slow",'
        b'"timestamp":9}}\n',
    ),
    (
        "error_unspecified",
        ev(error=pb.ErrorEvent(message="bad line", timestamp=1)),
        b'{"type":"Error","data":{"request_id":null,"error_code":"UNSPECIFIED","message":"bad line","timestamp":1}}\n',
    ),
    # background processes (PROTOCOL.md, "Background processes")
    (
        "shell_output_offset",
        ev(shell_output=pb.ShellOutputEvent(request_id=RID, stdout="x", offset=4096)),
        b'{"type":"ShellOutput","data":{"request_id":"' + R + b'","stdout":"x","stderr":null,"exit_code":null,'
        b'"finished":false,"offset":4096}}\n',
    ),
    (
        "process_list",
        ev(process_list=pb.ProcessListEvent(request_id=RID, processes=[pb.BackgroundProcess(
            id=RID2, command="make", state="exited", exit_code=0, pid=42, started_ms=1, ended_ms=2, next_offset=3, retained=3)])),
        b'{"type":"ProcessList","data":{"request_id":"' + R + b'","processes":[{"id":"' + RID2.encode() + b'","command":"make",'
        b'"state":"exited","exit_code":0,"pid":42,"started_ms":1,"ended_ms":2,"first_offset":0,"next_offset":3,'
        b'"retained":3,"attached":0,"stdin_open":false,"pty":false}]}}\n',
    ),
]


@pytest.mark.parametrize("name, command, line", GOLDEN_COMMANDS, ids=[g[0] for g in GOLDEN_COMMANDS])
def test_encode_command_golden(codec: JsonlCodec, name: str, command: pb.Command, line: bytes) -> None:
    assert codec.encode_command(command) == line


@pytest.mark.parametrize("name, command, line", GOLDEN_COMMANDS, ids=[g[0] for g in GOLDEN_COMMANDS])
def test_decode_command_golden(codec: JsonlCodec, name: str, command: pb.Command, line: bytes) -> None:
    assert codec.decode_command(line) == command
    assert codec.decode_command(line.rstrip(b"\n")) == command


@pytest.mark.parametrize("name, event, line", GOLDEN_EVENTS, ids=[g[0] for g in GOLDEN_EVENTS])
def test_encode_event_golden(codec: JsonlCodec, name: str, event: pb.Event, line: bytes) -> None:
    assert codec.encode_event(event) == line


@pytest.mark.parametrize("name, event, line", GOLDEN_EVENTS, ids=[g[0] for g in GOLDEN_EVENTS])
def test_decode_event_golden(codec: JsonlCodec, name: str, event: pb.Event, line: bytes) -> None:
    assert codec.decode_event(line) == event


def test_every_variant_has_a_golden_line() -> None:
    commands = {c.WhichOneof("command_type") for _, c, _ in GOLDEN_COMMANDS}
    events = {e.WhichOneof("event_type") for _, e, _ in GOLDEN_EVENTS}
    assert commands == {f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["command_type"].fields} - V1_ONLY_COMMANDS
    assert events == {f.name for f in pb.Event.DESCRIPTOR.oneofs_by_name["event_type"].fields} - V1_ONLY_EVENTS


def test_v1_only_members_have_no_v0_variant(codec: JsonlCodec) -> None:
    # The workspace commands and their answer (PROTOCOL.md, "Workspaces") are v1 only: nothing
    # encodes them as a line, and a v0 peer's line naming one is an unknown command.
    assert V1_ONLY_COMMANDS == {"checkpoint", "restore", "diff", "undo"} and V1_ONLY_EVENTS == {"workspace"}
    for kind in V1_ONLY_COMMANDS:
        assert kind not in COMMANDS_BY_ONEOF
        command = pb.Command(**{kind: {"request_id": "r1"}})
        with pytest.raises(EncodeError, match="v1 only"):
            codec.encode_command(command)
    with pytest.raises(EncodeError, match="v1 only"):
        codec.encode_event(pb.Event(workspace=pb.WorkspaceEvent(request_id="r1", checkpoint_id="c1")))
    rid = "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f"
    for name in ("Checkpoint", "Restore", "Diff", "Undo"):
        with pytest.raises(ProtocolError) as refused:
            codec.decode_command(b'{"type":"%s","data":{"request_id":"%s"}}\n' % (name.encode(), rid.encode()))
        assert refused.value.details["reason"] == "unknown_command" and refused.value.request_id == rid


def test_lines_are_one_compact_json_object(codec: JsonlCodec) -> None:
    for _, event, _ in GOLDEN_EVENTS:
        line = codec.encode_event(event)
        assert line.endswith(b"\n") and b"\n" not in line[:-1]
        assert json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":")).encode() + b"\n" == line


# --- round trips, v1 -> v0 -> v1, modulo the fields v0 lacks ---------------------------------


@pytest.mark.parametrize("name, command, line", GOLDEN_COMMANDS, ids=[g[0] for g in GOLDEN_COMMANDS])
def test_command_round_trip(codec: JsonlCodec, name: str, command: pb.Command, line: bytes) -> None:
    assert codec.decode_command(codec.encode_command(command)) == command


@pytest.mark.parametrize("name, event, line", GOLDEN_EVENTS, ids=[g[0] for g in GOLDEN_EVENTS])
def test_event_round_trip(codec: JsonlCodec, name: str, event: pb.Event, line: bytes) -> None:
    assert codec.decode_event(codec.encode_event(event)) == event


def test_fields_v0_lacks_are_dropped(codec: JsonlCodec) -> None:
    full_handshake = cmd(handshake=pb.HandshakeCommand(version=1, capabilities=[1], client_info={"name": "cli"}))
    assert codec.decode_command(codec.encode_command(full_handshake)) == cmd(
        handshake=pb.HandshakeCommand(version=1, capabilities=[1])
    )
    pairs = [
        (
            ev(ready=pb.ReadyEvent(version=1, service_id=RID, service_info={"git_commit": "abc"})),
            ev(ready=pb.ReadyEvent(version=1, service_id=RID)),
        ),
        (
            ev(log=pb.LogEvent(level=3, message="m", timestamp=1, request_id=RID, fields={"k": "v"})),
            ev(log=pb.LogEvent(level=3, message="m", timestamp=1, request_id=RID)),
        ),
        (
            ev(token_usage=pb.TokenUsageEvent(request_id=RID, tokens_used=1, model="m-1")),
            ev(token_usage=pb.TokenUsageEvent(request_id=RID, tokens_used=1)),
        ),
        (
            ev(tool_result=pb.ToolResultEvent(request_id=RID, success=True, result=b"1", duration_ms=12)),
            ev(tool_result=pb.ToolResultEvent(request_id=RID, success=True, result=b"1")),
        ),
        (
            ev(error=pb.ErrorEvent(error_code=7, message="m", timestamp=1, details={"reason": "x"})),
            ev(error=pb.ErrorEvent(error_code=7, message="m", timestamp=1)),
        ),
    ]
    for full, v0 in pairs:
        line = codec.encode_event(full)
        assert line == codec.encode_event(v0)
        assert codec.decode_event(line) == v0


def test_json_bytes_are_compacted_on_the_way(codec: JsonlCodec) -> None:
    call = cmd(tool_call=pb.ToolCallCommand(request_id=RID, tool="t", args=b' { "a" : [ 1 , "\\u00e9" ] }\r\n'))
    line = codec.encode_command(call)
    assert b'"args":{"a":[1,"\xc3\xa9"]}' in line
    assert codec.decode_command(line).tool_call.args == b'{"a":[1,"\xc3\xa9"]}'


# --- liberal input --------------------------------------------------------------------------


def test_decode_accepts_whitespace_unknown_fields_and_omissions(codec: JsonlCodec) -> None:
    line = (
        b' { "type" : "ShellExec", "extra": [1], "data" : { "request_id" : "' + R + b'",'
        b' "command" : "ls", "future_field": {"x": 1} } }\r'
    )
    assert codec.decode_command(line) == cmd(shell_exec=pb.ShellExecCommand(request_id=RID, command="ls"))
    assert codec.decode_command(b'{"type":"Handshake","data":{"version":0}}') == cmd(
        handshake=pb.HandshakeCommand(version=0)
    )
    assert codec.decode_event(
        b'{"type":"GraphDelta","data":{"request_id":null,"nodes_added":null,"edges_added":[{"id":"' + R
        + b'","from":"' + R + b'","to":"' + R + b'","edge_type":"e"}]}}'
    ) == ev(graph_delta=pb.GraphDeltaEvent(edges_added=[pb.GraphEdge(**{"id": RID, "from": RID, "to": RID,
                                                                        "edge_type": "e"})]))


@pytest.mark.parametrize("data", [b"", b',"data":null', b',"data":{}', b',"data":{"x":1}'])
def test_shutdown_ignores_its_data(codec: JsonlCodec, data: bytes) -> None:
    assert codec.decode_command(b'{"type":"Shutdown"' + data + b"}") == cmd(shutdown=pb.ShutdownCommand())


@pytest.mark.parametrize(
    "given_id",
    [
        RID.upper(),
        "{" + RID + "}",
        "urn:uuid:" + RID,
        RID.replace("-", ""),
        RID.replace("-", "").upper(),
    ],
)
def test_uuid_forms_the_rust_crate_parses_are_canonicalized(codec: JsonlCodec, given_id: str) -> None:
    line = b'{"type":"Plan","data":{"request_id":"' + given_id.encode() + b'","goal":"g","context":{}}}'
    assert codec.decode_command(line).plan.request_id == RID


def test_handshake_version_zero_asks_for_v0(codec: JsonlCodec) -> None:
    command = codec.decode_command(b'{"type":"Handshake","data":{"version":0,"capabilities":["replay"]}}')
    assert command.handshake.version == 0
    assert list(command.handshake.capabilities) == [pb.CAPABILITY_REPLAY]


def test_free_error_code_string_survives_a_round_trip(codec: JsonlCodec) -> None:
    line = b'{"type":"Error","data":{"request_id":null,"error_code":"TOOL_NOT_FOUND","message":"m","timestamp":1}}\n'
    event = codec.decode_event(line)
    assert event.error.error_code == pb.ERROR_CODE_UNSPECIFIED
    assert dict(event.error.details) == {"v0_error_code": "TOOL_NOT_FOUND"}
    assert codec.encode_event(event) == line


# --- JSON-in-bytes rules on encode -----------------------------------------------------------


def _result_value(codec: JsonlCodec, raw: bytes) -> Any:
    line = codec.encode_event(ev(tool_result=pb.ToolResultEvent(request_id=RID, success=True, result=raw)))
    return json.loads(line)["data"]["result"]


@pytest.mark.parametrize(
    "raw, value",
    [
        (b"", None),
        (b"null", None),
        (b"plain text", "plain text"),
        (b'{"a":', '{"a":'),
        (b"NaN", "NaN"),
        (b"\xff\xfeok", "\ufffd\ufffdok"),
        (b'"\\ud800"', '"\\ud800"'),
        (b"[" * 126 + b"]" * 126, "[" * 126 + "]" * 126),
        (b"[" * 125 + b"]" * 125, json.loads("[" * 125 + "]" * 125)),
    ],
    ids=["empty", "null", "text", "truncated", "nan", "bad-utf8", "lone-surrogate", "too-deep", "deepest"],
)
def test_result_bytes_that_are_not_v0_json_go_as_a_string(codec: JsonlCodec, raw: bytes, value: Any) -> None:
    assert _result_value(codec, raw) == value


def test_args_and_hook_data_follow_the_same_rules(codec: JsonlCodec) -> None:
    line = codec.encode_command(cmd(tool_call=pb.ToolCallCommand(request_id=RID, tool="t", args=b"oops")))
    assert json.loads(line)["data"]["args"] == "oops"
    line = codec.encode_event(ev(hook_result=pb.HookResultEvent(request_id=RID, action=pb.HookAction(type=1))))
    assert json.loads(line)["data"]["action"] == {"type": "Allow", "data": None}
    deep = b"[" * 125 + b"]" * 125  # fits in a result (2 levels down), not in hook data (3 levels down)
    action = pb.HookAction(type=3, transformed_data=deep)
    line = codec.encode_event(ev(hook_result=pb.HookResultEvent(request_id=RID, action=action)))
    assert json.loads(line)["data"]["action"]["data"] == deep.decode()


def test_hook_action_type_is_inferred_when_unspecified(codec: JsonlCodec) -> None:
    action = pb.HookAction(block_reason="nope")
    line = codec.encode_event(ev(hook_result=pb.HookResultEvent(request_id=RID, action=action)))
    assert json.loads(line)["data"]["action"] == {"type": "Block", "data": {"reason": "nope"}}


# --- the two backends agree ------------------------------------------------------------------


def test_backends_write_identical_bytes() -> None:
    a, b = CODECS["json"], CODECS["orjson"]
    for _, command, _ in GOLDEN_COMMANDS:
        assert a.encode_command(command) == b.encode_command(command)
    for _, event, _ in GOLDEN_EVENTS:
        assert a.encode_event(event) == b.encode_event(event)


def test_backend_selection() -> None:
    assert JsonlCodec().backend == "orjson"
    assert JsonlCodec("auto").backend == "orjson"
    assert JsonlCodec("json").backend == "json"
    with pytest.raises(ValueError, match="'simplejson'"):
        JsonlCodec("simplejson")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@HYPOTHESIS
@given(value=JSON_VALUES)
def test_backends_agree_on_random_json_values(value: Any) -> None:
    raw = json.dumps(value).encode()  # ASCII, escaped: as a Python v1 client would send it
    lines = {name: c.encode_command(cmd(tool_call=pb.ToolCallCommand(request_id=RID, tool="t", args=raw)))
             for name, c in CODECS.items()}
    assert lines["json"] == lines["orjson"]
    # orjson's own notation is the reference for numbers
    assert orjson.loads(lines["json"])["data"]["args"] == orjson.loads(raw)
    decoded = {name: c.decode_command(lines["json"]) for name, c in CODECS.items()}
    assert decoded["json"] == decoded["orjson"]
    assert decoded["json"].tool_call.args == orjson.dumps(orjson.loads(raw))


@HYPOTHESIS
@given(number=st.floats(allow_nan=False, allow_infinity=False))
def test_floats_are_written_in_orjson_notation(number: float) -> None:
    raw = repr(number).encode()
    for codec in CODECS.values():
        line = codec.encode_event(ev(tool_result=pb.ToolResultEvent(request_id=RID, result=raw)))
        assert b'"result":' + orjson.dumps(number) + b',' in line
        decoded = codec.decode_command(b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t",'
                                       b'"args":' + raw + b'}}')
        assert decoded.tool_call.args == orjson.dumps(number)


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"18446744073709551615", b"18446744073709551615"),
        (b"18446744073709551616", b"1.8446744073709552e+19"),
        (b"-9223372036854775808", b"-9223372036854775808"),
        (b"-9223372036854775809", b"-9.223372036854776e+18"),
        (b"1e-5", b"0.00001"),
        (b"1.5E-7", b"1.5e-7"),
        (b"1e16", b"1e+16"),
        (b"-0.0", b"-0.0"),
    ],
)
def test_numbers_beyond_64_bits_and_small_floats(codec: JsonlCodec, raw: bytes, expected: bytes) -> None:
    line = b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t","args":[' + raw + b']}}'
    assert codec.decode_command(line).tool_call.args == b"[" + expected + b"]"


def test_float_notation_fix_leaves_strings_alone(codec: JsonlCodec) -> None:
    raw = b'{"k1e-05":"2e-05 \\"3e-07\\"","n":[2e-05,3e-07,1e-10],"id":"6f1c2a4e-0b3d"}'
    line = codec.encode_command(cmd(tool_call=pb.ToolCallCommand(request_id=RID, tool="t", args=raw)))
    assert b'"args":{"k1e-05":"2e-05 \\"3e-07\\"","n":[0.00002,3e-7,1e-10],"id":"6f1c2a4e-0b3d"}' in line


# --- errors ---------------------------------------------------------------------------------

PLAN = b'{"type":"Plan","data":{"request_id":"' + R + b'","goal":"g","context":{}}}'


def _plan(**overrides: Any) -> bytes:
    data: dict[str, Any] = {"request_id": RID, "goal": "g", "context": {}}
    for key, value in overrides.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    return json.dumps({"type": "Plan", "data": data}).encode()


# (id, method, line, reason, message (exact, or a prefix ending in "..."), request_id)
BAD_LINES: list[tuple[str, str, bytes, str, str, str | None]] = [
    ("utf8", "decode_command", b'{"type":"Plan","data":{"goal":"\xff"}}', "invalid_utf8",
     "invalid UTF-8 at byte 31: invalid start byte", None),
    ("utf8-truncated", "decode_event", b'{"type":"Log","data":{"message":"\xc3"}}', "invalid_utf8",
     "invalid UTF-8 at byte 33: invalid continuation byte", None),
    ("json-truncated", "decode_command", b'{"type":"Plan","data":{', "invalid_json", "invalid JSON at character ...",
     None),
    ("json-trailing", "decode_command", PLAN + b" x", "invalid_json", "invalid JSON at character ...", None),
    ("json-empty", "decode_command", b"", "invalid_json", "invalid JSON at character 0...", None),
    ("json-nan", "decode_command", b'{"type":"ToolCall","data":{"args":NaN}}', "invalid_json", "invalid JSON...",
     None),
    ("json-infinity", "decode_command", b'{"type":"ToolCall","data":{"args":1e400}}', "invalid_json",
     "invalid JSON...", None),
    ("json-lone-surrogate", "decode_command", b'{"type":"Plan","data":{"goal":"\\udc00"}}', "invalid_json",
     "invalid JSON...", None),
    ("json-too-deep", "decode_command", b"[" * 128 + b"]" * 128, "invalid_json",
     "invalid JSON: arrays/objects nested deeper than 127 levels (the serde_json limit)", None),
    ("json-far-too-deep", "decode_event", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "invalid_json",
     "invalid JSON: arrays/objects nested deeper than 127 levels (the serde_json limit)", None),
    ("not-object", "decode_command", b"[1,2]", "malformed",
     "a v0 line must be a JSON object, got an array", None),
    ("not-object-string", "decode_event", b'"Shutdown"', "malformed",
     "a v0 line must be a JSON object, got the string 'Shutdown'", None),
    ("no-type", "decode_command", b'{"data":{}}', "malformed",
     'the command object has no "type"; expected a variant name string', None),
    ("type-not-string", "decode_event", b'{"type":7}', "malformed",
     'the event object has a "type" that is the number 7; expected a variant name string', None),
    ("unknown-command", "decode_command", b'{"type":"Launch","data":{"request_id":"' + R + b'"}}',
     "unknown_command", "unknown command type 'Launch' (expected one of Handshake, Plan, ToolCall, HookLoad, "
     "ShellExec, Shutdown, Cancel, Stdin, Resize, ListProcesses, Attach)", RID),
    ("event-as-command", "decode_command", b'{"type":"Ready","data":{}}', "unknown_command",
     "unknown command type 'Ready' (expected one of ...", None),
    ("unknown-event", "decode_event", b'{"type":"Plan","data":{}}', "unknown_event",
     "unknown event type 'Plan' (expected one of Ready, StateChange, Log, TokenUsage, ShellOutput, ToolResult, "
     "HookResult, GraphDelta, Error, ProcessList)", None),
    ("data-missing", "decode_command", b'{"type":"Plan"}', "invalid_field", "missing required field Plan.data",
     None),
    ("data-not-object", "decode_command", b'{"type":"Plan","data":[]}', "invalid_field",
     "Plan.data must be an object, got an array", None),
    ("missing-goal", "decode_command", _plan(goal=...), "invalid_field", "missing required field Plan.goal", RID),
    ("null-goal", "decode_command", _plan(goal=None), "invalid_field", "Plan.goal must be a string, got null", RID),
    ("context-value", "decode_command", _plan(context={"PATH": 1}), "invalid_field",
     "Plan.context['PATH'] must be a string, got the number 1", RID),
    ("context-type", "decode_command", _plan(context=["a"]), "invalid_field",
     "Plan.context must be an object with string values, got an array", RID),
    ("missing-request-id", "decode_command", _plan(request_id=...), "invalid_field",
     "missing required field Plan.request_id", None),
    ("bad-request-id", "decode_command", _plan(request_id="req-1"), "invalid_uuid",
     "Plan.request_id must be a UUID string, got the string 'req-1'", None),
    ("numeric-request-id", "decode_command", _plan(request_id=1), "invalid_uuid",
     "Plan.request_id must be a UUID string, got the number 1", None),
    ("braced-without-close", "decode_command", _plan(request_id="{" + RID + "]"), "invalid_uuid",
     "Plan.request_id must be a UUID string, got the string '{6f1c2a4e-9b3d-4c8a-8e2f-0a1b2c3d4e5f]'", None),
    ("urn-uppercase", "decode_command", _plan(request_id="URN:UUID:" + RID), "invalid_uuid",
     "Plan.request_id must be a UUID string, got the string 'URN:UUID:6f1c2a4e-9b3d-4c8a-8e2f-0a1b2c3d4e5f'", None),
    ("long-string", "decode_command", _plan(goal=["x"], request_id="r" * 100), "invalid_uuid",
     "Plan.request_id must be a UUID string, got the string '" + "r" * 55 + "...'", None),
    ("misplaced-hyphens", "decode_command", _plan(request_id="6f1c2a4e9-b3d-4c8a-8e2f-0a1b2c3d4e5f"),
     "invalid_uuid", "Plan.request_id must be a UUID string, got the string ...", None),
    ("optional-bad-uuid", "decode_event", b'{"type":"StateChange","data":{"request_id":"x","state":"Ready",'
     b'"timestamp":1}}', "invalid_uuid", "StateChange.request_id must be a UUID string or null, got the string 'x'",
     None),
    ("node-id", "decode_event", b'{"type":"GraphDelta","data":{"request_id":"' + R + b'","nodes_added":[{"id":"n1",'
     b'"label":"l","node_type":"t","metadata":{}}]}}', "invalid_uuid",
     "GraphDelta.nodes_added[0].id must be a UUID string, got the string 'n1'", RID),
    ("edge-to", "decode_event", b'{"type":"GraphDelta","data":{"edges_added":[{"id":"' + R + b'","from":"' + R
     + b'","edge_type":"e"}]}}', "invalid_field", "missing required field GraphDelta.edges_added[0].to", None),
    ("removed-id", "decode_event", b'{"type":"GraphDelta","data":{"nodes_removed":["' + R + b'",5]}}',
     "invalid_uuid", "GraphDelta.nodes_removed[1] must be a UUID string, got the number 5", None),
    ("timeout-string", "decode_command", b'{"type":"ShellExec","data":{"request_id":"' + R + b'","command":"c",'
     b'"timeout_ms":"5"}}', "invalid_field",
     "ShellExec.timeout_ms must be an unsigned 64-bit integer or null, got the string '5'", RID),
    ("timeout-negative", "decode_command", b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t",'
     b'"args":{},"timeout_ms":-1}}', "invalid_field",
     "ToolCall.timeout_ms must be an unsigned 64-bit integer or null, got the number -1", RID),
    ("timeout-float", "decode_command", b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t",'
     b'"args":{},"timeout_ms":1.0}}', "invalid_field",
     "ToolCall.timeout_ms must be an unsigned 64-bit integer or null, got the number 1.0", RID),
    ("args-missing", "decode_command", b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t"}}',
     "invalid_field", "missing required field ToolCall.args", RID),
    ("version-bool", "decode_command", b'{"type":"Handshake","data":{"version":true}}', "invalid_field",
     "Handshake.version must be an unsigned 32-bit integer, got the boolean true", None),
    ("version-wide", "decode_command", b'{"type":"Handshake","data":{"version":4294967296}}', "invalid_field",
     "Handshake.version must be an unsigned 32-bit integer, got the number 4294967296", None),
    ("capability-type", "decode_command", b'{"type":"Handshake","data":{"version":1,"capabilities":[1]}}',
     "invalid_field", "Handshake.capabilities[0] must be a capability name, got the number 1", None),
    ("exit-code-wide", "decode_event", b'{"type":"ShellOutput","data":{"request_id":"' + R + b'",'
     b'"exit_code":2147483648,"finished":true}}', "invalid_field",
     "ShellOutput.exit_code must be a signed 32-bit integer or null, got the number 2147483648", RID),
    ("finished-missing", "decode_event", b'{"type":"ShellOutput","data":{"request_id":"' + R + b'"}}',
     "invalid_field", "missing required field ShellOutput.finished", RID),
    ("state-unknown", "decode_event", b'{"type":"StateChange","data":{"state":"Busy","timestamp":1}}',
     "invalid_field", "StateChange.state must be one of Starting, Ready, Processing, Error, Shutting, got the "
     "string 'Busy'", None),
    ("state-lowercase", "decode_event", b'{"type":"StateChange","data":{"state":"ready","timestamp":1}}',
     "invalid_field", "StateChange.state must be one of Starting, Ready, Processing, Error, Shutting, got the "
     "string 'ready'", None),
    ("level-unknown", "decode_event", b'{"type":"Log","data":{"level":"Fatal","message":"m","timestamp":1}}',
     "invalid_field", "Log.level must be one of Trace, Debug, Info, Warn, Error, got the string 'Fatal'", None),
    ("error-code-type", "decode_event", b'{"type":"Error","data":{"error_code":4,"message":"m","timestamp":1}}',
     "invalid_field", "Error.error_code must be a string, got the number 4", None),
    ("hook-type", "decode_event", b'{"type":"HookResult","data":{"request_id":"' + R + b'","action":{"type":"Deny",'
     b'"data":null}}}', "invalid_field",
     "HookResult.action.type must be one of Allow, Block, Transform, got the string 'Deny'", RID),
    ("hook-block-reason", "decode_event", b'{"type":"HookResult","data":{"request_id":"' + R + b'","action":'
     b'{"type":"Block","data":{}}}}', "invalid_field", "missing required field HookResult.action.data.reason", RID),
    ("hook-allow-data", "decode_event", b'{"type":"HookResult","data":{"request_id":"' + R + b'","action":'
     b'{"type":"Allow"}}}', "invalid_field", "missing required field HookResult.action.data", RID),
    ("result-missing", "decode_event", b'{"type":"ToolResult","data":{"request_id":"' + R + b'","success":true}}',
     "invalid_field", "missing required field ToolResult.result", RID),
]


BAD_IDS = [b[0] for b in BAD_LINES]


@pytest.mark.parametrize("name, method, line, reason, message, request_id", BAD_LINES, ids=BAD_IDS)
def test_decode_errors(
    codec: JsonlCodec, name: str, method: str, line: bytes, reason: str, message: str, request_id: str | None
) -> None:
    exc = protocol_error(getattr(codec, method), line)
    assert exc.code == pb.ERROR_CODE_UNSPECIFIED
    assert exc.details == {"reason": reason}
    assert exc.request_id == request_id
    if message.endswith("..."):
        assert str(exc).startswith(message[:-3])
    else:
        assert str(exc) == message


@pytest.mark.parametrize("name, method, line, reason, message, request_id", BAD_LINES, ids=BAD_IDS)
def test_decode_errors_agree_across_backends(
    name: str, method: str, line: bytes, reason: str, message: str, request_id: str | None
) -> None:
    a = protocol_error(getattr(CODECS["json"], method), line)
    b = protocol_error(getattr(CODECS["orjson"], method), line)
    assert (a.code, a.details, a.request_id) == (b.code, b.details, b.request_id)
    if reason != "invalid_json" or "nested" in str(a):  # only the parsers' own wording may differ
        assert str(a) == str(b)


def test_invalid_json_message_carries_the_parser_position(codec: JsonlCodec) -> None:
    exc = protocol_error(codec.decode_command, b'{"type":"Plan","data":{"goal":"\xc3\xa9\xc3\xa9", x}}')
    assert str(exc).startswith("invalid JSON at character 36: ")  # the "x": a character, not byte, index


def test_brackets_inside_strings_do_not_count_as_nesting(codec: JsonlCodec) -> None:
    goal = "[{" * 500
    line = json.dumps({"type": "Plan", "data": {"request_id": RID, "goal": goal, "context": {}}}).encode()
    assert codec.decode_command(line).plan.goal == goal


def test_nesting_limit_is_exactly_serde_jsons(codec: JsonlCodec) -> None:
    def tool_call(depth: int) -> bytes:  # the line itself nests 2 levels before args
        args = b"[" * depth + b"]" * depth
        return b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t","args":' + args + b"}}"

    assert MAX_NESTING == 127
    assert codec.decode_command(tool_call(125)).tool_call.args == b"[" * 125 + b"]" * 125
    exc = protocol_error(codec.decode_command, tool_call(126))
    assert exc.details == {"reason": "invalid_json"}


def test_deep_nesting_with_invalid_utf8_reports_the_utf8(codec: JsonlCodec) -> None:
    exc = protocol_error(codec.decode_command, b"\xff" + b"[" * 200)
    assert exc.details == {"reason": "invalid_utf8"} and str(exc).startswith("invalid UTF-8 at byte 0")


def test_parser_recursion_error_becomes_a_protocol_error() -> None:
    # With little stack left the stdlib parser can hit the interpreter's recursion limit before our
    # nesting limit; the codec must still answer with a ProtocolError (or decode), never crash.
    args = b"[" * 120 + b"]" * 120
    line = b'{"type":"ToolCall","data":{"request_id":"' + R + b'","tool":"t","args":' + args + b"}}"
    outcomes = []

    def dive(n: int) -> None:
        if n:
            dive(n - 1)
            return
        try:
            outcomes.append(CODECS["json"].decode_command(line))
        except ProtocolError as exc:
            outcomes.append(exc)

    for headroom in (30, 60, 120, 240):
        depth = sys.getrecursionlimit() - headroom - len(__import__("inspect").stack(0))
        dive(depth)
    for outcome in outcomes:
        if isinstance(outcome, ProtocolError):
            assert outcome.details == {"reason": "invalid_json"}
            assert str(outcome) == "invalid JSON: arrays/objects nested too deeply to parse with the stack left"
        else:
            assert outcome.tool_call.args == args


def test_unknown_capabilities_are_reported_but_the_handshake_is_decoded(codec: JsonlCodec) -> None:
    line = b'{"type":"Handshake","data":{"version":1,"capabilities":["shell_exec","gpu","tracing","x,y"]}}'
    exc = protocol_error(codec.decode_command, line)
    assert exc.code == pb.ERROR_CODE_INVALID_CAPABILITY
    assert exc.details == {"reason": "unknown_capability", "unknown_capabilities": "gpu,x,y"}
    assert "'gpu', 'x,y'" in str(exc)
    assert exc.command == cmd(  # type: ignore[attr-defined]
        handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_TRACING])
    )
    line = b'{"type":"Ready","data":{"version":0,"capabilities":["nats","quantum"],"service_id":"' + R + b'"}}'
    exc = protocol_error(codec.decode_event, line)
    assert exc.code == pb.ERROR_CODE_INVALID_CAPABILITY
    assert exc.details["unknown_capabilities"] == "quantum"
    ready = ev(ready=pb.ReadyEvent(version=0, capabilities=[pb.CAPABILITY_NATS], service_id=RID))
    assert exc.event == ready  # type: ignore[attr-defined]


def test_decode_accepts_any_bytes_like(codec: JsonlCodec) -> None:
    expected = codec.decode_command(PLAN)
    assert codec.decode_command(bytearray(PLAN)) == expected
    assert codec.decode_command(memoryview(b"xx" + PLAN)[2:]) == expected


@pytest.mark.parametrize(
    "method, message, error",
    [
        ("encode_event", pb.Event(), "Event has no event_type set"),
        ("encode_command", pb.Command(), "Command has no command_type set"),
        ("encode_event", ev(state_change=pb.StateChangeEvent(timestamp=1)),
         "StateChangeEvent.state is SERVICE_STATE_UNSPECIFIED, which has no v0 state name"),
        ("encode_event", ev(state_change=pb.StateChangeEvent(state=42)),
         "StateChangeEvent.state is 42, which has no v0 state name"),
        ("encode_event", ev(log=pb.LogEvent(message="m")),
         "LogEvent.level is LOG_LEVEL_UNSPECIFIED, which has no v0 log level name"),
        ("encode_event", ev(ready=pb.ReadyEvent(capabilities=[1, 0], service_id=RID)),
         "ReadyEvent.capabilities is CAPABILITY_UNSPECIFIED, which has no v0 capability name"),
        ("encode_command", cmd(handshake=pb.HandshakeCommand(capabilities=[9])),
         "HandshakeCommand.capabilities is 9, which has no v0 capability name"),
        ("encode_event", ev(error=pb.ErrorEvent(error_code=99)),
         "ErrorEvent.error_code is 99, which has no v0 error code name"),
        ("encode_event", ev(hook_result=pb.HookResultEvent(request_id=RID)),
         "HookResultEvent.action is not set; v0 requires it"),
        ("encode_event", ev(hook_result=pb.HookResultEvent(request_id=RID, action=pb.HookAction())),
         "HookResultEvent.action.type is HOOK_ACTION_TYPE_UNSPECIFIED, which has no v0 hook action name"),
    ],
)
def test_encode_errors(codec: JsonlCodec, method: str, message: Any, error: str) -> None:
    with pytest.raises(EncodeError) as info:
        getattr(codec, method)(message)
    assert str(info.value) == error


# --- fast encoders: the same bytes as encode_event --------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
IDS = st.uuids().map(str) | TEXT
U64 = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.mark.parametrize("backend", BACKENDS)
@HYPOTHESIS
@given(request_id=IDS, stdout=st.none() | TEXT, stderr=st.none() | TEXT,
       exit_code=st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1), finished=st.booleans())
def test_shell_output_matches_encode_event(
    backend: str, request_id: str, stdout: str | None, stderr: str | None, exit_code: int | None, finished: bool
) -> None:
    codec = CODECS[backend]
    event = pb.ShellOutputEvent(request_id=request_id, stdout=stdout, stderr=stderr, exit_code=exit_code,
                                finished=finished)
    assert codec.shell_output(request_id, stdout, stderr, exit_code, finished) == codec.encode_event(
        ev(shell_output=event)
    )


@pytest.mark.parametrize("backend", BACKENDS)
@HYPOTHESIS
@given(state=st.sampled_from([1, 2, 3, 4, 5]), request_id=st.none() | IDS, timestamp=U64)
def test_state_change_matches_encode_event(
    backend: str, state: int, request_id: str | None, timestamp: int
) -> None:
    codec = CODECS[backend]
    event = pb.StateChangeEvent(request_id=request_id, state=state, timestamp=timestamp)
    assert codec.state_change(state, request_id, timestamp) == codec.encode_event(ev(state_change=event))


RESULTS = st.binary(max_size=30) | JSON_VALUES.map(lambda v: json.dumps(v).encode()) | TEXT.map(str.encode)


@pytest.mark.parametrize("backend", BACKENDS)
@HYPOTHESIS
@given(request_id=IDS, success=st.booleans(), result=RESULTS, error=st.none() | TEXT)
def test_tool_result_matches_encode_event(
    backend: str, request_id: str, success: bool, result: bytes, error: str | None
) -> None:
    codec = CODECS[backend]
    event = pb.ToolResultEvent(request_id=request_id, success=success, result=result, error=error)
    line = codec.tool_result(request_id, success, result, error)
    assert line == codec.encode_event(ev(tool_result=event))
    other = CODECS["json" if backend == "orjson" else "orjson"]
    assert line == other.tool_result(request_id, success, result, error)


@pytest.mark.parametrize("backend", BACKENDS)
@HYPOTHESIS
@given(level=st.sampled_from([1, 2, 3, 4, 5]), message=TEXT, timestamp=U64, request_id=st.none() | IDS)
def test_log_matches_encode_event(
    backend: str, level: int, message: str, timestamp: int, request_id: str | None
) -> None:
    codec = CODECS[backend]
    event = pb.LogEvent(level=level, message=message, timestamp=timestamp, request_id=request_id)
    assert codec.log(level, message, timestamp, request_id) == codec.encode_event(ev(log=event))


@pytest.mark.parametrize("backend", BACKENDS)
@HYPOTHESIS
@given(code=st.sampled_from(list(pb.ErrorCode.values())), message=TEXT, request_id=st.none() | IDS, timestamp=U64)
def test_error_matches_encode_event(
    backend: str, code: int, message: str, request_id: str | None, timestamp: int
) -> None:
    codec = CODECS[backend]
    event = pb.ErrorEvent(error_code=code, message=message, request_id=request_id, timestamp=timestamp)
    assert codec.error(code, message, request_id, timestamp) == codec.encode_event(ev(error=event))


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda c: c.shell_output(RID, None, None, 2**31, True),
         "ShellOutputEvent.exit_code 2147483648 does not fit in a signed 32-bit integer"),
        (lambda c: c.state_change(0, None, 1), "StateChangeEvent.state is SERVICE_STATE_UNSPECIFIED, which has no "
         "v0 state name"),
        (lambda c: c.state_change(2, None, -1), "StateChangeEvent.timestamp -1 does not fit in an unsigned 64-bit "
         "integer"),
        (lambda c: c.log(9, "m", 1, None), "LogEvent.level is 9, which has no v0 log level name"),
        (lambda c: c.log(1, "m", 2**64, None), "LogEvent.timestamp 18446744073709551616 does not fit in an "
         "unsigned 64-bit integer"),
        (lambda c: c.error(8, "m", None, 1), "ErrorEvent.error_code is 8, which has no v0 error code name"),
        (lambda c: c.shell_output(RID, "a\ud800b", None, None, False),
         "a string holds the lone surrogate U+D800, which is not valid UTF-8"),
        (lambda c: c.tool_result(RID, False, b"1", "\udfff"),
         "a string holds the lone surrogate U+DFFF, which is not valid UTF-8"),
    ],
    ids=["exit-code", "state", "timestamp", "level", "timestamp-wide", "error-code", "surrogate", "surrogate-2"],
)
def test_fast_encoder_errors(codec: JsonlCodec, call: Any, error: str) -> None:
    with pytest.raises(EncodeError) as info:
        call(codec)
    assert str(info.value) == error


# --- LineDecoder ------------------------------------------------------------------------------

STREAM = b'{"type":"Shutdown"}\n\r\n{"a":1}\r\n\n  \t \n' + PLAN + b"\n\xc3\xa9\r\r\n{}\n"
STREAM_LINES = [b'{"type":"Shutdown"}', b'{"a":1}', PLAN, b"\xc3\xa9\r", b"{}"]


def test_lines_split_at_every_offset() -> None:
    for i in range(len(STREAM) + 1):
        decoder = LineDecoder()
        assert decoder.feed(STREAM[:i]) + decoder.feed(STREAM[i:]) == STREAM_LINES, i
        assert decoder.buffered == 0


def test_lines_fed_one_byte_at_a_time() -> None:
    decoder = LineDecoder()
    lines = [line for i in range(len(STREAM)) for line in decoder.feed(STREAM[i : i + 1])]
    assert lines == STREAM_LINES


@HYPOTHESIS
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=8))
def test_lines_with_random_chunks(cuts: list[int]) -> None:
    decoder = LineDecoder(max_line_size=len(PLAN) + 1)
    bounds = [0, *sorted(cuts), len(STREAM)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out += decoder.feed(memoryview(STREAM)[a:b])
    assert out == STREAM_LINES


def test_line_decoder_accepts_bytes_like_and_keeps_the_pending_line() -> None:
    decoder = LineDecoder()
    assert decoder.feed(bytearray(b'{"x":')) == []
    assert decoder.buffered == 5
    assert decoder.feed(memoryview(b"1}\n{")) == [b'{"x":1}']
    assert decoder.buffered == 1
    assert decoder.max_line_size == DEFAULT_MAX_LINE_SIZE == 16 * 1024 * 1024


def test_line_limit_is_inclusive_and_counts_a_trailing_cr() -> None:
    decoder = LineDecoder(max_line_size=4)
    assert decoder.feed(b"abcd\nab\r\n") == [b"abcd", b"ab"]
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"abcd\r\n")
    with pytest.raises(ValueError):
        LineDecoder(max_line_size=-1)


def test_oversize_line_in_one_feed_is_dropped_and_decoding_goes_on() -> None:
    decoder = LineDecoder(max_line_size=10)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b'{"a":1}\n' + b"x" * 20 + b'\n{"b":2}\n{"c"')
    exc = info.value
    assert (exc.offset, exc.size, exc.limit) == (8, 20, 10)
    assert str(exc) == (
        "line at byte offset 8 exceeds max_line_size 10 (20 bytes); it is discarded up to the next newline"
    )
    assert exc.frames == [b'{"a":1}', b'{"b":2}']  # type: ignore[attr-defined]
    assert exc.index == 1  # type: ignore[attr-defined]
    assert decoder.feed(b":3}\n") == [b'{"c":3}']  # not sticky


def test_oversize_line_across_feeds_is_never_buffered() -> None:
    decoder = LineDecoder(max_line_size=10)
    assert decoder.feed(b"ok\n" + b"x" * 5) == [b"ok"]
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"x" * 10)
    exc = info.value
    assert (exc.offset, exc.size) == (3, 15)
    assert str(exc).endswith("(15 bytes so far); it is discarded up to the next newline")
    assert (exc.frames, exc.index) == ([], 0)  # type: ignore[attr-defined]
    assert decoder.buffered == 0
    assert decoder.feed(b"x" * 1000) == []
    assert decoder.buffered == 0
    assert decoder.feed(b'yy\n{"n":1}\n{"m"') == [b'{"n":1}']
    assert decoder.feed(b":2}\n") == [b'{"m":2}']


def test_oversize_tail_of_a_feed() -> None:
    decoder = LineDecoder(max_line_size=10)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"a\nb\n" + b"z" * 11)
    assert (info.value.offset, info.value.size) == (4, 11)
    assert (info.value.frames, info.value.index) == ([b"a", b"b"], 2)  # type: ignore[attr-defined]
    assert decoder.buffered == 0
    assert decoder.feed(b"zz\nc\n") == [b"c"]


def test_pending_line_completed_past_the_limit() -> None:
    decoder = LineDecoder(max_line_size=10)
    assert decoder.feed(b"0123456") == []
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"789ab\nok\n")
    assert (info.value.offset, info.value.size) == (0, 12)
    assert (info.value.frames, info.value.index) == ([b"ok"], 0)  # type: ignore[attr-defined]
    assert decoder.feed(b"next\n") == [b"next"]


def test_several_oversize_lines_in_one_feed_raise_once_for_the_first() -> None:
    decoder = LineDecoder(max_line_size=3)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"a\n" + b"x" * 5 + b"\nb\n" + b"y" * 6 + b"\nc\n")
    assert (info.value.offset, info.value.size) == (2, 5)
    assert (info.value.frames, info.value.index) == ([b"a", b"b", b"c"], 1)  # type: ignore[attr-defined]
    assert decoder.feed(b"d\n") == [b"d"]


def test_offsets_count_every_byte_fed() -> None:
    decoder = LineDecoder(max_line_size=8)
    decoder.feed(b"12345678\n\r\n")
    decoder.feed(b"abc")
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"defghi\n")
    assert info.value.offset == 11
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"ok\n" + b"q" * 9 + b"\n")
    assert info.value.offset == 24


@HYPOTHESIS
@given(
    lines=st.lists(st.binary(min_size=0, max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=10),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_oversize_resync_against_a_model(lines: list[bytes], cuts: list[int]) -> None:
    limit = 6
    stream = b"".join(line + b"\n" for line in lines)
    expected = []
    for line in lines:
        if len(line) <= limit:
            text = line[:-1] if line.endswith(b"\r") else line
            if text.strip(b" \t\r"):
                expected.append(text)
    decoder = LineDecoder(max_line_size=limit)
    bounds = [0, *sorted(c for c in cuts if c <= len(stream)), len(stream)]
    out: list[bytes] = []
    errors = 0
    for a, b in zip(bounds, bounds[1:]):
        try:
            out += decoder.feed(stream[a:b])
        except FrameTooLarge as exc:
            errors += 1
            assert exc.limit == limit and exc.size > limit
            out += exc.frames  # type: ignore[attr-defined]
    assert out == expected
    assert errors <= sum(len(line) > limit for line in lines)
    assert (errors == 0) == all(len(line) <= limit for line in lines)


def test_process_control_keys_are_optional_in_v0(codec: JsonlCodec) -> None:
    base = b'{"type":"ShellExec","data":{"request_id":"' + RID.encode() + b'","command":"x"'
    assert not codec.decode_command(base + b"}}").shell_exec.open_stdin
    assert not codec.decode_command(base + b"}}").shell_exec.HasField("pty")
    pty = codec.decode_command(base + b',"pty":{"rows":5}}}').shell_exec.pty
    assert (pty.rows, pty.cols, pty.term) == (5, 0, "")
    with pytest.raises(ProtocolError, match="open_stdin must be a boolean"):
        codec.decode_command(base + b',"open_stdin":1}}')
    with pytest.raises(ProtocolError, match="Stdin.data must be a string"):
        codec.decode_command(b'{"type":"Stdin","data":{"request_id":"' + RID.encode() + b'","data":[1]}}')
