"""The request runner seam: how a session's admitted requests are run, steered and ended.

A :class:`~smith_fast.service.session.Session` keeps the protocol state (handshake, grants, token,
flow control, teardown) and admits each request (capability, size, request id, ``--max-requests``);
what happens to an admitted request is its :class:`RequestRunner`'s business. :class:`LocalRunner`
(``serve``, and a NATS worker, which serves each relayed session as ``serve`` does) runs it here with
the handler of its row in :data:`~smith_fast.service.commands.COMMANDS`: ``PROCESSING``, the
handler's events, then ``READY`` or its error and ``ERROR``.

A runner is made per session (:func:`local_runner`, the core's factory) from the session's
:class:`RequestHost` view. What a later command does to a *running* request (cancel, stdin,
resize, attach) belongs here too: a method on :class:`RequestRunner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .. import tracing
from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .audit import Audit
from .commands import ControlTarget, Handler, RequestControl
from .execution import Execution, ExecutionCore
from .process_slots import SessionSlots
from .request import EarlyInput, Request, RequestState
from .request_table import RequestTable
from .session_hooks import SessionHooks
from ..sandbox.zygote import Zygotes

if TYPE_CHECKING:
    from ..hooks import Hook, HookLimits
    from ..process import Collected, ShellProcess
    from ..tools import ProcessRequest
    from .metrics import ServiceMetrics
    from .sinks import EventSink
    from .session_home import Homes, SessionHome
    from ..tools import ToolContext, ToolRegistry
    from ..workspaces import WorkspaceOps
    from ..workspaces.workspace import Workspace
    from ..plan import Planner
    from .config import Limits, ServiceConfig
    from .egress import SessionEgress
    from .execution import BackgroundProcesses

__all__ = ["RequestHost", "RequestRunner", "RunnerFactory", "LocalRunner", "RunnerCore", "WorkspaceScope", "local_runner"]

log = get_logger("smith_fast.session")

# The request a handler runs for (set in LocalRunner.run; the tasks a handler starts inherit it), so
# that a process started for a plan's step belongs to the plan a Cancel names.
_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar("smith_fast_request", default=None)



def _raising(exc: Exception) -> Handler:
    async def handler(_ex: Execution, _rid: str, _request: object) -> None:
        raise exc

    return handler


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

    @property
    def requests(self) -> RequestTable:
        """The session's requests."""
        ...

    async def reading(self) -> None:
        """Return once the peer reads (at once unless the session is paused)."""
        ...

    def report_error(self, code: int, message: str, rid: str | None = None, details: Mapping[str, str] | None = None) -> None:
        """Send (and count) an ``ErrorEvent``."""
        ...

    def reject(self, exc: ProtocolError) -> None:
        """Report an error, then its request's terminal ``ERROR`` state."""
        ...


class RequestRunner(RequestControl, Protocol):
    """Runs the admitted requests of one session, and finds the running ones a control command
    names (:class:`~smith_fast.service.commands.RequestControl`)."""

    def start(self, request: Request, at_once: bool) -> Coroutine[Any, Any, None] | None:
        """Start admitted ``request``: None when it ended here (the one-step shortcut of its row,
        tried only when ``at_once``: nothing holds the output budget and the peer reads), else
        the coroutine that runs it until its terminal state was sent, which the session runs as
        a task (cancelling it ends the request: shutdown, teardown).
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

    def use_workspace(self, workspace: Workspace) -> None:
        """Run the session's requests in ``workspace`` from now on (its handshake opened it)."""
        ...

    def use_egress(self, egress: SessionEgress) -> None:
        """Serve the network of the session's processes with ``egress`` (its handshake chose it: ``--network allow``)."""
        ...


RunnerFactory = Callable[[RequestHost], RequestRunner]
"""Makes the runner of a new session (``ServiceCore.make_runner``)."""


class LocalRunner:
    """Runs requests here, with the handlers of the command table (an
    :class:`~smith_fast.service.execution.Execution`).

    Args:
        core: tools, limits, planner, process slots, global hooks.
        host: the session.
    """

    def __init__(self, core: RunnerCore, host: RequestHost) -> None:
        self.core: RunnerCore = core
        self._host = host
        # The session's own home (session_home.py); with --workspaces it is the workspace's instead.
        self.home: SessionHome | None = None
        if core.homes is not None:
            self.home = core.homes.open()
            self.core = WorkspaceScope(core, _Scoped(_with_home(core.tool_context, self.home.path, core.homes.top)))
            core = self.core
        self.sink = host.sink
        self.requests = host.requests
        self.processes: set[ShellProcess] = set()
        self.slots = SessionSlots()  # of the service's process slots, what the session holds
        self.spans = self.requests.spans()  # request id -> its command span (while tracing is granted)
        # The tool context of the calls answered in one step: its processes are those of the
        # request the call runs for (the tool of a ToolCall that no hook renamed), found when one
        # starts, so that no context is copied per call. A call with tool hooks, or a plan's
        # step, gets a context bound to its id and tool (commands.run_tool).
        self.tool_context = core.tool_context.with_process_runner(self._current_call_process)
        self.audit = Audit(host.session_id, host.peer, self.requests.audit_record)
        self.workspace: WorkspaceOps | None = None  # the session's, once its handshake opened one
        # The session's sandbox, built at its first command and kept, its commands forked inside
        # (sandbox/zygote.py); closed with the session, which ends every process left in it.
        sandbox = core.tool_context.sandbox
        self.zygotes: Zygotes | None = Zygotes() if sandbox is not None and sandbox.active else None
        self.egress: SessionEgress | None = None  # the session's, once its handshake chose it (--network allow)
        self.hooks = SessionHooks(
            core.global_hooks,
            failure=core.config.hook_failure,
            limits=core.hook_limits,
            emit=host.sink.event,
            count=core.metrics.hook_decision,
            spans=self.spans,
            peer=host.peer,
            decided=self.audit.decision,
        )

    def use_workspace(self, workspace: Workspace) -> None:
        """Run the session's requests in ``workspace`` from now on (its handshake opened it): its
        root and sandbox instead of the core's, again after each remount of it."""
        self.workspace = workspace
        self.audit.workspace = workspace.id
        # The session's zygote is built on the workspace's root as it is mounted then (its view
        # binds that mount). The root is mounted again at a checkpoint's restore, an undo, and,
        # in a session that records what each request changed, after each request that wrote (its
        # own layer): each time with no command of the session running (layers freeze only when it
        # is quiet), the zygotes close and the next command builds one on the new root.
        if self.zygotes is not None:
            self.zygotes.reset()
        self.core = WorkspaceScope(self.core, workspace)
        self._rebind(workspace.tool_context)
        workspace.watch(functools.partial(self._remounted, workspace))

    def _remounted(self, workspace: Workspace, context: ToolContext) -> None:
        self._rebind(context)
        if self.zygotes is None:
            return
        self.zygotes.reset()
        if workspace.recording and workspace.sandbox.active:
            # Mounted again after each request that wrote: the next zygote is built now, while
            # the peer reads that request's end (a command that comes before it is ready waits for
            # it, as long as its own sandbox would have taken to build; built at the command, a
            # writing command took 6.3 ms here, against 3.8 one-shot: bench_workspaces' figure 4).
            from ..process_spawn import session_zygote  # the process stack, loaded with the first command

            with contextlib.suppress(OSError, ValueError):  # not built now: the next command tries
                session_zygote(self.zygotes, workspace.sandbox, asyncio.get_running_loop())

    def use_egress(self, egress: SessionEgress) -> None:
        self.egress = egress

    def _rebind(self, context: ToolContext) -> None:
        self.tool_context = context.with_process_runner(self._current_call_process)

    @property
    def paused(self) -> bool:
        return self._host.paused

    @property
    def shutting(self) -> bool:
        return self._host.shutting

    def start(self, request: Request, at_once: bool) -> Coroutine[Any, Any, None] | None:
        spec = request.spec
        assert spec is not None and spec.handler is not None  # the session starts only rows with a handler
        now = spec.now
        if now is not None and at_once and self._host.span is tracing.NOOP:
            try:
                step = now(self, request)
            except Exception as exc:  # a bug of ours: reported by run, as a handler's
                return self.run(request, _raising(exc))
            if step is True:
                return None
            if step is not None and step is not False:
                return self.run(request, step)  # started, not ended: it goes on as any request
        return self.run(request, spec.handler)

    async def run(self, request: Request, handler: Handler) -> None:
        """Run ``request`` with ``handler`` until its terminal state was sent."""
        host = self._host
        spec = request.spec
        assert spec is not None
        rid = request.id
        self.sink.state_change(pb.SERVICE_STATE_PROCESSING, rid)
        session_span = host.span
        if session_span is not tracing.NOOP:
            request.span = session_span.command_span(spec.kind, rid)
        request.audit = self.audit.open(rid, spec.kind)
        cmd = getattr(request.command, spec.kind)
        if spec.kind == "shell_exec" and (cmd.open_stdin or cmd.HasField("pty")):
            if request.early is None:
                request.early = EarlyInput()
        elif request.early is not None:  # stdin sent before it started, but it has none
            request.early = None
            host.protocol_error(ProtocolError(
                f"request {rid} has no open stdin: its ShellExec was sent without open_stdin or pty; the data was not written",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"},
            ))
        token = _REQUEST.set(request)
        try:
            if request.state is RequestState.CANCELLING:  # cancelled before it started
                raise ProtocolError("request cancelled before it started", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"})
            request.state = RequestState.RUNNING
            await handler(self, rid, cmd)
        except ProtocolError as exc:
            request.finish(exc)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()  # a cancellation arrives only in a task
            assert task is not None
            if request.state is RequestState.CANCELLING and not host.closing and not host.shutting and task.cancelling() <= 1:
                task.uncancel()  # our own Cancel: the request ends here, the session goes on
                request.finish()
                return
            request.finish(exc)
            raise
        except Exception as exc:  # a bug of ours: report it, keep the session
            log.exception("request failed", extra={"fields": {"peer": host.peer, "request_id": rid}})
            request.finish(exc)
        else:
            request.finish()
        finally:
            _REQUEST.reset(token)

    # ---- control: commands on a running request (RequestControl) ----------------------------------

    def target(self, rid: str, what: str) -> ControlTarget | None:
        return self.requests.resolve(rid, what, self.core.background, self._host.granted)

    def wants(self, addition: str) -> bool:
        return addition in self._host.accepted

    def cancelling(self) -> bool:
        """Whether the request this runs for (a handler's context) is being cancelled."""
        request = _REQUEST.get()
        return request is not None and request.state is RequestState.CANCELLING

    # ---- the processes of the running requests (Execution) --------------------------------------

    async def _current_call_process(self, spec: ProcessRequest) -> Collected:
        """``ToolContext.run_process`` of :attr:`tool_context`: through the choke point, for the
        ToolCall this runs for; refused outside one (a task the tool left behind)."""
        request = _REQUEST.get()
        if request is None or request.spec is None or request.spec.kind != "tool_call":
            raise ProtocolError("a tool started a process outside its call; it was not run", pb.ERROR_CODE_INTERNAL_ERROR)
        from . import launch  # the process stack: with the first process, not at start (service/commands.py)

        return await launch.collect(self, request.id, spec, origin=request.command.tool_call.tool)

    def process_started(self, rid: str, proc: ShellProcess) -> None:
        self.processes.add(proc)
        owner = _REQUEST.get() or self.requests.get(rid)
        if owner is not None:
            owner.process_started(rid, proc)

    def process_ended(self, rid: str, proc: ShellProcess) -> None:
        self.processes.discard(proc)
        owner = _REQUEST.get() or self.requests.get(rid)
        if owner is not None:
            owner.process_ended(proc)

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
        self.audit.close()
        if self.zygotes is not None:
            self.zygotes.close()
        if self.home is not None:
            self.home.remove()
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

    @property
    def homes(self) -> Homes | None:
        """``--home-dir``'s homes (sessions without a workspace, ``--sandbox workspace-write``), else None."""
        ...


class _ScopeSource(Protocol):
    @property
    def tool_context(self) -> ToolContext: ...


class _Scoped:
    """A fixed tool context (a session without a workspace, with a home of its own)."""

    __slots__ = ("tool_context",)

    def __init__(self, context: ToolContext) -> None:
        self.tool_context = context


def _with_home(context: ToolContext, home: str, homes: str) -> ToolContext:
    return context.with_sandbox(context.sandbox.with_home(home, homes)) if context.sandbox is not None else context


class WorkspaceScope:
    """A core as the requests of a session with a workspace see it: the core's, but for the tool
    context (the workspace's root, its sandbox), which changes at each remount of the workspace.
    A session without a workspace but with a home of its own sees the core through one too (its
    sandbox lets it write its home)."""

    __slots__ = ("_core", "_workspace")

    def __init__(self, core: RunnerCore, workspace: _ScopeSource) -> None:
        self._core = core
        self._workspace = workspace

    @property
    def tool_context(self) -> ToolContext:
        return self._workspace.tool_context

    @property
    def config(self) -> ServiceConfig:
        return self._core.config

    @property
    def limits(self) -> Limits:
        return self._core.limits

    @property
    def tools(self) -> ToolRegistry:
        return self._core.tools

    @property
    def planner(self) -> Planner:
        return self._core.planner

    @property
    def capabilities(self) -> frozenset[int]:
        return self._core.capabilities

    @property
    def background(self) -> BackgroundProcesses:
        return self._core.background

    @property
    def global_hooks(self) -> list[Hook]:
        return self._core.global_hooks

    @property
    def hook_limits(self) -> HookLimits:
        return self._core.hook_limits

    @property
    def metrics(self) -> ServiceMetrics:
        return self._core.metrics

    @property
    def homes(self) -> Homes | None:
        return self._core.homes

    def acquire_process(self) -> bool:
        return self._core.acquire_process()

    def release_process(self) -> None:
        self._core.release_process()


def local_runner(core: RunnerCore) -> RunnerFactory:
    """The factory of ``serve``'s runners: each session's requests run here on ``core``."""
    return lambda host: LocalRunner(core, host)
