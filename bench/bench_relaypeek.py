"""The gateway's peek at relayed frames: the compiled twin against the Python twin (``[c]`` / ``[py]``).

Run: ``.venv/bin/python -m bench.bench_relaypeek`` prints the cost per call of each twin (and of the
v0 helpers); ``.venv/bin/pytest bench/bench_relaypeek.py --benchmark-only`` runs the same cases
under pytest-benchmark. The cases are what the gateway peeks at most: a 72-byte ``tool_call`` frame
from a frontend (``command_ids``), and a command's final events as a batching session writes them,
one ``BatchEvent`` holding the last ``ShellOutput`` and the terminal ``StateChange`` (``event_marks``).
Nothing here asserts a time: the figures are for reading.
"""

from __future__ import annotations

import timeit
import uuid
from collections.abc import Callable
from types import ModuleType

from smith_fast import _relaypeek_v0
from smith_fast._compat import NO_EXTENSIONS
from smith_fast.jsonl import JsonlCodec
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.sinks import V0Sink, V1Sink

RID = str(uuid.UUID(int=1))


def tool_call_frame() -> bytes:
    """A frontend's ``tool_call`` Envelope, 72 bytes (a UUID request id, ``fs.read``, small args)."""
    call = pb.ToolCallCommand(request_id=RID, tool="fs.read", args=b'{"path":"a"}')
    frame = pb.Envelope(timestamp=1_700_000_000_000, command=pb.Command(tool_call=call)).SerializeToString()
    assert len(frame) == 72, len(frame)
    return frame


def final_batch() -> bytes:
    """The last output and the terminal state of a ShellExec, batched as a V1Sink writes them."""
    out: list[bytes] = []
    sink = V1Sink(out.append)
    sink.start_batching()
    sink.shell_output(RID, "done\n")
    sink.shell_output(RID, exit_code=0, finished=True)
    sink.state_change(pb.SERVICE_STATE_READY, RID)
    sink.flush_batch()
    return b"".join(out)


def v0_lines() -> tuple[bytes, bytes]:
    """The same two cases in v0: the ToolCall line, and the final lines a V0Sink writes."""
    codec = JsonlCodec()
    line = codec.encode_command(pb.Command(tool_call=pb.ToolCallCommand(request_id=RID, tool="fs.read", args=b'{"path":"a"}')))
    out: list[bytes] = []
    sink = V0Sink(out.append, codec)
    sink.shell_output(RID, "done\n")
    sink.shell_output(RID, exit_code=0, finished=True)
    sink.state_change(pb.SERVICE_STATE_READY, RID)
    return line, b"".join(out)


def test_command_ids_tool_call(benchmark, relaypeek: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    frame = tool_call_frame()
    benchmark.group = "relaypeek command_ids, 72-byte tool_call"
    assert benchmark(relaypeek.command_ids, frame) == [RID]


def test_event_marks_final_batch(benchmark, relaypeek: ModuleType, impl: str) -> None:  # type: ignore[no-untyped-def]
    buf = final_batch()
    benchmark.group = f"relaypeek event_marks, final BatchEvent ({len(buf)} B)"
    assert benchmark(relaypeek.event_marks, buf) == (1, [RID])


def _ns(call: Callable[[], object]) -> float:
    """Nanoseconds per call: the best of five timings of a run long enough to time."""
    timer = timeit.Timer(call)
    number, _ = timer.autorange()
    return min(timer.repeat(5, number)) / number * 1e9


def main() -> None:
    import importlib

    frame, batch = tool_call_frame(), final_batch()
    line, lines = v0_lines()
    print(f"{'case':<52} {'twin':>4} {'ns/call':>9}")
    for impl in ["py"] if NO_EXTENSIONS else ["c", "py"]:
        twin = importlib.import_module(f"smith_fast._relaypeek_{impl}")
        print(f"{'command_ids, 72-byte tool_call':<52} {impl:>4} {_ns(lambda: twin.command_ids(frame)):9.0f}")
        print(f"{f'event_marks, final BatchEvent ({len(batch)} B)':<52} {impl:>4} {_ns(lambda: twin.event_marks(batch)):9.0f}")
    print(f"{f'v0_command_ids, ToolCall line ({len(line)} B)':<52} {'py':>4} {_ns(lambda: _relaypeek_v0.v0_command_ids(line)):9.0f}")
    print(f"{f'v0_event_marks, final lines ({len(lines)} B)':<52} {'py':>4} {_ns(lambda: _relaypeek_v0.v0_event_marks(lines)):9.0f}")
    decode = pb.Envelope.FromString
    print(f"{'(for scale: Envelope.FromString of the tool_call)':<52} {'upb':>4} {_ns(lambda: decode(frame)):9.0f}")


if __name__ == "__main__":
    main()
