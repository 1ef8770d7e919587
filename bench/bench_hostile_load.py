"""Honest round trips under attack, as a ratio to an unloaded run in the same run (RELIABILITY.md,
"hostile sessions beside honest ones").

One real ``smith-fast serve``; 10 honest sessions (``harness.hostile.Honest``: rounds of 4
pipelined tool calls and a shell command) run for :data:`PHASE` seconds alone, then as long again
while the attacks of :data:`harness.hostile.ATTACKS` run (``all`` of them at once, then each alone, to
see which costs what). Reported in ``extra_info``: the p50
and p99 round trip of each phase, ``p99_ratio`` (attacked / unloaded), the rounds completed, and
the server's RSS growth (MiB) during the attack.

Run: ``.venv/bin/pytest bench/bench_hostile_load.py --benchmark-only -p no:cacheprovider -s``.
"""

from __future__ import annotations

import pathlib
import statistics
import threading
import time
from typing import Any

import pytest

from harness.hostile import ATTACKS, SERVER_ARGS, Honest, prepare_root, rss_kib, run_attacks
from harness.server import ServerProcess

HONEST = 10
PHASE = 10.0


def _phase(server: ServerProcess, attacks: list[str]) -> tuple[list[float], int, list[str]]:
    """One phase: the honest sessions (on the Unix socket) beside ``attacks`` (on TCP)."""
    stop = threading.Event()
    address, pid = server.unix, server.pid
    attackers = run_attacks(server.tcp, attacks, stop)
    honest = [Honest(address, i) for i in range(HONEST)]
    threads = [threading.Thread(target=h.run, args=(stop,), daemon=True) for h in honest]
    before = rss_kib(pid)
    peak = before
    for t in threads:
        t.start()
    deadline = time.monotonic() + PHASE
    while time.monotonic() < deadline:
        peak = max(peak, rss_kib(pid))
        time.sleep(0.1)
    stop.set()
    for t in [*threads, *attackers]:
        t.join(30)
    return [rt for h in honest for rt in h.round_trips], (peak - before) // 1024, [p for h in honest for p in h.problems]


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else values[0]


SETS = {"all": list(ATTACKS), **{name: [name] for name in ATTACKS}}


@pytest.mark.parametrize("attacks", list(SETS))
def test_hostile_load(benchmark: Any, tmp_path: pathlib.Path, attacks: str) -> None:
    benchmark.group = "hostile load: honest round trip"
    prepare_root(tmp_path)
    server = ServerProcess(tmp_path, *SERVER_ARGS, log_level="info", keep=2000).start()
    try:
        result: dict[str, Any] = {}

        def run() -> None:
            calm, _, calm_problems = _phase(server, [])
            hostile_rts, grown, problems = _phase(server, SETS[attacks])
            assert not calm_problems and not problems, (calm_problems + problems)[:10]
            result.update(
                unloaded_p50_ms=round(_p(calm, 50) * 1000, 1),
                unloaded_p99_ms=round(_p(calm, 99) * 1000, 1),
                attacked_p50_ms=round(_p(hostile_rts, 50) * 1000, 1),
                attacked_p99_ms=round(_p(hostile_rts, 99) * 1000, 1),
                p99_ratio=round(_p(hostile_rts, 99) / _p(calm, 99), 2),
                unloaded_rounds=len(calm),
                attacked_rounds=len(hostile_rts),
                rss_growth_mib=grown,
                attacks=",".join(SETS[attacks]),
            )

        benchmark.pedantic(run, rounds=1, iterations=1)
        benchmark.extra_info.update(result)
        print("\nhostile load:", result)
    finally:
        server.stop()
