"""A session's ``BatchCommand``s: refused whole over ``--max-batch-commands``; a large one handled a
slice per loop iteration (what arrives meanwhile waits, so envelopes are handled in the order they
came); an ordered one command after command."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb

if TYPE_CHECKING:
    from .request_table import RequestTable

__all__ = ["BATCH_SLICE", "Batches", "Batching"]

BATCH_SLICE = 128
"""Commands of a batch handled per loop iteration: a large batch must not stall other sessions."""


class Batching(Protocol):
    """What the batches do with their session (:class:`~smith_fast.service.session.Session`)."""

    @property
    def authenticated(self) -> bool: ...

    @property
    def closing(self) -> bool: ...

    @property
    def shutting(self) -> bool: ...

    @property
    def requests(self) -> RequestTable: ...

    def handle(self, command: pb.Command) -> None: ...

    def route(self, env: pb.Envelope, kind: str | None) -> None: ...

    def request_id(self, command: pb.Command) -> str | None: ...

    def protocol_error(self, exc: ProtocolError) -> None: ...

    def deny(self, message: str, rid: str | None = None) -> None: ...

    def end_refused(self, rid: str) -> None:
        """Send the terminal ``ERROR`` of request ``rid``, which did not run."""


class Batches:
    """The batches of one session being dispatched (or run in order).

    Args:
        session: the session.
        limit: ``--max-batch-commands``.
    """

    __slots__ = ("_session", "_limit", "tasks", "backlog", "_loop")

    def __init__(self, session: Batching, limit: int) -> None:
        self._session = session
        self._limit = limit
        self.tasks: set[asyncio.Task[None]] = set()
        # While a large batch is dispatched slice by slice, what arrives after it waits here.
        self.backlog: collections.deque[tuple[pb.Envelope, str | None]] | None = None
        self._loop = asyncio.get_running_loop()

    def admit(self, batch: pb.BatchCommand) -> None:
        commands = batch.commands
        if len(commands) > self._limit:
            self._refuse(list(commands))
            return
        if batch.require_ordering:
            self._in_task(self.run_ordered(list(commands)))
        elif len(commands) <= BATCH_SLICE:
            handle = self._session.handle
            for command in commands:
                handle(command)
        else:
            self.backlog = collections.deque()
            self._in_task(self._dispatch(list(commands)))

    def _in_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _dispatch(self, commands: list[pb.Command], each: Callable[[pb.Command], None] | None = None) -> None:
        """Handle an unordered batch ``BATCH_SLICE`` commands at a time (with ``each``, default
        the session's ``handle``), then what arrived meanwhile."""
        session = self._session
        each = session.handle if each is None else each
        try:
            for start in range(0, len(commands), BATCH_SLICE):
                for command in commands[start : start + BATCH_SLICE]:
                    each(command)
                await asyncio.sleep(0)
        finally:
            backlog, self.backlog = self.backlog, None
            while backlog and not (session.closing or session.shutting):
                env, kind = backlog.popleft()
                session.route(env, kind)
                if self.backlog is not None:  # it started another large batch: the rest waits for it
                    self.backlog.extend(backlog)
                    break

    def _refuse(self, commands: list[pb.Command]) -> None:
        """A batch over ``--max-batch-commands``: one error for the batch, nothing of it runs, and
        each readable request id in it (not that of a running request) ends ``ERROR``."""
        session, limit = self._session, self._limit
        message = f"a BatchCommand of {len(commands)} commands is over the limit of {limit} (--max-batch-commands); none of it was run"
        if not session.authenticated:
            session.deny("a BatchCommand before an authenticated handshake: this service needs a token")
            return
        session.protocol_error(
            ProtocolError(
                message,
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                details={"reason": "batch_too_large", "size": str(len(commands)), "limit": str(limit)},
            )
        )
        ended: set[str] = set()

        def end(command: pb.Command) -> None:
            rid = session.request_id(command)
            if rid is not None and rid not in ended and rid not in session.requests:
                ended.add(rid)
                session.end_refused(rid)

        if len(commands) <= BATCH_SLICE:
            for command in commands:
                end(command)
        else:  # 200,000 terminal states in one step stalled every other session for a second
            self.backlog = collections.deque()
            self._in_task(self._dispatch(list(commands), end))

    async def run_ordered(self, commands: list[pb.Command]) -> None:
        """A ``BatchCommand`` with ``require_ordering``: each command starts after the previous one ended."""
        session = self._session
        for i, command in enumerate(commands):
            if i % BATCH_SLICE == BATCH_SLICE - 1:
                await asyncio.sleep(0)  # refused commands start no task to wait for
            session.handle(command)
            kind = command.WhichOneof("command_type")
            rid = getattr(getattr(command, kind), "request_id", None) if kind else None
            request = session.requests.get(rid) if rid else None
            task = request.task if request is not None else None
            if task is not None:
                await asyncio.wait([task])
