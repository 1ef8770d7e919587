"""A session's output budget: what bounds the memory one peer can make the service hold.

A peer that stops reading must not make the service buffer without bound. The transport's own
flow control (``pause_writing``) only says the peer is behind; what fills memory is what the
session goes on producing for it: results of requests already running and of requests it keeps
sending. So every request of a session starts through its :class:`OutputBudget`:

* a request *reserves* what it may produce before the peer has to read again (:func:`reservation`:
  a tool call or plan its ``--tool-max-output``, a shell command one ``--chunk-size`` chunk, as its
  pipes stop being read while the peer is paused), and gives it back when it ends;
* it starts only while the reservations of the running requests plus the bytes the front still
  holds for the peer (the transport's write buffer, the gRPC queue: ``unsent``) stay within
  ``--max-session-buffer``; otherwise it waits, admitted but not started (no ``PROCESSING`` yet),
  in arrival order;
* while the peer is paused, or the commands waiting hold more than a quarter of the budget, the
  session stops reading the peer's commands (the front pauses its transport or its request
  stream), so nothing more piles up behind them; a peer that reads can still reach its running
  requests while a few wait (the waiting ones are also bounded by ``--max-requests``).
* a request that produces output step by step (a plan) waits before each step while the peer is
  paused (``Execution.reading``), so it adds at most its running steps' output (``max_parallel``
  results) beyond its reservation.

A request that runs alone always starts while the peer reads (else a budget smaller than one
reservation would never start anything). So a session holds at most about
``--max-session-buffer`` bytes of output, plus a quarter of it (and one read) of commands.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Limits

__all__ = ["OutputBudget", "SessionFlow", "reservation"]

MIN_RESERVATION = 4096  # any request: its state changes and errors, at least

# What a request of each kind may produce before the peer has to read again (see the module doc).
_RESERVATIONS: dict[str, Callable[[Limits], int]] = {
    "tool_call": lambda limits: limits.tool_max_output,
    "plan": lambda limits: limits.tool_max_output,
    "shell_exec": lambda limits: limits.chunk_size,
}


def reservation(kind: str, limits: Limits) -> int:
    """The bytes a request of ``kind`` reserves from its session's budget while it runs."""
    size = _RESERVATIONS.get(kind)
    return max(MIN_RESERVATION, size(limits) if size is not None else 0)


class OutputBudget:
    """The output budget of one session.

    Args:
        limit: ``--max-session-buffer``.
        unsent: the bytes the front holds for the peer right now.
    """

    __slots__ = ("limit", "reserved", "paused", "_unsent", "_waiting")

    def __init__(self, limit: int, unsent: Callable[[], int]) -> None:
        self.limit = limit
        self.reserved = 0
        self.paused = False  # the peer is not reading (the front said so)
        self._unsent = unsent
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Requests admitted but not started."""
        return len(self._waiting)

    def _fits(self, size: int) -> bool:
        if self.reserved == 0 and not self.paused:
            return True
        return self.reserved + size + self._unsent() <= self.limit

    async def acquire(self, size: int) -> None:
        """Wait until a request reserving ``size`` bytes may start, and reserve them.

        Raises:
            asyncio.CancelledError: cancelled while waiting (nothing stays reserved).
        """
        if not self._waiting and self._fits(size):
            self.reserved += size
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiting.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(size)  # granted in the same tick it was cancelled: give it back
            else:
                try:
                    self._waiting.remove(entry)
                except ValueError:
                    pass
                self.wake()
            raise

    def release(self, size: int) -> None:
        """A request that reserved ``size`` bytes ended."""
        self.reserved -= size
        self.wake()

    def set_paused(self, paused: bool) -> None:
        """The peer stopped (True) or resumed (False) reading."""
        self.paused = paused
        if not paused:
            self.wake()

    def wake(self) -> None:
        """Start the waiting requests that fit now, in arrival order."""
        waiting = self._waiting
        while waiting:
            size, future = waiting[0]
            if future.done():
                waiting.popleft()
                continue
            if not self._fits(size):
                return
            waiting.popleft()
            self.reserved += size
            future.set_result(None)


class SessionFlow:
    """The flow control of one session (this module's doc): its output budget, whether its peer
    reads, whether the peer's commands are read.

    Args:
        limit: ``--max-session-buffer``.
        unsent: the bytes held for the peer right now (the front's; a parked session's retained).
        hold_input: the front's: stop (True) or resume (False) reading the peer's commands.
    """

    __slots__ = ("budget", "paused", "waiting_bytes", "_reading", "_hold", "_held")

    def __init__(self, limit: int, unsent: Callable[[], int], hold_input: Callable[[bool], None] | None) -> None:
        self.budget = OutputBudget(limit, unsent)
        self.paused = False  # the peer is not reading (the front said so)
        self.waiting_bytes = 0  # of the commands waiting for the budget
        self._reading = asyncio.Event()  # clear while paused
        self._reading.set()
        self._hold = hold_input
        self._held = False

    @property
    def free(self) -> bool:
        """Nothing holds or waits for the budget and the peer reads: a request may start and end
        in one step (reserving and releasing the budget would be nothing)."""
        budget = self.budget
        return not (budget.waiting or budget.reserved or self.paused)

    def bind(self, hold_input: Callable[[bool], None] | None) -> None:
        """The session is carried by another connection (None: by none, while parked)."""
        self._hold = hold_input
        self._held = False

    def set_paused(self, paused: bool) -> None:
        """The peer stopped (True) or resumed (False) reading: no request starts meanwhile."""
        self.paused = paused
        if paused:
            self._reading.clear()
        else:
            self._reading.set()
        self.budget.set_paused(paused)

    async def reading(self) -> None:
        """Return once the peer reads."""
        await self._reading.wait()

    def update(self) -> None:
        """Hold the peer's input while it is not reading, or while the commands waiting for the
        budget hold more than a quarter of it; a peer that reads can still send what addresses
        the running requests while a few wait."""
        held = self.paused or self.waiting_bytes > self.budget.limit // 4
        if held != self._held and self._hold is not None:
            self._held = held
            self._hold(held)
