"""One MCP session on the service core: JSON-RPC messages in, Smith commands to a session, MCP
messages out.

The endpoint owns a :class:`~smith_fast.service.session.Session` made with ``core.new_session``
and an :class:`~smith_fast.mcp.sink.McpSink`; it answers the protocol's own requests
(``initialize``, ``ping``, ``tools/list``, ``logging/setLevel``) itself and turns each
``tools/call`` into a ``ToolCallCommand`` or ``ShellExecCommand`` with a request id of its own, so
admission, limits, hooks, recording, tracing and metrics are the session's, as for every front.
Calls run concurrently (each is a session request); the transport decides where a call's messages
go by the :class:`~smith_fast.mcp.sink.Channel` it passes with the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..logs import get_logger
from ..pb import smith_pb2 as pb
from . import protocol
from .results import FOOTER_ROOM, OutputDir, shares
from .shell_state import ShellState, new_marker, wrap
from .shell_result import shell_result
from .sink import Call, Channel, McpSink, ShellCall

if TYPE_CHECKING:
    from ..service.core import ServiceCore

__all__ = ["McpEndpoint"]

log = get_logger("smith_fast.mcp")

# What the front's session asks for: commands and tracing (recording follows --record; the
# replay capability would record every MCP session by default, and hooks are loaded with
# serve --hook, not by MCP clients).
_CAPABILITIES = (pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_TRACING)


class McpEndpoint:
    """An MCP session.

    Args:
        core: the service core.
        peer: a printable peer name for logs.
        close: called once when the session is over (the transport then ends).
        authenticated: the transport checked the peer (stdio: it started us; HTTP: its bearer token).
        notify: where messages that belong to no request go (logs); None drops them.
        unsent: the bytes the transport still holds for the client, counted against
            ``--max-session-buffer`` (:mod:`smith_fast.service.flow`).
    """

    def __init__(
        self,
        core: ServiceCore,
        *,
        peer: str,
        close: Callable[[], None],
        authenticated: bool,
        notify: Channel | None = None,
        unsent: Callable[[], int] | None = None,
    ) -> None:
        self.core = core
        self.calls: dict[str, Call] = {}
        self._by_id: dict[Any, str] = {}  # JSON-RPC id of a running call -> its request id
        self._next = 0
        self._close = close
        self.notify = notify
        self.initialized = False
        self.revision: str | None = None
        self._log_threshold = protocol.LOG_LEVELS.index("warning")
        self._paused = 0
        self._room = core.limits.tool_max_output
        self._listing: bytes | None = None
        self.cancelled: set[str] = set()
        self.shell_state = ShellState()  # where the next ``shell`` call starts (shell_state.py)
        self._marker = new_marker()
        self.outputs = OutputDir(core.config.state_dir)
        self.sink = McpSink(self)
        front = {} if unsent is None else {"unsent": unsent}
        self.session = core.new_session(self.sink, close=self._closed, peer=peer, protocol="mcp", **front)
        if authenticated:
            self.session.authenticated = True
        handshake = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[c for c in _CAPABILITIES if c in core.capabilities]))
        if self.session.recorder is not None:  # so that the log replays as the v1 session it was
            self.session.recorder.record_command(handshake)
        self.session.handle(handshake)
        self._methods: Mapping[str, Callable[[Any, Any, Channel], None]] = {
            "initialize": self._initialize,
            "ping": self._ping,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "logging/setLevel": self._set_level,
        }

    @property
    def closing(self) -> bool:
        return self.session.closing

    # ---- input -------------------------------------------------------------------------------

    def handle(self, message: Any, channel: Channel) -> None:
        """One decoded JSON-RPC message (a request, a notification, or a response we ignore)."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            rid = message.get("id") if isinstance(message, dict) else None
            channel.send(protocol.error_response(rid, protocol.INVALID_REQUEST, "not a JSON-RPC 2.0 message"), True)
            return
        method = message.get("method")
        if method is None:
            return  # a response to a request of ours: we send none
        params = message.get("params")
        if "id" not in message:
            if method == "notifications/cancelled" and isinstance(params, dict):
                self._cancelled(params.get("requestId"))
            elif method == "notifications/initialized":
                self.initialized = True
            return
        request_id = message["id"]
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            channel.send(protocol.error_response(None, protocol.INVALID_REQUEST, "the id must be a string or an integer"), True)
            return
        if params is not None and not isinstance(params, dict):
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, "params must be an object"), True)
            return
        handler = self._methods.get(method) if isinstance(method, str) else None
        if handler is None:
            channel.send(protocol.error_response(request_id, protocol.METHOD_NOT_FOUND, f"method {method!r} is not supported by smith-fast"), True)
            return
        if self.revision is None and method not in ("initialize", "ping"):
            channel.send(protocol.error_response(request_id, protocol.INVALID_REQUEST, f"{method} before initialize: send initialize first"), True)
            return
        handler(request_id, params or {}, channel)

    def _initialize(self, request_id: Any, params: Any, channel: Channel) -> None:
        self.revision = protocol.negotiate_revision(params.get("protocolVersion"))
        limits = self.core.limits
        facts = protocol.ServerFacts(
            root=str(self.core.tool_context.root),
            sandbox=self.core.config.sandbox,
            network=self.core.config.network,
            budget=limits.mcp_max_result_chars,
            output_dir=str(self.core.config.state_dir / "mcp-output"),
            default_timeout=limits.mcp_default_timeout,
            max_timeout=limits.mcp_max_timeout,
            max_output=limits.max_output,
        )
        channel.send(protocol.response(request_id, protocol.initialize_result(self.revision, facts)), True)

    def _ping(self, request_id: Any, _params: Any, channel: Channel) -> None:
        channel.send(protocol.response(request_id, {}), True)

    def _tools_list(self, request_id: Any, _params: Any, channel: Channel) -> None:
        if self._listing is None:  # the registry does not change while the service runs
            self._listing = orjson.dumps(protocol.tool_listing(self._listed()))
        channel.send(b'{"jsonrpc":"2.0","id":' + orjson.dumps(request_id) + b',"result":' + self._listing + b"}", True)

    def _listed(self) -> list[Any]:
        """The registry's tools an MCP client sees: all but the second ways to run a command and to
        list the tools (``shell.run``, ``tools.list``), unless ``--mcp-expose-all-tools``."""
        tools = self.core.tools.tools()
        if self.core.config.mcp_expose_all_tools:
            return list(tools)
        return [t for t in tools if t.name not in protocol.HIDDEN_TOOLS]

    def _set_level(self, request_id: Any, params: Any, channel: Channel) -> None:
        level = params.get("level")
        if level not in protocol.LOG_LEVELS:
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, f"level must be one of {', '.join(protocol.LOG_LEVELS)}"), True)
            return
        self._log_threshold = protocol.LOG_LEVELS.index(level)
        channel.send(protocol.response(request_id, {}), True)

    def _tools_call(self, request_id: Any, params: Any, channel: Channel) -> None:
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, "tools/call takes a name (string) and arguments (object)"), True)
            return
        shell = name == protocol.SHELL_TOOL
        hidden = name in protocol.HIDDEN_TOOLS and not self.core.config.mcp_expose_all_tools
        if not shell and (name not in self.core.tools or hidden):
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, f"unknown tool {name!r}; tools/list names them"), True)
            return
        if request_id in self._by_id:
            channel.send(protocol.error_response(request_id, protocol.INVALID_REQUEST, f"request {request_id!r} is already running"), True)
            return
        self._next += 1
        rid = f"mcp-{self._next}"
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        shell_call: ShellCall | None = None
        if shell:
            limits = self.core.limits
            try:
                args = protocol.shell_arguments(arguments, limits.mcp_default_timeout, limits.mcp_max_timeout)
            except ValueError as exc:
                channel.send(protocol.response(request_id, _tool_error(f"invalid arguments: {exc}")), True)
                return
            state = ShellState() if args.fresh else self.shell_state
            cmd = pb.ShellExecCommand(
                request_id=rid,
                command=wrap(args.command, self._marker, None if args.cwd is not None else state.cwd),
            )
            if args.timeout > 0:  # 0: both --mcp-default-timeout and --mcp-max-timeout are 0 (none)
                cmd.timeout_ms = max(1, round(args.timeout * 1000))
            if args.cwd is not None:
                cmd.cwd = args.cwd
            cmd.env.update(state.command_env(args.env))
            command = pb.Command(shell_exec=cmd)
            shell_call = ShellCall(limits.mcp_max_result_chars, self._marker, state, self.outputs, rid, args.timeout,
                                   args.capped, args.cwd is not None)
        else:
            command = pb.Command(tool_call=protocol.tool_command(rid, name, arguments))
        self.calls[rid] = Call(request_id, shell, channel, token, self._room)
        self.calls[rid].shell_call = shell_call
        self._by_id[request_id] = rid
        if self.session.recorder is not None:
            self.session.recorder.record_command(command)
        self.session.handle(command)  # its terminal state ends the call (ended)

    def _cancelled(self, request_id: Any) -> None:
        rid = self._by_id.get(request_id) if isinstance(request_id, str | int) else None
        call = self.calls.get(rid) if rid is not None else None
        if rid is None or call is None:
            return  # finished already, or never ours: the specification says to ignore it
        # No response is sent for a cancelled request, so the call is over for us now (a task
        # cancelled before it ran never reaches a terminal state).
        call.cancelled = True
        if len(self.cancelled) >= 1024:  # the late events of a cancelled call come within moments
            self.cancelled.clear()
        self.cancelled.add(rid)
        del self.calls[rid]
        self._by_id.pop(request_id, None)
        self.cancel(rid)

    def cancel(self, rid: str) -> None:
        """Stop a running request with the runner seam's Cancel, as a Smith peer's CancelCommand
        does: its processes get SIGTERM, then SIGKILL after ``--kill-grace``, and it ends cancelled."""
        self.session.cancel(rid)

    # ---- output ------------------------------------------------------------------------------

    def ended(self, rid: str, call: Call) -> None:
        """A call reached its terminal state: answer it (unless it was cancelled)."""
        self._by_id.pop(call.id, None)
        if call.cancelled:
            return
        result = self._shell_result(call) if call.shell else _tool_result(call)
        call.channel.send(protocol.response(call.id, result), True)

    def _shell_result(self, call: Call) -> dict[str, Any]:
        shell = call.shell_call
        assert shell is not None
        after = shell.state.after(shell.splitter.sections, self.core.config.allow_env, self.core.config.env_policy)
        dropped: list[str] = []
        if after is not None:
            self.shell_state, dropped = after
        budget = self.core.limits.mcp_max_result_chars
        out_share, err_share = shares(max(0, budget - FOOTER_ROOM), shell.out.chars, shell.err.chars)
        stdout, out_cut = shell.out.finish(out_share, self.outputs, f"{shell.name}.stdout.txt")
        stderr, err_cut = shell.err.finish(err_share, self.outputs, f"{shell.name}.stderr.txt")
        return shell_result(call, stdout, stderr, out_cut, err_cut, self.shell_state, after is not None, dropped)

    def log(self, level: str, message: str, rid: str | None, fields: Mapping[str, str]) -> None:
        if protocol.LOG_LEVELS.index(level) < self._log_threshold or self.revision is None:
            return
        if rid is not None and rid in self.cancelled:
            return  # the client cancelled it: nothing about it goes back
        call = self.calls.get(rid) if rid is not None else None
        channel = call.channel if call is not None and not call.cancelled else self.notify
        if channel is None:
            return
        data: dict[str, Any] = {"message": message, **fields}
        if call is not None:
            data["requestId"] = call.id
        channel.send(protocol.notification("notifications/message", {"level": level, "logger": "smith-fast", "data": data}), False)

    # ---- flow control and the end ----------------------------------------------------------------

    def pause(self) -> None:
        """A transport stopped taking output: stop producing it (the session's child pipes)."""
        self._paused += 1
        if self._paused == 1:
            self.session.pause()

    def resume(self) -> None:
        self._paused -= 1
        if self._paused == 0:
            self.session.resume()

    async def finish(self) -> None:
        """The client sends no more: let the running calls end, then close."""
        await self.session.finish()

    async def shutdown(self) -> None:
        await self.session.shutdown()

    def connection_lost(self) -> None:
        """The client is gone: nobody to answer, so stop everything now."""
        self.session.connection_lost()
        self._closed()

    def _closed(self) -> None:
        self.outputs.remove()
        close, self._close = self._close, _nothing
        close()


def _nothing() -> None:
    pass


def _tool_error(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}


def _tool_result(call: Call) -> dict[str, Any]:
    if call.errors or not call.success:
        return _tool_error("; ".join(call.errors) or "the tool failed")
    text = call.result.decode()
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    try:
        value = orjson.loads(call.result)
    except orjson.JSONDecodeError:
        return result
    if isinstance(value, dict):  # what Claude Code and Codex show the model: the same facts as the text
        result["structuredContent"] = value
    return result


