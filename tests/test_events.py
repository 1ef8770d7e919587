"""Direct event encoders: both twins, byte for byte against the protobuf runtime.

The reference for every encoder is the runtime itself: build the ``Envelope`` with ``smith_pb2``,
``SerializeToString(deterministic=True)``, prefix the varint length. Errors are checked against the
messages the API documents, for each twin, so the twins agree because both match the same text.
"""

from __future__ import annotations

import collections
import enum
import types
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast import events as facade
from smith_fast.errors import EncodeError, SmithFastError
from smith_fast.framing import FrameDecoder
from smith_fast.pb import smith_pb2

from .conftest import IMPLEMENTATIONS, assert_same_api, twin

U64_MAX = 2**64 - 1
uint64s = st.one_of(
    st.integers(0, U64_MAX),
    st.sampled_from([0, 1, 127, 128, 16383, 16384, 1_760_000_000_123, 2**56 - 1, 2**56, 2**63, U64_MAX]),
)
int32s = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, -1, 1, 127, 128, -(2**31), 2**31 - 1]))
# Lengths around 127/128 change the width of every enclosing length prefix.
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "a", "é", "\U0001f600", "\x00", "x" * 127, "x" * 128]),
    st.text(min_size=100, max_size=300),
)
opt_texts = st.one_of(st.none(), texts)
# Short keys over a two-letter alphabet make keys that are prefixes of one another (see the map order).
map_keys = st.one_of(st.text(alphabet="ab", max_size=3), st.text(max_size=8))
string_maps = st.dictionaries(map_keys, texts, max_size=12)
opt_maps = st.one_of(st.none(), string_maps)


def enums(enum: Any) -> st.SearchStrategy[int]:
    """The enum's named values, and any int32: proto3 enums are open, unknown values are kept."""
    return st.one_of(st.sampled_from(enum.values()), int32s)


def framed(message: Any) -> bytes:
    body = message.SerializeToString(deterministic=True)
    return _VarintBytes(len(body)) + body


def envelope(timestamp: int, sequence: int, **event: Any) -> Any:
    return smith_pb2.Envelope(timestamp=timestamp, sequence=sequence, event=smith_pb2.Event(**event))


def present(**kwargs: Any) -> dict[str, Any]:
    """Constructor keywords without the Nones: an unset ``optional`` field."""
    return {k: v for k, v in kwargs.items() if v is not None}


def assert_matches_runtime(encode: Callable[..., bytes], expected: Any, *args: Any, **kwargs: Any) -> None:
    """``encode`` gives the runtime's bytes, framed and bare, and they parse back to ``expected``."""
    frame = encode(*args, **kwargs)
    assert type(frame) is bytes
    assert frame == framed(expected)
    bare = encode(*args, **kwargs, framed=False)
    assert bare == expected.SerializeToString(deterministic=True)
    assert smith_pb2.Envelope.FromString(bare) == expected


class TestShellOutputBytes:
    """``binary_output`` chunks (PROTOCOL.md, "Process control"): ``stdout_bytes`` 6, ``stderr_bytes`` 7."""

    @settings(max_examples=200)
    @given(uint64s, uint64s, texts, st.binary(max_size=300), st.booleans())
    def test_matches_runtime(self, events: ModuleType, ts: int, seq: int, rid: str, data: bytes, err: bool) -> None:
        member = "stderr_bytes" if err else "stdout_bytes"
        expected = envelope(ts, seq, shell_output=smith_pb2.ShellOutputEvent(request_id=rid, **{member: data}))
        assert_matches_runtime(events.encode_shell_output_bytes, expected, ts, seq, rid, data, err)

    def test_buffers_and_an_empty_chunk(self, events: ModuleType) -> None:
        for data in (bytearray(b"\xff\x00"), memoryview(b"ab\xfe")):
            frame = events.encode_shell_output_bytes(1, 2, "r", data, framed=False)
            assert smith_pb2.Envelope.FromString(frame).event.shell_output.stdout_bytes == bytes(data)
        empty = smith_pb2.Envelope.FromString(events.encode_shell_output_bytes(0, 0, "", b"", framed=False))
        assert empty.event.shell_output.HasField("stdout_bytes")  # written although empty, as set

    def test_bad_arguments(self, events: ModuleType) -> None:
        with pytest.raises(TypeError, match="data"):
            events.encode_shell_output_bytes(0, 0, "r", "text")
        with pytest.raises(EncodeError, match="timestamp"):
            events.encode_shell_output_bytes(-1, 0, "r", b"")


class TestShellOutput:
    @settings(max_examples=200)
    @given(uint64s, uint64s, texts, opt_texts, opt_texts, st.one_of(st.none(), int32s), st.booleans())
    def test_matches_runtime(
        self, events: ModuleType, ts: int, seq: int, rid: str, out: str | None, err: str | None,
        code: int | None, fin: bool,
    ) -> None:
        fields = present(request_id=rid, stdout=out, stderr=err, exit_code=code, finished=fin)
        expected = envelope(ts, seq, shell_output=smith_pb2.ShellOutputEvent(**fields))
        assert_matches_runtime(events.encode_shell_output, expected, ts, seq, rid, out, err, code, fin)

    def test_defaults_are_an_empty_but_present_event(self, events: ModuleType) -> None:
        # Envelope{event{shell_output{}}}: both the Event and its member are written although empty.
        assert events.encode_shell_output(0, 0, "") == b"\x04\x5a\x02\x2a\x00"

    def test_optional_presence_is_kept_when_empty(self, events: ModuleType) -> None:
        env = smith_pb2.Envelope.FromString(events.encode_shell_output(1, 2, "r", "", None, 0, framed=False))
        so = env.event.shell_output
        assert so.HasField("stdout") and so.stdout == ""
        assert not so.HasField("stderr")
        assert so.HasField("exit_code") and so.exit_code == 0

    def test_negative_exit_code_is_a_ten_byte_varint(self, events: ModuleType) -> None:
        frame = events.encode_shell_output(0, 0, "", exit_code=-1, framed=False)
        assert frame == b"\x5a\x0d\x2a\x0b\x20" + b"\xff" * 9 + b"\x01"
        assert smith_pb2.Envelope.FromString(frame).event.shell_output.exit_code == -1

    def test_large_output_needs_a_three_byte_length(self, events: ModuleType) -> None:
        chunk = "é" * 40_000  # 80,000 UTF-8 bytes
        expected = envelope(7, 8, shell_output=smith_pb2.ShellOutputEvent(request_id="r", stdout=chunk))
        assert_matches_runtime(events.encode_shell_output, expected, 7, 8, "r", chunk)

    def test_str_subclass_is_text(self, events: ModuleType) -> None:
        class Tagged(str):
            pass

        # A subclass instance is not a "compact" str: the compiled twin takes its general path.
        message = smith_pb2.ShellOutputEvent(request_id="rid", stdout="ascii", stderr="ñ")
        args = (Tagged("rid"), Tagged("ascii"), Tagged("ñ"))
        assert_matches_runtime(events.encode_shell_output, envelope(1, 1, shell_output=message), 1, 1, *args)


class TestLog:
    @settings(max_examples=200)
    @given(uint64s, uint64s, enums(smith_pb2.LogLevel), texts, uint64s, opt_texts, opt_maps)
    def test_matches_runtime(
        self, events: ModuleType, ts: int, seq: int, level: int, msg: str, log_ts: int, rid: str | None,
        fields: dict[str, str] | None,
    ) -> None:
        values = present(level=level, message=msg, timestamp=log_ts, request_id=rid, fields=fields)
        expected = envelope(ts, seq, log=smith_pb2.LogEvent(**values))
        assert_matches_runtime(events.encode_log, expected, ts, seq, level, msg, log_ts, rid, fields)

    def test_map_order_is_the_runtimes(self, events: ModuleType) -> None:
        # upb's deterministic order: bytewise ascending, except that a key which is a proper prefix
        # of another comes after it. Pinned here so that a runtime change shows up as a failure.
        fields = {k: "" for k in ["b", "", "a", "ab", "abc", "ac", "é", "z"]}
        env = smith_pb2.Envelope.FromString(events.encode_log(0, 0, 0, "", fields=fields, framed=False))
        assert env.event.log.fields == fields
        bare = events.encode_log(0, 0, 0, "", fields=fields, framed=False)
        order = ["abc", "ab", "ac", "a", "b", "z", "é", ""]
        # Each entry: tag 5, entry length, {1: key, 2: ""} (both fields always written).
        keys = [k.encode() for k in order]
        entries = b"".join(bytes((0x2A, 4 + len(k), 0x0A, len(k))) + k + b"\x12\x00" for k in keys)
        assert bare.endswith(entries)
        expected = envelope(0, 0, log=smith_pb2.LogEvent(fields=fields))
        assert_matches_runtime(events.encode_log, expected, 0, 0, 0, "", fields=fields)

    @pytest.mark.parametrize(
        "mapping",
        [
            types.MappingProxyType({"k": "v", "a": "é"}),
            collections.OrderedDict([("z", "1"), ("a", "2")]),
            collections.ChainMap({"x": "1"}, {"y": "2"}),
        ],
        ids=["mappingproxy", "ordereddict", "chainmap"],
    )
    def test_any_mapping(self, events: ModuleType, mapping: Mapping[str, str]) -> None:
        expected = envelope(3, 4, log=smith_pb2.LogEvent(level=3, message="m", fields=dict(mapping)))
        assert_matches_runtime(events.encode_log, expected, 3, 4, 3, "m", fields=mapping)

    def test_empty_map_and_none_are_the_same(self, events: ModuleType) -> None:
        assert events.encode_log(1, 2, 3, "m", fields={}) == events.encode_log(1, 2, 3, "m", fields=None)

    def test_many_fields(self, events: ModuleType) -> None:
        fields = {f"key{i:03}": "v" * i for i in range(200)}  # past the compiled twin's stack buffer
        expected = envelope(1, 2, log=smith_pb2.LogEvent(level=5, message="m", fields=fields))
        assert_matches_runtime(events.encode_log, expected, 1, 2, 5, "m", fields=fields)


class TestStateChange:
    @settings(max_examples=200)
    @given(uint64s, uint64s, enums(smith_pb2.ServiceState), opt_texts, uint64s)
    def test_matches_runtime(
        self, events: ModuleType, ts: int, seq: int, state: int, rid: str | None, state_ts: int
    ) -> None:
        values = present(state=state, request_id=rid, timestamp=state_ts)
        expected = envelope(ts, seq, state_change=smith_pb2.StateChangeEvent(**values))
        assert_matches_runtime(events.encode_state_change, expected, ts, seq, state, rid, state_ts)

    def test_empty_request_id_is_present(self, events: ModuleType) -> None:
        env = smith_pb2.Envelope.FromString(events.encode_state_change(0, 0, 2, "", framed=False))
        assert env.event.state_change.HasField("request_id")
        assert env.event.state_change.state == smith_pb2.SERVICE_STATE_READY


class TestToolResult:
    @settings(max_examples=200)
    @given(uint64s, uint64s, texts, st.booleans(), st.binary(max_size=300), opt_texts, uint64s)
    def test_matches_runtime(
        self, events: ModuleType, ts: int, seq: int, rid: str, ok: bool, result: bytes, err: str | None,
        duration: int,
    ) -> None:
        values = present(request_id=rid, success=ok, result=result, error=err, duration_ms=duration)
        expected = envelope(ts, seq, tool_result=smith_pb2.ToolResultEvent(**values))
        assert_matches_runtime(events.encode_tool_result, expected, ts, seq, rid, ok, result, err, duration)

    @pytest.mark.parametrize(
        "wrap",
        [bytearray, memoryview, lambda b: memoryview(bytearray(b)).cast("B", (5, 7))],
        ids=["bytearray", "memoryview", "2d-memoryview"],
    )
    def test_any_contiguous_bytes_like_result(self, events: ModuleType, wrap: Callable[[bytes], Any]) -> None:
        result = b'{"files": ["a.py", "b.py"], "n": 2}'  # 35 bytes
        message = smith_pb2.ToolResultEvent(request_id="r", success=True, result=result)
        expected = envelope(5, 6, tool_result=message)
        assert_matches_runtime(events.encode_tool_result, expected, 5, 6, "r", True, wrap(result))


class TestToolDone:
    """The one-step tool call's three frames (service/sinks.py ``V1Sink.tool_done``)."""

    @settings(max_examples=200)
    @given(uint64s, st.integers(0, U64_MAX - 2), texts, st.booleans(), st.binary(max_size=300), opt_texts, uint64s)
    def test_is_the_three_frames(
        self, events: ModuleType, ts: int, seq: int, rid: str, ok: bool, result: bytes, err: str | None,
        duration: int,
    ) -> None:
        done = events.encode_tool_done(ts, seq, rid, ok, result, err, duration)
        parts = (
            events.encode_state_change(ts, seq, smith_pb2.SERVICE_STATE_PROCESSING, rid, ts),
            events.encode_tool_result(ts, seq + 1, rid, ok, result, err, duration),
            events.encode_state_change(ts, seq + 2, smith_pb2.SERVICE_STATE_READY, rid, ts),
        )
        assert done == b"".join(parts)
        values = present(request_id=rid, success=ok, result=result, error=err, duration_ms=duration)
        state = {"request_id": rid, **present(timestamp=ts)}
        assert done == b"".join((
            framed(envelope(ts, seq, state_change=smith_pb2.StateChangeEvent(state=smith_pb2.SERVICE_STATE_PROCESSING, **state))),
            framed(envelope(ts, seq + 1, tool_result=smith_pb2.ToolResultEvent(**values))),
            framed(envelope(ts, seq + 2, state_change=smith_pb2.StateChangeEvent(state=smith_pb2.SERVICE_STATE_READY, **state))),
        ))

    @pytest.mark.parametrize(
        "args",
        [
            (-1, 1, "r", True, b"{}", None, 0),
            ("1", 1, "r", True, b"{}", None, 0),
            (1, U64_MAX, "r", True, b"{}", None, 0),
            (1, U64_MAX - 1, "r", True, b"{}", None, 0),  # the ToolResult's sequence is out of range
            (1, 1, None, True, b"{}", None, 0),  # a state change takes None, the ToolResult does not
            (1, 1, "r\ud800", True, b"{}", None, 0),
            (1, 1, "r", True, "text", None, 0),
            (1, 1, "r", True, b"{}", 5, 0),
            (1, 1, "r", True, b"{}", None, -1),
        ],
    )
    def test_errors_are_the_parts_errors(self, events: ModuleType, args: tuple[Any, ...]) -> None:
        ts, seq, rid, ok, result, err, duration = args
        with pytest.raises((TypeError, EncodeError)) as expected:
            events.encode_state_change(ts, seq, smith_pb2.SERVICE_STATE_PROCESSING, rid, ts)
            events.encode_tool_result(ts, seq + 1, rid, ok, result, err, duration)
            events.encode_state_change(ts, seq + 2, smith_pb2.SERVICE_STATE_READY, rid, ts)
        with pytest.raises((TypeError, EncodeError)) as info:
            events.encode_tool_done(*args)
        assert (type(info.value), str(info.value)) == (type(expected.value), str(expected.value))
        for other in IMPLEMENTATIONS:
            assert outcome(twin("events", other), "encode_tool_done", dict(zip(TOOL_DONE_ARGS, args))) == outcome(
                events, "encode_tool_done", dict(zip(TOOL_DONE_ARGS, args))
            )


TOOL_DONE_ARGS = ("timestamp", "sequence", "request_id", "success", "result", "error", "duration_ms")


class TestError:
    @settings(max_examples=200)
    @given(uint64s, uint64s, enums(smith_pb2.ErrorCode), texts, opt_texts, uint64s, opt_maps)
    def test_matches_runtime(
        self, events: ModuleType, ts: int, seq: int, code: int, msg: str, rid: str | None, err_ts: int,
        details: dict[str, str] | None,
    ) -> None:
        values = present(error_code=code, message=msg, request_id=rid, timestamp=err_ts, details=details)
        expected = envelope(ts, seq, error=smith_pb2.ErrorEvent(**values))
        assert_matches_runtime(events.encode_error, expected, ts, seq, code, msg, rid, err_ts, details)


PAYLOAD_FIELDS = {f.number: f.name for f in smith_pb2.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields}
floats = st.floats(allow_nan=False)


def _command(rid: str, command: str, env: dict[str, str]) -> Any:
    return smith_pb2.Command(shell_exec=smith_pb2.ShellExecCommand(request_id=rid, command=command, env=env))


def _batch_event(states: list[int], partial: bool) -> Any:
    events = [smith_pb2.Event(state_change=smith_pb2.StateChangeEvent(state=s)) for s in states]
    return smith_pb2.BatchEvent(events=events, partial_batch=partial)


def _metrics(name: str, value: float, ts: int, labels: dict[str, str]) -> Any:
    return smith_pb2.MetricsEvent(metric_name=name, value=value, timestamp=ts, labels=labels)


# A strategy of messages for every Envelope.payload member, by field number.
payload_messages: dict[int, st.SearchStrategy[Any]] = {
    10: st.builds(_command, texts, texts, string_maps),
    11: st.builds(lambda msg: smith_pb2.Event(log=smith_pb2.LogEvent(message=msg)), texts),
    12: st.builds(
        lambda n, ordered: smith_pb2.BatchCommand(commands=[{"shutdown": {}}] * n, require_ordering=ordered),
        st.integers(0, 5),
        st.booleans(),
    ),
    13: st.builds(_batch_event, st.lists(int32s, max_size=5), st.booleans()),
    14: st.builds(lambda name: smith_pb2.HealthCheckRequest(service_name=name), texts),
    16: st.builds(lambda s, m: smith_pb2.HealthCheckResponse(status=s, metrics=m), int32s, string_maps),
    17: st.builds(_metrics, texts, floats, uint64s, string_maps),
    18: st.builds(
        lambda mem, cpu, n: smith_pb2.ResourceUsageEvent(memory_bytes=mem, cpu_percent=cpu, file_descriptors=n),
        uint64s, floats, uint64s,
    ),
}
members = st.sampled_from(sorted(payload_messages)).flatmap(lambda n: st.tuples(st.just(n), payload_messages[n]))


class TestEnvelope:
    def test_every_payload_member_is_covered(self, events: ModuleType) -> None:
        assert sorted(payload_messages) == sorted(PAYLOAD_FIELDS)

    @settings(max_examples=200)
    @given(uint64s, uint64s, members)
    def test_matches_runtime(self, events: ModuleType, ts: int, seq: int, member: tuple[int, Any]) -> None:
        number, message = member
        expected = smith_pb2.Envelope(timestamp=ts, sequence=seq)
        getattr(expected, PAYLOAD_FIELDS[number]).CopyFrom(message)
        payload = message.SerializeToString(deterministic=True)
        assert_matches_runtime(events.encode_envelope, expected, ts, seq, number, payload)
        assert events.encode_envelope(ts, seq, number, bytearray(payload)) == framed(expected)

    @pytest.mark.parametrize("number", sorted(PAYLOAD_FIELDS))
    def test_empty_payload_is_a_present_member(self, events: ModuleType, number: int) -> None:
        env = smith_pb2.Envelope.FromString(events.encode_envelope(0, 0, number, b"", framed=False))
        assert env.WhichOneof("payload") == PAYLOAD_FIELDS[number]

    def test_matches_the_event_encoders(self, events: ModuleType) -> None:
        event = smith_pb2.Event(shell_output=smith_pb2.ShellOutputEvent(request_id="r", stdout="out\n"))
        wrapped = events.encode_envelope(9, 10, 11, event.SerializeToString())
        assert wrapped == events.encode_shell_output(9, 10, "r", "out\n")


class TestStream:
    def test_frames_decode_back_in_order(self, events: ModuleType) -> None:
        frames = [
            events.encode_state_change(1, 1, smith_pb2.SERVICE_STATE_PROCESSING, "r"),
            events.encode_shell_output(2, 2, "r", stdout="line\n"),
            events.encode_log(3, 3, smith_pb2.LOG_LEVEL_INFO, "ran", 3, "r", {"cmd": "ls"}),
            events.encode_tool_result(4, 4, "r", True, b"{}", None, 12),
            events.encode_error(5, 5, smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT, "slow", "r", 5, {"after": "30s"}),
            events.encode_shell_output(6, 6, "r", exit_code=0, finished=True),
        ]
        decoded = [smith_pb2.Envelope.FromString(f) for f in FrameDecoder().feed(b"".join(frames))]
        assert [e.sequence for e in decoded] == [1, 2, 3, 4, 5, 6]
        assert [e.event.WhichOneof("event_type") for e in decoded] == [
            "state_change", "shell_output", "log", "tool_result", "error", "shell_output"
        ]
        assert decoded[2].event.log.fields == {"cmd": "ls"}
        assert decoded[4].event.error.details == {"after": "30s"}
        assert decoded[5].event.shell_output.finished


# ---------------------------------------------------------------------------------------------
# Errors: the documented class and message, for each twin.

# Every argument but ``framed``, in signature order, as name:kind.
SIGNATURES: dict[str, list[tuple[str, str]]] = {
    func: [tuple(arg.split(":")) for arg in args.split()]  # type: ignore[misc]
    for func, args in {
        "encode_shell_output": "timestamp:u64 sequence:u64 request_id:str stdout:opt_str stderr:opt_str "
        "exit_code:opt_i32 finished:bool",
        "encode_log": "timestamp:u64 sequence:u64 level:i32 message:str log_timestamp:u64 request_id:opt_str "
        "fields:map",
        "encode_state_change": "timestamp:u64 sequence:u64 state:i32 request_id:opt_str state_timestamp:u64",
        "encode_tool_result": "timestamp:u64 sequence:u64 request_id:str success:bool result:bytes error:opt_str "
        "duration_ms:u64",
        "encode_error": "timestamp:u64 sequence:u64 error_code:i32 message:str request_id:opt_str "
        "error_timestamp:u64 details:map",
        "encode_envelope": "timestamp:u64 sequence:u64 field:field payload:bytes",
    }.items()
}
VALID = {"u64": 1, "i32": 1, "opt_i32": None, "str": "s", "opt_str": None, "bytes": b"", "map": None, "bool": True}
VALID["field"] = 11
PAYLOAD_FIELD_LIST = "(10, 11, 12, 13, 14, 16, 17, 18)"
ErrorSpec = tuple[object, type[Exception], str]


def bad_values(name: str, kind: str) -> st.SearchStrategy[ErrorSpec]:
    """Invalid values for an argument, each with the exception class and message it must raise."""

    def wrong_type(expected: str) -> st.SearchStrategy[ErrorSpec]:
        candidates: list[object] = [1.0, 2.5, b"7", [1], object()]
        candidates += [7, True] if expected.startswith("str") else ["7"]
        candidates += [] if expected.endswith("None") else [None]
        values = st.sampled_from(candidates)
        return values.map(lambda v: (v, TypeError, f"{name} must be {expected}, not {type(v).__name__}"))

    if kind == "u64":
        out_of_range = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64))
        return st.one_of(
            wrong_type("int"),
            out_of_range.map(lambda v: (v, EncodeError, f"{name} must be in [0, 2**64) (uint64), got {v}")),
        )
    if kind in ("i32", "opt_i32"):
        out_of_range = st.one_of(st.integers(max_value=-(2**31) - 1), st.integers(min_value=2**31))
        return st.one_of(
            wrong_type("int" if kind == "i32" else "int or None"),
            out_of_range.map(lambda v: (v, EncodeError, f"{name} must be in [-2**31, 2**31) (int32), got {v}")),
        )
    if kind == "field":
        unknown = st.one_of(st.integers(), st.sampled_from([0, 1, 9, 15, 19]))
        unknown = unknown.filter(lambda v: v not in PAYLOAD_FIELDS)
        message = "field must be an Envelope payload field number " + PAYLOAD_FIELD_LIST + ", got {}"
        return st.one_of(wrong_type("int"), unknown.map(lambda v: (v, EncodeError, message.format(v))))
    if kind in ("str", "opt_str"):
        lone = st.sampled_from(["\ud800", "\udfff", "\udc80"])
        surrogate = st.tuples(st.text(max_size=5), lone, st.text(max_size=5))
        message = f"{name} cannot be encoded as UTF-8: surrogates not allowed at index " + "{}"
        return st.one_of(
            wrong_type("str" if kind == "str" else "str or None"),
            surrogate.map(lambda t: ("".join(t), EncodeError, message.format(len(t[0])))),
        )
    if kind == "bytes":
        values = st.sampled_from(["text", 5, None, memoryview(b"abcdef")[::2]])
        message = f"{name} must be a C-contiguous bytes-like object, not " + "{}"
        return values.map(lambda v: (v, TypeError, message.format(type(v).__name__)))
    assert kind == "map"
    not_a_map = f"{name} must be a mapping of str to str or None, not " + "{}"
    surrogates = "cannot be encoded as UTF-8: surrogates not allowed at index"
    return st.one_of(
        st.sampled_from([["ab"], "ab", 5, [("k", "v")]]).map(
            lambda v: (v, TypeError, not_a_map.format(type(v).__name__))
        ),
        st.sampled_from([
            ({"ok": "v", 3: "v"}, TypeError, f"{name} key must be str, not int"),
            ({"ok": "v", "k": None}, TypeError, f"{name}['k'] must be str, not NoneType"),
            ({"k\udc00": "v"}, EncodeError, f"{name} key {surrogates} 1"),
            ({"k": "va\ud800"}, EncodeError, f"{name}['k'] {surrogates} 2"),
        ]),
    )


@st.composite
def invalid_calls(draw: st.DrawFn) -> tuple[str, dict[str, object], type[Exception], str]:
    """A call with one to three invalid arguments; the first in signature order is the one reported."""
    func = draw(st.sampled_from(sorted(SIGNATURES)))
    sig = [(n, k) for n, k in SIGNATURES[func] if k != "bool"]
    positions = sorted(draw(st.sets(st.integers(0, len(sig) - 1), min_size=1, max_size=3)))
    kwargs: dict[str, object] = {n: VALID[k] for n, k in SIGNATURES[func]}
    reported: tuple[type[Exception], str] | None = None
    for i in positions:
        name, kind = sig[i]
        value, cls, message = draw(bad_values(name, kind))
        kwargs[name] = value
        reported = reported or (cls, message)
    assert reported is not None
    return func, kwargs, *reported


def outcome(module: ModuleType, func: str, kwargs: dict[str, object]) -> object:
    """The bytes a call returns, or the class and message of what it raises."""
    try:
        return getattr(module, func)(**kwargs)
    except Exception as exc:
        return type(exc), str(exc)


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3) | st.integers(), st.text(max_size=3) | st.none(), max_size=3),
)


@st.composite
def any_calls(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    """A call whose every argument is either valid or anything at all."""
    func = draw(st.sampled_from(sorted(SIGNATURES)))
    return func, {name: draw(st.one_of(st.just(VALID[kind]), junk)) for name, kind in SIGNATURES[func]}


class TestErrors:
    @settings(max_examples=300)
    @given(invalid_calls())
    def test_first_invalid_argument_is_reported(
        self, events: ModuleType, call: tuple[str, dict[str, object], type[Exception], str]
    ) -> None:
        func, kwargs, cls, message = call
        with pytest.raises(cls) as info:
            getattr(events, func)(**kwargs)
        assert type(info.value) is cls
        assert str(info.value) == message
        if cls is EncodeError:
            assert isinstance(info.value, SmithFastError) and isinstance(info.value, ValueError)

    @settings(max_examples=300)
    @given(any_calls())
    def test_twins_agree_on_anything(self, events: ModuleType, call: tuple[str, dict[str, object]]) -> None:
        func, kwargs = call
        result = outcome(events, func, kwargs)
        if isinstance(result, tuple):
            assert result[0] in (TypeError, EncodeError), result
        for other in IMPLEMENTATIONS:
            assert outcome(twin("events", other), func, kwargs) == result

    @pytest.mark.parametrize("func", sorted(SIGNATURES))
    def test_valid_placeholders_encode(self, events: ModuleType, func: str) -> None:
        # The invalid calls differ from this one only in the arguments they break.
        kwargs = {n: VALID[k] for n, k in SIGNATURES[func]}
        assert smith_pb2.Envelope.FromString(getattr(events, func)(**kwargs, framed=False)).sequence == 1

    def test_bool_and_int_subclasses_are_ints(self, events: ModuleType) -> None:
        # Like the runtime: an IntEnum or a bool is an int.
        Level = enum.IntEnum("Level", {"WARN": smith_pb2.LOG_LEVEL_WARN})
        frame = events.encode_log(True, 2, Level.WARN, "m", fields={"a": "b"})
        message = smith_pb2.LogEvent(level=smith_pb2.LOG_LEVEL_WARN, message="m", fields={"a": "b"})
        expected = envelope(1, 2, log=message)
        assert frame == framed(expected)

    def test_error_from_a_failing_mapping_propagates(self, events: ModuleType) -> None:
        class Broken(Mapping[str, str]):
            def __getitem__(self, key: str) -> str:
                raise KeyError(key)

            def __iter__(self) -> Iterator[str]:
                raise RuntimeError("cannot iterate")

            def __len__(self) -> int:
                return 1

        with pytest.raises(RuntimeError, match="cannot iterate"):
            events.encode_log(1, 2, 3, "m", fields=Broken())


class TestApi:
    def test_same_public_api(self, events: ModuleType) -> None:
        assert sorted(events.__all__) == sorted(n for n in facade.__all__ if n != "IMPLEMENTATION")
        if "c" in IMPLEMENTATIONS:
            assert_same_api("events")

    def test_facade_exports_the_active_twin(self, events: ModuleType) -> None:
        active = twin("events", facade.IMPLEMENTATION)
        for name in active.__all__:
            assert getattr(facade, name) is getattr(active, name)
