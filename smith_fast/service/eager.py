"""Eager start of a request: run its coroutine at once, a Task only if it suspends.

``asyncio.eager_task_factory`` does this on Python 3.12+; smith-fast runs on 3.11, so the session
(``Session._start``, for the rows of ``service/commands.py`` marked ``eager``) sends the coroutine
its first ``None`` itself. Most small tool calls end right there: no Task, no loop iteration, no
done callback. One that suspends hands :func:`resume` what it waits for, and a Task goes on from
there exactly as if it had run the coroutine from the start (cancellation included: the Task's
``cancel`` reaches the future the coroutine waits on, or is thrown into it).

Until it suspends, an eager request runs with no current task: what needs one
(``asyncio.timeout``) awaits ``asyncio.sleep(0)`` first (``ToolRegistry.call`` does).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["resume"]

T = TypeVar("T")


class _Resume:
    """Awaitable that passes between a Task and a coroutine already started by hand."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting = self._coro, self._waiting
        self._waiting = None
        while True:
            try:
                sent = yield waiting  # the Task waits on the future the coroutine yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # the Task throws (a cancellation): into the coroutine
                try:
                    waiting = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def resume(coro: Coroutine[Any, Any, T], waiting: Any) -> T:
    """Go on with ``coro``, which was sent its first value by hand and yielded ``waiting``
    (a future, or None for a bare yield); for ``loop.create_task(resume(...), context=...)``
    with the context it started in."""
    result: T = await _Resume(coro, waiting)
    return result
