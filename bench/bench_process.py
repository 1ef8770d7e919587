"""Bulk output throughput of ShellProcess against asyncio's subprocess pipes and a blocking-read ceiling.

Run: ``.venv/bin/pytest bench/bench_process.py --benchmark-only -p no:cacheprovider``

Each round runs one command that writes :data:`TOTAL` bytes to stdout and reads all of it:

* ``ceiling``: a plain blocking ``os.read(fd, 1 MiB)`` loop on the command's pipe (enlarged to
  :data:`smith_fast.process.PIPE_SIZE` like ShellProcess's, so only the reading differs);
* ``ShellProcess[uvloop]`` / ``ShellProcess[asyncio]``: ``on_output`` only counts bytes;
* ``create_subprocess_exec[...]``: ``await proc.stdout.read(1 MiB)`` until EOF.

Two writers: ``head -c`` writes 8 KiB at a time (readers wake per small write), ``dd bs=1M`` writes
1 MiB at a time (the reader's per-wakeup cost shows). After the run, a summary is printed to the
terminal: MB/s and its ratio to the ceiling (best round of each), and the CPU time the reading process
spent per round, which on a shared machine is steadier than wall time.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import resource
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

from smith_fast import containment
from smith_fast.process import PIPE_SIZE, ShellProcess

from ._summary import print_summary

TOTAL = 256 << 20
READ = 1 << 20
COMMANDS = {
    "head": f"head -c {TOTAL} /dev/zero",
    "dd": f"dd if=/dev/zero bs=1M count={TOTAL >> 20} status=none",
}
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}
ROUNDS = 7

_results: dict[str, dict[str, tuple[float, float]]] = {}  # writer -> variant -> (best MB/s, best CPU ms)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuTimed:
    """Wraps a benchmarked callable to also keep the least CPU time this process spent in one call."""

    def __init__(self, fn: Callable[[], int]) -> None:
        self.fn = fn
        self.best = float("inf")

    def __call__(self) -> int:
        start = cpu_seconds()
        result = self.fn()
        self.best = min(self.best, cpu_seconds() - start)
        return result


def ceiling(command: str) -> int:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(read_end, 1031, PIPE_SIZE)  # F_SETPIPE_SZ
    except OSError:
        pass
    child = subprocess.Popen(
        ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=write_end, start_new_session=True
    )
    os.close(write_end)
    total = 0
    try:
        while data := os.read(read_end, READ):
            total += len(data)
    finally:
        os.close(read_end)
        child.wait()
    return total


async def shell_process(command: str) -> int:
    total = 0

    def on_output(fd: int, data: bytes) -> None:
        nonlocal total
        total += len(data)

    proc = await ShellProcess.start(command, on_output=on_output)
    await proc.wait()
    return total


async def create_subprocess(command: str) -> int:
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    total = 0
    while data := await proc.stdout.read(READ):
        total += len(data)
    await proc.wait()
    return total


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _summary_lines())


def _summary_lines() -> Iterator[str]:
    if _spawn:
        on, off = _spawn["cgroup"], _spawn["no cgroup"]
        yield ""
        yield f"ShellExec start latency (sh -c true, start to reaped), median of {SPAWN_ROUNDS} interleaved rounds:"
        yield f"  with its cgroup {on * 1000:6.2f} ms   without {off * 1000:6.2f} ms   ratio {on / off:4.2f}x"
    if not _results:
        return
    yield ""
    yield f"bulk output, {TOTAL >> 20} MiB per round, best of {ROUNDS} rounds:"
    for writer, variants in _results.items():
        top = variants.get("ceiling", (0.0, 0.0))[0]
        for variant, (mbps, cpu_ms) in variants.items():
            ratio = f"{mbps / top:5.0%} of ceiling" if top else ""
            yield f"  {writer:5} {variant:32} {mbps:6.0f} MB/s {ratio:17}  reader CPU {cpu_ms:5.0f} ms"


def record(benchmark: Any, writer: str, variant: str, timed: CpuTimed) -> None:
    mbps = TOTAL / benchmark.stats.stats.min / 1e6
    benchmark.extra_info["MB/s"] = round(mbps)
    benchmark.extra_info["reader_cpu_ms"] = round(timed.best * 1000, 1)
    _results.setdefault(writer, {})[variant] = (mbps, timed.best * 1000)


@pytest.fixture(params=sorted(LOOPS))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


@pytest.mark.parametrize("writer", list(COMMANDS))
def test_ceiling(benchmark: Any, writer: str) -> None:
    benchmark.group = f"process-bulk-{writer}"
    timed = CpuTimed(lambda: ceiling(COMMANDS[writer]))
    assert benchmark.pedantic(timed, rounds=ROUNDS, warmup_rounds=1) == TOTAL
    record(benchmark, writer, "ceiling", timed)


@pytest.mark.parametrize("writer", list(COMMANDS))
def test_shell_process(benchmark: Any, writer: str, loop: asyncio.AbstractEventLoop) -> None:
    benchmark.group = f"process-bulk-{writer}"
    name = "uvloop" if isinstance(loop, uvloop.Loop) else "asyncio"
    timed = CpuTimed(lambda: loop.run_until_complete(shell_process(COMMANDS[writer])))
    assert benchmark.pedantic(timed, rounds=ROUNDS, warmup_rounds=1) == TOTAL
    record(benchmark, writer, f"ShellProcess[{name}]", timed)


@pytest.mark.parametrize("writer", list(COMMANDS))
def test_create_subprocess_exec(benchmark: Any, writer: str, loop: asyncio.AbstractEventLoop) -> None:
    benchmark.group = f"process-bulk-{writer}"
    name = "uvloop" if isinstance(loop, uvloop.Loop) else "asyncio"
    timed = CpuTimed(lambda: loop.run_until_complete(create_subprocess(COMMANDS[writer])))
    assert benchmark.pedantic(timed, rounds=ROUNDS, warmup_rounds=1) == TOTAL
    record(benchmark, writer, f"create_subprocess_exec[{name}]", timed)


@pytest.mark.benchmark(group="process-spawn")
def test_spawn_shell_process(benchmark: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Start ``sh -c true`` and wait for it: the fixed cost of every ShellExec."""
    assert benchmark(lambda: loop.run_until_complete(shell_process("true"))) == 0


@pytest.mark.benchmark(group="process-spawn")
def test_spawn_create_subprocess_exec(benchmark: Any, loop: asyncio.AbstractEventLoop) -> None:
    assert benchmark(lambda: loop.run_until_complete(create_subprocess("true"))) == 0


SPAWN_ROUNDS = 200
_spawn: dict[str, float] = {}  # variant -> median seconds


@pytest.mark.benchmark(group="process-spawn")
def test_spawn_with_and_without_cgroup(loop: asyncio.AbstractEventLoop) -> None:
    """The cost of containment (smith_fast.containment: a cgroup per command, made, joined, killed,
    read and removed) on the start of ``sh -c true``: rounds alternate, so both see the same load."""
    import statistics
    import time

    times: dict[str, list[float]] = {"cgroup": [], "no cgroup": []}
    try:
        for i in range(SPAWN_ROUNDS * 2):
            variant = "cgroup" if i % 2 == 0 else "no cgroup"
            containment.set_enabled(variant == "cgroup")
            started = time.perf_counter()
            assert loop.run_until_complete(shell_process("true")) == 0
            times[variant].append(time.perf_counter() - started)
    finally:
        containment.set_enabled(True)
    for variant, values in times.items():
        _spawn[variant] = statistics.median(values)
