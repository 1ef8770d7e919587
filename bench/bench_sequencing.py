"""Sequencer and Resequencer: compiled twin vs pure Python, side by side per group.

Run: ``.venv/bin/pytest bench/bench_sequencing.py --benchmark-only -p no:cacheprovider``.
Each benchmarked call does 10,000 operations; divide the times by 10,000 for one.
"""

from __future__ import annotations

import importlib
import random
from types import ModuleType
from typing import Any

import pytest

from smith_fast._compat import NO_EXTENSIONS

N = 10_000


@pytest.fixture(params=["py"] if NO_EXTENSIONS else ["c", "py"])
def sequencing(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(f"smith_fast._sequencing_{request.param}")


def bounded_shuffle(n: int, window: int, redelivery: float, seed: int = 1) -> list[int]:
    """1..n with each number at most ``window`` ahead of the lowest missing, plus redeliveries."""
    rnd = random.Random(seed)
    order = sorted(range(1, n + 1), key=lambda i: (i + rnd.randint(0, window), i))
    out: list[int] = []
    for s in order:
        out.append(s)
        if rnd.random() < redelivery:
            out.append(rnd.choice(out))
    return out


def test_sequencer_next(benchmark: Any, sequencing: ModuleType) -> None:
    benchmark.group = "Sequencer.next x10k (default clock)"
    seq = sequencing.Sequencer()

    def run() -> None:
        nxt = seq.next
        for _ in range(N):
            nxt()

    benchmark(run)
    assert seq.last >= N


def test_sequencer_stamp(benchmark: Any, sequencing: ModuleType) -> None:
    from smith_fast.pb import smith_pb2

    benchmark.group = "Sequencer.stamp x10k"
    seq = sequencing.Sequencer()
    envelopes = [smith_pb2.Envelope() for _ in range(N)]

    def run() -> None:
        stamp = seq.stamp
        for env in envelopes:
            stamp(env)

    benchmark(run)
    assert envelopes[-1].sequence == seq.last


def test_resequencer_in_order(benchmark: Any, sequencing: ModuleType) -> None:
    benchmark.group = "Resequencer.push x10k in order"
    arrivals = list(range(1, N + 1))

    def run() -> Any:
        r = sequencing.Resequencer()
        push = r.push
        for s in arrivals:
            push(s, s)
        return r

    r = benchmark(run)
    assert r.delivered == N


def test_resequencer_shuffled(benchmark: Any, sequencing: ModuleType) -> None:
    benchmark.group = "Resequencer.push x10k shuffled (window 32, 5% redelivered)"
    arrivals = bounded_shuffle(N, 32, 0.05)

    def run() -> Any:
        r = sequencing.Resequencer(window=32)
        push = r.push
        for s in arrivals:
            push(s, s)
        return r

    r = benchmark(run)
    assert (r.delivered, r.gaps, r.duplicates) == (N, 0, len(arrivals) - N)


def test_resequencer_lossy(benchmark: Any, sequencing: ModuleType) -> None:
    benchmark.group = "Resequencer.push x10k shuffled, 1% lost (window 32)"
    rnd = random.Random(2)
    arrivals = [s for s in bounded_shuffle(N, 32, 0.0) if rnd.random() >= 0.01]

    def run() -> Any:
        r = sequencing.Resequencer(window=32)
        push = r.push
        for s in arrivals:
            push(s, s)
        r.flush()
        return r

    r = benchmark(run)
    assert r.delivered == len(arrivals)
