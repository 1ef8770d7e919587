"""The MCP front's event sink: a session's events gathered per request into MCP messages.

A request's output is kept in its :class:`Call` (bounded by ``--tool-max-output``, the bytes beyond
counted, not kept) and, when the client asked for progress, streamed as
``notifications/progress``; its terminal state hands the call to the endpoint, which answers the
JSON-RPC request. Events without a request (the handshake's) are dropped, except logs and errors,
which go to the endpoint's log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..pb import smith_pb2 as pb
from .results import OutputDir, StreamKeeper
from .shell_state import ShellState, StateSplitter
from ..service.egress import EGRESS_REFUSED
from ..service.sinks import EventSink, Recording, as_text, now_ms
from . import protocol

if TYPE_CHECKING:
    from .envelope import Envelope
    from .tasks import Task

__all__ = ["Call", "Channel", "McpSink", "CallHost", "ShellCall"]

_TERMINAL = frozenset({pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR})


_REFUSALS_KEPT = 16  # refused connections a call's result lists (a command retrying in a loop makes more)

class Channel(Protocol):
    """Where the messages about one JSON-RPC request go (stdio: the one pipe; HTTP: its response)."""

    def send(self, data: bytes, final: bool) -> None:
        """Send one message; ``final``: the request's response, the last message about it."""
        ...


class Call:
    """One ``tools/call`` in flight: its JSON-RPC id, where to answer, what it produced so far."""

    __slots__ = (
        "id", "shell", "channel", "token", "cancelled", "room", "out", "err", "out_bytes", "err_bytes",
        "exit_code", "success", "result", "errors", "progress", "failures", "shell_call",
        "modern", "task", "timer", "parked", "input_key", "asks", "refused_connections",
    )

    def __init__(self, request_id: Any, shell: bool, channel: Channel, token: Any, room: int) -> None:
        self.id = request_id
        self.shell = shell
        self.channel = channel
        self.token = token  # the client's progressToken, or None
        self.cancelled = False
        self.room = room  # output bytes still kept for the result
        self.out: list[str] = []
        self.err: list[str] = []
        self.out_bytes = 0
        self.err_bytes = 0
        self.exit_code: int | None = None
        self.success = False
        self.result = b""
        self.errors: list[str] = []
        self.failures: list[tuple[int, Mapping[str, str]]] = []  # each ErrorEvent's code and details
        # connections the egress proxy refused the command (--network allow): its result says why,
        # since a client may show the model no logging notification
        self.refused_connections: list[dict[str, str]] = []
        self.progress = 0
        self.shell_call: ShellCall | None = None  # a ``shell`` call's keepers and state (results.py)
        # The stateless revision (2026-07-28): the request's envelope, the task it is or may become,
        # the timer that makes it one, the requestState of an input_required answer, the key of
        # the input request outstanding and how many were made.
        self.modern: Envelope | None = None
        self.task: Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.parked: str | None = None
        self.input_key: str | None = None
        self.asks = 0

    def add(self, parts: list[str], text: str) -> int:
        """Keep what fits of ``text`` in ``parts``; the bytes it had."""
        size = len(text) if text.isascii() else len(text.encode())
        if self.room > 0:
            if size <= self.room:
                parts.append(text)
                self.room -= size
            else:
                data = text.encode()[: self.room]
                parts.append(data.decode(errors="ignore"))
                self.room = 0
        return size

    @property
    def truncated(self) -> bool:
        kept = sum(len(p.encode()) for p in (*self.out, *self.err))
        return kept < self.out_bytes + self.err_bytes


class ShellCall:
    """What a ``shell`` call keeps besides :class:`Call`'s counts: its streams within the result
    budget (:mod:`~smith_fast.mcp.results`), the state it started from and the sections that tell
    the state it left (:mod:`~smith_fast.mcp.shell_state`)."""

    __slots__ = ("out", "err", "splitter", "state", "files", "name", "timeout_s", "capped_timeout", "explicit_cwd")

    def __init__(self, budget: int, marker: str, state: ShellState, files: OutputDir, name: str, timeout_s: float,
                 capped_timeout: bool, explicit_cwd: bool) -> None:
        self.out = StreamKeeper(budget)
        self.err = StreamKeeper(budget)
        self.splitter = StateSplitter(marker)
        self.state = state
        self.files = files
        self.name = name
        self.timeout_s = timeout_s
        self.capped_timeout = capped_timeout
        self.explicit_cwd = explicit_cwd

    def add(self, keeper: StreamKeeper, text: str, stream: str) -> int:
        size = len(text) if text.isascii() else len(text.encode())
        keeper.add(text, size, self.files, f"{self.name}.{stream}.txt")
        return size


class CallHost(Protocol):
    """What the sink hands its findings to (:class:`~smith_fast.mcp.endpoint.McpEndpoint`)."""

    calls: dict[str, Call]
    cancelled: set[str]  # request ids of calls the client cancelled

    def ended(self, rid: str, call: Call) -> None: ...

    def log(self, level: str, message: str, rid: str | None, fields: Mapping[str, str]) -> None: ...


class McpSink(EventSink):
    """An :class:`~smith_fast.service.sinks.EventSink` that writes no Smith bytes: its events fill
    the calls of ``host``; progress notifications go out through each call's channel."""

    version = 1  # the session speaks v1 semantics (the front's handshake asks for version 1)
    framed = False

    def __init__(self, host: CallHost) -> None:
        super().__init__(_nowhere)
        self._host = host
        self._calls = host.calls
        self._recording: Recording | None = None

    def record_to(self, recording: Recording) -> None:
        self._recording = recording

    def _record(self, **event: Any) -> None:
        if self._recording is not None:
            self._recording.record_event(pb.Event(**event))

    def event(self, event: pb.Event) -> None:
        if self._recording is not None:
            self._recording.record_event(event)

    def state_change(self, state: int, request_id: str | None = None) -> None:
        if self._recording is not None:
            self._record(state_change=pb.StateChangeEvent(request_id=request_id, state=state, timestamp=now_ms()))  # type: ignore[arg-type]  # ints and Mappings where the stubs want enum and dict types
        if request_id is not None and state in _TERMINAL:
            call = self._calls.pop(request_id, None)
            if call is not None:
                self._host.ended(request_id, call)

    def shell_output(
        self,
        request_id: str,
        stdout: str | None = None,
        stderr: str | None = None,
        exit_code: int | None = None,
        finished: bool = False,
    ) -> None:
        if self._recording is not None:
            self._record(shell_output=pb.ShellOutputEvent(request_id=request_id, stdout=stdout, stderr=stderr, exit_code=exit_code, finished=finished))
        call = self._calls.get(request_id)
        if call is None:
            return
        shell = call.shell_call
        if shell is not None:  # the MCP shell: state sections out, then kept within the budget
            if stderr:
                stderr = shell.splitter.feed(stderr)
            if finished or exit_code is not None:
                stderr = (stderr or "") + shell.splitter.flush()
            if stdout:
                size = shell.add(shell.out, stdout, "stdout")
                call.out_bytes += size
                if call.task is not None:
                    call.task.output("stdout", stdout, size)
            if stderr:
                size = shell.add(shell.err, stderr, "stderr")
                call.err_bytes += size
                if call.task is not None:
                    call.task.output("stderr", stderr, size)
        else:
            if stdout:
                call.out_bytes += call.add(call.out, stdout)
            if stderr:
                call.err_bytes += call.add(call.err, stderr)
        if exit_code is not None:
            call.exit_code = exit_code
        if call.token is not None and (stdout or stderr) and not call.cancelled:
            call.progress = call.out_bytes + call.err_bytes
            call.channel.send(
                protocol.notification(
                    "notifications/progress",
                    {"progressToken": call.token, "progress": call.progress, "message": stdout or stderr},
                ),
                False,
            )

    def shell_output_bytes(self, request_id: str, fd: int, data: bytes | memoryview) -> None:
        # An MCP result carries text: raw output (an attach or ShellExec asking for bytes) is kept
        # as text, as v0 peers get it.
        as_text(self, request_id, fd, data)

    def tool_result(self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int) -> None:
        if self._recording is not None:
            self._record(tool_result=pb.ToolResultEvent(request_id=request_id, success=success, result=result, error=error, duration_ms=duration_ms))
        call = self._calls.get(request_id)
        if call is not None:
            call.success, call.result = success, result
            if error:
                call.errors.append(error)

    def log(self, level: int, message: str, request_id: str | None = None, fields: Mapping[str, str] | None = None) -> None:
        if self._recording is not None:
            self._record(log=pb.LogEvent(level=level, message=message, timestamp=now_ms(), request_id=request_id, fields=fields))  # type: ignore[arg-type]  # ints and Mappings where the stubs want enum and dict types
        if fields is not None and request_id is not None and fields.get("reason") == EGRESS_REFUSED:
            call = self._calls.get(request_id)
            if call is not None and len(call.refused_connections) < _REFUSALS_KEPT:
                call.refused_connections.append({"host": fields.get("host", ""), "port": fields.get("port", ""),
                                                 "rule": fields.get("rule", ""), "message": message})
        self._host.log(protocol.SMITH_LOG_LEVEL.get(level, "info"), message, request_id, fields or {})

    def error(self, code: int, message: str, request_id: str | None = None, details: Mapping[str, str] | None = None) -> None:
        if self._recording is not None:
            self._record(error=pb.ErrorEvent(request_id=request_id, error_code=code, message=message, timestamp=now_ms(), details=details))  # type: ignore[arg-type]  # ints and Mappings where the stubs want enum and dict types
        call = self._calls.get(request_id) if request_id is not None else None
        if call is not None:
            call.errors.append(message)
            call.failures.append((code, details or {}))
        elif request_id is not None and request_id in self._host.cancelled:
            pass  # the client cancelled it and expects no answer; an error-level log would read as a fault
        else:
            self._host.log("error", message, request_id, {"error_code": pb.ErrorCode.Name(code), **(details or {})})



def _nowhere(_data: bytes) -> None:
    pass

