"""MCP: smith-fast's MCP front against a server built with the official MCP Python SDK.

Run: ``.venv/bin/pytest bench/bench_mcp.py --benchmark-only -p no:cacheprovider``.

Both contenders run as stdio servers, spawned the way MCP clients spawn them, and are driven by
the same minimal JSON-RPC client (``bench.report.stdio.StdioPeer``, the end-to-end report's; newline-delimited messages on the pipes, so the client's
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
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.server import ROOT

from ._summary import print_summary
from .report.drivers import cpu_seconds_of
from .report.stats import percentile
from .report.stdio import StdioPeer

N = 2000
WINDOW = 64
SEQUENTIAL = 300
TRUE_CALLS = 50
CONTENT = b"x" * 71 + b"\n"  # 72 bytes, the file of the report's small tool calls (bench/report)

_results: dict[tuple[str, str], dict[str, float]] = {}


def _read_once(peer: StdioPeer, tool: str) -> None:
    peer.call(tool, {"path": "small.txt"})


def _pipelined(peer: StdioPeer, tool: str, n: int, window: int) -> None:
    answers = peer.pipelined([peer.call_line(tool, {"path": "small.txt"}) for _ in range(n)], window)
    assert all(a["result"]["isError"] is False for a in answers), answers[:3]


def _contenders(root: pathlib.Path) -> dict[str, tuple[list[str], str]]:
    return {
        "smith-fast --mcp": ([sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(root), "--log-level", "warning",
                              "--tool-max-output", "16M"], "fs.read"),
        "mcp SDK MCPServer": ([sys.executable, str(ROOT / "bench" / "mcp_sdk_server.py"), str(root)], "read_file"),
    }


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[StdioPeer, str]]]:
    root = tmp_path_factory.mktemp("mcp-bench")
    (root / "small.txt").write_bytes(CONTENT)
    made = {name: (StdioPeer(argv, ROOT), tool) for name, (argv, tool) in _contenders(root).items()}
    for peer, tool in made.values():
        _read_once(peer, tool)  # warm: imports, first-call caches
    yield made
    for peer, _ in made.values():
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
def test_pipelined_reads(benchmark, peers: dict[str, tuple[StdioPeer, str]], name: str) -> None:  # type: ignore[no-untyped-def]
    peer, tool = peers[name]
    cpu: list[float] = []
    walls: list[float] = []

    def run() -> None:
        c0, t0 = cpu_seconds_of(peer.proc.pid), time.perf_counter()
        _pipelined(peer, tool, N, WINDOW)
        walls.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds_of(peer.proc.pid) - c0)

    benchmark.pedantic(run, rounds=3, iterations=1)
    best = min(range(len(walls)), key=walls.__getitem__)
    _results[(name, "pipelined")] = {
        "rate": N / walls[best], "p50_ms": math.nan, "cpu_us": cpu[best] / N * 1e6,
    }


@pytest.mark.parametrize("name", list(_contenders(pathlib.Path("."))))
def test_sequential_reads(benchmark, peers: dict[str, tuple[StdioPeer, str]], name: str) -> None:  # type: ignore[no-untyped-def]
    peer, tool = peers[name]
    samples: list[float] = []
    cpu: list[float] = []

    def run() -> None:
        c0 = cpu_seconds_of(peer.proc.pid)
        for _ in range(SEQUENTIAL):
            t0 = time.perf_counter()
            _read_once(peer, tool)
            samples.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds_of(peer.proc.pid) - c0)

    benchmark.pedantic(run, rounds=1, iterations=1)
    samples.sort()
    _results[(name, "sequential")] = {
        "rate": len(samples) / sum(samples), "p50_ms": percentile(samples, 0.5) * 1000, "cpu_us": sum(cpu) / len(samples) * 1e6,
    }



@pytest.mark.parametrize("name", list(_contenders(pathlib.Path("."))))
def test_seq_200000(benchmark, peers: dict[str, tuple[StdioPeer, str]], name: str) -> None:  # type: ignore[no-untyped-def]
    peer, tool = peers[name]
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
def test_sequential_true(benchmark, peers: dict[str, tuple[StdioPeer, str]], name: str) -> None:  # type: ignore[no-untyped-def]
    peer, tool = peers[name]
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
