"""The command table (smith_fast/service/commands.py) and the request runner seam (runner.py).

The table is what dispatch, the capability and size checks, metrics and the local runner read, so
a command type the schema has but the table lacks would be refused as unsupported: these tests
make the schema and the table agree. The session tests build a session with the runner seam's
factory (``Session(runner=...)``), handshake, and run real requests through the local runner.
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid

from smith_fast.jsonl._fields import COMMANDS_BY_ONEOF, V1_ONLY_COMMANDS
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.commands import COMMANDS
from smith_fast.service.config import ServiceConfig
from smith_fast.service.core import ServiceCore
from smith_fast.service.runner import LocalRunner
from smith_fast.service.session import Session
from smith_fast.service.sinks import V1Sink

_COMMAND_TYPES = [f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["command_type"].fields]


def test_every_command_type_of_the_schema_has_a_row() -> None:
    assert sorted(COMMANDS) == sorted(_COMMAND_TYPES)
    for kind, spec in COMMANDS.items():
        assert spec.kind == kind


def test_v0_names_are_the_v0_codecs() -> None:
    for kind, spec in COMMANDS.items():
        if kind in V1_ONLY_COMMANDS:
            assert spec.v0_name is None and kind not in COMMANDS_BY_ONEOF, kind
        else:
            assert spec.v0_name == COMMANDS_BY_ONEOF[kind][0], kind


def test_requests_have_handlers_and_request_ids() -> None:
    # Rows with a handler start requests, which carry a request id; the session answers the others.
    handled = {kind for kind, spec in COMMANDS.items() if spec.handler is not None}
    assert handled == {"shell_exec", "tool_call", "hook_load", "plan", "list_processes", "attach", "checkpoint", "restore", "diff", "undo"}
    for kind in handled:
        assert "request_id" in getattr(pb, type(getattr(pb.Command(), kind)).__name__).DESCRIPTOR.fields_by_name


def test_metrics_histograms_come_from_the_table(tmp_path: pathlib.Path) -> None:
    timed = [kind for kind, spec in COMMANDS.items() if spec.timed]
    assert timed == ["shell_exec", "tool_call", "checkpoint", "restore", "diff", "undo"]
    assert list(ServiceCore(ServiceConfig(root=tmp_path)).metrics.latency) == timed


def test_capability_and_size_columns() -> None:
    shell = pb.ShellExecCommand(request_id="r", command="echo hé", env={"A": "b"})
    assert COMMANDS["shell_exec"].needs(shell) == pb.CAPABILITY_SHELL_EXEC
    assert COMMANDS["shell_exec"].size(shell) == len("echo hé".encode()) + len("A=b") + 1  # exec's NAME=value\0
    assert COMMANDS["hook_load"].needs(pb.HookLoadCommand(hook_type="js")) == pb.CAPABILITY_HOOKS_JS
    assert COMMANDS["hook_load"].needs(pb.HookLoadCommand(hook_type="lua")) == "hooks for 'lua'"
    assert COMMANDS["tool_call"].needs is None
    assert COMMANDS["tool_call"].size(pb.ToolCallCommand(args=b"{}")) == 2
    for kind in V1_ONLY_COMMANDS:  # the workspace commands (PROTOCOL.md, "Workspaces")
        spec = COMMANDS[kind]
        assert spec.needs is not None and spec.needs(getattr(pb.Command(), kind)) == pb.CAPABILITY_WORKSPACES, kind
        assert spec.size is None and spec.control is None and spec.now is None


def _events(out: list[bytes]) -> list[pb.Event]:
    return [pb.Envelope.FromString(data).event for data in out]


def _run_handshaken(tmp_path: pathlib.Path, capabilities: tuple[int, ...], command: pb.Command, offer: tuple[int, ...] = ()) -> list[pb.Event]:
    """The events of ``command`` in a session built with a LocalRunner factory, after a handshake
    asking for ``capabilities`` (the handshake's own events left out); the core offers ``offer`` too."""
    (tmp_path / "a.txt").write_text("hello\n")

    async def main() -> list[pb.Event]:
        core = ServiceCore(ServiceConfig(root=tmp_path))
        for capability in offer:
            core.offer(capability, True)
        out: list[bytes] = []
        closed: list[bool] = []
        session = Session(
            core, V1Sink(out.append, framed=False),
            close=lambda: closed.append(True),
            runner=lambda host: LocalRunner(core, host),
            peer="test",
        )
        assert isinstance(session.runner, LocalRunner) and not session.handshaken
        session.handle(pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=capabilities)))
        assert session.handshaken and session.granted == frozenset(capabilities)
        answered = len(out)
        session.handle(command)
        await session.finish()
        assert closed == [True]
        assert session not in core.sessions
        return _events(out[answered:])

    return asyncio.run(main())


def test_a_session_runs_requests_through_its_runner(tmp_path: pathlib.Path) -> None:
    rid = str(uuid.uuid4())
    command = pb.Command(tool_call=pb.ToolCallCommand(request_id=rid, tool="fs.read", args=b'{"path": "a.txt"}'))
    events = _run_handshaken(tmp_path, (), command)
    kinds = [e.WhichOneof("event_type") for e in events]
    assert kinds == ["state_change", "tool_result", "state_change"], kinds
    assert [events[0].state_change.state, events[2].state_change.state] == [pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY]
    assert events[1].tool_result.success and events[1].tool_result.request_id == rid
    assert b"hello" in events[1].tool_result.result


def test_its_requests_need_what_its_handshake_was_granted(tmp_path: pathlib.Path) -> None:
    rid = str(uuid.uuid4())
    command = pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command="echo hi"))
    refused = _run_handshaken(tmp_path, (), command)
    assert [e.WhichOneof("event_type") for e in refused] == ["error", "state_change"]
    assert refused[0].error.error_code == pb.ERROR_CODE_INVALID_CAPABILITY
    assert refused[1].state_change.state == pb.SERVICE_STATE_ERROR

    ran = _run_handshaken(tmp_path, (pb.CAPABILITY_SHELL_EXEC,), command)
    out = "".join(e.shell_output.stdout for e in ran if e.WhichOneof("event_type") == "shell_output")
    assert out == "hi\n"
    exits = [e.shell_output for e in ran if e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished]
    assert [x.exit_code for x in exits] == [0]
    assert ran[-1].state_change.state == pb.SERVICE_STATE_READY


def test_control_rows_address_a_running_request() -> None:
    # Control commands run nothing of their own: the session hands them to its runner at once.
    control = {kind for kind, spec in COMMANDS.items() if spec.control is not None}
    assert control == {"cancel", "stdin", "resize"}
    for kind in control:
        spec = COMMANDS[kind]
        assert spec.handler is None and spec.needs is None and not spec.timed
        assert "request_id" in getattr(pb, type(getattr(pb.Command(), kind)).__name__).DESCRIPTOR.fields_by_name
    assert COMMANDS["stdin"].size(pb.StdinCommand(data=b"abc")) == 3


_WORKSPACE_COMMANDS = {
    "checkpoint": pb.CheckpointCommand(label="before"),
    "restore": pb.RestoreCommand(checkpoint_id="k1"),
    "diff": pb.DiffCommand(from_id="k1"),
    "undo": pb.UndoCommand(target_request_id="r1"),
}


def test_workspace_commands_need_the_capability(tmp_path: pathlib.Path) -> None:
    # A service without --workspaces offers no `workspaces`: the handshake could not be granted it,
    # and each command is refused as any command whose capability is missing.
    for kind, body in _WORKSPACE_COMMANDS.items():
        rid = str(uuid.uuid4())
        command = pb.Command(**{kind: body})
        getattr(command, kind).request_id = rid
        events = _run_handshaken(tmp_path, (), command)
        assert [e.WhichOneof("event_type") for e in events] == ["error", "state_change"], kind
        assert events[0].error.error_code == pb.ERROR_CODE_INVALID_CAPABILITY and events[0].error.request_id == rid
        assert events[1].state_change.state == pb.SERVICE_STATE_ERROR and events[1].state_change.request_id == rid


def test_workspace_commands_without_a_workspace_say_how_to_get_one(tmp_path: pathlib.Path) -> None:
    # Granted `workspaces` but the session has none (LocalRunner.workspace None): one ErrorEvent
    # with reason no_workspace naming the option, then ERROR; nothing else is sent.
    for kind, body in _WORKSPACE_COMMANDS.items():
        rid = str(uuid.uuid4())
        command = pb.Command(**{kind: body})
        getattr(command, kind).request_id = rid
        events = _run_handshaken(tmp_path, (pb.CAPABILITY_WORKSPACES,), command, offer=(pb.CAPABILITY_WORKSPACES,))
        kinds = [e.WhichOneof("event_type") for e in events]
        assert kinds == ["state_change", "error", "state_change"], (kind, kinds)
        assert events[0].state_change.state == pb.SERVICE_STATE_PROCESSING
        error = events[1].error
        assert error.request_id == rid and error.error_code == pb.ERROR_CODE_UNSPECIFIED
        assert error.details["reason"] == "no_workspace" and "--workspaces" in error.message
        assert events[2].state_change.state == pb.SERVICE_STATE_ERROR and events[2].state_change.request_id == rid


def test_recorded_requests_run_as_before_without_a_workspace(tmp_path: pathlib.Path) -> None:
    # The brackets around a ShellExec and an fs.write are no-ops without a workspace: the final
    # ShellOutput and the ToolResult carry no changes, and an fs.write still answers in one step.
    rid = str(uuid.uuid4())
    ran = _run_handshaken(tmp_path, (pb.CAPABILITY_SHELL_EXEC,), pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command="echo hi > b.txt")))
    final = [e.shell_output for e in ran if e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished]
    assert [f.exit_code for f in final] == [0] and not final[0].HasField("changes")
    assert (tmp_path / "b.txt").read_text() == "hi\n"
    wid = str(uuid.uuid4())
    wrote = _run_handshaken(tmp_path, (), pb.Command(tool_call=pb.ToolCallCommand(request_id=wid, tool="fs.write", args=b'{"path": "c.txt", "content": "x"}')))
    assert [e.WhichOneof("event_type") for e in wrote] == ["state_change", "tool_result", "state_change"]
    assert wrote[1].tool_result.success and not wrote[1].tool_result.HasField("changes")
    assert (tmp_path / "c.txt").read_text() == "x"
