"""What the MCP front says, independent of its transport: revisions, error codes, the tool listing,
and how a ``tools/call`` becomes a Smith command and its events become a ``CallToolResult``.

MCP (the Model Context Protocol, https://modelcontextprotocol.io) is JSON-RPC 2.0. A ``tools/call``
of a registered tool becomes a ``ToolCallCommand``; one of the ``shell`` tool a ``ShellExecCommand``
(PROTOCOL.md, "MCP"). Everything else a request does (limits, hooks, recording, tracing, metrics)
follows from that, as for any other front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from .._version import __version__
from ..pb import smith_pb2 as pb
from ..tools import Tool

__all__ = [
    "REVISIONS",
    "LATEST",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "SHELL_TOOL",
    "LOG_LEVELS",
    "negotiate_revision",
    "initialize_result",
    "tool_listing",
    "shell_command",
    "tool_command",
    "error_message",
    "response",
    "notification",
]

# The initialize-handshake revisions, newest first: 2025-11-25 is what the official SDKs offer in
# ``initialize``; the older ones are still sent by clients that have not been updated. (The
# stateless 2026-07-28 era starts with ``server/discover``, which we answer "method not found",
# so the SDKs fall back to ``initialize``.)
REVISIONS: Final[tuple[str, ...]] = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST: Final[str] = REVISIONS[0]

# JSON-RPC 2.0 error codes (MCP uses them as they are).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

SHELL_TOOL: Final = "shell"

# RFC 5424 severities as MCP names them, and the Smith log levels they correspond to.
LOG_LEVELS: Final[tuple[str, ...]] = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
SMITH_LOG_LEVEL: Final[Mapping[int, str]] = {
    pb.LOG_LEVEL_TRACE: "debug",
    pb.LOG_LEVEL_DEBUG: "debug",
    pb.LOG_LEVEL_INFO: "info",
    pb.LOG_LEVEL_WARN: "warning",
    pb.LOG_LEVEL_ERROR: "error",
}

SHELL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "the command line, run by /bin/sh -c"},
        "cwd": {"type": "string", "description": "working directory; relative to the workspace root (default: the root)"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "seconds before the process group is terminated"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "extra environment variables"},
    },
    "required": ["command"],
    "additionalProperties": False,
}
SHELL_OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "exit_code": {"type": ["integer", "null"], "description": "negative: killed by that signal; null: it never ran"},
        "stdout_bytes": {"type": "integer", "description": "bytes the command wrote to stdout (all of them, kept or not)"},
        "stderr_bytes": {"type": "integer"},
        "truncated": {"type": "boolean", "description": "output beyond the result limit was left out"},
    },
    "required": ["stdout", "stderr", "exit_code", "stdout_bytes", "stderr_bytes", "truncated"],
}

# MCP tool annotations of the built-ins (hints for clients deciding what to confirm with the user);
# a plugin's tool has none, which clients read as "may write, not idempotent, open world".
_READ_ONLY: Final = {"readOnlyHint": True, "openWorldHint": False}
ANNOTATIONS: Final[Mapping[str, Mapping[str, Any]]] = {
    "fs.read": _READ_ONLY,
    "fs.list": _READ_ONLY,
    "fs.search": _READ_ONLY,
    "tools.list": _READ_ONLY,
    "fs.write": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False},
    "shell.run": {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
    SHELL_TOOL: {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
}


def negotiate_revision(requested: object) -> str:
    """The revision to answer an ``initialize`` with: the client's when we speak it, else our newest
    (the client then decides whether it can go on, as the specification says)."""
    return requested if isinstance(requested, str) and requested in REVISIONS else LATEST


def initialize_result(revision: str) -> dict[str, Any]:
    return {
        "protocolVersion": revision,
        # The registry is fixed once the service runs (plugins load at start-up): no listChanged.
        "capabilities": {"tools": {"listChanged": False}, "logging": {}},
        "serverInfo": {"name": "smith-fast", "title": "smith-fast", "version": __version__},
        "instructions": "Tools run in the service's workspace; `shell` runs a command there and streams its output as progress.",
    }


def tool_listing(tools: Sequence[Tool]) -> dict[str, Any]:
    """The ``tools/list`` result: the registry's tools, then ``shell``."""
    listed: list[dict[str, Any]] = []
    for tool in tools:
        entry: dict[str, Any] = {"name": tool.name, "description": tool.description, "inputSchema": dict(tool.schema)}
        if tool.name in ANNOTATIONS:
            entry["annotations"] = dict(ANNOTATIONS[tool.name])
        listed.append(entry)
    listed.append(
        {
            "name": SHELL_TOOL,
            "title": "Run a shell command",
            "description": (
                "Run a shell command in the workspace; output streams as progress notifications and the "
                "result holds stdout, stderr and the exit code."
            ),
            "inputSchema": SHELL_SCHEMA,
            "outputSchema": SHELL_OUTPUT_SCHEMA,
            "annotations": dict(ANNOTATIONS[SHELL_TOOL]),
        }
    )
    return {"tools": listed}


def shell_command(rid: str, args: Mapping[str, Any]) -> pb.ShellExecCommand:
    """The ShellExec of a ``shell`` call.

    Raises:
        ValueError: an argument of the wrong shape (the call then fails as a tool error).
    """
    extra = set(args) - {"command", "cwd", "timeout", "env"}
    if extra:
        raise ValueError(f"unknown argument(s) {', '.join(sorted(extra))}; shell takes command, cwd, timeout, env")
    command = args.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError("command must be a non-empty string")
    cmd = pb.ShellExecCommand(request_id=rid, command=command)
    cwd = args.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str):
            raise ValueError("cwd must be a string")
        cmd.cwd = cwd
    timeout = args.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 2**31 / 1000:
            raise ValueError("timeout must be a positive number of seconds")
        cmd.timeout_ms = max(1, round(timeout * 1000))
    env = args.get("env")
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env must be an object of strings")
        cmd.env.update(env)
    return cmd


def tool_command(rid: str, name: str, args: Mapping[str, Any]) -> pb.ToolCallCommand:
    return pb.ToolCallCommand(request_id=rid, tool=name, args=orjson.dumps(args))


def error_message(code: int, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


def response(request_id: Any, result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def error_response(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


def notification(method: str, params: Mapping[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params})
