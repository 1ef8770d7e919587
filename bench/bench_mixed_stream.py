"""v1 (varint-delimited protobuf) against v0 JSONL on one realistic mixed event stream.

Run: ``.venv/bin/pytest bench/bench_mixed_stream.py --benchmark-only -p no:cacheprovider``.

The stream: 1,000 events from a fixed seed, shuffled: 60% shell output lines of ~80 B, 15% tool
results carrying ~200 B of JSON, 15% logs with two structured fields, 10% state changes. Every
contender starts from the same Python values and ends with one buffer for the whole stream.

ENCODE (group ``mixed stream encode``):
  * ``test_encode_v1[c]`` / ``[py]``: the ``smith_fast`` event encoders (both twins), frames joined.
  * ``test_encode_v0_json`` / ``_orjson``: build the v0 adjacently tagged object (``{"type": ...,
    "data": {...}}``, snake_case, ``null`` for absent options, string enums; PROTOCOL.md, "v0: JSON lines") and
    serialize it, one object per line: ``json.dumps`` (its cached default encoder, the fastest
    stdlib path; lines joined, then encoded once) or ``orjson.dumps`` (``OPT_APPEND_NEWLINE``,
    appended to one ``bytearray``: its fastest idiom here, see ``encode_orjson``).
    ``ToolResult.result`` is a JSON value in v0, so the v0 events carry the parsed object, parsed
    outside the timed region; v1 carries the same JSON as bytes.

DECODE (group ``mixed stream decode``):
  * ``test_decode_v1[c]`` / ``[py]``: ``FrameDecoder.feed`` (both framing twins), then
    ``Envelope.FromString`` per frame. upb parses eagerly but creates Python objects only when a
    field is read, whereas the JSON decoders build every object; ``test_decode_v1_reading_every_field``
    (compiled framing) therefore also reads every set field of each event (``ListFields``): the
    like-for-like entry when the consumer reads everything.
  * ``test_decode_v0_json`` / ``_orjson``: split the buffer on newlines, ``json.loads`` /
    ``orjson.loads`` per line (``json`` gets ``str`` lines, decoded from UTF-8 once; ``orjson``
    takes the bytes as they are).

What v0 cannot carry is simply absent from its stream, which favours JSONL: no envelope
timestamp/sequence, no ``Log.fields``, no ``ToolResult.duration_ms`` (PROTOCOL.md, "v0: JSON lines").
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import orjson
import pytest

from smith_fast import _events_py, framing as framing_facade
from smith_fast.pb import smith_pb2

COUNT = 1000
T0 = 1_760_000_000_000
MIX = [("shell_output", 60), ("tool_result", 15), ("log", 15), ("state_change", 10)]
LEVELS = {1: "Trace", 2: "Debug", 3: "Info", 4: "Warn", 5: "Error"}
STATES = {1: "Starting", 2: "Ready", 3: "Processing", 4: "Error", 5: "Shutting"}
WORDS = ["src/", "main.py", "ok", "PASSED", "tests/", "error:", "line", "42", "->", "warning", "build", "[ 80%]"]


def _text(rnd: random.Random, size: int) -> str:
    out = ""
    while len(out) < size:
        out += rnd.choice(WORDS) + " "
    return out[:size]


def _values() -> list[tuple[str, dict[str, Any]]]:
    """The stream as plain values: (kind, fields), with ``result`` as parsed JSON."""
    rnd = random.Random(20260101)
    rids = [str(uuid.UUID(int=rnd.getrandbits(128), version=4)) for _ in range(8)]
    kinds = [k for k, n in MIX for _ in range(COUNT * n // 100)]
    rnd.shuffle(kinds)
    out = []
    for i, kind in enumerate(kinds):
        v: dict[str, Any] = {"ts": T0 + i // 3, "seq": i + 1, "request_id": rnd.choice(rids)}
        if kind == "shell_output":
            line = _text(rnd, rnd.randint(70, 90)) + "\n"
            if rnd.random() < 0.9:
                v.update(stdout=line, stderr=None)
            else:
                v.update(stdout=None, stderr=line)
        elif kind == "tool_result":
            v["result"] = {
                "path": "src/" + _text(rnd, 16).replace(" ", "_") + ".py",
                "matches": [rnd.randint(1, 9999) for _ in range(20)],
                "encoding": "utf-8",
                "truncated": False,
            }
            v["duration_ms"] = rnd.randint(1, 900)
        elif kind == "log":
            v["level"] = rnd.choice([2, 3, 3, 3, 4])
            v["message"] = _text(rnd, rnd.randint(30, 60))
            v["fields"] = {"tool": rnd.choice(["grep", "shell", "edit"]), "duration_ms": str(rnd.randint(1, 5000))}
        else:
            v["state"] = rnd.choice([2, 3])
        out.append((kind, v))
    return out


def _v1_calls(events: ModuleType) -> list[tuple[Callable[..., bytes], tuple[Any, ...]]]:
    """Each event as (encoder, positional arguments); results serialized as compact JSON bytes."""
    calls: list[tuple[Callable[..., bytes], tuple[Any, ...]]] = []
    for kind, v in _values():
        ts, seq, rid = v["ts"], v["seq"], v["request_id"]
        if kind == "shell_output":
            calls.append((events.encode_shell_output, (ts, seq, rid, v["stdout"], v["stderr"])))
        elif kind == "tool_result":
            result = json.dumps(v["result"], separators=(",", ":")).encode()
            calls.append((events.encode_tool_result, (ts, seq, rid, True, result, None, v["duration_ms"])))
        elif kind == "log":
            calls.append((events.encode_log, (ts, seq, v["level"], v["message"], ts, rid, v["fields"])))
        else:
            calls.append((events.encode_state_change, (ts, seq, v["state"], rid, ts)))
    return calls


# v0 builders: the v1 encoders' arguments, returning the v0 object (PROTOCOL.md, "v0: JSON lines").
def _v0_shell_output(ts, seq, rid, stdout, stderr, exit_code=None, finished=False):  # type: ignore[no-untyped-def]
    return {"type": "ShellOutput", "data": {"request_id": rid, "stdout": stdout, "stderr": stderr,
                                            "exit_code": exit_code, "finished": finished}}


def _v0_tool_result(ts, seq, rid, success, result, error, duration_ms):  # type: ignore[no-untyped-def]
    data = {"request_id": rid, "success": success, "result": result, "error": error}
    return {"type": "ToolResult", "data": data}


def _v0_log(ts, seq, level, message, log_ts, rid, fields):  # type: ignore[no-untyped-def]
    return {"type": "Log", "data": {"level": LEVELS[level], "message": message, "timestamp": log_ts,
                                    "request_id": rid}}


def _v0_state_change(ts, seq, state, rid, state_ts):  # type: ignore[no-untyped-def]
    return {"type": "StateChange", "data": {"request_id": rid, "state": STATES[state], "timestamp": state_ts}}


def _v0_calls() -> list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]]:
    """Each event as (v0 builder, arguments): the v1 arguments, with ``result`` pre-parsed."""
    calls: list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]] = []
    for kind, v in _values():
        ts, seq, rid = v["ts"], v["seq"], v["request_id"]
        if kind == "shell_output":
            calls.append((_v0_shell_output, (ts, seq, rid, v["stdout"], v["stderr"])))
        elif kind == "tool_result":
            calls.append((_v0_tool_result, (ts, seq, rid, True, v["result"], None, v["duration_ms"])))
        elif kind == "log":
            calls.append((_v0_log, (ts, seq, v["level"], v["message"], ts, rid, v["fields"])))
        else:
            calls.append((_v0_state_change, (ts, seq, v["state"], rid, ts)))
    return calls


def encode_v1(calls: list[tuple[Callable[..., bytes], tuple[Any, ...]]]) -> bytes:
    return b"".join([encode(*args) for encode, args in calls])


def encode_json(calls: list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]]) -> bytes:
    dumps = json.dumps
    lines = [dumps(build(*args)) for build, args in calls]
    lines.append("")
    return "\n".join(lines).encode()


def encode_orjson(calls: list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]]) -> bytearray:
    # orjson's fastest idiom here: each result is appended and dropped at once. Keeping 1,000 of
    # them alive for a join made it ~3x slower on this machine (every call then gets a fresh
    # output buffer from the system allocator), which would handicap it.
    buf = bytearray()
    dumps = orjson.dumps
    newline = orjson.OPT_APPEND_NEWLINE
    for build, args in calls:
        buf += dumps(build(*args), option=newline)
    return buf


def decode_v1(framing: ModuleType, data: bytes) -> list[Any]:
    parse = smith_pb2.Envelope.FromString
    return [parse(frame) for frame in framing.FrameDecoder().feed(data)]


def decode_v1_fields(framing: ModuleType, data: bytes) -> list[Any]:
    out = []
    for env in decode_v1(framing, data):
        event = env.event
        out.append((env.timestamp, env.sequence, getattr(event, event.WhichOneof("event_type")).ListFields()))
    return out


def decode_json(data: bytes) -> list[Any]:
    # One UTF-8 decode for the whole buffer: json.loads of a str line skips the per-line
    # encoding detection and decode it does for bytes (~25% faster here).
    loads = json.loads
    return [loads(line) for line in data.decode().split("\n")[:-1]]


def decode_orjson(data: bytes | bytearray) -> list[Any]:
    loads = orjson.loads
    return [loads(line) for line in data.split(b"\n")[:-1]]


def _check_v0(data: bytes) -> None:
    """The JSONL stream holds every event, in the v0 shapes."""
    objs = decode_json(data)
    assert len(objs) == COUNT
    types = {o["type"] for o in objs}
    assert types == {"ShellOutput", "ToolResult", "Log", "StateChange"}
    for obj, (kind, v) in zip(objs, _values()):
        if kind == "tool_result":
            assert obj["data"]["result"] == v["result"]
        if kind == "state_change":
            assert obj["data"]["state"] in ("Ready", "Processing")


@pytest.fixture(scope="module")
def v1_stream() -> bytes:
    data = encode_v1(_v1_calls(_events_py))  # the specification twin; both must give these bytes
    _check_v1_content(data)
    return data


def _check_v1_content(data: bytes) -> None:
    """The v1 stream holds the same events, with the same content, as the values."""
    envelopes = decode_v1(framing_facade, data)
    assert len(envelopes) == COUNT
    for env, (kind, v) in zip(envelopes, _values()):
        event = getattr(env.event, kind)
        assert (env.sequence, event.request_id) == (v["seq"], v["request_id"])
        if kind == "shell_output":
            assert (event.stdout if event.HasField("stdout") else event.stderr) == (v["stdout"] or v["stderr"])
        elif kind == "tool_result":
            assert json.loads(event.result) == v["result"]
        elif kind == "log":
            assert (event.message, dict(event.fields)) == (v["message"], v["fields"])


@pytest.fixture(scope="module")
def v0_stream() -> bytes:
    data = encode_json(_v0_calls())
    _check_v0(data)
    return data


# --- encode ------------------------------------------------------------------------------------


@pytest.mark.benchmark(group="mixed stream encode: 1,000 events")
def test_encode_v1(benchmark, events: ModuleType, impl: str, v1_stream: bytes):  # type: ignore[no-untyped-def]
    calls = _v1_calls(events)
    benchmark.extra_info["stream_bytes"] = len(v1_stream)
    assert benchmark(encode_v1, calls) == v1_stream


@pytest.mark.benchmark(group="mixed stream encode: 1,000 events")
def test_encode_v0_json(benchmark, v0_stream: bytes) -> None:  # type: ignore[no-untyped-def]
    calls = _v0_calls()
    benchmark.extra_info["stream_bytes"] = len(v0_stream)
    assert benchmark(encode_json, calls) == v0_stream


@pytest.mark.benchmark(group="mixed stream encode: 1,000 events")
def test_encode_v0_orjson(benchmark, v0_stream: bytes) -> None:  # type: ignore[no-untyped-def]
    calls = _v0_calls()
    data = benchmark(encode_orjson, calls)
    benchmark.extra_info["stream_bytes"] = len(data)
    assert decode_orjson(data) == decode_json(v0_stream)


# --- decode ------------------------------------------------------------------------------------


def _check_v1(decoded: list[Any]) -> None:
    assert len(decoded) == COUNT
    assert [env.sequence for env in decoded] == list(range(1, COUNT + 1))


@pytest.mark.benchmark(group="mixed stream decode: 1,000 events")
def test_decode_v1(benchmark, framing: ModuleType, impl: str, v1_stream: bytes):  # type: ignore[no-untyped-def]
    _check_v1(benchmark(decode_v1, framing, v1_stream))


@pytest.mark.benchmark(group="mixed stream decode: 1,000 events")
def test_decode_v1_reading_every_field(benchmark, v1_stream: bytes) -> None:  # type: ignore[no-untyped-def]
    out = benchmark(decode_v1_fields, framing_facade, v1_stream)
    assert len(out) == COUNT and all(fields for _, _, fields in out)


@pytest.mark.benchmark(group="mixed stream decode: 1,000 events")
def test_decode_v0_json(benchmark, v0_stream: bytes) -> None:  # type: ignore[no-untyped-def]
    assert len(benchmark(decode_json, v0_stream)) == COUNT


@pytest.mark.benchmark(group="mixed stream decode: 1,000 events")
def test_decode_v0_orjson(benchmark, v0_stream: bytes) -> None:  # type: ignore[no-untyped-def]
    assert benchmark(decode_orjson, v0_stream) == decode_json(v0_stream)
