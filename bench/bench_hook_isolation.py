"""Where a JavaScript hook runs: on the event loop (the old model) or on a thread of its own.

Two measurements, each for both models (HOOKS.md, "Execution model", quotes the figures):

* ``cost``: 200 calls of an allow hook, one after another, from a coroutine: what the thread hop
  adds to a call that does nothing;
* ``stall``: 20 calls of a hook that busy-waits 100 ms, started together (as 20 pipelined
  requests are), while a ticker task on the same loop sleeps 1 ms at a time: the ticker's
  longest wait is the latency every other session would see. ``extra_info["max_lag_ms"]``.

Run: ``.venv/bin/pytest bench/bench_hook_isolation.py --benchmark-only -q``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import quickjs

from smith_fast.hooks import JsHook, load_hook

ALLOW = "function beforeToolCall(p) { return {action: 'allow'}; }"
SPIN_MS = 100
BUSY = "function beforeToolCall(p) { const t = Date.now(); while (Date.now() - t < %d) {} return {action: 'allow'}; }" % SPIN_MS
PAYLOAD = {"tool": "fs.read", "args": {"path": "README.md"}}
CALLS = 200
BUSY_CALLS = 20


def inline(source: str) -> Callable[[], Awaitable[Any]]:
    """The old model: a context called on the loop's thread (a coroutine that never yields)."""
    ctx = quickjs.Context()
    ctx.set_time_limit(5)
    ctx.eval(source + "\nfunction __call(s) { return JSON.stringify(beforeToolCall(JSON.parse(s))); }")
    fn = ctx.get("__call")
    text = '{"tool":"fs.read","args":{"path":"README.md"}}'

    async def call() -> Any:
        return fn(text)

    return call


def threaded(source: str) -> Callable[[], Awaitable[Any]]:
    hook = asyncio.run(load_hook("js", source))
    assert isinstance(hook, JsHook)

    async def call() -> Any:
        return await hook.call("before_tool_call", PAYLOAD)

    return call


MODELS = {"inline": inline, "thread": threaded}


@pytest.mark.parametrize("model", list(MODELS))
def test_cost(benchmark: Any, model: str) -> None:
    benchmark.group = "hook isolation: allow call"
    call = MODELS[model](ALLOW)

    async def body() -> None:
        for _ in range(CALLS):
            await call()

    benchmark.pedantic(lambda: asyncio.run(body()), rounds=5, warmup_rounds=1)
    benchmark.extra_info["calls"] = CALLS


@pytest.mark.parametrize("model", list(MODELS))
def test_stall(benchmark: Any, model: str) -> None:
    benchmark.group = "hook isolation: 20 busy calls"
    call = MODELS[model](BUSY)
    lags: list[float] = []

    async def body() -> None:
        done = asyncio.Event()

        async def ticker() -> None:
            worst = 0.0
            while not done.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                worst = max(worst, time.perf_counter() - t)
            lags.append(worst)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        await asyncio.gather(*(call() for _ in range(BUSY_CALLS)))
        done.set()
        await tick

    benchmark.pedantic(lambda: asyncio.run(body()), rounds=2, warmup_rounds=0)
    benchmark.extra_info["max_lag_ms"] = round(max(lags) * 1000, 1)
    benchmark.extra_info["busy_ms"] = SPIN_MS * BUSY_CALLS
