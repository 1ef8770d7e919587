"""Waiting on a benchmark's work while watching the processes it needs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

__all__ = ["Watched", "guarded"]

T = TypeVar("T")


class Watched(Protocol):
    """A set of processes a run needs (a topology, a service)."""

    @property
    def name(self) -> str: ...

    def gone(self) -> str:
        """What ended of them (their exit, their last stderr), "" while all run."""
        ...


async def guarded(watched: Watched, work: Awaitable[T], timeout: float = 120.0) -> T:
    """Await ``work``, failing early when a process of ``watched`` ends (a request it held would
    otherwise be waited for for ever) or after ``timeout`` seconds."""
    task = asyncio.ensure_future(work)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if done:
                return task.result()
            gone = watched.gone()
            if gone:
                raise RuntimeError(f"{watched.name}: {gone} during the run (a signal means something outside this benchmark)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{watched.name}: not done within {timeout:.0f} s")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
