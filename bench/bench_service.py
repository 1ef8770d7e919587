"""End-to-end service benchmarks: a real ``smith-fast serve``, real sockets.

Run: ``.venv/bin/pytest bench/bench_service.py --benchmark-only -p no:cacheprovider``

One server process per event loop (``--loop uvloop`` / ``--loop asyncio``), started once for the
module, listening on a Unix socket; the benchmarks talk to it from this process with blocking
sockets through :mod:`bench._service_helpers`, whose v1 and v0 drivers are the same code apart from
the wire (v1: ``framing`` + ``Envelope``; v0: ``jsonl`` with the orjson backend, decoded into the
same ``Event`` messages). Each group puts the contenders of one question side by side:

* **(a)** ``a-pipelined-fs.read``: 256 tool calls in flight, :data:`PIPELINE_REQUESTS` per round,
  each bringing ``StateChange(PROCESSING)``, its ``ToolResult`` and ``StateChange(READY)``; v1
  against v0, on both loops. The cheap built-in tool is ``fs.read`` of a 72-byte file (a real
  path resolution, open, fstat, pread and UTF-8 decode). ``a-pipelined-tools.list`` repeats it with
  ``tools.list`` (a 3.7 KB result, no file system) on uvloop.
* **(b)** ``b-shell-1M-lines``: ``seq 1000000`` (1,000,000 short lines, 6.9 MB): MB/s of stdout
  delivered and time to the final event, v1 against v0.
* **(c)** ``c-bulk-output``: :data:`BULK` bytes from ``head -c`` per round (the issue's 1 GiB
  reduced to 256 MiB per round to keep the suite short, ``SMITH_FAST_BENCH_BULK_MIB=1024`` for the
  full size; the server runs with ``--max-output 2G``),
  delivered over v1, against a blocking ``os.read`` loop on the same command's pipe in this process
  (pipe enlarged like the service's) as the ceiling.
* **(d)** ``d-round-trip-*``: sequential tool calls (``fs.read``), p50/p99, against a bare echo-style
  server (same loop, same Unix socket kind, same request and reply sizes) as the floor.
* **(e)** the ``asyncio`` entries of (a) and (d) against the ``uvloop`` ones.

Figures go to ``benchmark.extra_info`` (requests/s, MB/s, p50/p99 in µs, the server's CPU time
per request from ``/proc``, which on a shared machine is steadier than wall time) and, with the
ratios the issue asks for, to a summary printed after the module. Ratios use the best round.
"""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.server import ServerProcess
from smith_fast.framing import FrameDecoder

from .bench_process import ceiling as _ceiling  # the same blocking os.read loop, one definition

from ._service_helpers import (
    READ_SIZE,
    EchoServer,
    Session,
    cpu_seconds_of,
    percentile,
    pipelined_tool_calls,
    round_trip,
    shell_exec,
    tool_call_request_ids,
)
from ._summary import print_summary

LOOPS = ["uvloop", "asyncio"]
WIRES = ["v1", "v0"]
WINDOW = 256
PIPELINE_REQUESTS = 10_000
PIPELINE_ROUNDS = 5
SMALL_FILE = "small.txt"
SMALL_TEXT = "hello, smith-fast\n" * 4  # 72 bytes
FS_READ_ARGS = b'{"path":"small.txt"}'
LINES_COMMAND = "seq 1000000"
LINES_ROUNDS = 5
# The issue asks for 1 GiB; 256 MiB per round keeps the suite short. SMITH_FAST_BENCH_BULK_MIB=1024
# runs the full size (the server's --max-output 2G allows up to 2 GiB).
BULK = int(os.environ.get("SMITH_FAST_BENCH_BULK_MIB", "256")) << 20
BULK_COMMAND = f"head -c {BULK} /dev/zero"
BULK_ROUNDS = 5
RT_ROUNDS = 3000

_summary: dict[str, dict[str, Any]] = {}


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("bench-service")
    (root / SMALL_FILE).write_text(SMALL_TEXT)
    return root


@pytest.fixture(scope="module")
def servers(workspace: pathlib.Path) -> Iterator[Callable[[str], ServerProcess]]:
    """``servers(loop)``: the module's server for that loop, started on first use."""
    running: dict[str, ServerProcess] = {}

    def get(loop: str) -> ServerProcess:
        if loop not in running:
            sock_dir = workspace.parent / f"sock-{loop}"
            sock_dir.mkdir(exist_ok=True)
            running[loop] = ServerProcess(sock_dir, "--max-output", "2G", loop=loop, root=workspace, log_level="info").start()
        return running[loop]

    yield get
    for server in running.values():
        server.stop()


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, summary_lines() if _summary else [])


def _get(key: str, field: str) -> float | None:
    value = _summary.get(key, {}).get(field)
    return None if value is None else float(value)


def _ratio(label: str, a: float | None, b: float | None, target: str = "") -> str:
    if a is None or b is None or not b:
        return f"  {label}: n/a"
    return f"  {label}: {a / b:.2f}x{f'  (target {target})' if target else ''}"


def summary_lines() -> list[str]:
    out = ["", "service end-to-end (best round; server CPU per request from /proc):"]
    for key, figures in _summary.items():
        shown = ", ".join(f"{k} {v}" for k, v in figures.items())
        out.append(f"  {key:34} {shown}")
    out.append("ratios:")
    for tool in ("fs.read", "tools.list"):
        out.append(
            _ratio(
                f"(a) {tool} pipelined, v1 / v0 requests/s [uvloop]",
                _get(f"a {tool} v1 uvloop", "requests/s"),
                _get(f"a {tool} v0 uvloop", "requests/s"),
                ">= 2x" if tool == "fs.read" else "",
            )
        )
    out.append(
        _ratio("(a) fs.read pipelined, v0 / v1 server CPU per request [uvloop]",
               _get("a fs.read v0 uvloop", "server_cpu_us/request"), _get("a fs.read v1 uvloop", "server_cpu_us/request"))
    )
    out.append(
        _ratio("(a) fs.read pipelined, v1 / v0 requests/s [asyncio]",
               _get("a fs.read v1 asyncio", "requests/s"), _get("a fs.read v0 asyncio", "requests/s"))
    )
    out.append(_ratio("(b) 1M lines, v1 / v0 MB/s", _get("b v1", "MB/s"), _get("b v0", "MB/s")))
    out.append(_ratio("(b) 1M lines, v0 / v1 time to final event", _get("b v0", "final_ms"), _get("b v1", "final_ms")))
    out.append(_ratio("(c) bulk, v1 / ceiling MB/s", _get("c v1", "MB/s"), _get("c ceiling", "MB/s"), ">= 0.50"))
    for loop in LOOPS:
        out.append(
            _ratio(f"(d) round trip p50, v1 / floor [{loop}]", _get(f"d v1 {loop}", "p50_us"),
                   _get(f"d floor {loop}", "p50_us"), "<= 2x" if loop == "uvloop" else "")
        )
        out.append(
            _ratio(f"(d) round trip p99, v1 / floor [{loop}]", _get(f"d v1 {loop}", "p99_us"),
                   _get(f"d floor {loop}", "p99_us"))
        )
    out.append(
        _ratio("(e) pipelined fs.read v1 requests/s, uvloop / asyncio",
               _get("a fs.read v1 uvloop", "requests/s"), _get("a fs.read v1 asyncio", "requests/s"))
    )
    out.append(
        _ratio("(e) pipelined fs.read v0 requests/s, uvloop / asyncio",
               _get("a fs.read v0 uvloop", "requests/s"), _get("a fs.read v0 asyncio", "requests/s"))
    )
    out.append(
        _ratio("(e) echo floor p50, asyncio / uvloop", _get("d floor asyncio", "p50_us"), _get("d floor uvloop", "p50_us"))
    )
    out.append(
        _ratio("(e) round trip p50 v1, asyncio / uvloop", _get("d v1 asyncio", "p50_us"), _get("d v1 uvloop", "p50_us"))
    )
    return out


def record(benchmark: Any, key: str, **figures: float) -> None:
    shown = {name: round(value, 1) if value < 100 else round(value) for name, value in figures.items()}
    benchmark.extra_info.update(shown)
    _summary[key] = shown


class _CpuMeter:
    """CPU time of the server and of this process (the client) over the benchmark's rounds."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.server = cpu_seconds_of(pid)
        self.client = cpu_self()

    def per(self, units: int) -> tuple[float, float]:
        """(server, client) CPU µs per unit since construction."""
        return (
            (cpu_seconds_of(self.pid) - self.server) / units * 1e6,
            (cpu_self() - self.client) / units * 1e6,
        )


# --- (a) pipelined tool calls ------------------------------------------------------------------


def _pipelined(benchmark: Any, servers: Callable[[str], ServerProcess], loop: str, wire: str, tool: str,
               args: bytes) -> None:
    server = servers(loop)
    with Session(server.sock_path, wire) as session:
        rids = tool_call_request_ids(PIPELINE_REQUESTS)
        requests = [session.wire.tool_call(rid, tool, args) for rid in rids]
        meter = _CpuMeter(server.pid)
        calls = 0

        def run() -> int:
            nonlocal calls
            calls += 1
            return pipelined_tool_calls(session, requests, rids, WINDOW).results

        assert benchmark.pedantic(run, rounds=PIPELINE_ROUNDS, iterations=1, warmup_rounds=1) == PIPELINE_REQUESTS
        server_us, client_us = meter.per(calls * PIPELINE_REQUESTS)
    stats = benchmark.stats.stats
    record(
        benchmark,
        f"a {tool} {wire} {loop}",
        **{
            "requests/s": PIPELINE_REQUESTS / stats.min,
            "requests/s median": PIPELINE_REQUESTS / stats.median,
            "server_cpu_us/request": server_us,
            "client_cpu_us/request": client_us,
        },
    )


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("loop", LOOPS)
def test_a_pipelined_fs_read(benchmark: Any, servers: Callable[[str], ServerProcess], loop: str, wire: str) -> None:
    benchmark.group = "a-pipelined-fs.read (256 in flight)"
    _pipelined(benchmark, servers, loop, wire, "fs.read", FS_READ_ARGS)


@pytest.mark.parametrize("wire", WIRES)
def test_a_pipelined_tools_list(benchmark: Any, servers: Callable[[str], ServerProcess], wire: str) -> None:
    benchmark.group = "a-pipelined-tools.list (256 in flight)"
    _pipelined(benchmark, servers, "uvloop", wire, "tools.list", b"{}")


# --- (b) a command printing 1,000,000 short lines ----------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
def test_b_shell_million_lines(benchmark: Any, servers: Callable[[str], ServerProcess], wire: str) -> None:
    benchmark.group = "b-shell-1M-lines (seq 1000000)"
    server = servers("uvloop")
    with Session(server.sock_path, wire) as session:
        rid = tool_call_request_ids(1)[0]
        request = session.wire.shell_exec(rid, LINES_COMMAND)
        results = []

        def run() -> int:
            results.append(shell_exec(session, request, rid))
            return results[-1].stdout_bytes

        expected = len(subprocess.run(LINES_COMMAND.split(), capture_output=True, check=True).stdout)
        assert benchmark.pedantic(run, rounds=LINES_ROUNDS, iterations=1, warmup_rounds=1) == expected
    best = min(r.seconds for r in results)
    record(
        benchmark,
        f"b {wire}",
        **{"MB/s": expected / best / 1e6, "final_ms": best * 1e3, "events": results[-1].events},
    )


# --- (c) bulk output against the os.read ceiling -----------------------------------------------


def test_c_bulk_ceiling(benchmark: Any) -> None:
    benchmark.group = f"c-bulk-output ({BULK >> 20} MiB per round)"
    assert benchmark.pedantic(_ceiling, args=(BULK_COMMAND,), rounds=BULK_ROUNDS, iterations=1, warmup_rounds=1) == BULK
    record(benchmark, "c ceiling", **{"MB/s": BULK / benchmark.stats.stats.min / 1e6})


def test_c_bulk_v1(benchmark: Any, servers: Callable[[str], ServerProcess]) -> None:
    benchmark.group = f"c-bulk-output ({BULK >> 20} MiB per round)"
    server = servers("uvloop")
    with Session(server.sock_path, "v1") as session:
        rid = tool_call_request_ids(1)[0]
        request = session.wire.shell_exec(rid, BULK_COMMAND)
        meter = _CpuMeter(server.pid)
        rounds = 0

        def run() -> int:
            nonlocal rounds
            rounds += 1
            return shell_exec(session, request, rid).stdout_bytes

        assert benchmark.pedantic(run, rounds=BULK_ROUNDS, iterations=1, warmup_rounds=1) == BULK
        server_us, client_us = meter.per(rounds)
    record(
        benchmark,
        "c v1",
        **{
            "MB/s": BULK / benchmark.stats.stats.min / 1e6,
            "server_cpu_ms/round": server_us / 1e3,
            "client_cpu_ms/round": client_us / 1e3,
        },
    )


# --- (d) sequential round trips against a bare echo floor, (e) on both loops -------------------


def _percentiles(benchmark: Any) -> tuple[float, float]:
    data = benchmark.stats.stats.sorted_data
    return percentile(data, 0.50) * 1e6, percentile(data, 0.99) * 1e6


def _message_sizes(server: ServerProcess, rid: str) -> tuple[int, int]:
    """Bytes of one v1 fs.read request, and of the three frames the service answers it with."""
    with Session(server.sock_path, "v1") as session:
        request = session.wire.tool_call(rid, "fs.read", FS_READ_ARGS)
        session.sock.sendall(request)
        frames = FrameDecoder()
        reply = seen = 0
        while seen < 3:  # PROCESSING, ToolResult, READY
            data = session.sock.recv(READ_SIZE)
            reply += len(data)
            seen += len(frames.feed(data))
    return len(request), reply


@pytest.mark.parametrize("loop", LOOPS)
def test_d_round_trip_floor(benchmark: Any, servers: Callable[[str], ServerProcess], loop: str,
                            tmp_path: pathlib.Path) -> None:
    benchmark.group = f"d-round-trip-{loop} (sequential, Unix socket)"
    request_size, reply_size = _message_sizes(servers(loop), tool_call_request_ids(1)[0])
    echo = EchoServer(str(tmp_path / "echo.sock"), loop, request_size, reply_size)
    try:
        benchmark.pedantic(echo.round_trip, rounds=RT_ROUNDS, iterations=1, warmup_rounds=100)
    finally:
        echo.stop()
    p50, p99 = _percentiles(benchmark)
    record(benchmark, f"d floor {loop}", p50_us=p50, p99_us=p99, request_bytes=request_size, reply_bytes=reply_size)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("loop", LOOPS)
def test_d_round_trip_tool_call(benchmark: Any, servers: Callable[[str], ServerProcess], loop: str, wire: str) -> None:
    benchmark.group = f"d-round-trip-{loop} (sequential, Unix socket)"
    server = servers(loop)
    with Session(server.sock_path, wire) as session:
        rid = tool_call_request_ids(1)[0]
        request = session.wire.tool_call(rid, "fs.read", FS_READ_ARGS)
        meter = _CpuMeter(server.pid)
        calls = 0

        def run() -> None:
            nonlocal calls
            calls += 1
            round_trip(session, request, rid)

        benchmark.pedantic(run, rounds=RT_ROUNDS, iterations=1, warmup_rounds=100)
        server_us, _ = meter.per(calls)
    p50, p99 = _percentiles(benchmark)
    record(benchmark, f"d {wire} {loop}", p50_us=p50, p99_us=p99, **{"server_cpu_us/request": server_us})
