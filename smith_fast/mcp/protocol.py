"""What the MCP front says, independent of its transport: revisions, error codes, the tool listing,
and how a ``tools/call`` becomes a Smith command and its events become a ``CallToolResult``.

MCP (the Model Context Protocol, https://modelcontextprotocol.io) is JSON-RPC 2.0. A ``tools/call``
of a registered tool becomes a ``ToolCallCommand``; one of the ``shell`` tool a ``ShellExecCommand``
(PROTOCOL.md, "MCP"). Everything else a request does (limits, hooks, recording, tracing, metrics)
follows from that, as for any other front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from .._version import __version__
from ..pb import smith_pb2 as pb
from ..tools import Tool

__all__ = [
    "REVISIONS",
    "LATEST",
    "MODERN",
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
    "HIDDEN_TOOLS",
    "ServerFacts",
    "ShellArguments",
    "instructions",
    "shell_arguments",
    "error_message",
    "response",
    "notification",
]

# The initialize-handshake revisions, newest first: 2025-11-25 is what the official SDKs offer in
# ``initialize``; the older ones are still sent by clients that have not been updated. (The
# stateless 2026-07-28 starts with ``server/discover``, which we answer only with --mcp-discover:
# otherwise the SDKs fall back to ``initialize``, and the shell keeps its state between calls.)
REVISIONS: Final[tuple[str, ...]] = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST: Final[str] = REVISIONS[0]

# The stateless revision: no initialize, no session; every request carries its protocol version
# and the client's capabilities in ``params._meta`` (envelope.py), every result a ``resultType``.
MODERN: Final = "2026-07-28"
VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
LOG_LEVEL_KEY: Final = "io.modelcontextprotocol/logLevel"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
# Ours, in ``_meta`` (a prefix outside the reserved ``*.modelcontextprotocol``/``*.mcp`` ones):
# the output cursor a ``tasks/get`` asks from and the output it gets back.
CURSOR_KEY: Final = "smith-fast/cursor"
OUTPUT_KEY: Final = "smith-fast/output"
# How long a client may cache what does not change while the service runs (tools/list,
# server/discover): the registry is fixed at start-up, but a restart may load other plugins.
LISTING_TTL_MS: Final = 300_000

# JSON-RPC 2.0 error codes (MCP uses them as they are).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# The 2026-07-28 revision's own: headers that disagree with the body, a client capability a
# request needs and did not declare, a protocol version we do not speak.
HEADER_MISMATCH: Final = -32020
MISSING_CLIENT_CAPABILITY: Final = -32021
UNSUPPORTED_VERSION: Final = -32022

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

# The registry's tools an MCP client does not see unless --mcp-expose-all-tools: a second way to
# run a command (without the state ``shell`` keeps) and to list what tools/list lists.
HIDDEN_TOOLS: Final = frozenset({"shell.run", "tools.list"})

SHELL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "the command line, run by /bin/sh -c"},
        "cwd": {
            "type": "string",
            "description": "working directory, relative to the workspace root; default: where the previous call left off (the root at first)",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "seconds (not milliseconds) before the process group is terminated; default and maximum: see the server's instructions",
        },
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "extra environment variables for this call only"},
        "fresh": {
            "type": "boolean",
            "default": False,
            "description": "start from the root and the service's environment, forgetting the directory and exported variables of earlier calls",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}
_CUT = {
    "type": ["object", "null"],
    "description": "null: shown whole; else what the result shows of the stream and where the whole of it is",
    "properties": {
        "head_lines": {"type": "integer"},
        "tail_lines": {"type": "integer"},
        "cut_lines": {"type": "integer"},
        "cut_bytes": {"type": "integer"},
        "total_lines": {"type": "integer"},
        "total_bytes": {"type": "integer"},
        "file": {"type": ["string", "null"], "description": "the whole stream, readable with fs.read (offset/limit in lines)"},
    },
    "required": ["head_lines", "tail_lines", "cut_lines", "cut_bytes", "total_lines", "total_bytes", "file"],
}
SHELL_OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "stdout": {"type": "string", "description": "the output, or its head and tail with a marker line where lines were cut"},
        "stderr": {"type": "string"},
        "exit_code": {"type": ["integer", "null"], "description": "negative: killed by that signal; null: it never ran"},
        "stdout_bytes": {"type": "integer", "description": "bytes the command wrote to stdout (all of them, shown or not)"},
        "stderr_bytes": {"type": "integer"},
        "truncated": {"type": "boolean", "description": "not all the output is shown here (see cut, output_capped)"},
        "cut": {"type": "object", "properties": {"stdout": _CUT, "stderr": _CUT}, "required": ["stdout", "stderr"]},
        "output_file": {"type": ["string", "null"], "description": "the whole output of a cut stream (stdout's if both were cut)"},
        "output_capped": {"type": "boolean", "description": "the command wrote more than --max-output: the rest was not read"},
        "timed_out": {"type": "boolean"},
        "timeout_s": {"type": "number", "description": "the timeout the call ran with, in seconds"},
        "timeout_capped": {"type": "boolean", "description": "the timeout asked for was over the maximum, which was used"},
        "killed": {"type": "boolean", "description": "ended by a signal, a timeout, a limit or a cancel"},
        "signal": {"type": ["integer", "null"]},
        "kill_reason": {"type": ["string", "null"], "description": "why it was killed: timeout, limit FLAG, cancelled, or the signal"},
        "refused": {"type": "boolean", "description": "the command did not run (a hook, the env policy, the sandbox, no process slot)"},
        "refusal": {"type": ["string", "null"], "description": "why: hook_blocked, env_refused, cwd_outside_root …"},
        "errors": {"type": "array", "items": {"type": "string"}},
        "cwd": {"type": ["string", "null"], "description": "where the next call starts (null: the root)"},
        "state_saved": {"type": "boolean", "description": "this call's directory and exported variables were kept for the next"},
        "env_not_kept": {"type": "array", "items": {"type": "string"}, "description": "variables it exported that the env policy does not carry"},
        "egress_refused": {
            "type": "array", "description": "connections the egress proxy refused it (--network allow): host, port, the rule that decided, why",
            "items": {"type": "object", "properties": {k: {"type": "string"} for k in ("host", "port", "rule", "message")},
                      "required": ["host", "port", "rule", "message"]},
        },
    },
    "required": [
        "stdout", "stderr", "exit_code", "stdout_bytes", "stderr_bytes", "truncated", "cut", "output_file", "output_capped",
        "timed_out", "timeout_s", "timeout_capped", "killed", "signal", "kill_reason", "refused", "refusal", "errors", "cwd",
        "state_saved", "env_not_kept", "egress_refused",
    ],
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


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the ``instructions`` of ``initialize`` tell the model about this service."""

    root: str
    sandbox: str
    network: str
    budget: int
    output_dir: str
    default_timeout: float
    max_timeout: float
    max_output: int


def instructions(facts: ServerFacts) -> str:
    confined = (
        "off: commands run with the service's rights"
        if facts.sandbox == "off"
        else f"{facts.sandbox}: commands see the host read-only"
        + (", may write only beneath the root" if facts.sandbox == "workspace-write" else "")
        + " and a private /tmp"
    )
    return (
        f"Tools run in the workspace root {facts.root}; fs.* paths are relative to it. "
        f"Sandbox {confined}; network {facts.network}. "
        "`shell` runs a command with /bin/sh; between calls of this session it keeps the working directory and the "
        "variables you export (`\"fresh\": true` starts over from the root), and reports the directory after each command. "
        f"Timeout: {facts.default_timeout:g} s unless the call gives `timeout` (seconds), at most {facts.max_timeout:g} s. "
        f"A result shows at most {facts.budget} characters of output: the head and the tail of a longer stream, with a marker "
        f"line; the whole stream goes to a file under {facts.output_dir} (its path is in the result), which fs.read reads by "
        "lines (`offset` 1-based, `limit`) while the session lasts. "
        f"A command's output beyond {facts.max_output} bytes is not read. "
        "isError is true when a command exits non-zero, times out, is killed or is refused; structuredContent says which."
    )


def initialize_result(revision: str, facts: ServerFacts) -> dict[str, Any]:
    return {
        "protocolVersion": revision,
        # The registry is fixed once the service runs (plugins load at start-up): no listChanged.
        "capabilities": {"tools": {"listChanged": False}, "logging": {}},
        "serverInfo": server_info(),
        "instructions": instructions(facts),
    }


def server_info() -> dict[str, Any]:
    return {"name": "smith-fast", "title": "smith-fast", "version": __version__}


def discover_result(facts: ServerFacts) -> dict[str, Any]:
    """The ``server/discover`` result: what ``initialize`` tells, for the stateless revision."""
    return {
        "resultType": "complete",
        "supportedVersions": [MODERN],
        # No logging capability: 2026-07-28 asks for logs per request (``_meta`` logLevel).
        "capabilities": {"tools": {"listChanged": False}, "extensions": {TASKS_EXTENSION: {}}},
        "instructions": instructions(facts) + " " + STATELESS_NOTE,
        "ttlMs": LISTING_TTL_MS,
        "cacheScope": "public",
        "_meta": {SERVER_INFO_KEY: server_info()},
    }


STATELESS_NOTE: Final = (
    "Requests of protocol revision 2026-07-28 are stateless: each `shell` call starts from the root and the "
    "service's environment (pass `cwd` to go on where a call left off; its result names the directory)."
)


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
                "Run a shell command in the workspace. The working directory and exported variables carry over "
                "to the next call (fresh: true starts over); output streams as progress notifications; the result "
                "holds stdout, stderr (head and tail when long, the whole in a file fs.read reads), the exit code, "
                "whether it timed out, was killed or refused, and the directory it left."
            ),
            "inputSchema": SHELL_SCHEMA,
            "outputSchema": SHELL_OUTPUT_SCHEMA,
            "annotations": dict(ANNOTATIONS[SHELL_TOOL]),
        }
    )
    return {"tools": listed}


@dataclass(frozen=True, slots=True)
class ShellArguments:
    """The arguments of a ``shell`` call, checked (:func:`shell_arguments`)."""

    command: str
    cwd: str | None
    timeout: float  # seconds
    capped: bool  # the timeout asked for was over the maximum
    env: dict[str, str]
    fresh: bool


def shell_arguments(args: Mapping[str, Any], default_timeout: float, max_timeout: float) -> ShellArguments:
    """The arguments of a ``shell`` call.

    Raises:
        ValueError: an argument of the wrong shape (the call then fails as a tool error).
    """
    extra = set(args) - set(SHELL_SCHEMA["properties"])
    if extra:
        raise ValueError(f"unknown argument(s) {', '.join(sorted(extra))}; shell takes {', '.join(SHELL_SCHEMA['properties'])}")
    command = args.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError("command must be a non-empty string")
    cwd = args.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError("cwd must be a string")
    timeout = args.get("timeout")
    capped = False
    if timeout is None:
        timeout = default_timeout if default_timeout > 0 else max_timeout
    elif isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 2**31 / 1000:
        raise ValueError("timeout must be a positive number of seconds")
    if max_timeout > 0 and timeout > max_timeout:
        timeout, capped = max_timeout, True
    env = args.get("env")
    if env is None:
        env = {}
    elif not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must be an object of strings")
    fresh = args.get("fresh", False)
    if not isinstance(fresh, bool):
        raise ValueError("fresh must be a boolean")
    return ShellArguments(command, cwd, float(timeout), capped, dict(env), fresh)


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
