"""``bench/bench_nats.py``'s verdicts: the pipelined figure's target and the CPU-bound ceiling it is
read against (the measurement itself runs in ``make bench``: a benchmark, not a timed test)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import bench_nats
from bench.bench_nats import cpu_bound, cpu_ceiling


def test_cpu_bound_is_the_busiest_process_or_the_cpus_shared() -> None:
    # two processes on two CPUs: each has one, the busier sets the pace
    assert cpu_bound({"serve": 25.0, "client": 30.0}, 2) == pytest.approx(1e6 / 30.0)
    # four on two: together they need more than two CPUs' time per call
    assert cpu_bound({"client": 40.0, "gateway": 7.0, "worker1": 33.0, "nats-server": 9.0}, 2) == pytest.approx(1e6 / 44.5)
    # on one CPU everything is shared
    assert cpu_bound({"serve": 25.0, "client": 30.0}, 1) == pytest.approx(1e6 / 55.0)
    assert cpu_bound({"serve": 0.0}, 2) == 0.0


def test_the_ceiling_is_the_ratio_of_the_bounds() -> None:
    ceiling = cpu_ceiling({"serve": 25.0, "client": 30.0}, {"client": 40.0, "gateway": 7.0, "worker1": 33.0, "nats-server": 9.0}, 2)
    assert ceiling["cpus"] == 2
    assert ceiling["ratio"] == pytest.approx(30.0 / 44.5)
    assert ceiling["relayed"] / ceiling["direct"] == pytest.approx(ceiling["ratio"])


def _result(ratio: float, gateway_cpu: float) -> dict[str, Any]:
    direct = {"serve": 25.0, "client": 30.0}
    relayed = {"gateway": gateway_cpu, "worker1": 33.0, "nats-server": 9.0, "client": 40.0}
    return {
        "scale": "quick", "wall_s": 1.0, "cpus": 2, "command_cpu_ms_unconfined": 50.0,
        "pipelined": {
            "calls": 100, "window": 64, "reps": 1, "file_bytes": 72,
            "serve": {"calls_per_s": [1000], "median": 1000.0, "cpu_us_per_call": direct},
            "gateway+1": {"calls_per_s": [round(1000 * ratio)], "median": 1000.0 * ratio, "cpu_us_per_call": relayed},
            "ratio": ratio, "ratio_of": "gateway+1 / serve", "target": bench_nats.RELAY_TARGET,
            "met": ratio >= bench_nats.RELAY_TARGET and gateway_cpu <= direct["serve"],
            "ceiling": cpu_ceiling(direct, relayed, 2),
        },
        "scaling": {
            "sessions": 16, "commands_per_session": 1, "reps": 1, "command": "true", "target": 3.2, "met": True,
            "ratio": 3.5, "ratio_of": "4 workers / 1", "worker_cpu_source": "cell",
            "quota": {"fraction": 0.25, "method": "cgroup2", "detail": "cpu.max", "commands_seen_inside": 1,
                      "commands_seen_outside": 0, "throttled_periods": {}},
            "1": {"median": 1.0, "worker_cpu_s": [1.0]}, "4": {"median": 3.5, "worker_cpu_s": [1.0, 1.0, 1.0, 1.0]},
        },
        "session_start": {"starts": 1, "target": 2.0, "met": True, "ratio": 1.5, "ratio_of": "gateway+1 / serve",
                          "serve": {"p50_ms": 1.0, "p90_ms": 1.0}, "gateway+1": {"p50_ms": 1.5, "p90_ms": 1.5}},
    }


@pytest.mark.parametrize(("ratio", "gateway_cpu", "verdict"), [
    (0.75, 7.0, ": met"),
    (0.65, 7.0, ": NOT met"),
    (0.75, 26.0, ": NOT met"),  # fast enough, but the gateway spends more per call than serve
])
def test_the_pipelined_figure_says_whether_its_target_is_met(ratio: float, gateway_cpu: float, verdict: str) -> None:
    lines = bench_nats.render(_result(ratio, gateway_cpu))
    line = next(line for line in lines if "x the calls/s" in line)
    assert f"{ratio:.3f}x" in line and "target >= 0.7x" in line and line.endswith(verdict), line
    ceiling = next(line for line in lines if "CPU-bound ceiling" in line)
    assert "the client's included" in ceiling
    assert f"{30.0 / (40.0 + gateway_cpu + 33.0 + 9.0) * 2:.3f}x" in ceiling, ceiling
    # the client's CPU is a column of the table, for both topologies
    header = next(line for line in lines if "CPU µs/call" in line)
    assert "client" in header
