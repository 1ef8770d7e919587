"""What a command handler may use while it runs a request on this machine.

The handlers (:mod:`~smith_fast.service.commands`, :mod:`~smith_fast.service.shell_exec`) are typed
against these protocols, not against the session or the core, so they import neither:
:class:`~smith_fast.service.runner.LocalRunner` is the one :class:`Execution` of the service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .. import tracing
    from ..plan import Planner
    from ..process import ShellProcess
    from ..tools import ToolContext, ToolRegistry
    from .config import Limits, ServiceConfig
    from .session_hooks import SessionHooks
    from .sinks import EventSink

__all__ = ["Execution", "ExecutionCore"]


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
    def processes(self) -> set[ShellProcess]:
        """The running children, so flow control and teardown reach them."""
        ...

    @property
    def spans(self) -> dict[str, tracing.SpanHandle]:
        """Request id → its command span (only while tracing is granted)."""
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
