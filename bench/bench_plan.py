"""What a PlanCommand costs smith-fast itself: planning, drawing, scheduling, one model round trip.

Run: ``.venv/bin/pytest bench/bench_plan.py --benchmark-only -p no:cacheprovider``

* ``plan-rules``: the rules planner on a shell goal of 1, 16 and 128 commands, and on a 128-step
  ``context["steps"]`` JSON plan (parse, validate, topological sort).
* ``plan-deltas``: :func:`plan_deltas` for 16 and 128 steps, and the same serialized as v1 ``Event``
  bytes (what the session's sink does with them).
* ``plan-execute``: the executor's own overhead over 128 tool steps whose runner returns at once, as
  a chain (each step depends on the previous) and as a fan (all independent, 64 at a time), on
  uvloop and stdlib asyncio. Status deltas are built and dropped.
* ``plan-llm``: one :class:`LlmPlanner` round trip to a chat-completions server on a loopback
  socket (asyncio server in the same loop, canned 4-step reply), on uvloop and stdlib asyncio.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import pytest
import uvloop

from smith_fast.pb import smith_pb2
from smith_fast.plan import LlmPlanner, Plan, PlanExecutor, RulesPlanner, Step, plan_deltas

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


def shell_goal(n: int) -> str:
    return "\n".join(f"echo step {i} 'quoted; text' && test -e file{i}" if i % 2 else f"make target{i}" for i in range(n))


def steps_json(n: int, chain: bool) -> str:
    steps = [
        {"id": f"s{i}", "kind": "tool", "tool": "fs.read", "args": {"path": f"f{i}"}, "depends_on": [f"s{i - 1}"] if chain and i else []}
        for i in range(n)
    ]
    return json.dumps({"steps": steps})


@pytest.fixture(params=sorted(LOOPS))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    runner = asyncio.Runner(loop_factory=LOOPS[request.param])
    with runner:
        yield runner.get_loop()


@pytest.mark.benchmark(group="plan-rules")
@pytest.mark.parametrize("commands", [1, 16, 128])
def test_rules_shell_goal(benchmark, commands: int) -> None:  # type: ignore[no-untyped-def]
    goal = shell_goal(commands)
    planner = RulesPlanner()
    plan = benchmark(planner.plan_now, goal, {})
    assert len(plan.steps) == commands + commands // 2


@pytest.mark.benchmark(group="plan-rules")
def test_rules_context_steps_128(benchmark) -> None:  # type: ignore[no-untyped-def]
    context = {"steps": steps_json(128, chain=True)}
    planner = RulesPlanner()
    plan = benchmark(planner.plan_now, "goal", context)
    assert len(plan.steps) == 128


@pytest.mark.benchmark(group="plan-deltas")
@pytest.mark.parametrize("steps", [16, 128])
@pytest.mark.parametrize("encode", [False, True], ids=["build", "build+serialize"])
def test_plan_deltas(benchmark, steps: int, encode: bool) -> None:  # type: ignore[no-untyped-def]
    plan = RulesPlanner().plan_now("goal", {"steps": steps_json(steps, chain=True)})

    def draw() -> int:
        deltas = plan_deltas(plan, "0b9e3c8a-8d7f-4a43-9d2c-0d6f2b0a6e11")
        if encode:
            return sum(len(smith_pb2.Event(graph_delta=d).SerializeToString()) for d in deltas)
        return len(deltas)

    assert benchmark(draw) > 0


@pytest.mark.benchmark(group="plan-execute")
@pytest.mark.parametrize("shape", ["chain", "fan"])
def test_executor_overhead(benchmark, loop: asyncio.AbstractEventLoop, shape: str) -> None:  # type: ignore[no-untyped-def]
    plan = RulesPlanner().plan_now("goal", {"steps": steps_json(128, chain=shape == "chain")})
    emitted = 0

    def emit(_delta: smith_pb2.GraphDeltaEvent) -> None:
        nonlocal emitted
        emitted += 1

    async def run_shell(_step: Step) -> int:
        return 0

    async def run_tool(_step: Step) -> bool:
        return True

    def execute() -> dict[str, str]:
        executor = PlanExecutor(plan, "r", run_shell=run_shell, run_tool=run_tool, emit=emit, max_parallel=64)
        return loop.run_until_complete(executor.run())

    result = benchmark(execute)
    assert set(result.values()) == {"succeeded"}


REPLY = json.dumps(
    {
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": json.dumps(
                        {"steps": [{"id": str(i), "command": f"make t{i}", "depends_on": [str(i - 1)] if i else []} for i in range(4)]}
                    ),
                },
            }
        ],
        "usage": {"prompt_tokens": 300, "completion_tokens": 80, "total_tokens": 380},
    }
).encode()


@pytest.mark.benchmark(group="plan-llm")
def test_llm_round_trip(benchmark, loop: asyncio.AbstractEventLoop) -> None:  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(REPLY), REPLY))
        await writer.drain()
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    planner = LlmPlanner(f"http://127.0.0.1:{port}/v1", "bench-model", timeout=10)
    try:
        plan: Plan = benchmark(lambda: loop.run_until_complete(planner.plan("build and test", {"token_budget": "1000"})))
    finally:
        server.close()
        loop.run_until_complete(server.wait_closed())
    assert len(plan.steps) == 4 and plan.usage is not None and plan.usage.tokens_remaining == 620
