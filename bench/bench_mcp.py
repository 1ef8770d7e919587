"""MCP: smith-fast's MCP front against a server built with the official MCP Python SDK.

Run: ``.venv/bin/pytest bench/bench_mcp.py --benchmark-only -p no:cacheprovider``.

Both contenders run as stdio servers, spawned the way MCP clients spawn them, and are driven by
the same minimal JSON-RPC client here (newline-delimited messages on the pipes, so the client's
cost is the same for both and small): ``smith-fast serve --mcp`` (``fs.read``) and
``bench/mcp_sdk_server.py`` (``MCPServer`` with a ``read_file`` tool, written the way the SDK's
documentation shows). The same 72-byte file is read by each:

* ``pipelined``: :data:`N` calls with up to :data:`WINDOW` in flight;
* ``sequential``: one call at a time (the p50 is of single round trips);
* ``seq 200000``: one ``shell`` call printing 200,000 lines (1.3 MB), its whole output in the
  result (smith-fast with ``--tool-max-output 16M`` so that nothing is cut);
* ``true``: sequential ``shell`` calls of ``true`` (process start and exit, p50).

The summary gives calls/s, p50 and the server's CPU per call (all its threads), and the ratios.
"""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from harness.server import ROOT

from ._summary import print_summary
from .report.drivers import cpu_seconds_of
from .report.stats import percentile

N = 2000
WINDOW = 64
SEQUENTIAL = 300
TRUE_CALLS = 50
CONTENT = b"x" * 71 + b"\n"  # 72 bytes, as in issue 17's measurement

_results: dict[tuple[str, str], dict[str, float]] = {}


class StdioPeer:
    """A spawned MCP server and a JSON-RPC client on its pipes."""

    def __init__(self, argv: list[str], tool: str, path_arg: str) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin
        self._out = self.proc.stdout
        self.tool = tool
        self.path_arg = path_arg
        self._id = 0
        self._request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self._in.flush()

    def _send(self, message: dict[str, Any]) -> None:
        self._in.write(orjson.dumps(message) + b"\n")

    def _request(self, method: str, params: dict[str, Any]) -> Any:
        self._id += 1
        self._send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        self._in.flush()
        while True:
            answer = orjson.loads(self._out.readline())
            if answer.get("id") == self._id:
                assert "result" in answer, answer
                return answer["result"]

    def _call_message(self) -> bytes:
        self._id += 1
        return orjson.dumps({"jsonrpc": "2.0", "id": self._id, "method": "tools/call",
                             "params": {"name": self.tool, "arguments": {"path": self.path_arg}}}) + b"\n"

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        self._in.write(orjson.dumps({"jsonrpc": "2.0", "id": self._id, "method": "tools/call", "params": {"name": tool, "arguments": args}}) + b"\n")
        self._in.flush()
        while True:
            answer = orjson.loads(self._out.readline())
            if answer.get("id") == self._id:
                assert answer["result"]["isError"] is False, answer
                return dict(answer["result"])

    def read_once(self) -> None:
        self._in.write(self._call_message())
        self._in.flush()
        answer = orjson.loads(self._out.readline())
        assert answer["result"]["isError"] is False, answer

    def pipelined(self, n: int, window: int) -> None:
        sent = received = 0
        while received < n:
            batch = [self._call_message() for _ in range(min(window - (sent - received), n - sent))]
            if batch:
                self._in.write(b"".join(batch))
                self._in.flush()
                sent += len(batch)
            answer = orjson.loads(self._out.readline())
            if "id" in answer:
                assert answer["result"]["isError"] is False, answer
                received += 1

    def close(self) -> None:
        self._in.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _contenders(root: pathlib.Path) -> dict[str, tuple[list[str], str]]:
    return {
        "smith-fast --mcp": ([sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(root), "--log-level", "warning",
                              "--tool-max-output", "16M"], "fs.read"),
        "mcp SDK MCPServer": ([sys.executable, str(ROOT / "bench" / "mcp_sdk_server.py"), str(root)], "read_file"),
    }


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, StdioPeer]]:
    root = tmp_path_factory.mktemp("mcp-bench")
    (root / "small.txt").write_bytes(CONTENT)
    made = {name: StdioPeer(argv, tool, "small.txt") for name, (argv, tool) in _contenders(root).items()}
    for peer in made.values():
        peer.read_once()  # warm: imports, first-call caches
    yield made
    for peer in made.values():
        peer.close()


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _lines())


def _lines() -> Iterator[str]:
    if not _results:
        return
    yield ""
    yield "MCP over stdio, smith-fast --mcp vs the SDK's MCPServer (reads: fs.read vs read_file; shell vs shell):"
    for (name, mode), r in sorted(_results.items()):
        yield f"  {mode:11s} {name:20s} {r['rate']:9.0f} calls/s  p50 {'-' if math.isnan(r['p50_ms']) else format(r['p50_ms'], '6.3f'):>6s} ms  server CPU {r['cpu_us']:7.1f} µs/call"
    for mode in ("pipelined", "sequential", "seq 200000", "true"):
        ours, sdk = _results.get(("smith-fast --mcp", mode)), _results.get(("mcp SDK MCPServer", mode))
        if ours and sdk:
            p50 = "" if math.isnan(ours["p50_ms"]) else f", p50 {sdk['p50_ms'] / ours['p50_ms']:.1f}x lower"
            yield f"  {mode}: smith-fast {ours['rate'] / sdk['rate']:.1f}x the calls/s{p50}, {sdk['cpu_us'] / ours['cpu_us']:.1f}x less server CPU per call"


@pytest.mark.parametrize("name", list(_contenders(pathlib.Path("."))))
def test_pipelined_reads(benchmark, peers: dict[str, StdioPeer], name: str) -> None:  # type: ignore[no-untyped-def]
    peer = peers[name]
    cpu: list[float] = []
    walls: list[float] = []

    def run() -> None:
        c0, t0 = cpu_seconds_of(peer.proc.pid), time.perf_counter()
        peer.pipelined(N, WINDOW)
        walls.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds_of(peer.proc.pid) - c0)

    benchmark.pedantic(run, rounds=3, iterations=1)
    best = min(range(len(walls)), key=walls.__getitem__)
    _results[(name, "pipelined")] = {
        "rate": N / walls[best], "p50_ms": math.nan, "cpu_us": cpu[best] / N * 1e6,
    }


@pytest.mark.parametrize("name", list(_contenders(pathlib.Path("."))))
def test_sequential_reads(benchmark, peers: dict[str, StdioPeer], name: str) -> None:  # type: ignore[no-untyped-def]
    peer = peers[name]
    samples: list[float] = []
    cpu: list[float] = []

    def run() -> None:
        c0 = cpu_seconds_of(peer.proc.pid)
        for _ in range(SEQUENTIAL):
            t0 = time.perf_counter()
            peer.read_once()
            samples.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds_of(peer.proc.pid) - c0)

    benchmark.pedantic(run, rounds=1, iterations=1)
    samples.sort()
    _results[(name, "sequential")] = {
        "rate": len(samples) / sum(samples), "p50_ms": percentile(samples, 0.5) * 1000, "cpu_us": sum(cpu) / len(samples) * 1e6,
    }



@pytest.mark.parametrize("name", list(_contenders(pathlib.Path("."))))
def test_seq_200000(benchmark, peers: dict[str, StdioPeer], name: str) -> None:  # type: ignore[no-untyped-def]
    peer = peers[name]
    walls: list[float] = []
    cpu: list[float] = []

    def run() -> None:
        c0, t0 = cpu_seconds_of(peer.proc.pid), time.perf_counter()
        result = peer.call("shell", {"command": "seq 200000"})
        walls.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds_of(peer.proc.pid) - c0)
        structured = result.get("structuredContent") or {}
        assert structured.get("stdout", "").endswith("199999\n200000\n"), str(result)[:200]

    benchmark.pedantic(run, rounds=3, iterations=1)
    best = min(range(len(walls)), key=walls.__getitem__)
    _results[(name, "seq 200000")] = {"rate": 1 / walls[best], "p50_ms": walls[best] * 1000, "cpu_us": cpu[best] * 1e6}


@pytest.mark.parametrize("name", list(_contenders(pathlib.Path("."))))
def test_sequential_true(benchmark, peers: dict[str, StdioPeer], name: str) -> None:  # type: ignore[no-untyped-def]
    peer = peers[name]
    samples: list[float] = []
    cpu: list[float] = []

    def run() -> None:
        c0 = cpu_seconds_of(peer.proc.pid)
        for _ in range(TRUE_CALLS):
            t0 = time.perf_counter()
            peer.call("shell", {"command": "true"})
            samples.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds_of(peer.proc.pid) - c0)

    benchmark.pedantic(run, rounds=1, iterations=1)
    samples.sort()
    _results[(name, "true")] = {
        "rate": len(samples) / sum(samples), "p50_ms": percentile(samples, 0.5) * 1000, "cpu_us": sum(cpu) / len(samples) * 1e6,
    }
