"""What a command handler may use while it runs a request on this machine.

The handlers (:mod:`~smith_fast.service.commands`, :mod:`~smith_fast.service.shell_exec`) are typed
against these protocols, not against the session or the core, so they import neither:
:class:`~smith_fast.service.runner.LocalRunner` is the one :class:`Execution` of the service.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .. import tracing
    from ..errors import ProtocolError
    from ..plan import Planner
    from ..process import ShellProcess
    from ..sandbox.zygote import Zygotes
    from ..tools import ToolContext, ToolRegistry
    from .audit import Audit
    from ..pb import smith_pb2 as pb
    from .config import Limits, ServiceConfig
    from .egress import SessionEgress
    from .process_slots import SessionSlots
    from .session_hooks import SessionHooks
    from .session_home import SessionHome
    from .sinks import EventSink
    from ..workspaces import WorkspaceOps

__all__ = ["BackgroundProcesses", "ControlTarget", "Execution", "ExecutionCore"]


class ControlTarget(Protocol):
    """What a control command can do to the running request it names (a
    :class:`~smith_fast.service.request.Request` or a background process). Each raises
    :class:`~smith_fast.errors.ProtocolError` when it cannot (no open stdin, no terminal, stdin
    buffer full); the request itself goes on."""

    def cancel(self) -> None:
        """End it as cancelled: its processes get SIGTERM, then SIGKILL after ``--kill-grace``;
        its final events are sent, then one ``ErrorEvent`` (reason ``cancelled``) and
        ``StateChange ERROR``. Harmless while a cancel of it is under way."""
        ...

    def write_stdin(self, data: bytes, eof: bool) -> None:
        """Write ``data`` to its open stdin (or terminal); then close it if ``eof``."""
        ...

    def resize(self, rows: int, cols: int) -> None:
        """Set its terminal size (a ShellExec run with a ``pty``)."""
        ...


class BackgroundProcesses(Protocol):
    """The service's background processes (:class:`~smith_fast.service.background.BackgroundTable`)."""

    async def start(self, ex: Execution, rid: str, cmd: pb.ShellExecCommand, env: dict[str, str]) -> int:
        """Run admitted ShellExec ``rid`` on in the background; its request then ends."""
        ...

    async def attach(self, ex: Execution, rid: str, cmd: pb.AttachCommand) -> None: ...

    async def list_processes(self, ex: Execution, rid: str, cmd: pb.ListProcessesCommand) -> None: ...

    def __contains__(self, pid: object) -> bool: ...

    def running_in(self, workspace: str) -> list[str]:
        """The ids of the running background processes started in ``workspace``."""
        ...

    def process(self, pid: str) -> ShellProcess | None:
        """Its process (for stdin and resizes), None when there is no background process ``pid``."""
        ...

    def cancel(self, pid: str) -> None: ...

    def elsewhere(self, pid: str, report: Callable[[ProtocolError], None]) -> ControlTarget | None:
        """What Cancel, Stdin and Resize naming ``pid``, a background process not held here, act
        on: None on ``serve``; on a NATS worker, another worker's process (answered later: what it
        refuses goes to ``report``)."""
        ...


class ExecutionCore(Protocol):
    """The shared parts a request runs with (:class:`~smith_fast.service.core.ServiceCore` is one)."""

    @property
    def config(self) -> ServiceConfig: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def tool_context(self) -> ToolContext: ...

    @property
    def planner(self) -> Planner: ...

    @property
    def capabilities(self) -> frozenset[int]:
        """What the service offers (``--capabilities``): a process needs ``shell_exec`` whichever way it starts."""
        ...

    @property
    def background(self) -> BackgroundProcesses:
        """The service's background processes (ShellExec ``background``), shared by its sessions."""
        ...

    def acquire_process(self) -> bool: ...

    def release_process(self) -> None: ...


class Execution(Protocol):
    """One session's requests as they run here: where their events go, their hooks, their processes."""

    @property
    def core(self) -> ExecutionCore: ...

    @property
    def sink(self) -> EventSink: ...

    @property
    def hooks(self) -> SessionHooks: ...

    @property
    def tool_context(self) -> ToolContext:
        """The context of a tool call answered in one step: its processes run for the ToolCall
        being run (a call through the hooks binds its own: ``commands.run_tool``)."""
        ...

    @property
    def audit(self) -> Audit:
        """The session's audit records: what each request ran, what the hooks said, how it ended."""
        ...

    @property
    def home(self) -> SessionHome | None:
        """The session's home under ``--home-dir``, bounded before each process starts; None with a
        workspace (its home is in the workspace's volume) or when commands get none."""
        ...

    @property
    def processes(self) -> set[ShellProcess]:
        """The running children, so flow control and teardown reach them."""
        ...

    @property
    def slots(self) -> SessionSlots:
        """The process slots the session holds (``--max-processes-per-session``; process_slots.py)."""
        ...

    @property
    def spans(self) -> Mapping[str, tracing.SpanHandle]:
        """Request id → its command span (only while tracing is granted)."""
        ...

    @property
    def workspace(self) -> WorkspaceOps | None:
        """The session's workspace (``serve --workspaces``), None without one."""
        ...

    @property
    def zygotes(self) -> Zygotes | None:
        """The session's sandboxes built once (:mod:`smith_fast.sandbox.zygote`), in which its piped
        commands are forked; None: each command gets a sandbox of its own (no sandbox)."""
        ...

    @property
    def egress(self) -> SessionEgress | None:
        """The session's egress (``--network allow``: :mod:`smith_fast.service.egress`), None without it."""
        ...

    def process_started(self, rid: str, proc: ShellProcess) -> None:
        """``proc`` runs for ShellExec ``rid``: in :attr:`processes`, reached by a Cancel of its
        request, and given the stdin and resizes sent for ``rid`` (with open stdin or a pty)."""
        ...

    def process_ended(self, rid: str, proc: ShellProcess) -> None:
        """``proc`` (started with :meth:`process_started`) is over."""
        ...

    def cancelling(self) -> bool:
        """The request this handler runs for is being cancelled: start nothing more."""
        ...

    def wants(self, addition: str) -> bool:
        """The peer asked for this Envelope addition in its handshake (``smith_fast.accept``;
        PROTOCOL.md, "Asking for the additions"), e.g. ``usage``."""
        ...

    @property
    def paused(self) -> bool:
        """The peer stopped reading: a process started now starts paused."""
        ...

    async def reading(self) -> None:
        """Return once the peer reads (at once unless it stopped): what produces output step
        by step waits here before each step (service/flow.py)."""
        ...

    @property
    def shutting(self) -> bool:
        """The session is shutting down: a command that ends now ends as cancelled."""
        ...
