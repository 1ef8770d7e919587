"""A session's ``BatchCommand``s: refused whole over ``--max-batch-commands`` (a v1 frame counted
before it is decoded: :meth:`Batches.take_unread`); a large one handled a slice per loop iteration
(what arrives meanwhile waits, so envelopes are handled in the order they came); an ordered one
command after command."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from ..relaypeek import batch_size, command_ids
from .admission import id_size
from .commands import COMMANDS

if TYPE_CHECKING:
    from .request_table import RequestTable

__all__ = ["BATCH_SLICE", "Batches", "Batching"]

BATCH_SLICE = 128
"""Commands of a batch handled per loop iteration: a large batch must not stall other sessions."""

# The commands that are requests (one terminal state each): a refused batch ends their ids, and
# only theirs (a cancel's id names another request), as relaypeek.command_ids reads them.
_REQUESTS = frozenset(kind for kind, spec in COMMANDS.items() if spec.handler is not None and spec.control is None)
_UNREAD = "unread_batch"  # a backlog entry's kind: (bytes, size) of a batch refused without decoding it

T = TypeVar("T")


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

    __slots__ = ("_session", "_limit", "_id_limit", "peek_above", "tasks", "backlog", "_loop")

    def __init__(self, session: Batching, limit: int, id_limit: int) -> None:
        self._session = session
        self._limit = limit
        self._id_limit = id_limit
        # The smallest frame that can hold a batch over the limit: each command is 2 bytes or more.
        self.peek_above = 2 * limit
        self.tasks: set[asyncio.Task[None]] = set()
        # While a large batch is dispatched slice by slice, what arrives after it waits here
        # (an Envelope and its payload's kind, or a batch refused unread, its bytes and size, and _UNREAD).
        self.backlog: collections.deque[tuple[Any, str | None]] | None = None
        self._loop = asyncio.get_running_loop()

    def take_unread(self, frame: bytes) -> bool:
        """Refuse ``frame`` if it is a v1 ``Envelope`` whose batch is over the limit, counted
        without decoding it (200,000 commands decoded only to be refused held 60 MB); True when
        it was (it is then handled in turn, after a backlog). The caller checks ``peek_above``."""
        size = batch_size(frame)
        if size <= self._limit:
            return False
        if self.backlog is not None:
            self.backlog.append(((frame, size), _UNREAD))
        else:
            self._refuse(size, command_ids(frame))
        return True

    def admit(self, batch: pb.BatchCommand) -> None:
        commands = batch.commands
        if len(commands) > self._limit:
            request_id = self._session.request_id
            self._refuse(len(commands), [rid for c in commands if c.WhichOneof("command_type") in _REQUESTS and (rid := request_id(c))])
            return
        if batch.require_ordering:
            self._in_task(self.run_ordered(list(commands)))
        elif len(commands) <= BATCH_SLICE:
            handle = self._session.handle
            for command in commands:
                handle(command)
        else:
            self.backlog = collections.deque()
            self._in_task(self._dispatch(list(commands), self._session.handle))

    def _in_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _dispatch(self, items: Sequence[T], each: Callable[[T], None]) -> None:
        """``each`` item of a batch (a command to handle, an id to end) ``BATCH_SLICE`` at a time,
        then what arrived meanwhile."""
        session = self._session
        try:
            for start in range(0, len(items), BATCH_SLICE):
                for item in items[start : start + BATCH_SLICE]:
                    each(item)
                await asyncio.sleep(0)
        finally:
            backlog, self.backlog = self.backlog, None
            while backlog and not (session.closing or session.shutting):
                env, kind = backlog.popleft()
                if kind == _UNREAD:
                    frame, size = env
                    self._refuse(size, command_ids(frame))
                else:
                    session.route(env, kind)
                if self.backlog is not None:  # it started another large batch: the rest waits for it
                    self.backlog.extend(backlog)
                    break

    def _refuse(self, size: int, ids: list[str]) -> None:
        """A batch of ``size`` commands over ``--max-batch-commands``: one error for the batch,
        nothing of it runs, and each readable request id in it (``ids``: those of its requests, in
        order; not that of a running request) ends ``ERROR``."""
        session, limit, id_limit = self._session, self._limit, self._id_limit
        message = f"a BatchCommand of {size} commands is over the limit of {limit} (--max-batch-commands); none of it was run"
        if not session.authenticated:
            session.deny("a BatchCommand before an authenticated handshake: this service needs a token")
            return
        session.protocol_error(
            ProtocolError(
                message,
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                details={"reason": "batch_too_large", "size": str(size), "limit": str(limit)},
            )
        )
        ended: set[str] = set()

        def end(rid: str) -> None:
            if rid not in ended and rid not in session.requests and id_size(rid) <= id_limit:
                ended.add(rid)
                session.end_refused(rid)

        if len(ids) <= BATCH_SLICE:
            for rid in ids:
                end(rid)
        else:  # 200,000 terminal states in one step stalled every other session for a second
            self.backlog = collections.deque()
            self._in_task(self._dispatch(ids, end))

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
