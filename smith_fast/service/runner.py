"""The request runner seam: how a session's admitted requests are run, steered and ended.

A :class:`~smith_fast.service.session.Session` keeps the protocol state (handshake, grants, token,
flow control, teardown) and admits each request (capability, size, request id, ``--max-requests``);
what happens to an admitted request is its :class:`RequestRunner`'s business:

* :class:`LocalRunner` (``serve``, a NATS worker) runs it here with the handler of its row in
  :data:`~smith_fast.service.commands.COMMANDS`: ``PROCESSING``, the handler's events, then
  ``READY`` or its error and ``ERROR``;
* ``smith_fast.nats.gateway.NatsRunner`` (``gateway``) forwards the command to the workers and
  passes their events through.

A runner is made per session by the core's runner factory (``ServiceCore(runner=...)``) from the
session's :class:`RequestHost` view. What a later command does to a *running* request (cancel,
stdin, resize, attach) belongs here too: a method on :class:`RequestRunner`, implemented once per
runner.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .. import tracing
from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .audit import Audit
from .commands import Handler, RequestControl
from .execution import Execution, ExecutionCore
from .shell_exec import terminal_size
from .session_hooks import SessionHooks

if TYPE_CHECKING:
    from ..hooks import Hook, HookLimits
    from ..process import ShellProcess
    from .commands import CommandSpec
    from .metrics import ServiceMetrics
    from .session_hooks import HookShelf
    from .sinks import EventSink

__all__ = ["RequestHost", "RequestRunner", "RunnerFactory", "LocalRunner", "RunnerCore", "local_runner"]

log = get_logger("smith_fast.session")

# The request a handler runs for (set in LocalRunner.run; the tasks a handler starts inherit it), so
# that a process started for a plan's step belongs to the plan a Cancel names.
_REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("smith_fast_request", default=None)
_STOPPING: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps only weak refs)
_ENDED_KEPT = 1024  # recently ended request ids, so a late Cancel gets "has ended", not "unknown"


def _raising(exc: Exception) -> Handler:
    async def handler(_ex: Execution, _rid: str, _request: object) -> None:
        raise exc

    return handler


def _not_running(rid: str, what: str, ended: bool) -> ProtocolError:
    if ended:
        return ProtocolError(f"request {rid} has already ended; nothing to {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "not_running"})
    return ProtocolError(
        f"no request {rid} is running in this session; nothing to {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "unknown_request"}
    )


@dataclass(slots=True)
class _EarlyInput:
    """What a peer sent a ShellExec with open stdin before its process started (hooks run first)."""

    data: bytearray = field(default_factory=bytearray)
    eof: bool = False
    size: tuple[int, int] | None = None


class RequestHost(Protocol):
    """What a runner sees of its session."""

    @property
    def sink(self) -> EventSink: ...

    @property
    def accepted(self) -> frozenset[str]: ...

    @property
    def peer(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def granted(self) -> frozenset[int]: ...

    @property
    def span(self) -> tracing.SpanHandle:
        """The session's span (:data:`~smith_fast.tracing.NOOP` unless tracing was granted)."""
        ...

    @property
    def paused(self) -> bool: ...

    @property
    def shutting(self) -> bool: ...

    @property
    def closing(self) -> bool:
        """The session is over: nobody reads what would be sent now."""
        ...

    def protocol_error(self, exc: ProtocolError) -> None:
        """Report (and count) an error with the request it names."""
        ...

    def is_running(self, rid: str) -> bool:
        """Request ``rid`` was admitted and has not ended (its task may not have started yet: a
        Cancel or stdin in the same read as its command)."""
        ...

    def task(self, rid: str) -> asyncio.Task[None] | None:
        """The task running request ``rid``; None when there is none (not running, or running
        eagerly, before its first suspension: see ``CommandSpec.eager``)."""

    async def reading(self) -> None:
        """Return once the peer reads (at once unless the session is paused)."""
        ...

    def report_error(self, code: int, message: str, rid: str | None = None, details: Mapping[str, str] | None = None) -> None:
        """Send (and count) an ``ErrorEvent``."""
        ...

    def reject(self, exc: ProtocolError) -> None:
        """Report an error, then its request's terminal ``ERROR`` state."""
        ...

    def adopt_request(self, rid: str, work: Coroutine[Any, Any, None]) -> None:
        """Count request ``rid``, which runs already (elsewhere), as running until ``work`` ends."""
        ...


class RequestRunner(RequestControl, Protocol):
    """Runs the admitted requests of one session, and steers the running ones (cancel, stdin,
    resize: :class:`~smith_fast.service.commands.RequestControl`).

    A runner may also offer ``run_now(spec, rid, command) -> bool`` (:meth:`LocalRunner.run_now`):
    for a row with a ``now`` shortcut the session tries it first, without a coroutine, and calls
    :meth:`run` only when it returns False.
    """

    async def run(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        """Run one request until its terminal state was sent.

        The session made sure it may run (``command`` holds a request of ``spec.kind`` with id
        ``rid``); cancelling the awaiting task ends it (shutdown, teardown).
        """
        ...

    def pause(self) -> None:
        """The peer stopped reading: stop producing output."""
        ...

    def resume(self) -> None:
        """The peer reads again."""
        ...

    async def shutdown(self, grace: float) -> None:
        """The session shuts down: end what runs within ``grace`` s, final events still sent."""
        ...

    def kill(self) -> None:
        """The session is torn down: stop what runs at once."""
        ...

    def end(self) -> None:
        """The session is over (every way it ends passes here once): release what it held."""
        ...


RunnerFactory = Callable[[RequestHost], RequestRunner]
"""Makes the runner of a new session (``ServiceCore(runner=...)``)."""


class LocalRunner:
    """Runs requests here, with the handlers of the command table (an
    :class:`~smith_fast.service.execution.Execution`).

    Args:
        core: tools, limits, planner, process slots, global hooks.
        host: the session.
        hooks: the session's hooks to start with (a NATS worker passes the gateway session's).
        shelf: keeps the hooks this session loads beyond it (a NATS worker's session state); then
            the shelf, not this runner, closes them.
    """

    def __init__(
        self,
        core: RunnerCore,
        host: RequestHost,
        *,
        hooks: Sequence[Hook] = (),
        shelf: HookShelf | None = None,
    ) -> None:
        self.core = core
        self._host = host
        self.sink = host.sink
        self.processes: set[ShellProcess] = set()
        self.spans: dict[str, tracing.SpanHandle] = {}  # request id -> its command span
        self.audit = Audit(host.session_id, host.peer)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it runs requests on (known at the first)
        self._running: dict[str, asyncio.Task[None] | None] = {}  # request id -> the task running it (None: eager)
        self._cancelling: dict[str, asyncio.Task[None] | None] = {}  # request id -> the task stopping it (None: not started yet)
        self._ended: OrderedDict[str, bool] = OrderedDict()  # recently ended id -> it was cancelled
        self._owned: dict[str, set[ShellProcess]] = {}  # request id -> the processes started for it
        self._interactive: dict[str, ShellProcess] = {}  # ShellExec id -> its process with open stdin
        self._early: dict[str, _EarlyInput] = {}  # ShellExec id with open stdin -> input before its process
        self._going_on: dict[str, Handler] = {}  # request id -> how run goes on with what run_now started
        self.hooks = SessionHooks(
            core.global_hooks,
            failure=core.config.hook_failure,
            limits=core.hook_limits,
            emit=host.sink.event,
            count=core.metrics.hook_decision,
            spans=self.spans,
            peer=host.peer,
            hooks=hooks,
            shelf=shelf,
            decided=self.audit.decision,
        )

    @property
    def paused(self) -> bool:
        return self._host.paused

    @property
    def shutting(self) -> bool:
        return self._host.shutting

    async def run(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        host = self._host
        sink = self.sink
        handler = spec.handler
        assert handler is not None  # the session starts only rows with a handler
        session_span = host.span
        going_on = self._going_on.pop(rid, None) if self._going_on else None
        if going_on is not None:
            handler = going_on  # run_now started it
        elif spec.now is not None:
            step = self._now(spec, rid, command)
            if step is True:
                return
            if step is not None:
                handler = step  # started, not ended: it goes on as any request
        sink.state_change(pb.SERVICE_STATE_PROCESSING, rid)
        span = session_span.command_span(spec.kind, rid) if session_span is not tracing.NOOP else tracing.NOOP
        if span is not tracing.NOOP:
            self.spans[rid] = span
        self.audit.begin(rid, spec.kind)
        request = getattr(command, spec.kind)
        if spec.kind == "shell_exec" and (request.open_stdin or request.HasField("pty")):
            self._early.setdefault(rid, _EarlyInput())
        elif self._early.pop(rid, None) is not None:  # stdin sent before it started, but it has none
            host.protocol_error(ProtocolError(
                f"request {rid} has no open stdin: its ShellExec was sent without open_stdin or pty; the data was not written",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"},
            ))
        # None while the session runs it eagerly (Session._start): nothing can cancel it before it
        # suspends, and then its task is the session's (cancel asks for it).
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._running[rid] = asyncio.current_task(loop)  # the loop given: no getpid() per call
        token = _REQUEST.set(rid)
        try:
            if rid in self._cancelling:  # cancelled before it started
                raise ProtocolError("request cancelled before it started", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"})
            await handler(self, rid, request)
        except ProtocolError as exc:
            if rid in self._cancelling:
                self._cancelled(rid, span)
            else:
                exc.request_id = exc.request_id or rid
                self.audit.end(rid, exc)
                span.fail(pb.ErrorCode.Name(exc.code), str(exc))
                # The audit line says how it ended (a hook block as a block): not a "protocol error".
                host.report_error(exc.code, str(exc), exc.request_id, exc.details)
                sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()  # a cancellation arrives only in a task
            assert task is not None
            if rid in self._cancelling and not host.closing and not host.shutting and task.cancelling() <= 1:
                task.uncancel()  # our own Cancel: the request ends here, the session goes on
                self._cancelled(rid, span)
                return
            self.audit.end(rid, exc)
            if not host.closing:  # shutdown, not disconnect: somebody is listening
                host.report_error(pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", rid, {"reason": "cancelled"})
                sink.state_change(pb.SERVICE_STATE_ERROR, rid)
            raise
        except Exception as exc:  # a bug of ours: report it, keep the session
            self.audit.end(rid, exc)
            log.exception("request failed", extra={"fields": {"peer": host.peer, "request_id": rid}})
            host.report_error(pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", rid)
            sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        else:
            if rid in self._cancelling:  # it ended after the Cancel came: cancelled all the same
                self._cancelled(rid, span)
            else:
                self.audit.end(rid)
                sink.state_change(pb.SERVICE_STATE_READY, rid)
        finally:
            _REQUEST.reset(token)
            self._running.pop(rid, None)
            self._early.pop(rid, None)
            self._ended[rid] = self._cancelling.pop(rid, None) is not None
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
            if span is not tracing.NOOP:
                self.spans.pop(rid, None)
                span.end()

    def run_now(self, spec: CommandSpec, rid: str, command: pb.Command) -> bool:
        """Run a request of a row with a ``now`` shortcut in this step, without a coroutine, when
        it can (what ``run`` does first); the session calls it when nothing else holds the output
        budget. True: it ended, its terminal state sent. False: :meth:`run` it, which goes on
        with what this started, if anything."""
        step = self._now(spec, rid, command)
        if step is True:
            return True
        if step is not None:
            self._going_on[rid] = step
        return False

    def _now(self, spec: CommandSpec, rid: str, command: pb.Command) -> Literal[True] | Handler | None:
        """The row's shortcut (a small fs.read), where nothing watches the request (tracing, a
        Cancel or stdin sent before it): True when it ended, its handler's replacement when it
        started and goes on, None when it did not run."""
        now = spec.now
        if now is None or self._host.span is not tracing.NOOP or rid in self._cancelling or rid in self._early:
            return None
        try:
            step = now(self, rid, getattr(command, spec.kind))
        except Exception as exc:  # a bug of ours: reported by run, as a handler's
            return _raising(exc)
        if step is True:
            self._ended[rid] = False
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
            return True
        return None if step is None or step is False else step

    def _cancelled(self, rid: str, span: tracing.SpanHandle) -> None:
        """The one terminal state of a request ended by a Cancel."""
        message = f"request {rid} cancelled by the peer"
        span.fail("cancelled", message)
        self.audit.end(rid, ProtocolError(message, pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"}))
        self._host.report_error(pb.ERROR_CODE_UNSPECIFIED, message, rid, {"reason": "cancelled"})
        self.sink.state_change(pb.SERVICE_STATE_ERROR, rid)

    # ---- control: commands on a running request (RequestControl) ----------------------------------

    def cancel(self, rid: str) -> None:
        if rid in self._cancelling:
            return  # a second Cancel while the first is under way
        task = self._running.get(rid)
        if task is None and rid in self._running:  # started eagerly, now suspended in the session's task
            task = self._host.task(rid)
        if task is None:
            if self._host.is_running(rid):  # admitted, its task not started yet: it ends at its start
                self._cancelling[rid] = None
                return
            if self._background(rid):  # not this session's request: a background process
                self.core.background.cancel(rid)
                return
            if self._ended.get(rid):
                return  # already cancelled and ended: cancelling twice is harmless
            raise _not_running(rid, "cancel", rid in self._ended)
        stopping = self._cancelling[rid] = asyncio.get_running_loop().create_task(self._stop(rid, task))
        _STOPPING.add(stopping)
        stopping.add_done_callback(_STOPPING.discard)

    async def _stop(self, rid: str, task: asyncio.Task[None]) -> None:
        """SIGTERM to the request's process groups, SIGKILL after ``--kill-grace``; the handler
        then sends their final output and ends (as cancelled, ``run``). A request without a process
        of its own (a tool call, a hook load, a plan between steps) has its task cancelled."""
        grace = self.core.limits.kill_grace
        procs = list(self._owned.get(rid, ()))
        if procs:
            await asyncio.gather(*(p.terminate(grace) for p in procs), return_exceptions=True)
            await asyncio.wait([task], timeout=grace)
        if not task.done():
            task.cancel()

    def wants(self, addition: str) -> bool:
        return addition in self._host.accepted

    def cancelling(self) -> bool:
        """Whether the request this runs for (a handler's context) is being cancelled."""
        rid = _REQUEST.get()
        return rid is not None and rid in self._cancelling

    def _input_target(self, rid: str, what: str) -> ShellProcess | _EarlyInput:
        proc = self._interactive.get(rid)
        if proc is not None:
            return proc
        early = self._early.get(rid)
        if early is not None:
            return early
        if rid not in self._running and self._host.is_running(rid):  # its task has not started yet
            early = self._early[rid] = _EarlyInput()
            return early
        if rid not in self._running and self._background(rid) and (proc := self.core.background.process(rid)) is not None:
            return proc  # (one without stdin or a terminal: refused by the caller)
        if rid in self._running and what == "resize":  # as for a command with open stdin only
            raise ProtocolError(f"request {rid} has no terminal: send its ShellExec with pty to resize it", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "no_terminal"})
        if rid in self._running:
            raise ProtocolError(
                f"request {rid} has no open stdin: {what} needs a ShellExec sent with open_stdin or pty",
                pb.ERROR_CODE_UNSPECIFIED,
                rid,
                {"reason": "stdin_closed"},
            )
        raise _not_running(rid, what, rid in self._ended)

    def _background(self, rid: str) -> bool:
        """Whether ``rid`` is a background process (any session's, service/background.py); steering
        it takes what starting it took, ``shell_exec`` granted."""
        found = rid in self.core.background
        if found and pb.CAPABILITY_SHELL_EXEC not in self._host.granted:
            raise ProtocolError(
                f"background process {rid} can be steered only by a session granted shell_exec in its handshake",
                pb.ERROR_CODE_INVALID_CAPABILITY, rid, {"reason": "capability_required", "capability": "shell_exec"},
            )
        return found

    def write_stdin(self, rid: str, data: bytes, eof: bool) -> None:
        target = self._input_target(rid, "write stdin to")
        limit = self.core.limits.max_stdin_buffer
        if isinstance(target, _EarlyInput):
            if data and (target.eof or len(target.data) + len(data) > limit):
                raise self._stdin_refused(rid, len(target.data), limit, target.eof)
            target.data += data
            target.eof = target.eof or eof
            return
        if data:
            if not target.stdin_open:
                raise self._stdin_refused(rid, 0, limit, True)
            if not target.write_stdin(data):
                raise self._stdin_refused(rid, target.stdin_buffered, limit, False)
        if eof:
            target.close_stdin()

    @staticmethod
    def _stdin_refused(rid: str, buffered: int, limit: int, closed: bool) -> ProtocolError:
        if closed:
            return ProtocolError(f"the stdin of request {rid} is closed; the data was not written", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"})
        return ProtocolError(
            f"the stdin of request {rid} is full: the command has not read {buffered} bytes "
            f"(max --max-stdin-buffer {limit}); this StdinCommand was refused whole, send it again once it reads",
            pb.ERROR_CODE_RESOURCE_EXHAUSTED,
            rid,
            {"reason": "stdin_full"},
        )

    def resize(self, rid: str, rows: int, cols: int) -> None:
        target = self._input_target(rid, "resize")
        size = terminal_size(rows, cols, rid)
        if isinstance(target, _EarlyInput):
            target.size = size
        elif not target.is_pty:
            raise ProtocolError(f"request {rid} has no terminal: send its ShellExec with pty to resize it", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "no_terminal"})
        else:
            target.resize(*size)

    # ---- the processes of the running requests (Execution) --------------------------------------

    def process_started(self, rid: str, proc: ShellProcess) -> None:
        self.processes.add(proc)
        self._owned.setdefault(_REQUEST.get() or rid, set()).add(proc)
        early = self._early.pop(rid, None)
        if early is None or not (proc.stdin_open or proc.is_pty):
            return
        self._interactive[rid] = proc
        if early.size is not None and proc.is_pty:
            proc.resize(*early.size)
        if early.data:
            proc.write_stdin(bytes(early.data))  # within the limit, which is the process's too
        if early.eof:
            proc.close_stdin()

    def process_ended(self, rid: str, proc: ShellProcess) -> None:
        self.processes.discard(proc)
        owner = _REQUEST.get() or rid
        owned = self._owned.get(owner)
        if owned is not None:
            owned.discard(proc)
            if not owned:
                del self._owned[owner]
        if self._interactive.get(rid) is proc:
            del self._interactive[rid]

    async def reading(self) -> None:
        await self._host.reading()

    def pause(self) -> None:
        for proc in self.processes:
            proc.pause_reading()

    def resume(self) -> None:
        for proc in self.processes:
            proc.resume_reading()

    async def shutdown(self, grace: float) -> None:
        # Stop children gracefully so their last output and exit codes are still delivered.
        await asyncio.gather(*(p.terminate(grace) for p in list(self.processes)), return_exceptions=True)

    def kill(self) -> None:
        for proc in list(self.processes):
            proc.close()

    def end(self) -> None:
        self._going_on.clear()  # started by run_now, never run (cancelled waiting for the budget)
        self.audit.close()
        if self.hooks.owns_hooks:
            asyncio.get_running_loop().create_task(self.hooks.close())  # Rust hooks' processes end with the session


class RunnerCore(ExecutionCore, Protocol):
    """What the local runner takes from the core: an execution core, plus hooks and counters."""

    @property
    def global_hooks(self) -> list[Hook]: ...

    @property
    def hook_limits(self) -> HookLimits: ...

    @property
    def metrics(self) -> ServiceMetrics: ...


def local_runner(core: RunnerCore) -> RunnerFactory:
    """The factory of ``serve``'s runners: each session's requests run here on ``core``."""
    return lambda host: LocalRunner(core, host)
