"""Eager start (service/eager.py): a coroutine started by hand goes on in a Task as if the Task had
started it: its result, its exceptions, cancellation and its context all carry over."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

import pytest

from smith_fast.service.eager import resume

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="unset")


async def _eager(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any, asyncio.Task[Any] | None, contextvars.Context]:
    """:func:`_start` from a loop callback, as a connection's ``data_received`` runs: no current task."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[tuple[bool, Any, asyncio.Task[Any] | None, contextvars.Context]] = loop.create_future()
    loop.call_soon(lambda: started.set_result(_start(coro)))
    return await started


def _start(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any, asyncio.Task[Any] | None, contextvars.Context]:
    """What Session._start does: run to the first suspension; (ended, value, task, context)."""
    assert asyncio.current_task() is None
    context = contextvars.copy_context()
    try:
        waiting = context.run(coro.send, None)
    except StopIteration as stop:
        return True, stop.value, None, context
    task = asyncio.get_running_loop().create_task(resume(coro, waiting), context=context)
    return False, None, task, context


def test_a_coroutine_that_never_suspends_ends_in_the_first_step(run) -> None:
    async def quick() -> int:
        assert asyncio.current_task() is None  # no task was made for it
        return 7

    async def main() -> None:
        ended, value, task, _ = await _eager(quick())
        assert ended and value == 7 and task is None

    run(main())


def test_a_suspended_coroutine_goes_on_in_its_task_with_its_context(run) -> None:
    async def waits(fut: asyncio.Future[str]) -> str:
        token = _VAR.set("mine")
        got = await fut
        seen = _VAR.get()
        _VAR.reset(token)  # a token made in the eager step is reset in the task: one context
        return f"{got}:{seen}:{_VAR.get()}"

    async def main() -> None:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        ended, _, task, context = await _eager(waits(fut))
        assert not ended and task is not None
        assert _VAR.get() == "unset"  # the caller's context is untouched
        fut.set_result("done")
        assert await task == "done:mine:unset"
        assert _VAR not in context  # reset where it was set

    run(main())


def test_a_bare_yield_then_a_timeout_works_in_the_task(run) -> None:
    async def needs_task() -> str:
        await asyncio.sleep(0)  # what ToolRegistry.call does before asyncio.timeout
        async with asyncio.timeout(5):
            await asyncio.sleep(0.01)
        return "ok"

    async def main() -> None:
        ended, _, task, _ = await _eager(needs_task())
        assert not ended and task is not None
        assert await task == "ok"

    run(main())


def test_exceptions_after_the_suspension_reach_the_task(run) -> None:
    async def fails(fut: asyncio.Future[None]) -> None:
        await fut
        raise ValueError("after")

    async def main() -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _, _, task, _ = await _eager(fails(fut))
        assert task is not None
        fut.set_result(None)
        with pytest.raises(ValueError, match="after"):
            await task

    run(main())


def test_cancelling_the_task_cancels_the_coroutine_where_it_waits(run) -> None:
    cleaned: list[str] = []

    async def long(fut: asyncio.Future[None]) -> None:
        try:
            await fut
        finally:
            cleaned.append("finally")

    async def catches(fut: asyncio.Future[None]) -> str:
        try:
            await fut
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 1
            task.uncancel()  # as LocalRunner.run does for the peer's own Cancel
            return "uncancelled"
        return "not cancelled"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        _, _, task, _ = await _eager(long(fut))
        assert task is not None
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and fut.cancelled() and cleaned == ["finally"]

        fut2: asyncio.Future[None] = loop.create_future()
        _, _, task2, _ = await _eager(catches(fut2))
        assert task2 is not None
        task2.cancel()  # before the task's first step: thrown into the coroutine
        assert await task2 == "uncancelled"

    run(main())
