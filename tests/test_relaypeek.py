"""The gateway's peek at relayed bytes: which request ids a frontend starts, which the session ended.

Every v1 test runs on both twins (``relaypeek`` fixture, ``[c]``/``[py]``). The reference is the
protobuf runtime itself: what ``Envelope.FromString`` reads from the same bytes, so unknown fields,
merged messages, wrong wire types and malformed bytes are held to what the service would see.
Frames come from the protobuf classes, from the service's own encoders (``V1Sink``, ``events``) and,
at the end, from a real ``serve`` process: every id the peek says a frontend started gets exactly
one terminal state in what the service wrote, by the peek's own reading of it.
"""

from __future__ import annotations

import collections
import pathlib
import socket
import time
import uuid
from types import ModuleType

import orjson
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smith_fast import _relaypeek_py, _relaypeek_v0, relaypeek as facade
from smith_fast._varint import encode as varint
from smith_fast.errors import FramingError
from smith_fast.framing import FrameDecoder, encode_frame, encode_frames
from smith_fast.jsonl import JsonlCodec
from smith_fast.jsonl._fields import COMMANDS_BY_ONEOF, V1_ONLY_COMMANDS
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.commands import COMMANDS
from smith_fast.service.request import Request
from smith_fast.service.sinks import V0Sink, V1Sink

from .conftest import IMPLEMENTATIONS, assert_same_api, twin
from .peers import open_socket
from .server import ServerProcess, assert_clean_log

TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
# The commands that run and end with one terminal StateChange: a handler, and not a control command.
REQUEST_KINDS = frozenset(kind for kind, spec in COMMANDS.items() if spec.handler is not None and spec.control is None)
ALL_KINDS = [f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["command_type"].fields]
_codec = JsonlCodec()


# ---- the reference: the protobuf runtime ------------------------------------------------------


def expected_ids(frame: bytes) -> list[str] | None:
    """What ``command_ids`` must say, read by the runtime; None when it refuses the bytes."""
    try:
        env = pb.Envelope.FromString(frame)
    except DecodeError:
        return None
    which = env.WhichOneof("payload")
    commands = [env.command] if which == "command" else list(env.batch_command.commands) if which == "batch_command" else []
    ids = []
    for command in commands:
        kind = command.WhichOneof("command_type")
        if kind in REQUEST_KINDS and getattr(command, kind).request_id:
            ids.append(getattr(command, kind).request_id)
    return ids


def expected_marks(buf: bytes) -> tuple[tuple[int, list[str]], bool]:
    """What ``event_marks`` must say, read by the runtime, and whether the runtime read every
    complete frame (when it refused one for what lies deeper than the peek walks, they may differ)."""
    try:
        frames = FrameDecoder((1 << 32) - 1).feed(buf)
    except FramingError as exc:
        frames = exc.frames
    top, ended = 0, []
    for frame in frames:
        try:
            env = pb.Envelope.FromString(frame)
        except DecodeError:
            return (top, ended), False
        top = max(top, env.sequence)
        which = env.WhichOneof("payload")
        events = [env.event] if which == "event" else list(env.batch_event.events) if which == "batch_event" else []
        for event in events:
            if event.WhichOneof("event_type") == "state_change":
                change = event.state_change
                if change.state in TERMINAL and change.request_id:
                    ended.append(change.request_id)
    return (top, ended), True


def command(kind: str, rid: str = "") -> pb.Command:
    """A Command of ``kind``, with ``rid`` as its request id where it has one."""
    fields = pb.Command.DESCRIPTOR.fields_by_name[kind].message_type.fields_by_name
    return pb.Command(**{kind: {"request_id": rid} if "request_id" in fields else {}})


def envelope(cmd: pb.Command | list[pb.Command], sequence: int = 0) -> bytes:
    if isinstance(cmd, list):
        return pb.Envelope(sequence=sequence, batch_command=pb.BatchCommand(commands=cmd)).SerializeToString()
    return pb.Envelope(sequence=sequence, command=cmd).SerializeToString()


def state(rid: str | None, value: int, sequence: int = 0) -> bytes:
    change = pb.StateChangeEvent(state=value) if rid is None else pb.StateChangeEvent(request_id=rid, state=value)
    return pb.Envelope(sequence=sequence, event=pb.Event(state_change=change)).SerializeToString()


def field(number: int, wire: int, value: int | bytes) -> bytes:
    """One field, written by hand: a varint value for wire type 0, else raw bytes (a length and
    the payload for 2, the group's contents and end tag for 3)."""
    tag = varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(value, int)
        return tag + varint(value)
    assert isinstance(value, bytes)
    if wire == 2:
        return tag + varint(len(value)) + value
    if wire == 3:
        return tag + value + varint(number << 3 | 4)
    return tag + value


TOP = (1 << 29) - 1  # the largest field number
UNKNOWN = b"".join((
    field(TOP, 0, (1 << 64) - 1),
    field(TOP - 1, 1, b"\x01" * 8),
    field(TOP - 2, 2, b"\xff\xfe not UTF-8, not read"),
    field(TOP - 3, 5, b"\x02" * 4),
    field(TOP - 4, 3, field(7, 0, 1) + field(8, 2, b"x") + field(9, 3, field(1, 5, b"abcd"))),
    field(99, 0, 5),
))  # fmt: skip


# ---- the twins --------------------------------------------------------------------------------


def test_twins_share_one_api(impl: str) -> None:
    assert_same_api("relaypeek", impl)  # each twin against the Python one, the specification
    assert facade.IMPLEMENTATION in IMPLEMENTATIONS
    assert set(twin("relaypeek", "py").__all__) | {"IMPLEMENTATION", "ToolCall", "v0_command_ids", "v0_event_marks"} == set(facade.__all__)


def test_request_kinds_are_the_commands_table_ones() -> None:
    """The peek's list of requests is the command table's: a row with a handler and no control."""
    numbers = {pb.Command.DESCRIPTOR.fields_by_name[kind].number for kind in REQUEST_KINDS}
    assert REQUEST_KINDS == {"plan", "tool_call", "hook_load", "shell_exec", "list_processes", "attach", "checkpoint", "restore", "diff", "undo"}
    assert set(_relaypeek_py._REQUESTS) == numbers
    # v0 has the requests it has variants for (the workspace commands are v1 only)
    assert _relaypeek_v0._REQUESTS == {COMMANDS_BY_ONEOF[kind][0] for kind in REQUEST_KINDS if kind in COMMANDS_BY_ONEOF}
    assert {kind for kind in REQUEST_KINDS if kind not in COMMANDS_BY_ONEOF} == V1_ONLY_COMMANDS


def test_oneof_members_are_the_schemas() -> None:
    """Every member of Command's and Event's oneof is a member to the peek: one it did not know
    would be stepped over as unknown, and the member before it taken for the message's."""
    commands = {f.number for f in pb.Command.DESCRIPTOR.oneofs_by_name["command_type"].fields}
    events = {f.number for f in pb.Event.DESCRIPTOR.oneofs_by_name["event_type"].fields}
    assert set(_relaypeek_py._COMMAND_MEMBERS) == commands
    assert set(_relaypeek_py._EVENT_MEMBERS) == events


def test_a_workspace_event_ends_no_request(relaypeek: ModuleType) -> None:
    """The answer to a Checkpoint (and Restore, Diff, Undo) is no terminal state: its READY is; and
    a StateChange followed by a WorkspaceEvent in one Event is the WorkspaceEvent (the oneof's last)."""
    answer = pb.Envelope(sequence=4, event=pb.Event(workspace=pb.WorkspaceEvent(
        request_id="c1", checkpoint_id="k1", changes=[pb.FileChange(path="a", kind=pb.CHANGE_KIND_ADDED)]))).SerializeToString()
    ready = state("c1", pb.SERVICE_STATE_READY, sequence=5)
    assert relaypeek.event_marks(encode_frames([answer, ready])) == (5, ["c1"])
    assert relaypeek.event_marks(encode_frame(answer)) == (4, [])
    inner = pb.Event(state_change=pb.StateChangeEvent(request_id="c1", state=pb.SERVICE_STATE_READY)).SerializeToString()
    then = pb.Event(workspace=pb.WorkspaceEvent(request_id="c1")).SerializeToString()
    mixed = pb.Envelope(sequence=6).SerializeToString() + field(11, 2, inner + then)
    assert pb.Envelope.FromString(mixed).event.WhichOneof("event_type") == "workspace"
    assert relaypeek.event_marks(encode_frame(mixed)) == (6, []) == expected_marks(encode_frame(mixed))[0]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_request_gives_its_id_and_nothing_else_does(relaypeek: ModuleType, kind: str) -> None:
    frame = envelope(command(kind, "req-1"), sequence=7)
    want = ["req-1"] if kind in REQUEST_KINDS else []
    assert relaypeek.command_ids(frame) == want == expected_ids(frame)
    assert relaypeek.command_ids(bytearray(frame)) == want
    assert relaypeek.command_ids(memoryview(b"xx" + frame)[2:]) == want


def test_a_batch_gives_its_requests_ids_in_order(relaypeek: ModuleType) -> None:
    ids = ["été-1", "请求-2", "🚀-3", "a" * 300, "ck-5", "rs-6", "df-7", "un-8"]
    batch = [
        command("shell_exec", ids[0]),
        command("cancel", "not-a-start"),
        command("tool_call", ""),  # an empty id: the service cannot end it
        command("attach", ids[1]),
        command("stdin", "not-a-start"),
        command("plan", ids[2]),
        command("handshake"),
        command("list_processes", ids[3]),
        pb.Command(),  # an empty command
        pb.Command(checkpoint=pb.CheckpointCommand(request_id=ids[4], label="before")),
        pb.Command(restore=pb.RestoreCommand(request_id=ids[5], checkpoint_id="k1")),
        pb.Command(diff=pb.DiffCommand(request_id=ids[6], from_id="k1", paths=["src"])),
        pb.Command(undo=pb.UndoCommand(request_id=ids[7], target_request_id="r1", force=True)),
    ]
    frame = envelope(batch, sequence=3)
    assert relaypeek.command_ids(frame) == ids == expected_ids(frame)
    assert relaypeek.command_ids(envelope([])) == []


def test_frames_that_start_nothing(relaypeek: ModuleType) -> None:
    frames = [
        b"",
        pb.Envelope(health_check_request=pb.HealthCheckRequest()).SerializeToString(),
        state("r", pb.SERVICE_STATE_READY, 4),
        pb.Envelope(sequence=1, timestamp=2).SerializeToString(),
        pb.Envelope(command=pb.Command()).SerializeToString(),
        envelope(command("shell_exec", "r"))[:-1],  # truncated
        b"\xff" * 12,
        b"\x08",
    ]
    for frame in frames:
        assert relaypeek.command_ids(frame) == []


def test_the_last_payload_wins_and_a_repeated_message_is_merged(relaypeek: ModuleType) -> None:
    """Concatenated Envelopes are one merged Envelope to the runtime; the compiled twin hands such
    frames to the Python one, so both must read them as the runtime does."""
    a = envelope(command("shell_exec", "first"))
    b = pb.Envelope(command=pb.Command(shell_exec=pb.ShellExecCommand(command="echo"))).SerializeToString()
    c = envelope(command("tool_call", "third"))
    event = state("x", pb.SERVICE_STATE_READY)
    batch = envelope([command("plan", "p1")])
    cases = {
        a + b: ["first"],  # merged: the id of the first, the command of the second
        a + c: ["third"],  # the Command's oneof switched
        a + event: [],  # the Envelope's oneof switched to an event
        event + a: ["first"],
        a + event + b: [],  # switched away and back: the second command alone, no id
        batch + batch: ["p1", "p1"],  # a repeated field: two elements
        a + a: ["first"],
    }
    for frame, want in cases.items():
        assert expected_ids(frame) == want
        assert relaypeek.command_ids(frame) == want


def test_unknown_fields_of_every_wire_type_are_stepped_over(relaypeek: ModuleType) -> None:
    inner = UNKNOWN + field(1, 0, 5) + field(1, 2, "réq".encode()) + UNKNOWN  # field 1 as a varint: unknown
    cmd = UNKNOWN + field(5, 2, inner) + UNKNOWN + field(4, 0, 1)  # hook_load as a varint: unknown, no switch
    env = field(1, 0, 1700000000000) + UNKNOWN + field(2, 2, b"\x05") + field(2, 0, 9) + field(10, 2, cmd) + UNKNOWN
    assert expected_ids(env) == ["réq"]
    assert relaypeek.command_ids(env) == ["réq"]
    batch = field(12, 2, UNKNOWN + field(1, 2, cmd) + field(2, 0, 1) + field(1, 2, UNKNOWN) + field(1, 2, cmd))
    assert expected_ids(batch) == ["réq", "réq"]
    assert relaypeek.command_ids(batch) == ["réq", "réq"]

    change = UNKNOWN + field(1, 2, b"done") + field(2, 0, pb.SERVICE_STATE_ERROR) + field(2, 2, b"\x03") + UNKNOWN
    event = UNKNOWN + field(2, 2, change) + UNKNOWN
    frame = UNKNOWN + field(2, 0, (1 << 64) - 1) + field(11, 2, event) + UNKNOWN
    buf = encode_frame(frame) + encode_frame(field(13, 2, field(1, 2, event) + field(2, 0, 1)))
    assert expected_marks(buf) == (((1 << 64) - 1, ["done", "done"]), True)
    assert relaypeek.event_marks(buf) == ((1 << 64) - 1, ["done", "done"])


@pytest.mark.parametrize(
    "raw",
    [
        field(7, 1, b"\x00" * 7),  # a fixed64 cut short
        field(7, 5, b"\x00" * 3),
        bytes([0x0E, 0]),  # wire type 6
        bytes([0x0F, 0]),  # wire type 7
        bytes([0x3C]),  # an end-group tag without its start
        bytes([0x3B, 0x44]),  # a group closed by another field's end
        bytes([0x3B, 0x08, 0x01]),  # a group never closed
        bytes([0x02, 0x00]),  # field number 0
        bytes([0x90, 0x80, 0x80, 0x80, 0x80, 0x00, 0x03]),  # a tag of six bytes
        bytes([0x80, 0x80, 0x80, 0x80, 0x10, 0x00]),  # a tag beyond 32 bits
        bytes([0x3A, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]),  # a length of six bytes
        bytes([0x10]) + b"\x80" * 10 + b"\x00",  # a varint of eleven bytes
    ],
)
def test_malformed_wire_at_every_level_gives_nothing(relaypeek: ModuleType, raw: bytes) -> None:
    good_inner = field(1, 2, b"r")
    for frame in (
        raw + field(10, 2, field(3, 2, good_inner)),
        field(10, 2, raw + field(3, 2, good_inner)),
        field(10, 2, field(3, 2, good_inner + raw)),
        field(12, 2, field(1, 2, field(3, 2, good_inner)) + field(1, 2, field(2, 2, raw + good_inner))),
    ):
        assert expected_ids(frame) is None
        assert relaypeek.command_ids(frame) == []
    good = encode_frame(state("a", pb.SERVICE_STATE_READY, 1))
    for frame in (
        raw + field(11, 2, field(2, 2, good_inner + field(2, 0, 2))),
        field(11, 2, field(2, 2, good_inner + field(2, 0, 2) + raw)),
        field(13, 2, field(1, 2, field(2, 2, good_inner + field(2, 0, 4))) + field(1, 2, raw)),
    ):
        buf = good + encode_frame(frame) + good
        assert expected_marks(buf) == ((1, ["a"]), False)
        assert relaypeek.event_marks(buf) == (1, ["a"])


def test_group_depth_is_the_runtimes(relaypeek: ModuleType) -> None:
    """upb takes groups nested 100 deep in an Envelope, one less per message level below."""

    def groups(n: int) -> bytes:
        return b"\x3b" * n + b"\x3c" * n

    rid = field(1, 2, b"r")
    for n in (96, 97, 98, 99, 100, 101):
        frames = [
            groups(n) + field(10, 2, field(5, 2, rid)),
            field(10, 2, groups(n) + field(5, 2, rid)),
            field(10, 2, field(5, 2, groups(n) + rid)),
            field(12, 2, groups(n) + field(1, 2, field(5, 2, rid))),
            field(12, 2, field(1, 2, groups(n) + field(5, 2, rid))),
            field(12, 2, field(1, 2, field(5, 2, rid + groups(n)))),
        ]
        for frame in frames:
            assert relaypeek.command_ids(frame) == (expected_ids(frame) or [])
        for frame in (
            field(11, 2, field(2, 2, rid + field(2, 0, 2) + groups(n))),
            field(13, 2, field(1, 2, field(2, 2, rid + field(2, 0, 2) + groups(n)))),
            field(13, 2, groups(n) + field(1, 2, field(2, 2, rid + field(2, 0, 2)))),
        ):
            buf = encode_frame(frame)
            assert relaypeek.event_marks(buf) == expected_marks(buf)[0]


def test_an_id_of_invalid_utf8_refuses_the_frame(relaypeek: ModuleType) -> None:
    """The runtime checks every occurrence of a string field, the overwritten ones too."""
    bad = field(1, 2, b"\xed\xa0\x80")  # a surrogate
    for inner in (bad, bad + field(1, 2, b"ok"), field(1, 2, b"ok") + bad):
        frame = field(10, 2, field(3, 2, inner))
        assert expected_ids(frame) is None
        assert relaypeek.command_ids(frame) == []
        buf = encode_frame(state("a", 2, 1)) + encode_frame(field(11, 2, field(2, 2, inner + field(2, 0, 4))))
        assert relaypeek.event_marks(buf) == expected_marks(buf)[0] == (1, ["a"])
    # the last occurrence wins
    frame = field(10, 2, field(3, 2, field(1, 2, b"one") + field(1, 2, "двa".encode())))
    assert relaypeek.command_ids(frame) == ["двa"] == expected_ids(frame)


def test_a_state_is_an_int32(relaypeek: ModuleType) -> None:
    """An enum value keeps its low 32 bits: 2**32 + 2 is READY to the runtime."""
    for value in (2, 4, (1 << 32) + 2, (1 << 64) - 1 - ((1 << 32) - 5), 3, 0, (1 << 32) + 3):
        buf = encode_frame(field(2, 0, 5) + field(11, 2, field(2, 2, field(1, 2, b"r") + field(2, 0, value))))
        assert relaypeek.event_marks(buf) == expected_marks(buf)[0]


def test_marks_from_the_service_sink(relaypeek: ModuleType) -> None:
    """The bytes the service's own V1Sink writes, one envelope per event and then batched."""
    out: list[bytes] = []
    sink = V1Sink(out.append)
    sink.state_change(pb.SERVICE_STATE_STARTING)
    sink.state_change(pb.SERVICE_STATE_READY)  # no request id: the session's, not a request's
    sink.state_change(pb.SERVICE_STATE_PROCESSING, "a-é")
    sink.shell_output("a-é", "hi\n")
    sink.shell_output("a-é", exit_code=0, finished=True)
    sink.state_change(pb.SERVICE_STATE_READY, "a-é")
    sink.error(pb.ERROR_CODE_INVALID_CAPABILITY, "no", "b")
    sink.state_change(pb.SERVICE_STATE_ERROR, "b")
    sink.tool_done("c", True, b"{}", None, 3)
    sink.log(pb.LOG_LEVEL_INFO, "state READY for nothing", "d")
    sink.state_change(pb.SERVICE_STATE_PROCESSING, "d")
    single = b"".join(out)
    assert relaypeek.event_marks(single) == (sink.last_sequence, ["a-é", "b", "c"]) == expected_marks(single)[0]

    out.clear()
    sink.start_batching()
    sink.state_change(pb.SERVICE_STATE_PROCESSING, "e")
    sink.shell_output("d", "x" * 300)
    sink.state_change(pb.SERVICE_STATE_READY, "d")
    sink.tool_done("e", False, b"", "boom", 1)
    sink.error(pb.ERROR_CODE_EXECUTION_TIMEOUT, "late", "f")
    sink.state_change(pb.SERVICE_STATE_ERROR, "f")
    sink.flush_batch()
    batched = b"".join(out)
    assert {pb.Envelope.FromString(f).WhichOneof("payload") for f in _frames(batched)} == {"batch_event"}
    assert relaypeek.event_marks(batched) == (sink.last_sequence, ["d", "e", "f"]) == expected_marks(batched)[0]
    both = single + batched
    assert relaypeek.event_marks(both) == (sink.last_sequence, ["a-é", "b", "c", "d", "e", "f"])
    assert relaypeek.event_marks(memoryview(bytearray(both))) == relaypeek.event_marks(both)
    for frame in _frames(both):
        assert relaypeek.command_ids(frame) == []  # events start nothing


def test_marks_stop_at_an_incomplete_or_malformed_frame(relaypeek: ModuleType) -> None:
    frames = [state(f"r{i}", TERMINAL[i % 2], i + 1) for i in range(6)]
    buf = encode_frames(frames)
    for cut in range(len(buf) + 1):
        want, clean = expected_marks(buf[:cut])
        assert clean
        assert relaypeek.event_marks(buf[:cut]) == want
    assert relaypeek.event_marks(buf) == (6, [f"r{i}" for i in range(6)])
    bad = encode_frame(b"\x3c")  # an end-group tag alone
    assert relaypeek.event_marks(buf + bad + buf) == (6, [f"r{i}" for i in range(6)])
    for prefix in (b"\xff" * 11, b"\x80\x80\x80\x80\x10", varint(1 << 40)):  # too long, too wide
        assert relaypeek.event_marks(buf + prefix + buf) == (6, [f"r{i}" for i in range(6)])
    assert relaypeek.event_marks(b"") == (0, [])
    non_terminal = encode_frames([state("p", value, 9) for value in (0, 1, 3, 5, 6)] + [state("", 2, 10), state(None, 4, 11)])
    assert relaypeek.event_marks(non_terminal) == (11, [])


def test_not_bytes_is_a_type_error(relaypeek: ModuleType) -> None:
    for bad in ("text", None, 5, memoryview(b"abcdef")[::2]):
        with pytest.raises(TypeError, match="contiguous bytes-like"):
            relaypeek.command_ids(bad)
        with pytest.raises(TypeError, match="contiguous bytes-like"):
            relaypeek.event_marks(bad)


def _frames(buf: bytes) -> list[bytes]:
    return FrameDecoder().feed(buf)


# ---- properties -------------------------------------------------------------------------------

_ids = st.text(max_size=10)
_commands = st.builds(command, st.sampled_from(ALL_KINDS), _ids)
_states = st.sampled_from([0, 1, 2, 3, 4, 5, -1, -(1 << 31)])  # negatives: ten-byte varints


@st.composite
def _events(draw: st.DrawFn) -> pb.Event:
    rid = draw(_ids)
    match draw(st.integers(0, 3)):
        case 0:
            return pb.Event(state_change=pb.StateChangeEvent(request_id=rid, state=draw(_states)))
        case 1:
            return pb.Event(state_change=pb.StateChangeEvent(state=draw(_states)))
        case 2:
            return pb.Event(shell_output=pb.ShellOutputEvent(request_id=rid, stdout=draw(_ids)))
        case _:
            return pb.Event(log=pb.LogEvent(message=draw(_ids), request_id=rid))


@st.composite
def _command_frames(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 3))):  # more than one: the runtime merges them
        if draw(st.booleans()):
            parts.append(envelope(draw(_commands), draw(st.integers(0, 1 << 64 - 1))))
        else:
            parts.append(envelope(draw(st.lists(_commands, max_size=5))))
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from([UNKNOWN, state("s", 2), field(2, 0, 3)])))
    return _mutate(draw, b"".join(parts))


@st.composite
def _event_bufs(draw: st.DrawFn) -> bytes:
    frames = []
    for _ in range(draw(st.integers(0, 5))):
        sequence = draw(st.integers(0, (1 << 64) - 1))
        if draw(st.booleans()):
            frame = pb.Envelope(sequence=sequence, event=draw(_events())).SerializeToString()
        else:
            batch = pb.BatchEvent(events=draw(st.lists(_events(), max_size=4)), partial_batch=draw(st.booleans()))
            frame = pb.Envelope(sequence=sequence, batch_event=batch).SerializeToString()
        if draw(st.booleans()):  # merged with another, or unknown fields
            frame += draw(st.sampled_from([UNKNOWN, state("m", 4, 3), envelope(command("plan", "q"))]))
        frames.append(frame)
    return _mutate(draw, encode_frames(frames))


def _mutate(draw: st.DrawFn, data: bytes) -> bytes:
    match draw(st.integers(0, 4)):
        case 0 if data:
            cut = draw(st.integers(0, len(data) - 1))
            return data[:cut]
        case 1 if data:
            at = draw(st.integers(0, len(data) - 1))
            return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
        case 2:
            at = draw(st.integers(0, len(data)))
            return data[:at] + draw(st.binary(max_size=6)) + data[at:]
    return data


_settings = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(st.one_of(st.binary(max_size=200), _command_frames()))
def test_command_ids_read_what_the_runtime_reads(relaypeek: ModuleType, frame: bytes) -> None:
    got = relaypeek.command_ids(frame)
    assert got == _relaypeek_py.command_ids(frame)
    want = expected_ids(frame)
    if want is not None:  # bytes the runtime refuses deeper than the peek walks may still give ids
        assert got == want


def expected_batch_size(frame: bytes) -> int | None:
    """What ``batch_size`` must say, read by the runtime; None when it refuses the bytes."""
    try:
        env = pb.Envelope.FromString(frame)
    except DecodeError:
        return None
    return len(env.batch_command.commands) if env.WhichOneof("payload") == "batch_command" else -1


@_settings
@given(st.one_of(st.binary(max_size=200), _command_frames()))
def test_batch_size_counts_what_the_runtime_reads(relaypeek: ModuleType, frame: bytes) -> None:
    got = relaypeek.batch_size(frame)
    assert got == _relaypeek_py.batch_size(frame)
    want = expected_batch_size(frame)
    if want is not None:  # bytes the runtime refuses inside a command are still counted
        assert got == want


def test_batch_size_of_large_merged_and_foreign_frames(relaypeek: ModuleType) -> None:
    batch = envelope([command("tool_call", f"t{i}") for i in range(3000)] + [pb.Command(), command("cancel", "c")])
    assert relaypeek.batch_size(batch) == 3002 == expected_batch_size(batch)
    assert relaypeek.batch_size(memoryview(b"xx" + batch)[2:]) == 3002
    assert relaypeek.batch_size(bytearray(batch)) == 3002
    assert relaypeek.batch_size(batch + batch) == 6004 == expected_batch_size(batch + batch)  # merged
    assert relaypeek.batch_size(batch + envelope(command("plan", "p"))) == -1  # the oneof switched
    assert relaypeek.batch_size(envelope([])) == 0
    # elements of another wire type are unknown fields, not commands; the batch's own fields are read
    odd = field(12, 2, field(1, 0, 7) + field(1, 2, b"") + field(2, 0, 1) + UNKNOWN + field(1, 2, b""))
    assert relaypeek.batch_size(odd) == 2 == expected_batch_size(odd)
    for frame in (b"", envelope(command("tool_call", "a")), state("s", 2), batch[:-1], field(12, 2, b"\x0a\x05ab")):
        assert relaypeek.batch_size(frame) == -1
    with pytest.raises(TypeError, match="contiguous bytes-like"):
        relaypeek.batch_size("text")  # type: ignore[arg-type]


@_settings
@given(st.one_of(st.binary(max_size=200), _event_bufs()))
def test_event_marks_read_what_the_runtime_reads(relaypeek: ModuleType, buf: bytes) -> None:
    got = relaypeek.event_marks(buf)
    assert got == _relaypeek_py.event_marks(buf)
    want, clean = expected_marks(buf)
    if clean:
        assert got == want
    else:  # the peek may read on past a frame refused for what lies deeper, never stop sooner
        assert got[1][: len(want[1])] == want[1]


# ---- tool_call: the session's quick read of a plain tool call -----------------------------------


def expected_call(frame: bytes) -> tuple[str, str, bytes, int]:
    """What the runtime reads of the tool call in ``frame`` (which it must read)."""
    call = pb.Envelope.FromString(frame).command.tool_call
    return call.request_id, call.tool, call.args, call.timeout_ms if call.HasField("timeout_ms") else -1


def tool_call_frame(rid: str = "r-1", tool: str = "fs.read", args: bytes = b'{"path":"a.txt"}', timeout: int | None = None,
                    **envelope_fields: int) -> bytes:
    call = pb.ToolCallCommand(request_id=rid, tool=tool, args=args)
    if timeout is not None:
        call.timeout_ms = timeout
    return pb.Envelope(command=pb.Command(tool_call=call), **envelope_fields).SerializeToString()


_INNER = pb.ToolCallCommand(request_id="r", tool="t", args=b"{}").SerializeToString()


def _in_command(tool_call: bytes) -> bytes:
    return field(10, 2, field(3, 2, tool_call))


@pytest.mark.parametrize("frame", [
    tool_call_frame(),
    tool_call_frame(timeout=0),  # set to 0 (no timeout) is not unset (the service's default)
    tool_call_frame(timeout=1500),
    tool_call_frame(timeout=(1 << 63) - 1),
    tool_call_frame(sequence=(1 << 64) - 1, timestamp=1_700_000_000_000),
    tool_call_frame(rid="", tool="", args=b""),
    tool_call_frame(rid="ré-✓-\U0001f600", tool="fs.读", args=bytes(range(256))),
    # fields in another order than the encoders write them
    _in_command(field(3, 2, b"{}") + field(4, 0, 7) + field(2, 2, b"fs.list") + field(1, 2, b"x")) + field(2, 0, 9),
], ids=["plain", "timeout-0", "timeout", "timeout-max", "envelope-fields", "empty", "unicode", "reordered"])  # fmt: skip
def test_a_plain_tool_call_is_read_as_the_runtime_reads_it(relaypeek: ModuleType, frame: bytes) -> None:
    assert relaypeek.tool_call(frame) == expected_call(frame)


def test_anything_more_than_a_plain_tool_call_is_left_to_the_runtime(relaypeek: ModuleType) -> None:
    """None where the runtime's reading would take more than the plain walk (merging, last one
    wins, unknown fields kept) or where it refuses the bytes: the session then decodes the frame."""
    plain = tool_call_frame()
    frames = {
        "another command": envelope(command("shell_exec", "r")),
        "a control command": envelope(pb.Command(cancel=pb.CancelCommand(request_id="r"))),
        "an event": state("r", 2),
        "a batch of one tool call": envelope([pb.Command(tool_call=pb.ToolCallCommand(request_id="r"))]),
        "no bytes": b"",
        "no payload": field(2, 0, 1),
        "an empty command": field(10, 2, b""),
        "the command again (merged)": plain + plain,
        "the sequence twice": field(2, 0, 1) + plain + field(2, 0, 2),
        "an unknown varint": plain + field(99, 0, 1),
        "an unknown length-delimited field": plain + field(3, 2, b"x"),
        "a fixed-width field": plain + field(TOP, 1, b"\x01" * 8),
        "a group": plain + field(TOP - 4, 3, b""),
        "the timestamp length-delimited": field(1, 2, b"x") + plain,
        "the command as a varint": field(10, 0, 1),
        "a second member of the command": field(10, 2, field(3, 2, _INNER) + field(5, 2, b"")),
        "the id twice": _in_command(_INNER + field(1, 2, b"s")),
        "the args twice": _in_command(_INNER + field(3, 2, b"{}")),
        "an unknown field of the tool call": _in_command(_INNER + field(5, 0, 1)),
        "the timeout length-delimited": _in_command(_INNER + field(4, 2, b"1")),
        "the id a varint": _in_command(field(1, 0, 1)),
        "an id of invalid UTF-8": _in_command(field(1, 2, b"\xff")),
        "a tool of invalid UTF-8": _in_command(field(2, 2, b"\xed\xa0\x80")),  # a surrogate
        "a timeout past an int64": _in_command(_INNER + field(4, 0, 1 << 63)),
        "cut short": plain[:-1],
        "a length past the end": _in_command(b"\x0a\x05ab"),
        "a tag of eleven bytes": b"\xff" * 11,
    }
    for name, frame in frames.items():
        assert relaypeek.tool_call(frame) is None, name
    for other in (bytearray(plain), memoryview(plain), plain.decode("latin-1"), None):
        assert relaypeek.tool_call(other) is None  # bytes only: the session's frames are


def test_a_request_makes_its_command_of_the_call_as_the_runtime_read_it() -> None:
    """Request.command of a request started from a call is the Command the runtime decodes from
    the same frame (what the runner's whole path and a hook see), made once."""
    for frame in (tool_call_frame(), tool_call_frame(timeout=0), tool_call_frame(timeout=9, rid="", args=b"")):
        call = facade.tool_call(frame)
        assert call is not None
        request = Request(None, call[0], COMMANDS["tool_call"], None, None, call)  # type: ignore[arg-type]  # no host: nothing is sent
        made = request.command
        assert made == pb.Envelope.FromString(frame).command
        assert made.tool_call.HasField("timeout_ms") == (call[3] >= 0)
        assert request.command is made
    command_ = pb.Command(tool_call=pb.ToolCallCommand(request_id="q"))
    assert Request(None, "q", COMMANDS["tool_call"], command_).command is command_  # type: ignore[arg-type]


@st.composite
def _tool_call_frames(draw: st.DrawFn) -> bytes:
    call = pb.ToolCallCommand(request_id=draw(st.text(max_size=12)), tool=draw(st.text(max_size=8)), args=draw(st.binary(max_size=24)))
    if draw(st.booleans()):
        call.timeout_ms = draw(st.integers(0, (1 << 64) - 1))
    frame = pb.Envelope(sequence=draw(st.integers(0, 3)), command=pb.Command(tool_call=call)).SerializeToString()
    if draw(st.integers(0, 3)) == 0:
        frame += draw(st.sampled_from([UNKNOWN, field(2, 0, 3), _in_command(field(1, 2, b"again")), field(1, 0, 5)]))
    return _mutate(draw, frame)


@_settings
@given(st.one_of(st.binary(max_size=120), _tool_call_frames()))
def test_tool_call_reads_what_the_runtime_reads(relaypeek: ModuleType, frame: bytes) -> None:
    got = relaypeek.tool_call(frame)
    assert got == _relaypeek_py.tool_call(frame)
    if got is not None:
        env = pb.Envelope.FromString(frame)  # the runtime reads it as well: it must not raise
        assert env.WhichOneof("payload") == "command" and env.command.WhichOneof("command_type") == "tool_call"
        assert got == expected_call(frame)
        # nothing of the command left unread: the runtime writes back the unknown fields it kept
        made = Request(None, got[0], COMMANDS["tool_call"], None, None, got).command  # type: ignore[arg-type]
        assert made.SerializeToString() == env.command.SerializeToString()


# ---- v0 -----------------------------------------------------------------------------------------


def _line(obj: object) -> bytes:
    return orjson.dumps(obj) + b"\n"


def test_v0_command_lines() -> None:
    rid = str(uuid.uuid4())
    for kind in ALL_KINDS:
        if kind in V1_ONLY_COMMANDS:
            # no v0 variant: a line naming one is an unknown command, refused with ERROR, so it
            # starts its id as any refused line does
            name = kind.capitalize()
            assert facade.v0_command_ids(_line({"type": name, "data": {"request_id": rid}})) == [rid], kind
            continue
        line = _codec.encode_command(command(kind, rid))
        assert _relaypeek_v0.v0_command_ids(line) == ([rid] if kind in REQUEST_KINDS else []), kind
        assert facade.v0_command_ids(memoryview(line.rstrip(b"\n"))) == _relaypeek_v0.v0_command_ids(line)
    upper = rid.upper()
    shell = {"type": "ShellExec", "data": {"request_id": upper, "command": "true"}}
    assert facade.v0_command_ids(_line(shell)) == [rid]  # the form the service writes back
    assert facade.v0_command_ids(_line({**shell, "data": {"request_id": "not-a-uuid", "command": "true"}})) == []
    # Refused with a readable id: a terminal ERROR follows, so these start it too.
    assert facade.v0_command_ids(_line({"type": "ShellExecute", "data": {"request_id": rid}})) == [rid]
    assert facade.v0_command_ids(_line({"type": "ShellExec", "data": {"request_id": rid, "command": 5}})) == [rid]
    assert facade.v0_command_ids(_line({"type": "Stdin", "data": {"request_id": rid, "data": 5}})) == [rid]
    assert facade.v0_command_ids(_line({"type": "Resize", "data": {"request_id": rid}})) == [rid]
    # Well-formed control commands have no states; a handshake's unknown capability refuses nothing.
    assert facade.v0_command_ids(_line({"type": "Stdin", "data": {"request_id": rid, "data": "x"}})) == []
    hs = {"type": "Handshake", "data": {"version": 0, "capabilities": ["bogus"], "request_id": rid}}
    assert facade.v0_command_ids(_line(hs)) == []
    too_deep = {"type": "ShellExec", "data": {"request_id": rid, "command": "true", "env": {"a": "b"}, "x": [[[[]]]]}}
    deep = _line(too_deep).replace(b"[[[[]]]]", b"[" * 200 + b"]" * 200)
    assert facade.v0_command_ids(deep) == []
    for junk in (b"", b"\n", b"[1]", b"{", b'{"type": 5}', b"\xff\xfe", b'{"type":"ShellExec","data":[]}'):
        assert facade.v0_command_ids(junk) == []


def test_v0_event_marks_from_the_service_sink() -> None:
    out: list[bytes] = []
    sink = V0Sink(out.append, _codec)
    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    sink.state_change(pb.SERVICE_STATE_STARTING)
    sink.state_change(pb.SERVICE_STATE_READY)
    sink.state_change(pb.SERVICE_STATE_PROCESSING, a)
    sink.shell_output(a, '{"type":"StateChange","data":{"request_id":"x","state":"Ready"}}\n')
    sink.state_change(pb.SERVICE_STATE_READY, a)
    sink.log(pb.LOG_LEVEL_INFO, "StateChange", b)
    sink.error(pb.ERROR_CODE_UNSPECIFIED, "no", b)
    sink.state_change(pb.SERVICE_STATE_ERROR, b)
    sink.tool_done(c, True, b"{}", None, 1)
    buf = b"".join(out)
    assert facade.v0_event_marks(buf) == [a, b, c]
    assert facade.v0_event_marks(bytearray(buf)) == [a, b, c]
    cut = buf.rindex(b"\n", 0, len(buf) - 1) + 1 + 20  # the last line cut short: passed over
    assert facade.v0_event_marks(buf[:cut]) == [a, b]
    assert facade.v0_event_marks(b"") == facade.v0_event_marks(b"\xff\n{") == []


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120))
def test_v0_never_raises(data: bytes) -> None:
    assert isinstance(facade.v0_command_ids(data), list)
    assert isinstance(facade.v0_event_marks(b'{"type":"StateChange"' + data), list)


# ---- against a real service ---------------------------------------------------------------------


def _exchange(address: str, sent: list[bytes], done: object, deadline: float = 20.0, linger: float = 0.5) -> bytes:
    """Send ``sent`` on a new connection, read until ``done(received)`` and then for ``linger``
    seconds more (a second terminal state would come then); what was received."""
    sock = open_socket(address, deadline)
    try:
        sock.sendall(b"".join(sent))
        received = b""
        end = time.monotonic() + deadline
        while not done(received):  # type: ignore[operator]
            assert time.monotonic() < end, f"no end in time; received {received[-2000:]!r}"
            try:
                chunk = sock.recv(1 << 16)
            except socket.timeout:
                continue
            assert chunk, "the service closed the connection"
            received += chunk
        sock.settimeout(0.05)
        end = time.monotonic() + linger
        while time.monotonic() < end:
            try:
                chunk = sock.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                break
            received += chunk
        return received
    finally:
        sock.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    tmp: pathlib.Path = tmp_path_factory.mktemp("relaypeek")
    srv = ServerProcess(tmp, tcp=False).start()
    yield srv  # type: ignore[misc]
    srv.stop()
    assert_clean_log(srv)


def test_every_started_id_ends_once_v1(relaypeek: ModuleType, service: ServerProcess) -> None:
    """What the peek says a frontend started is what the peek finds ended in the service's answer,
    each id once, and the sequence it reads is the last one the service sent."""
    ids = [f"{name}-{uuid.uuid4().hex[:6]}-ü" for name in ("shell", "tool", "plan", "hook", "list", "attach", "run2")]
    hello = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
    frames = [
        envelope(hello),
        envelope(pb.Command(shell_exec=pb.ShellExecCommand(request_id=ids[0], command="echo hi"))),
        envelope(pb.Command(tool_call=pb.ToolCallCommand(request_id=ids[1], tool="no.such.tool", args=b"{}"))),
        envelope(command("plan", ids[2])),
        envelope(pb.Command(hook_load=pb.HookLoadCommand(request_id=ids[3], hook_type="cobol", script=""))),
        envelope(command("cancel", "nothing-running")),  # an ErrorEvent, no terminal state
        envelope(command("list_processes", ids[4])),
        envelope(pb.Command(attach=pb.AttachCommand(request_id=ids[5], process_id="none"))),
        envelope(pb.Command(shell_exec=pb.ShellExecCommand(request_id=ids[6], command="true"))),
        envelope(command("shell_exec", "")),  # no id: refused, nothing to end
    ]
    started = [rid for frame in frames for rid in relaypeek.command_ids(frame)]
    assert started == ids

    def done(received: bytes) -> bool:
        return set(relaypeek.event_marks(received)[1]) >= set(started)

    received = _exchange(service.unix, [encode_frame(f) for f in frames], done)
    top, ended = relaypeek.event_marks(received)
    assert collections.Counter(ended) == collections.Counter(started)
    sequences = [pb.Envelope.FromString(f).sequence for f in _frames(received)]
    assert top == max(sequences) == len(sequences)


def test_every_started_id_ends_once_v0(service: ServerProcess) -> None:
    ids = [str(uuid.uuid4()) for _ in range(6)]
    lines = [
        _line({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}}),
        _line({"type": "ShellExec", "data": {"request_id": ids[0].upper(), "command": "echo hi"}}),
        _line({"type": "ToolCall", "data": {"request_id": ids[1], "tool": "no.such.tool", "args": {}}}),
        _line({"type": "ShellExecute", "data": {"request_id": ids[2]}}),  # unknown type: refused
        _line({"type": "Stdin", "data": {"request_id": ids[3], "data": 5}}),  # a wrong field: refused
        _line({"type": "Cancel", "data": {"request_id": ids[4]}}),  # nothing running: an Error only
        _line({"type": "ShellExec", "data": {"request_id": "not-a-uuid", "command": "true"}}),
        _line({"type": "Plan", "data": {"request_id": ids[5], "goal": "g", "context": {}}}),
    ]
    started = [rid for line in lines for rid in facade.v0_command_ids(line)]
    assert started == [ids[0], ids[1], ids[2], ids[3], ids[5]]

    def done(received: bytes) -> bool:
        return set(facade.v0_event_marks(received[: received.rfind(b"\n") + 1])) >= set(started)

    received = _exchange(service.unix, lines, done)
    assert collections.Counter(facade.v0_event_marks(received)) == collections.Counter(started)


@pytest.mark.parametrize("inner, runtime_reads", [
    (b"\x00\x05", True), (b"\x02\x01x", True), (b"\x05abcd", True), (b"\x01abcdefgh", True), (b"\x03\x04", True),
    (b"\x04", False),
], ids=["varint", "bytes", "fixed32", "fixed64", "group", "end-group-alone"])
def test_field_zero_inside_a_skipped_group_is_read_as_upb_reads_it(relaypeek: ModuleType, inner: bytes, runtime_reads: bool) -> None:
    """Field number 0 is refused at a message's top level but stepped over inside an unknown group
    by upb (found by the hypothesis test above: the peek stopped at a frame the runtime read)."""
    group = 1000
    body = b"\x10\x81\x01" + varint(group << 3 | 3) + inner + varint(group << 3 | 4)
    buf = varint(len(body)) + body
    (top, _), clean = expected_marks(buf)
    assert clean is runtime_reads and top == (129 if runtime_reads else 0)
    assert relaypeek.event_marks(buf) == (top, [])
