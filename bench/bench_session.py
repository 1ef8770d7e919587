"""Session → LocalRunner → handler → sink, in process: what the service layer costs per request.

Run: ``.venv/bin/pytest bench/bench_session.py --benchmark-only -p no:cacheprovider``.
Each benchmarked call pipelines 200 ``fs.read`` tool calls into one session (no socket, no
client) and waits until they all ended; divide the times by 200 for one request. Compare a change
to the session, the runner or the command table against its parent as the ratio of the medians.
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from smith_fast.jsonl import JsonlCodec
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.config import ServiceConfig
from smith_fast.service.core import ServiceCore
from smith_fast.service.sinks import EventSink, V0Sink, V1Sink

N = 200


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("wire", ["v1", "v0"])
def test_pipelined_tool_calls(benchmark: Any, loop: asyncio.AbstractEventLoop, tmp_path: pathlib.Path, wire: str) -> None:
    benchmark.group = f"session: {N} pipelined fs.read, in process"
    (tmp_path / "a.txt").write_text("hello world\n")
    out: list[bytes] = []

    async def open_session() -> Any:
        core = ServiceCore(ServiceConfig(root=tmp_path))
        sink: EventSink = V1Sink(out.append) if wire == "v1" else V0Sink(out.append, JsonlCodec())
        session = core.new_session(sink, close=lambda: None, peer="bench")
        session.handle(pb.Command(handshake=pb.HandshakeCommand(version=1 if wire == "v1" else 0)))
        return session

    session = loop.run_until_complete(open_session())
    commands = [
        pb.Command(tool_call=pb.ToolCallCommand(request_id=str(uuid.uuid4()), tool="fs.read", args=b'{"path": "a.txt"}'))
        for _ in range(N)
    ]

    async def burst() -> None:
        for command in commands:
            session.handle(command)
        while session.busy:
            await asyncio.sleep(0)

    def run() -> None:
        out.clear()
        loop.run_until_complete(burst())

    benchmark(run)
    # PROCESSING, ToolResult, READY per request
    assert len(out) == 3 * N
