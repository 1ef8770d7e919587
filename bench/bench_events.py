"""Direct event encoders against the protobuf runtime, per hot event, side by side.

Run: ``.venv/bin/pytest bench/bench_events.py --benchmark-only -p no:cacheprovider``. Each group holds
three entries for one event type: the compiled twin ``[c]``, the Python twin ``[py]`` and
``protobuf``, the runtime path a service would otherwise take (build the ``Envelope`` by assigning
fields of a fresh message, the runtime's fastest idiom; ``SerializeToString()``; frame it with
``smith_fast.framing.encode_frame``). Every benchmarked call encodes a batch of realistic events,
so per-event costs are far above timer resolution; the test checks that all three give the same
bytes before timing anything.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from smith_fast.framing import encode_frame
from smith_fast.pb import smith_pb2

BATCH = 1000
T0 = 1_760_000_000_000  # Unix milliseconds, late 2025: six-byte varints, as on a live stream
EVENTS = ["shell_output", "log", "state_change", "tool_result", "error"]


def _rid(rnd: random.Random) -> str:
    return str(uuid.UUID(int=rnd.getrandbits(128), version=4))


def _words(rnd: random.Random, size: int) -> str:
    vocab = ["src", "main.py", "ok", "PASSED", "tests", "error:", "line", "0x1f", "->", "build", "[100%]"]
    out = ""
    while len(out) < size:
        out += rnd.choice(vocab) + " "
    return out[:size]


def _args(event: str, rnd: random.Random, i: int) -> tuple[Any, ...]:
    """Arguments of ``encode_<event>``: (timestamp, sequence, ...), realistic sizes."""
    ts, seq, rid = T0 + i // 4, i + 1, _rid(rnd)
    if event == "shell_output":  # ~80-byte output lines, stderr now and then, a final exit code
        line = _words(rnd, rnd.randint(60, 100)) + "\n"
        if i % 100 == 99:
            return ts, seq, rid, None, None, 0, True
        return (ts, seq, rid, line, None, None, False) if i % 10 else (ts, seq, rid, None, line, None, False)
    if event == "log":
        fields = {"tool": rnd.choice(["grep", "shell", "edit"]), "duration_ms": str(rnd.randint(1, 5000))}
        return ts, seq, smith_pb2.LOG_LEVEL_INFO, _words(rnd, 48), ts, rid, fields
    if event == "state_change":
        return ts, seq, rnd.choice([smith_pb2.SERVICE_STATE_PROCESSING, smith_pb2.SERVICE_STATE_READY]), rid, ts
    if event == "tool_result":  # ~200-byte JSON results
        result = ('{"path":"src/%s","matches":[%s],"truncated":false}' % (
            _words(rnd, 20).strip().replace(" ", "_"),
            ",".join(str(rnd.randint(1, 9999)) for _ in range(28)),
        )).encode()
        return ts, seq, rid, True, result, None, rnd.randint(1, 900)
    assert event == "error"
    details = {"tool": "shell", "timeout_ms": "30000"}
    return ts, seq, smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT, "command exceeded its timeout", rid, ts, details


def _protobuf(event: str, deterministic: bool = False) -> Callable[..., bytes]:
    """The runtime path for ``event``: fill a fresh Envelope field by field, serialize, frame.

    The timed path serializes without ``deterministic`` (what a service would do: cheaper, maps in
    any order); the deterministic variant is the reference our encoders must match byte for byte.
    """
    Envelope = smith_pb2.Envelope

    def shell_output(ts, seq, rid, stdout, stderr, exit_code, finished):  # type: ignore[no-untyped-def]
        env = Envelope(timestamp=ts, sequence=seq)
        m = env.event.shell_output
        m.request_id = rid
        if stdout is not None:
            m.stdout = stdout
        if stderr is not None:
            m.stderr = stderr
        if exit_code is not None:
            m.exit_code = exit_code
        m.finished = finished
        return encode_frame(env.SerializeToString(deterministic=deterministic))

    def log(ts, seq, level, message, log_ts, rid, fields):  # type: ignore[no-untyped-def]
        env = Envelope(timestamp=ts, sequence=seq)
        m = env.event.log
        m.level = level
        m.message = message
        m.timestamp = log_ts
        m.request_id = rid
        m.fields.update(fields)
        return encode_frame(env.SerializeToString(deterministic=deterministic))

    def state_change(ts, seq, state, rid, state_ts):  # type: ignore[no-untyped-def]
        env = Envelope(timestamp=ts, sequence=seq)
        m = env.event.state_change
        m.state = state
        m.request_id = rid
        m.timestamp = state_ts
        return encode_frame(env.SerializeToString(deterministic=deterministic))

    def tool_result(ts, seq, rid, success, result, error, duration_ms):  # type: ignore[no-untyped-def]
        env = Envelope(timestamp=ts, sequence=seq)
        m = env.event.tool_result
        m.request_id = rid
        m.success = success
        m.result = result
        if error is not None:
            m.error = error
        m.duration_ms = duration_ms
        return encode_frame(env.SerializeToString(deterministic=deterministic))

    def error(ts, seq, code, message, rid, error_ts, details):  # type: ignore[no-untyped-def]
        env = Envelope(timestamp=ts, sequence=seq)
        m = env.event.error
        m.error_code = code
        m.message = message
        m.request_id = rid
        m.timestamp = error_ts
        m.details.update(details)
        return encode_frame(env.SerializeToString(deterministic=deterministic))

    return locals()[event]  # type: ignore[no-any-return]


def _batch(event: str) -> list[tuple[Any, ...]]:
    rnd = random.Random(f"bench-events-{event}")
    return [_args(event, rnd, i) for i in range(BATCH)]


def _run(encode: Callable[..., bytes], batch: list[tuple[Any, ...]]) -> list[bytes]:
    return [encode(*args) for args in batch]


@pytest.mark.parametrize("event", EVENTS)
def test_encode_twin(benchmark, events: ModuleType, impl: str, event: str) -> None:  # type: ignore[no-untyped-def]
    batch = _batch(event)
    encode = getattr(events, f"encode_{event}")
    benchmark.group = f"events encode {event} x {BATCH}"
    benchmark.extra_info["bytes"] = sum(map(len, _run(encode, batch)))
    assert benchmark(_run, encode, batch) == _run(_protobuf(event, deterministic=True), batch)


@pytest.mark.parametrize("event", EVENTS)
def test_encode_protobuf_runtime(benchmark, event: str) -> None:  # type: ignore[no-untyped-def]
    batch = _batch(event)
    benchmark.group = f"events encode {event} x {BATCH}"
    frames = benchmark(_run, _protobuf(event), batch)
    assert len(frames) == BATCH
