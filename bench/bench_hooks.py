"""Per-call overhead of hooks: JavaScript (in-process QuickJS) against Rust (child process), and chains.

Run: ``.venv/bin/pytest bench/bench_hooks.py --benchmark-only -p no:cacheprovider``

Every benchmarked round makes :data:`CALLS` calls in one ``run_until_complete``, so the figures are
far above timer resolution; the summary printed at the end divides the best round by the number of
calls. Groups:

* ``hook call: allow``: a trivial hook that allows a ``before_tool_call`` payload. ``js[sync]`` is
  the path :class:`~smith_fast.hooks.HookChain` takes for JavaScript (no coroutine); ``js[uvloop]``
  awaits ``Hook.call``; ``rust[uvloop]`` / ``rust[asyncio]`` include the pipe round trip to the
  hook's process, so they depend on how fast the OS switches to the child and back.
* ``hook call: transform``: the hook rewrites ``args.path`` and hands back the payload (decoded and
  shape-checked on our side).
* ``hook call: on_shell_output 64 KiB, allow``: one 64 KiB output chunk per call (the service's
  default ``--chunk-size``): the cost of carrying the text across.
* ``HookChain.run``: 0, 1 and 5 allowing JavaScript hooks on uvloop.

The Rust hooks are compiled once into a temporary cache (a few seconds) before anything is timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from smith_fast.hooks import Hook, HookChain, JsHook, load_hook

from ._summary import print_summary

CALLS = 1000
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}

JS = {
    "allow": "function beforeToolCall(p) { return { action: 'allow' }; }\n"
    "function onShellOutput(p) { return { action: 'allow' }; }",
    "transform": "function beforeToolCall(p) { p.args.path = '/redacted'; return { action: 'transform', data: p }; }",
}
RUST = {
    "allow": "fn before_tool_call(_p: &Json) -> Action { Action::Allow }\n"
    "fn on_shell_output(_p: &Json) -> Action { Action::Allow }\n"
    "hooks! { before_tool_call, on_shell_output }\n",
    "transform": "fn before_tool_call(p: &Json) -> Action {\n"
    "    let mut q = p.clone();\n"
    '    q.get_mut("args").unwrap().set("path", "/redacted");\n'
    "    Action::transform(q)\n"
    "}\n"
    "hooks! { before_tool_call }\n",
}
TOOL_CALL = {"tool": "fs.read", "args": {"path": "src/smith_fast/hooks/model.py", "max_bytes": 65536}}
OUTPUT = {"stream": "stdout", "text": ("make[1]: compiling src/module.c -> build/module.o\n" * 1400)[:65536]}

_results: dict[str, dict[str, float]] = {}  # group -> entry -> best µs per call


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hook-cache")

    async def compile_all() -> None:
        for source in RUST.values():
            hook = await load_hook("rust", source, cache_dir=path)
            await hook.close()

    asyncio.run(compile_all())
    return path


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _summary_lines())


def _summary_lines() -> Iterator[str]:
    if not _results:
        return
    yield ""
    yield f"hooks, best round of {CALLS} calls, per call:"
    for group, entries in _results.items():
        for entry, micros in entries.items():
            yield f"  {group:42} {entry:16} {micros:9.2f} µs"


def record(benchmark: Any, entry: str) -> None:
    micros = benchmark.stats.stats.min / CALLS * 1e6
    benchmark.extra_info["us_per_call"] = round(micros, 2)
    _results.setdefault(benchmark.group, {})[entry] = micros


def bench_loop(benchmark: Any, loop_name: str, setup: Callable[[], Coroutine[Any, Any, Hook | HookChain]], body: Callable[[Any], Coroutine[Any, Any, None]], entry: str) -> None:
    """Load on a fresh loop, time ``body`` (CALLS calls) on it, close."""
    loop = LOOPS[loop_name]()
    try:
        subject = loop.run_until_complete(setup())
        loop.run_until_complete(body(subject))  # warm up (and start a Rust hook's process)
        benchmark.pedantic(lambda: loop.run_until_complete(body(subject)), rounds=15, warmup_rounds=1)
        record(benchmark, entry)
        loop.run_until_complete(subject.close())
    finally:
        loop.close()


def calls(trigger: str, payload: dict[str, Any], expect: str) -> Callable[[Hook], Coroutine[Any, Any, None]]:
    async def body(hook: Hook) -> None:
        call = hook.call
        for _ in range(CALLS):
            decision = await call(trigger, payload)
        assert decision.action == expect

    return body


CASES = [("allow", "before_tool_call", TOOL_CALL, "allow"), ("transform", "before_tool_call", TOOL_CALL, "transform")]


@pytest.mark.parametrize(("name", "trigger", "payload", "expect"), CASES, ids=[c[0] for c in CASES])
def test_js_sync(benchmark: Any, name: str, trigger: str, payload: dict[str, Any], expect: str) -> None:
    benchmark.group = f"hook call: {name}"
    hook = asyncio.run(load_hook("js", JS[name]))
    # A JS hook runs on a thread of its own (HOOKS.md, "Execution model"): this is a blocking
    # caller's cost, the thread hop included.
    assert isinstance(hook, JsHook)
    call_sync = hook.call_blocking

    def body() -> None:
        for _ in range(CALLS):
            decision = call_sync(trigger, payload)
        assert decision.action == expect

    benchmark.pedantic(body, rounds=15, warmup_rounds=1)
    record(benchmark, "js[sync]")


# JS calls never touch the loop, so js[uvloop] stands for both loops.
ENGINES = [("js", "uvloop"), ("rust", "uvloop"), ("rust", "asyncio")]


@pytest.mark.parametrize(("name", "trigger", "payload", "expect"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize(("kind", "loop_name"), ENGINES, ids=[f"{k}-{n}" for k, n in ENGINES])
def test_hook_call(benchmark: Any, cache: Path, loop_name: str, kind: str, name: str, trigger: str, payload: dict[str, Any], expect: str) -> None:
    benchmark.group = f"hook call: {name}"
    source = (JS if kind == "js" else RUST)[name]
    bench_loop(benchmark, loop_name, lambda: load_hook(kind, source, cache_dir=cache), calls(trigger, payload, expect), f"{kind}[{loop_name}]")


@pytest.mark.parametrize("kind", ["js", "rust"])
def test_shell_output_chunk(benchmark: Any, cache: Path, kind: str) -> None:
    benchmark.group = "hook call: on_shell_output 64 KiB, allow"
    source = (JS if kind == "js" else RUST)["allow"]
    bench_loop(benchmark, "uvloop", lambda: load_hook(kind, source, cache_dir=cache), calls("on_shell_output", OUTPUT, "allow"), f"{kind}[uvloop]")


@pytest.mark.parametrize("hooks", [0, 1, 5])
def test_chain(benchmark: Any, hooks: int) -> None:
    benchmark.group = "HookChain.run, allowing JS hooks"

    async def setup() -> HookChain:
        # Distinct sources, so each hook is its own context.
        return HookChain([await load_hook("js", JS["allow"] + f"\n// hook {n}") for n in range(hooks)])

    async def body(chain: HookChain) -> None:
        run = chain.run
        for _ in range(CALLS):
            result = await run("before_tool_call", TOOL_CALL)
        assert result.action == "allow"

    bench_loop(benchmark, "uvloop", setup, body, f"{hooks} hooks")


# ---- end to end: tool-call round trip through a real service with 0, 1 and 5 hooks loaded --------

ROUND_TRIPS = 300


@pytest.fixture(scope="module")
def hook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from harness.server import ServerProcess

    tmp = tmp_path_factory.mktemp("hook-rtt")
    (tmp / "small.txt").write_text("x" * 72)
    srv = ServerProcess(tmp).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("hooks", [0, 1, 5])
def test_tool_call_round_trip_with_hooks(benchmark: Any, hook_server: Any, hooks: int) -> None:
    """Sequential ``fs.read`` round trips (SDK client, v1) in a session with N allowing JS hooks
    on ``before_tool_call`` and ``after_tool_result``: what a loaded policy costs per request."""
    from smith_fast.client import Client

    script = (
        "function beforeToolCall(p) {{ return {{ action: 'allow' }}; }}\n"
        "function afterToolResult(p) {{ return {{ action: 'allow' }}; }} // {n}"
    )
    loop = uvloop.new_event_loop()

    async def setup() -> Client:
        client = await Client.connect(hook_server.unix)
        await client.handshake(["hooks_js"])
        for n in range(hooks):
            await client.load_hook("js", script.format(n=n))  # distinct sources: distinct hook ids
        return client

    async def round_trips() -> None:
        for _ in range(ROUND_TRIPS):
            result = await client.call_tool("fs.read", {"path": "small.txt"})
            assert result.success

    client = loop.run_until_complete(setup())
    try:
        benchmark.group = "tool-call round trip with N hooks (fs.read, sequential, per 300 calls)"
        benchmark.pedantic(lambda: loop.run_until_complete(round_trips()), rounds=5, iterations=1, warmup_rounds=1)
        benchmark.extra_info["us_per_call_best"] = benchmark.stats.stats.min / ROUND_TRIPS * 1e6
    finally:
        loop.run_until_complete(client.close())
        loop.close()
