"""V1Sink's event methods, unbatched and batched side by side: the per-event cost of the sink itself.

Run: ``.venv/bin/pytest bench/bench_sinks.py --benchmark-only -p no:cacheprovider``.
Each benchmarked call sends 1,000 events (bare envelopes, as to gRPC) to a list; divide the times by 1,000 for one. Compare a
change against its parent as the ratio of the two runs' medians, per row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.sinks import V1Sink

N = 1_000
RID = "3f2a5c1e-0000-4000-8000-000000000001"

CASES: dict[str, Callable[[V1Sink], None]] = {
    "tool_result": lambda s: s.tool_result(RID, True, b'{"content":"hello world"}', None, 3),
    "shell_output": lambda s: s.shell_output(RID, stdout="a line of output\n"),
    "state_change": lambda s: s.state_change(pb.SERVICE_STATE_PROCESSING, RID),
}


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("case", list(CASES))
def test_sink_event(benchmark: Any, case: str, batched: bool) -> None:
    benchmark.group = f"V1Sink.{case} x1k"
    out: list[bytes] = []
    sink = V1Sink(out.append, framed=False, notify=lambda: None)
    if batched:
        sink.start_batching()
    send = CASES[case]

    def run() -> None:
        out.clear()
        for _ in range(N):
            send(sink)
        sink.flush_batch()

    benchmark(run)
    envelopes = [pb.Envelope.FromString(b) for b in out]
    sent = sum(len(e.batch_event.events) if e.HasField("batch_event") else 1 for e in envelopes)
    assert sent == N
