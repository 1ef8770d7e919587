"""Starting a session's admitted requests: the one way a request starts.

A request whose row has a one-step shortcut (a tool call that ends at once) is answered in the step
that read it, when nothing holds or waits for the output budget and the peer reads (then
reserving and releasing the budget is nothing). Every other request runs as a task (started
eagerly on Python 3.12+, up to its first suspension; a plain task on 3.11) that first takes its
share of the output budget (:mod:`~smith_fast.service.flow`): while it waits, the command is held
and counted, and the session stops reading the peer's commands when those held weigh over a quarter
of the budget.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Coroutine
from time import perf_counter  # bound once: twice per request
from typing import TYPE_CHECKING, Any, Protocol

from .flow import SessionFlow, reservation
from .request import Request

if TYPE_CHECKING:
    from ..pb import smith_pb2 as pb
    from ..relaypeek import ToolCall
    from .commands import CommandSpec
    from .config import Limits
    from .metrics import ServiceMetrics
    from .request_table import RequestTable
    from .runner import RequestRunner

__all__ = ["RequestStarter", "Starting"]


class Starting(Protocol):
    """What starting requests uses of the session (:class:`~smith_fast.service.session.Session`)."""

    shutting: bool
    last_active: float

    @property
    def requests(self) -> RequestTable: ...

    @property
    def runner(self) -> RequestRunner: ...

    def update_input(self) -> None:
        """Hold or release the peer's input, as its flow says (unless the session is over)."""

    def now(self) -> float: ...


class RequestStarter:
    """Starts the requests of one session.

    Args:
        session: the session.
        flow: its flow control (the budget a request waits for).
        limits: the service's limits (the budget a request of each kind reserves).
        metrics: where each request's latency is observed.
    """

    __slots__ = ("_session", "_flow", "_limits", "_metrics", "_loop")

    def __init__(self, session: Starting, flow: SessionFlow, limits: Limits, metrics: ServiceMetrics) -> None:
        self._session = session
        self._flow = flow
        self._limits = limits
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()

    def start(self, rid: str, spec: CommandSpec, command: pb.Command | None, call: ToolCall | None = None) -> None:
        """Admit request ``rid`` (refused: the table says so) and start it; ``command`` asked for
        it, or ``call`` did (a plain tool call read off its frame, :class:`Request`)."""
        session = self._session
        requests = session.requests
        request = requests.admit(rid, spec, command, call)
        if request is None:
            return
        start = perf_counter()
        work = session.runner.start(request, self._flow.free and not session.shutting)
        if work is None:  # ended in this step
            requests.forget(request)
            session.last_active = self._loop.time()
            self._metrics.observe_request(spec.kind, perf_counter() - start)
            return
        task = request.task = _task(self._loop, self._run(request, work, start))
        task.add_done_callback(functools.partial(_forget, requests, request))

    async def _run(self, request: Request, work: Coroutine[Any, Any, None], start: float) -> None:
        session = self._session
        spec = request.spec
        assert spec is not None
        size = reservation(spec.kind, self._limits)
        budget = self._flow.budget
        try:
            if not self._flow.free:
                await self._wait(size, request.command.ByteSize())
            else:
                budget.reserved += size  # the common case: nothing else runs, the peer reads
        except asyncio.CancelledError:
            work.close()
            request.finish(asyncio.CancelledError())  # its one terminal state, as a running request's
            raise
        if session.shutting:  # it waited for the budget while the session began shutting down
            budget.release(size)
            work.close()
            request.finish(asyncio.CancelledError())
            return
        try:
            await work
        finally:
            budget.release(size)
            session.update_input()
            session.last_active = session.now()
            self._metrics.observe_request(spec.kind, perf_counter() - start)

    async def _wait(self, size: int, held: int) -> None:
        """Wait for the output budget, holding a ``held``-byte command meanwhile."""
        session, flow = self._session, self._flow
        flow.waiting_bytes += held
        session.update_input()
        try:
            await flow.budget.acquire(size)
        finally:
            flow.waiting_bytes -= held
            session.update_input()


def _forget(requests: RequestTable, request: Request, _task: asyncio.Task[None]) -> None:
    requests.forget(request)


if sys.version_info >= (3, 12):

    def _task(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A request's task, run at once up to its first suspension (one that does not wait
        ends without a loop iteration)."""
        return asyncio.Task(work, loop=loop, eager_start=True)

else:

    def _task(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A request's task (3.11 has no eager start)."""
        return loop.create_task(work)
