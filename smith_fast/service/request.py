"""One request, from its admission to its one terminal state.

A :class:`Request` holds everything the service keeps about a request while it lives: its command,
its state (``ADMITTED → RUNNING → CANCELLING → ENDED``), the task that runs it, its span, its audit
record, the input a peer sent before its process started, the processes started for it and the
one its stdin goes to. What a control command does to it is a method of it (:meth:`cancel`,
:meth:`write_stdin`, :meth:`resize`), and :meth:`finish` (with :meth:`answer_at_once`, the same
for a call answered in one step) is the only code that sends a terminal state (PROTOCOL.md,
"Terminal states"): ``READY``, or an ``ErrorEvent`` and ``ERROR``, exactly once.

The requests of one session are in its :class:`~smith_fast.service.request_table.RequestTable`.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import tracing
from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from .audit import refused
from .sizes import terminal_size

if TYPE_CHECKING:
    from ..process import ShellProcess
    from ..relaypeek import ToolCall
    from .audit import AuditRecord
    from .commands import CommandSpec
    from .config import Limits
    from .sinks import EventSink

__all__ = ["EarlyInput", "Request", "RequestState", "Terminal", "tool_call_command", "write_input", "stdin_refused"]

_STOPPING: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps only weak refs)


_CANCELLED_BY = {"restored": "the session restored its workspace to a checkpoint"}
"""How a cancel that the peer did not send itself is worded, by reason."""


class RequestState(enum.Enum):
    ADMITTED = "admitted"  # read and admitted; nothing sent yet
    RUNNING = "running"  # PROCESSING sent, its handler runs
    CANCELLING = "cancelling"  # a Cancel came: it ends as cancelled
    ENDED = "ended"  # its terminal state was sent (or its task ended without one: cancelled before it ran)


class Terminal(Protocol):
    """What a request's end needs of its session (:class:`~smith_fast.service.session.Session`)."""

    @property
    def sink(self) -> EventSink: ...

    @property
    def closing(self) -> bool:
        """The session is over: nobody reads an end now."""
        ...

    def report_error(self, code: int, message: str, rid: str | None = None, details: Any = None) -> None:
        """Send (and count) an ``ErrorEvent``."""
        ...

    def request_ended(self, request: Request) -> None:
        """``request`` sent its terminal state (the table keeps its id among the ended)."""
        ...


def tool_call_command(call: ToolCall) -> pb.Command:
    """The ``pb.Command`` of a plain tool call (``Session.start_tool_call``): the one the runtime
    reads from a frame that ``relaypeek.tool_call`` read as ``call``."""
    rid, tool, args, timeout_ms = call
    tool_call = pb.ToolCallCommand(request_id=rid, tool=tool, args=args)
    if timeout_ms >= 0:
        tool_call.timeout_ms = timeout_ms
    return pb.Command(tool_call=tool_call)


@dataclass(slots=True)
class EarlyInput:
    """What a peer sent a ShellExec with open stdin before its process started (hooks run first)."""

    data: bytearray = field(default_factory=bytearray)
    eof: bool = False
    size: tuple[int, int] | None = None


class Request:
    """One admitted request of a session.

    Args:
        host: its session, which sends what it ends with.
        rid: its id.
        spec: its row of the command table.
        command: the command that asked for it; None when ``call`` says it.
        limits: the service's limits (None: a request that never runs).
        call: a plain tool call started without a ``pb.Command`` (``Session.start_tool_call``:
            a v1 frame read by :func:`smith_fast.relaypeek.tool_call`, or MCP's ``tools/call``):
            what the quick path reads, while :attr:`command` is made of it only when something
            asks for it.
    """

    __slots__ = (
        "_host", "_limits", "id", "spec", "_command", "call", "state", "task", "span", "audit", "early", "processes",
        "stdin_target", "cancelled", "cancel_reason",
    )

    def __init__(
        self, host: Terminal, rid: str, spec: CommandSpec | None, command: Any, limits: Limits | None = None,
        call: ToolCall | None = None,
    ) -> None:
        self._host = host
        self._limits = limits  # --kill-grace and --max-stdin-buffer (None: a request that never runs)
        self.id = rid
        self.spec = spec
        self._command = command
        self.call = call
        self.state = RequestState.ADMITTED
        self.task: asyncio.Task[None] | None = None
        self.span: tracing.SpanHandle = tracing.NOOP
        self.audit: AuditRecord | None = None
        self.early: EarlyInput | None = None
        self.processes: set[ShellProcess] | None = None  # started for it (a plan's steps' included)
        self.stdin_target: ShellProcess | None = None  # its process with open stdin or a pty
        self.cancelled = False  # it ended by a Cancel
        self.cancel_reason = "cancelled"  # what its ErrorEvent says when cancelled: a Restore says "restored"

    @property
    def command(self) -> Any:
        """The command that asked for it (a ``pb.Command``; one read as a :attr:`call` is made on
        first use, with the same fields as the runtime would have read)."""
        command = self._command
        if command is None and self.call is not None:
            command = self._command = tool_call_command(self.call)
        return command

    @property
    def ended(self) -> bool:
        return self.state is RequestState.ENDED

    # ---- control ------------------------------------------------------------------------------

    def cancel(self, reason: str = "cancelled") -> None:
        """End it as cancelled: its processes get SIGTERM, SIGKILL after ``--kill-grace``, then its
        task is cancelled; one not started yet ends as cancelled when it starts. Harmless twice.
        ``reason``: its ErrorEvent's ``details.reason`` (a Restore of the workspace: ``restored``)."""
        state = self.state
        if state is RequestState.CANCELLING or state is RequestState.ENDED:
            return
        self.cancel_reason = reason
        self.state = RequestState.CANCELLING
        if state is RequestState.ADMITTED or self.task is None:
            return
        grace = self._limits.kill_grace if self._limits is not None else 0.0
        stopping = asyncio.get_running_loop().create_task(self._stop(self.task, grace))
        _STOPPING.add(stopping)
        stopping.add_done_callback(_STOPPING.discard)

    async def _stop(self, task: asyncio.Task[None], grace: float) -> None:
        """A request without a process of its own (a tool call, a hook load, a plan between steps)
        has its task cancelled at once; one with processes lets them end first, so their final
        output is still sent."""
        procs = list(self.processes or ())
        if procs:
            await asyncio.gather(*(p.terminate(grace) for p in procs), return_exceptions=True)
            await asyncio.wait([task], timeout=grace)
        if not task.done():
            task.cancel()

    def _input_target(self, what: str) -> ShellProcess | EarlyInput:
        if self.stdin_target is not None:
            return self.stdin_target
        if self.early is not None:
            return self.early
        if self.state is RequestState.ADMITTED:  # its task has not started yet
            early = self.early = EarlyInput()
            return early
        rid = self.id
        if what == "resize":  # as for a command with open stdin only
            raise ProtocolError(
                f"request {rid} has no terminal: send its ShellExec with pty to resize it",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "no_terminal"},
            )
        raise ProtocolError(
            f"request {rid} has no open stdin: {what} needs a ShellExec sent with open_stdin or pty",
            pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"},
        )

    def write_stdin(self, data: bytes, eof: bool) -> None:
        """Write to its process's stdin (or keep it until the process starts), then close it if ``eof``."""
        limit = self._limits.max_stdin_buffer if self._limits is not None else 0
        target = self._input_target("write stdin to")
        if isinstance(target, EarlyInput):
            if data and (target.eof or len(target.data) + len(data) > limit):
                raise stdin_refused(self.id, len(target.data), limit, target.eof)
            target.data += data
            target.eof = target.eof or eof
            return
        write_input(target, self.id, data, eof, limit)

    def resize(self, rows: int, cols: int) -> None:
        """Set its terminal's size (or keep it until the process starts)."""
        target = self._input_target("resize")
        size = terminal_size(rows, cols, self.id)
        if isinstance(target, EarlyInput):
            target.size = size
        elif not target.is_pty:
            raise ProtocolError(
                f"request {self.id} has no terminal: send its ShellExec with pty to resize it",
                pb.ERROR_CODE_UNSPECIFIED, self.id, {"reason": "no_terminal"},
            )
        else:
            target.resize(*size)

    def process_started(self, rid: str, proc: ShellProcess) -> None:
        """``proc`` runs for it (for ``rid``: itself, or a step of its plan)."""
        if self.processes is None:
            self.processes = set()
        self.processes.add(proc)
        if rid != self.id:
            return
        early, self.early = self.early, None
        if early is None or not (proc.stdin_open or proc.is_pty):
            return
        self.stdin_target = proc
        if early.size is not None and proc.is_pty:
            proc.resize(*early.size)
        if early.data:
            proc.write_stdin(bytes(early.data))  # within the limit, which is the process's too
        if early.eof:
            proc.close_stdin()

    def process_ended(self, proc: ShellProcess) -> None:
        if self.processes is not None:
            self.processes.discard(proc)
        if self.stdin_target is proc:
            self.stdin_target = None

    # ---- the end ------------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None) -> None:
        """Send its one terminal state and write its audit line.

        Args:
            error: None: it ended well (``READY``), unless a Cancel came meanwhile (then it ends
                cancelled, whatever else happened). A :class:`~smith_fast.errors.ProtocolError`:
                its ``ErrorEvent``, then ``ERROR``. ``CancelledError``: the session shuts down
                (nothing is sent once it is closed). Any other exception: a bug of ours, an
                internal error.
        """
        if self.state is RequestState.ENDED:
            return
        host, rid, span = self._host, self.id, self.span
        self.cancelled = self.state is RequestState.CANCELLING
        if self.cancelled and not isinstance(error, asyncio.CancelledError):
            reason = self.cancel_reason
            message = f"request {rid} cancelled by the peer" if reason == "cancelled" else f"request {rid} cancelled: {_CANCELLED_BY.get(reason, reason)}"
            error = ProtocolError(message, pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": reason})
            span.fail("cancelled", message)
        self.state = RequestState.ENDED
        self.stdin_target = None
        self.early = None
        if self.audit is not None:
            self.audit.end(error)
        if error is None:
            host.sink.state_change(pb.SERVICE_STATE_READY, rid)
        elif isinstance(error, ProtocolError):
            if not self.cancelled:
                span.fail(pb.ErrorCode.Name(error.code), str(error))
            # The audit line says how it ended (a hook block as a block): not a "protocol error".
            host.report_error(error.code, str(error), error.request_id or rid, error.details)
            host.sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        elif isinstance(error, asyncio.CancelledError):
            if not host.closing:  # shutdown, not disconnect: somebody is listening
                host.report_error(pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", rid, {"reason": "cancelled"})
                host.sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        else:
            host.report_error(pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(error).__name__}: {error}", rid)
            host.sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        if span is not tracing.NOOP:
            span.end()
        host.request_ended(self)

    def refuse(self, error: ProtocolError | None, session: str = "", peer: str = "") -> None:
        """End a request that never ran (refused before it was admitted, or with its batch): its
        error and audit line (when ``error`` is given), then its terminal ``ERROR``."""
        self.state = RequestState.ENDED
        if error is not None:
            refused(session, peer, error)
            self._host.report_error(error.code, str(error), error.request_id, error.details)
        self._host.sink.state_change(pb.SERVICE_STATE_ERROR, self.id)

    def answer_at_once(self, success: bool, result: bytes, error: str | None, duration_ms: int) -> None:
        """A tool call that ended in the step that read it: ``PROCESSING``, its ``ToolResult`` and
        ``READY`` in one write (what :meth:`finish` ends with, for a call never started as a task;
        its table then forgets it, among the ended)."""
        self._host.sink.tool_done(self.id, success, result, error, duration_ms)


def write_input(target: ShellProcess, rid: str, data: bytes, eof: bool, limit: int) -> None:
    """Write ``data`` to ``target``'s open stdin (a request's process, or a background one)."""
    if data:
        if not target.stdin_open:
            raise stdin_refused(rid, 0, limit, True)
        if not target.write_stdin(data):
            raise stdin_refused(rid, target.stdin_buffered, limit, False)
    if eof:
        target.close_stdin()


def stdin_refused(rid: str, buffered: int, limit: int, closed: bool) -> ProtocolError:
    if closed:
        return ProtocolError(f"the stdin of request {rid} is closed; the data was not written", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"})
    return ProtocolError(
        f"the stdin of request {rid} is full: the command has not read {buffered} bytes "
        f"(max --max-stdin-buffer {limit}); this StdinCommand was refused whole, send it again once it reads",
        pb.ERROR_CODE_RESOURCE_EXHAUSTED,
        rid,
        {"reason": "stdin_full"},
    )
