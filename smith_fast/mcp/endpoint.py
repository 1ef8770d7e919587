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

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from .. import tracing
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.request import tool_call_command
from . import protocol
from .envelope import Envelope, EnvelopeError, envelope, is_modern
from .results import FOOTER_ROOM, OutputDir, shares
from .shell_state import ShellState, new_marker, wrap
from .shell_result import shell_result
from .sink import Call, Channel, McpSink, ShellCall
from .tasks import TASK_AFTER, Task, TaskTable

if TYPE_CHECKING:
    from ..service.core import ServiceCore

__all__ = ["McpEndpoint"]

log = get_logger("smith_fast.mcp")

# What the front's session asks for: commands and tracing (recording follows --record; the
# replay capability would record every MCP session by default, and hooks are loaded with
# serve --hook, not by MCP clients). Tracing only when spans are recorded (an exporter set up
# from OTEL_*, or a provider given): no MCP request carries a trace context to pass on, so its
# spans would be empty no-ops, whose making imports OpenTelemetry on the way to `initialize`.
_CAPABILITIES = (pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_TRACING)


class McpEndpoint:
    """An MCP session.

    Args:
        core: the service core.
        peer: a printable peer name for logs.
        close: called once when the session is over (the transport then ends).
        authenticated: the transport checked the peer (stdio: it started us; HTTP: its bearer token).
        notify: where messages that belong to no request go (logs); None drops them.
        tasks: where its tasks are kept (the HTTP front's stateless endpoint shares its own); None: a
            table of its own.
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
        tasks: TaskTable | None = None,
    ) -> None:
        self.core = core
        self.tasks = TaskTable() if tasks is None else tasks
        # Calls answered with input_required (no task): the requestState handed out -> the call; and
        # the result of one that ended before the client came back with the input.
        self.parked: dict[str, str] = {}
        self.parked_results: dict[str, dict[str, Any]] = {}
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
        wanted = [c for c in _CAPABILITIES if c in core.capabilities and (c != pb.CAPABILITY_TRACING or tracing.configured())]
        handshake = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=wanted))
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
        # 2026-07-28: no initialize, no ping or logging/setLevel (logs are asked for per request).
        self._modern: Mapping[str, Callable[[Any, Any, Channel, Envelope], None]] = {
            "server/discover": self._discover,
            "tools/list": lambda i, _p, c, _e: self._tools_list(i, None, c, modern=True),
            "tools/call": self._tools_call,
            "tasks/get": self._task_get,
            "tasks/update": self._task_update,
            "tasks/cancel": self._task_cancel,
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
        if params is not None and is_modern(params):
            self._handle_modern(request_id, method, params, channel)
            return
        handler = self._methods.get(method) if isinstance(method, str) else None
        if handler is None:
            channel.send(protocol.error_response(request_id, protocol.METHOD_NOT_FOUND, f"method {method!r} is not supported by smith-fast"), True)
            return
        if self.revision is None and method not in ("initialize", "ping"):
            channel.send(protocol.error_response(request_id, protocol.INVALID_REQUEST, f"{method} before initialize: send initialize first"), True)
            return
        handler(request_id, params or {}, channel)

    def _handle_modern(self, request_id: Any, method: Any, params: dict[str, Any], channel: Channel) -> None:
        """A request of the stateless revision: its envelope checked, then its method."""
        env = envelope(params)
        if isinstance(env, EnvelopeError):
            channel.send(protocol.error_response(request_id, env.code, env.message, env.data), True)
            return
        handler = self._modern.get(method) if isinstance(method, str) else None
        if handler is None:
            channel.send(protocol.error_response(request_id, protocol.METHOD_NOT_FOUND, f"method {method!r} is not part of MCP {env.version} as smith-fast speaks it"), True)
            return
        handler(request_id, params, channel, env)

    def _discover(self, request_id: Any, _params: Any, channel: Channel, _env: Envelope) -> None:
        channel.send(discover(self.core, request_id), True)

    def _facts(self) -> protocol.ServerFacts:
        return facts(self.core)

    def _initialize(self, request_id: Any, params: Any, channel: Channel) -> None:
        self.revision = protocol.negotiate_revision(params.get("protocolVersion"))
        channel.send(protocol.response(request_id, protocol.initialize_result(self.revision, self._facts())), True)

    def _ping(self, request_id: Any, _params: Any, channel: Channel) -> None:
        channel.send(protocol.response(request_id, {}), True)

    def _tools_list(self, request_id: Any, _params: Any, channel: Channel, *, modern: bool = False) -> None:
        if self._listing is None:  # the registry does not change while the service runs
            self._listing = orjson.dumps(protocol.tool_listing(self._listed()))
        listing = self._listing
        if modern:  # the cache hints: the same for every client (public) until a restart
            listing = listing[:-1] + b',"resultType":"complete","ttlMs":%d,"cacheScope":"public"}' % protocol.LISTING_TTL_MS
        channel.send(b'{"jsonrpc":"2.0","id":' + orjson.dumps(request_id) + b',"result":' + listing + b"}", True)

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

    def _tools_call(self, request_id: Any, params: Any, channel: Channel, env: Envelope | None = None) -> None:
        if env is not None and params.get("requestState") is not None:
            self._resume(request_id, params, channel)
            return
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
        command: pb.Command | None
        if shell:
            limits = self.core.limits
            try:
                args = protocol.shell_arguments(arguments, limits.mcp_default_timeout, limits.mcp_max_timeout)
            except ValueError as exc:
                failed = _tool_error(f"invalid arguments: {exc}")
                if env is not None:
                    failed["resultType"] = "complete"
                channel.send(protocol.response(request_id, failed), True)
                return
            # A stateless request starts from the root: no state rides between its calls.
            state = ShellState() if args.fresh or env is not None else self.shell_state
            cmd = pb.ShellExecCommand(
                request_id=rid,
                command=wrap(args.command, self._marker, None if args.cwd is not None else state.cwd),
            )
            if args.timeout > 0:  # 0: both --mcp-default-timeout and --mcp-max-timeout are 0 (none)
                cmd.timeout_ms = max(1, round(args.timeout * 1000))
            if args.cwd is not None:
                cmd.cwd = args.cwd
            cmd.env.update(state.command_env(args.env))
            # Open stdin only for a client that can answer "waiting for input"; for any other a
            # read gets end-of-file at once, as it always did, instead of waiting for the timeout.
            cmd.open_stdin = env is not None and (env.answers_input or env.tasks)
            command = pb.Command(shell_exec=cmd)
            shell_call = ShellCall(limits.mcp_max_result_chars, self._marker, state, self.outputs, rid, args.timeout,
                                   args.capped, args.cwd is not None)
        else:
            tool_args = orjson.dumps(arguments)
            command = None
        call = self.calls[rid] = Call(request_id, shell, channel, token, self._room)
        call.shell_call = shell_call
        call.modern = env
        if env is not None and shell and env.tasks:
            # Its output is kept for tasks/get from the start; it becomes a task (and the request
            # is answered with its handle) if it is still running TASK_AFTER seconds from now.
            call.task = Task(rid)
            call.timer = asyncio.get_running_loop().call_later(TASK_AFTER, self._promote, rid)
        self._by_id[request_id] = rid
        if command is None:  # a tool call: started without a pb.Command where the session may
            quick = (rid, name, tool_args, -1)
            if self.session.start_tool_call(quick):
                return  # its terminal state ends the call (ended)
            command = tool_call_command(quick)
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
        self._forget(rid, call)

    def _forget(self, rid: str, call: Call) -> None:
        """The client cancelled ``call``: nothing more about it goes back; stop it."""
        call.cancelled = True
        if call.timer is not None:
            call.timer.cancel()
        if len(self.cancelled) >= 1024:  # the late events of a cancelled call come within moments
            self.cancelled.clear()
        self.cancelled.add(rid)
        self.calls.pop(rid, None)
        self._by_id.pop(call.id, None)
        self.cancel(rid)

    def cancel(self, rid: str) -> None:
        """Stop a running request with the runner seam's Cancel, as a Smith peer's CancelCommand
        does: its processes get SIGTERM, then SIGKILL after ``--kill-grace``, and it ends cancelled."""
        self.session.cancel(rid)

    # ---- output ------------------------------------------------------------------------------

    def ended(self, rid: str, call: Call) -> None:
        """A call reached its terminal state: answer it (unless it was cancelled)."""
        self._by_id.pop(call.id, None)
        if call.timer is not None:
            call.timer.cancel()
        if call.cancelled:
            return
        result = self._shell_result(call) if call.shell else _tool_result(call)
        if call.modern is not None:
            result["resultType"] = "complete"
        task = call.task
        if task is not None and task.id in self.tasks.tasks:  # answered with the task's handle
            task.result = result
            task.input_requests = None
            task.touch("completed", "the command ended" if not result.get("isError") else "the command failed, was killed or refused")
            return
        if call.parked is not None:  # answered input_required: the result waits for the retry
            if len(self.parked_results) >= _PARKED_RESULTS:  # a client that never came back
                oldest = next(iter(self.parked_results))
                del self.parked_results[oldest]
                self.parked.pop(oldest, None)
            self.parked_results[call.parked] = result
            return
        call.channel.send(protocol.response(call.id, result), True)

    # ---- the stateless revision: tasks and input_required ----------------------------------------

    def _promote(self, rid: str) -> None:
        """A call of a client that takes tasks still runs: answer its request with a task handle."""
        call = self.calls.get(rid)
        task = call.task if call is not None else None
        if call is None or task is None or task.id in self.tasks.tasks or call.cancelled:
            return
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if not self.tasks.add(task):
            call.task = None  # too many running tasks: answered at its end instead
            return
        call.channel.send(protocol.response(call.id, task.handle()), True)
        call.channel = _NOWHERE  # the request is answered: tasks/get tells the rest
        self._by_id.pop(call.id, None)

    def _input_wait(self, rid: str, call: Call, message: str) -> None:
        """The command of a stateless call waits for input: ask the client for it, in the task's
        state (tasks/update answers) or as the call's input_required result (the retry answers)."""
        if call.input_key is not None:
            return  # asked already, not answered yet
        call.asks += 1
        call.input_key = f"stdin-{call.asks}"
        requests = {call.input_key: _stdin_request(message)}
        if call.task is not None:
            self._promote(rid)
        task = call.task  # None if it could not become one
        if task is not None:
            task.input_requests = requests
            task.touch("input_required", message)
            return
        env = call.modern
        if env is None or not env.answers_input or call.parked is not None:
            return
        import secrets  # here: secrets (hmac, hashlib, random) was a tenth of serve --mcp's imports at start

        token = secrets.token_urlsafe(18)
        self.parked[token] = rid
        call.parked = token
        call.channel.send(protocol.response(call.id, {"resultType": "input_required", "inputRequests": requests, "requestState": token}), True)
        call.channel = _NOWHERE
        self._by_id.pop(call.id, None)

    def _resume(self, request_id: Any, params: Any, channel: Channel) -> None:
        """The retry of a call answered input_required: its input goes to the command's stdin, and
        this request gets what comes next (the result, or input_required again)."""
        token = params.get("requestState")
        rid = self.parked.pop(token, None) if isinstance(token, str) else None
        if rid is None:
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, "unknown or used requestState: call the tool again"), True)
            return
        call = self.calls.get(rid)
        if call is None:  # it ended while the client was away
            result = self.parked_results.pop(token, None)
            if result is None:
                channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, "the call is gone: call the tool again"), True)
            else:
                channel.send(protocol.response(request_id, result), True)
            return
        problem = self._answer(rid, call, params.get("inputResponses"))
        if problem is not None:
            self.parked[token] = rid
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, problem), True)
            return
        call.parked = None
        call.id = request_id
        call.channel = channel
        self._by_id[request_id] = rid

    def _answer(self, rid: str, call: Call, responses: object) -> str | None:
        """Write the client's answer to the command's stdin; why it cannot be taken, or None."""
        key = call.input_key
        if key is None:
            return "the command is not waiting for input"
        if not isinstance(responses, dict) or key not in responses or not isinstance(responses[key], dict):
            return f"inputResponses must answer {key!r}"
        answer = responses[key]
        content = answer.get("content") if answer.get("action") == "accept" else None
        if content is not None and not isinstance(content, dict):
            return "the answer's content must be an object"
        line = content.get("line") if content else None
        eof = content is None or content.get("eof") is True
        if line is not None and not isinstance(line, str):
            return "line must be a string"
        data = b"" if line is None else (line if line.endswith("\n") else line + "\n").encode()
        command = pb.Command(stdin=pb.StdinCommand(request_id=rid, data=data, eof=eof))
        if self.session.recorder is not None:
            self.session.recorder.record_command(command)
        self.session.handle(command)
        call.input_key = None
        if call.task is not None:
            call.task.input_requests = None
            call.task.touch("working", None)
        return None

    def _task(self, request_id: Any, params: Any, channel: Channel) -> Task | None:
        task = self.tasks.get(params.get("taskId"))
        if task is None:
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, "no such task (it ended long ago or never existed)"), True)
        return task

    def _task_get(self, request_id: Any, params: Any, channel: Channel, _env: Envelope) -> None:
        task = self._task(request_id, params, channel)
        if task is None:
            return
        cursor = params["_meta"].get(protocol.CURSOR_KEY)
        if cursor is not None and (isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0):
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, f"{protocol.CURSOR_KEY} must be a byte count"), True)
            return
        channel.send(protocol.response(request_id, task.detailed(cursor)), True)

    def _task_update(self, request_id: Any, params: Any, channel: Channel, _env: Envelope) -> None:
        task = self._task(request_id, params, channel)
        if task is None:
            return
        call = self.calls.get(task.rid)
        problem = "the task is not waiting for input" if call is None or task.finished else self._answer(task.rid, call, params.get("inputResponses"))
        if problem is not None:
            channel.send(protocol.error_response(request_id, protocol.INVALID_PARAMS, problem), True)
            return
        channel.send(protocol.response(request_id, {"resultType": "complete"}), True)

    def _task_cancel(self, request_id: Any, params: Any, channel: Channel, _env: Envelope) -> None:
        task = self._task(request_id, params, channel)
        if task is None:
            return
        call = self.calls.pop(task.rid, None)
        if call is not None and not task.finished:
            task.input_requests = None
            task.touch("cancelled", "cancelled by the client")
            self._forget(task.rid, call)
        channel.send(protocol.response(request_id, {"resultType": "complete"}), True)

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
        call = self.calls.get(rid) if rid is not None else None
        if rid is not None and call is not None and call.modern is not None:
            self._modern_log(level, message, rid, call, fields)
            return
        if protocol.LOG_LEVELS.index(level) < self._log_threshold or self.revision is None:
            return
        if rid is not None and rid in self.cancelled:
            return  # the client cancelled it: nothing about it goes back
        channel = call.channel if call is not None and not call.cancelled else self.notify
        if channel is not None:
            _send_log(channel, level, message, call, fields)

    def _modern_log(self, level: str, message: str, rid: str, call: Call, fields: Mapping[str, str]) -> None:
        """A log of a 2026-07-28 call: sent only if its request asked for logs (``_meta``
        logLevel), from that level up; a "waiting for input" notice then asks for the input."""
        if call.cancelled:
            return
        wanted = call.modern.log_level if call.modern is not None else None
        if wanted is not None and protocol.LOG_LEVELS.index(level) >= protocol.LOG_LEVELS.index(wanted):
            _send_log(call.channel, level, message, call, fields)  # before the input_required answer ends the request
        # input_wait (its /proc reading, its dataclasses) is imported by the process stack: a log
        # comes from a command, so it is there by now, and the start's first answer need not wait for it
        from ..service.input_wait import WAITING_FOR_INPUT

        if fields.get("reason") == WAITING_FOR_INPUT:
            self._input_wait(rid, call, message)

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


def facts(core: ServiceCore) -> protocol.ServerFacts:
    """What the instructions tell about ``core``."""
    limits = core.limits
    return protocol.ServerFacts(
        root=str(core.tool_context.root),
        sandbox=core.config.sandbox,
        network=core.config.network,
        budget=limits.mcp_max_result_chars,
        output_dir=str(core.config.state_dir / "mcp-output"),
        default_timeout=limits.mcp_default_timeout,
        max_timeout=limits.mcp_max_timeout,
        max_output=limits.max_output,
    )


def discover(core: ServiceCore, request_id: Any) -> bytes:
    """The answer to ``server/discover`` (it needs no session: the HTTP front answers it without one)."""
    if not core.config.mcp_discover:
        # Without --mcp-discover a negotiating client falls back to initialize (a session, and a
        # shell that keeps its state between calls).
        return protocol.error_response(request_id, protocol.METHOD_NOT_FOUND, "server/discover is off (serve --mcp-discover); use initialize")
    return protocol.response(request_id, protocol.discover_result(facts(core)))


# Results of calls answered input_required that ended before their retry, kept for it: the
# oldest goes when there are more.
_PARKED_RESULTS = 256


def _nothing() -> None:
    pass


def _send_log(channel: Channel, level: str, message: str, call: Call | None, fields: Mapping[str, str]) -> None:
    data: dict[str, Any] = {"message": message, **fields}
    if call is not None:
        data["requestId"] = call.id
    channel.send(protocol.notification("notifications/message", {"level": level, "logger": "smith-fast", "data": data}), False)


class _Nowhere:
    """The channel of a call whose request was answered already (a task handle, input_required)."""

    def send(self, data: bytes, final: bool) -> None:
        pass


_NOWHERE = _Nowhere()


def _stdin_request(message: str) -> dict[str, Any]:
    """The input request of a command waiting for input: a form elicitation of one line."""
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": f"The command is waiting for input ({message}). Give the line to send to its stdin.",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "line": {"type": "string", "title": "Input", "description": "a line for the command's stdin (a newline is added)"},
                    "eof": {"type": "boolean", "title": "End of input", "description": "close stdin after the line", "default": False},
                },
            },
        },
    }


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


