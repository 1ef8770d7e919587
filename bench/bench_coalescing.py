"""EventBatcher, CommandBatcher and WriteCoalescer: compiled twin vs pure Python, side by side.

Run: ``.venv/bin/pytest bench/bench_coalescing.py --benchmark-only -p no:cacheprovider``.
Each benchmarked call handles 10,000 messages; divide the times by 10,000 for one.
"""

from __future__ import annotations

import importlib
import random
from types import ModuleType
from typing import Any

import pytest

from smith_fast._compat import NO_EXTENSIONS
from smith_fast.pb import smith_pb2

N = 10_000


@pytest.fixture(params=["py"] if NO_EXTENSIONS else ["c", "py"])
def coalescing(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(f"smith_fast._coalescing_{request.param}")


def log_events(n: int, seed: int = 3) -> list[bytes]:
    """``n`` serialized LogEvents of about 100 bytes (80..120)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        text = "x" * rnd.randint(60, 100)
        msg = smith_pb2.Event(log=smith_pb2.LogEvent(level=smith_pb2.LOG_LEVEL_INFO, message=text, timestamp=1_700_000_000_000 + i))
        out.append(msg.SerializeToString())
    return out


EVENTS = log_events(N)


def test_event_batcher(benchmark: Any, coalescing: ModuleType) -> None:
    benchmark.group = "EventBatcher.add x10k ~100 B events (256/64 KiB)"

    def run() -> list[bytes]:
        b = coalescing.EventBatcher()
        add = b.add
        out: list[bytes] = []
        for e in EVENTS:
            batches = add(e, 0.0)
            if batches:
                out += batches
        out += b.flush()
        return out

    out = benchmark(run)
    assert sum(len(smith_pb2.BatchEvent.FromString(b).events) for b in out) == N


def test_event_batcher_clock(benchmark: Any, coalescing: ModuleType) -> None:
    benchmark.group = "EventBatcher.add x10k ~100 B events, now omitted"

    def run() -> list[bytes]:
        b = coalescing.EventBatcher()
        add = b.add
        out: list[bytes] = []
        for e in EVENTS:
            batches = add(e)
            if batches:
                out += batches
        out += b.flush()
        return out

    out = benchmark(run)
    assert len(out) == -(-N // 256)


def test_command_batcher(benchmark: Any, coalescing: ModuleType) -> None:
    benchmark.group = "CommandBatcher.add x10k ~100 B commands"
    commands = [
        smith_pb2.Command(tool_call=smith_pb2.ToolCallCommand(request_id=f"{i:036d}", tool="t", args=b"{}" * 20))
        .SerializeToString()
        for i in range(N)
    ]

    def run() -> list[bytes]:
        b = coalescing.CommandBatcher()
        add = b.add
        out: list[bytes] = []
        for c in commands:
            batches = add(c, 0.0)
            if batches:
                out += batches
        out += b.flush()
        return out

    out = benchmark(run)
    assert sum(len(smith_pb2.BatchCommand.FromString(b).commands) for b in out) == N


@pytest.mark.parametrize("size", [16, 100, 4096, 65536])
def test_write_coalescer(benchmark: Any, coalescing: ModuleType, size: int) -> None:
    benchmark.group = f"WriteCoalescer.add x10k frames of {size} B"
    frames = [bytes([i % 256]) * size for i in range(N)]

    def run() -> int:
        w = coalescing.WriteCoalescer()
        add = w.add
        total = 0
        for f in frames:
            joined = add(f)
            if joined is not None:
                total += len(joined)
        return total + len(w.flush())

    assert benchmark(run) == N * size
