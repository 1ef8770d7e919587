"""Fuzz the fields of v0 commands as far as the service reads them before anything runs (found by
review: a NUL in a v0 ``cwd`` reached ``os.path.realpath`` and came back as ``INTERNAL_ERROR ValueError``).

Input layout: the bytes are cut at ``\\xfe`` into field values (decoded as UTF-8 with lone
surrogates kept, which JSON carries as ``\\udcXX`` escapes); they fill, in turn, a ``ShellExec``'s
``command``, ``shell``, ``cwd``, an ``env`` name and value, a ``ToolCall``'s ``tool`` and ``path``
argument and a ``Plan``'s ``goal``. Each line is decoded by both v0 backends, then put through what
the service does before running it:

* ShellExec: ``--max-command-size``'s measure, the env policy, the NUL check of the choke point
  (``launch.refuse_nul``) and the working directory as a confined command gets it;
* Plan: the rules planner;
* ToolCall: the workspace's path resolution.

Checked on every input: the backends agree; decoding and every check either pass or raise a
``ProtocolError`` whose code is not ``INTERNAL_ERROR`` (the path resolution of a tool: a
``ValueError``/``OSError``, which a tool call reports as its failed result); nothing else escapes.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from fuzz._common import fuzz_main, instrumented, outcome

with instrumented(__name__):
    from smith_fast.errors import ProtocolError
    from smith_fast.jsonl import JsonlCodec
    from smith_fast.pb import smith_pb2 as pb
    from smith_fast.plan.rules import RulesPlanner
    from smith_fast.refused_env import check_env
    from smith_fast.service.launch import refuse_nul
    from smith_fast.service.shell_exec import working_directory
    from smith_fast.service.sizes import command_size
    from smith_fast.tools import ToolContext

CODECS = (JsonlCodec("json"), JsonlCodec("orjson"))
RID = "6f1c2a4e-1b2c-4d3e-8f90-0123456789ab"
ROOT = pathlib.Path(tempfile.gettempdir()).resolve()
TOOLS = ToolContext(root=ROOT)
PLANNER = RulesPlanner()
_ERR = ("code", "details", "request_id")


def _fields(data: bytes) -> list[str]:
    values = [part.decode("utf-8", "surrogateescape") for part in data.split(b"\xfe")]
    return (values + [""] * 8)[:8]


def _lines(values: list[str]) -> list[bytes]:
    command, shell, cwd, name, value, tool, path, goal = values
    messages = [
        {"type": "ShellExec", "data": {"request_id": RID, "command": command, "shell": shell or None, "cwd": cwd or None,
                                       "env": {name: value} if name else {}, "timeout_ms": None}},
        {"type": "ToolCall", "data": {"request_id": RID, "tool": tool or "fs.read", "args": {"path": path}, "timeout_ms": None}},
        {"type": "Plan", "data": {"request_id": RID, "goal": goal or command, "context": {}}},
    ]
    return [json.dumps(m).encode() for m in messages]


def _not_internal(result: tuple[object, ...], what: str) -> None:
    if result[0] == "err":
        assert result[1] is ProtocolError or issubclass(result[1], ProtocolError), f"{what} raised {result[1]}: {result[2]}"  # type: ignore[arg-type]
        assert result[3]["code"] != pb.ERROR_CODE_INTERNAL_ERROR, f"{what}: {result[2]}"  # type: ignore[index]


def _shell_exec(cmd: pb.ShellExecCommand) -> None:
    command_size(cmd)
    check_env(cmd.env, request_id=RID)
    refuse_nul(cmd, RID, "shell_exec")
    working_directory(ROOT, cmd.cwd if cmd.HasField("cwd") else None, confined=True)


def check_line(line: bytes) -> None:
    results = [outcome(codec.decode_command, line, attrs=_ERR) for codec in CODECS]
    assert results[0][:2] == results[1][:2], f"backends disagree on {line[:300]!r}: {results!r:.600}"
    _not_internal(results[0], "decode_command")
    if results[0][0] != "ok":
        return
    command = results[0][1]
    kind = command.WhichOneof("command_type")
    if kind == "shell_exec":
        _not_internal(outcome(_shell_exec, command.shell_exec, attrs=_ERR), "the ShellExec checks")
    elif kind == "plan":
        _not_internal(outcome(PLANNER.plan_now, command.plan.goal, dict(command.plan.context), attrs=_ERR), "the planner")
    elif kind == "tool_call":
        args = json.loads(command.tool_call.args or b"{}")
        try:
            TOOLS.resolve(str(args.get("path", "")))
        except (ValueError, OSError, ProtocolError):
            pass  # a tool call's failed result (the registry reports it), never an internal error


def test_one_input(data: bytes) -> None:
    for line in _lines(_fields(data)):
        check_line(line)


if __name__ == "__main__":
    fuzz_main(test_one_input)
