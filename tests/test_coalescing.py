"""EventBatcher, CommandBatcher and WriteCoalescer, run against both twins (``[c]`` and ``[py]``).

Batches are checked against protobuf itself: each must parse with ``smith_pb2.BatchEvent`` /
``BatchCommand`` to exactly the messages put in, and be byte-identical to protobuf's own
serialization of that message.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast import _coalescing_py as reference
from smith_fast import coalescing as facade
from smith_fast.pb import smith_pb2

from .conftest import assert_same_api, public_members

PROPS = settings(max_examples=200, deadline=None)


def event(size: int, tag: int = 0) -> bytes:
    """A serialized ``Event`` of ``size`` bytes, or one more where a varint boundary forbids
    exactly ``size`` (``size`` 0, 2, or at least 5)."""
    if size == 0:
        return b""
    for want in (size, size + 1):
        for extra in ({}, {"success": True}):  # two more bytes, to step over a varint boundary
            for n in range(max(0, want - 8), want):
                result = bytes([tag % 256]) * n
                msg = smith_pb2.Event(tool_result=smith_pb2.ToolResultEvent(result=result, **extra))
                data = msg.SerializeToString()
                if len(data) == want:
                    return data
    raise AssertionError(f"cannot build an event of {size} bytes")


def command(size: int) -> bytes:
    msg = smith_pb2.Command(tool_call=smith_pb2.ToolCallCommand(tool="t", args=b"a" * size))
    return msg.SerializeToString()


def entry(message: bytes) -> int:
    """Bytes ``message`` takes inside a batch: tag, length varint, payload."""
    n = len(message)
    return 1 + max(1, (n.bit_length() + 6) // 7) + n


SIZES = st.one_of(st.sampled_from([0, 2]), st.integers(5, 200), st.integers(120, 140), st.integers(16_370, 16_400))


# --- the twins are one API -------------------------------------------------------------------


def test_twins_share_names_signatures_and_docs(impl: str) -> None:
    assert_same_api("coalescing", impl)


def test_compiled_twin_keeps_its_state_in_c_fields(coalescing: ModuleType, impl: str) -> None:
    # Guards the augmenting .pxd being found (see test_sequencing for why this can fail silently).
    assert coalescing.__name__ == f"smith_fast._coalescing_{impl}"
    typed = impl == "c"
    assert hasattr(coalescing.EventBatcher(), "_parts") is not typed
    assert hasattr(coalescing.CommandBatcher(), "_parts") is not typed
    assert hasattr(coalescing.WriteCoalescer(), "_frames") is not typed


def test_facade_exports_the_chosen_twin(coalescing: ModuleType) -> None:
    chosen = __import__(f"smith_fast._coalescing_{facade.IMPLEMENTATION}", fromlist=["*"])
    assert facade.IMPLEMENTATION in ("c", "py")
    for name in reference.__all__:
        assert getattr(facade, name) is getattr(chosen, name)
        assert public_members(getattr(facade, name)).keys() == public_members(getattr(coalescing, name)).keys()


# --- EventBatcher: examples -------------------------------------------------------------------


def parse(batch: bytes) -> tuple[list[bytes], bool]:
    msg = smith_pb2.BatchEvent.FromString(batch)
    return [e.SerializeToString() for e in msg.events], msg.partial_batch


def protobuf_batch(events: list[bytes], partial: bool) -> bytes:
    return smith_pb2.BatchEvent(
        events=[smith_pb2.Event.FromString(e) for e in events], partial_batch=partial
    ).SerializeToString()


def test_a_batch_is_cut_when_the_next_event_does_not_fit_the_count(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher(max_count=3, linger=1.0)
    events = [event(10, i) for i in range(7)]
    assert [b.add(e, now=5.0) for e in events[:3]] == [[], [], []]
    assert b.pending == 3
    [first] = b.add(events[3], now=5.0)
    assert parse(first) == (events[:3], True)
    assert first == protobuf_batch(events[:3], True)
    assert b.pending == 1
    assert b.add(events[4], now=5.0) == []
    assert b.add(events[5], now=5.0) == []
    [second] = b.add(events[6], now=5.0)
    assert parse(second) == (events[3:6], True)
    [last] = b.flush()
    assert parse(last) == ([events[6]], False)
    assert last == protobuf_batch([events[6]], False)
    assert (b.pending, b.flush(), b.deadline) == (0, [], None)


def test_a_batch_is_cut_when_the_next_event_does_not_fit_the_bytes(coalescing: ModuleType) -> None:
    e = event(100)  # 102 bytes in a batch
    # 2 events plus the partial_batch field: 206 bytes; a third would make 308.
    b = coalescing.EventBatcher(max_bytes=306)
    assert b.add(e, now=0.0) == [] and b.add(e, now=0.0) == []
    [batch] = b.add(e, now=0.0)
    assert len(batch) == 206
    assert parse(batch) == ([e, e], True)
    # One byte fewer and the second event no longer fits beside the room kept for the flag.
    b = coalescing.EventBatcher(max_bytes=205)
    assert b.add(e, now=0.0) == []
    [batch] = b.add(e, now=0.0)
    assert parse(batch) == ([e], True)


def test_an_event_larger_than_max_bytes_goes_out_alone(coalescing: ModuleType) -> None:
    small, huge = event(20), event(5000)
    b = coalescing.EventBatcher(max_bytes=1000)
    assert b.add(small, now=0.0) == []
    [before] = b.add(huge, now=0.0)
    assert parse(before) == ([small], True)
    [alone] = b.add(small, now=0.0)
    assert parse(alone) == ([huge], True)
    assert alone == protobuf_batch([huge], True)
    [rest] = b.flush()
    assert parse(rest) == ([small], False)


def test_linger_runs_from_the_first_event_of_a_batch(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher(linger=0.5)
    assert b.deadline is None
    assert b.poll(100.0) == []
    b.add(event(8, 1), now=10.0)
    b.add(event(8, 2), now=10.4)  # does not move the deadline
    assert b.deadline == pytest.approx(10.5)
    assert b.poll(10.49) == []
    [batch] = b.poll(10.5)
    assert parse(batch) == ([event(8, 1), event(8, 2)], False)
    assert (b.deadline, b.pending, b.poll(99.0)) == (None, 0, [])
    b.add(event(8, 3), now=20.0)
    assert b.deadline == pytest.approx(20.5)


def test_cutting_restarts_the_linger_at_the_event_that_did_not_fit(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher(max_count=1, linger=0.25)
    b.add(event(8), now=1.0)
    [batch] = b.add(event(8), now=3.0)
    assert parse(batch) == ([event(8)], True)
    assert b.deadline == pytest.approx(3.25)


def test_now_defaults_to_the_monotonic_clock(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher(linger=60.0)
    before = time.monotonic()
    b.add(event(8))
    after = time.monotonic()
    assert before + 60.0 <= b.deadline <= after + 60.0
    assert b.poll(after) == []


def test_zero_linger_is_due_at_once(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher(linger=0)
    b.add(event(8), now=7.0)
    assert b.deadline == 7.0
    assert len(b.poll(7.0)) == 1


def test_a_bad_now_loses_nothing(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher(max_count=1)
    b.add(event(8, 1), now=0.0)
    with pytest.raises(TypeError):
        b.add(event(8, 2), now="soon")  # type: ignore[arg-type]
    assert b.pending == 1
    [batch] = b.flush()
    assert parse(batch) == ([event(8, 1)], False)


def test_bytes_like_events_are_copied(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher()
    buf = bytearray(event(30, 7))
    b.add(buf, now=0.0)
    b.add(memoryview(event(10, 8)), now=0.0)
    buf[:] = b"\x00" * len(buf)
    [batch] = b.flush()
    assert parse(batch) == ([event(30, 7), event(10, 8)], False)


def test_non_bytes_events_are_refused(coalescing: ModuleType) -> None:
    b = coalescing.EventBatcher()
    with pytest.raises(TypeError, match="bytes-like object is required, not 'str'"):
        b.add("event", now=0.0)  # type: ignore[arg-type]
    assert b.pending == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_count": 0}, ValueError, r"max_count must be in \[1, 2\*\*62\), got 0"),
        ({"max_count": 2.0}, TypeError, "'float' object cannot be interpreted as an integer"),
        ({"max_bytes": -5}, ValueError, r"max_bytes must be in \[1, 2\*\*62\), got -5"),
        ({"max_bytes": 1 << 62}, ValueError, r"max_bytes must be in \[1, 2\*\*62\), got 4611686018427387904"),
        ({"linger": -0.1}, ValueError, "linger must be a finite number of seconds >= 0, got -0.1"),
        ({"linger": float("nan")}, ValueError, "linger must be a finite number of seconds >= 0, got nan"),
        ({"linger": "1"}, TypeError, "linger must be a number of seconds, got str"),
        ({"linger": True}, TypeError, "linger must be a number of seconds, got bool"),
    ],
)
@pytest.mark.parametrize("cls", ["EventBatcher", "CommandBatcher"])
def test_batchers_reject_bad_bounds(
    coalescing: ModuleType, cls: str, kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        getattr(coalescing, cls)(**kwargs)


# --- CommandBatcher ---------------------------------------------------------------------------


@pytest.mark.parametrize("ordering", [True, False])
def test_command_batches_carry_require_ordering(coalescing: ModuleType, ordering: bool) -> None:
    b = coalescing.CommandBatcher(max_count=2, require_ordering=ordering)
    assert b.require_ordering is ordering
    commands = [command(n) for n in (1, 200, 3)]
    out = [batch for c in commands for batch in b.add(c, now=0.0)] + b.flush()
    assert len(out) == 2
    for batch, expected in zip(out, (commands[:2], commands[2:])):
        msg = smith_pb2.BatchCommand.FromString(batch)
        assert [c.SerializeToString() for c in msg.commands] == expected
        assert msg.require_ordering is ordering
        assert batch == smith_pb2.BatchCommand(
            commands=[smith_pb2.Command.FromString(c) for c in expected], require_ordering=ordering
        ).SerializeToString()


def test_command_byte_budget_leaves_room_only_for_a_written_flag(coalescing: ModuleType) -> None:
    c = command(97)  # 104 bytes: 106 in a batch
    assert entry(c) == 106
    ordered = coalescing.CommandBatcher(max_bytes=213, require_ordering=True)
    loose = coalescing.CommandBatcher(max_bytes=213, require_ordering=False)
    for b, together in ((ordered, 1), (loose, 2)):
        out = [batch for _ in range(3) for batch in b.add(c, now=0.0)]
        assert len(smith_pb2.BatchCommand.FromString(out[0]).commands) == together
        assert all(len(batch) <= 213 for batch in out)


# --- batchers: properties ---------------------------------------------------------------------


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), SIZES, st.floats(0, 0.004)),
        st.tuples(st.just("poll"), st.just(0), st.floats(0, 0.004)),
        st.tuples(st.just("flush"), st.just(0), st.just(0.0)),
    ),
    max_size=80,
)


def drive(module: ModuleType, ops: list[tuple[str, int, float]], **kwargs: Any) -> list[Any]:
    """Run ``ops`` on an EventBatcher with a virtual clock; record every call's result and state."""
    b = module.EventBatcher(**kwargs)
    now = 0.0
    log: list[Any] = []
    for i, (op, size, dt) in enumerate(ops):
        now += dt
        if op == "add":
            log.append((op, b.add(event(size, i), now=now)))
        elif op == "poll":
            log.append((op, b.poll(now)))
        else:
            log.append((op, b.flush()))
        log.append((b.pending, b.deadline))
    log.append(("flush", b.flush()))
    return log


@PROPS
@given(
    ops=OPS,
    max_count=st.integers(1, 10),
    max_bytes=st.one_of(st.integers(1, 40), st.integers(100, 1200), st.just(64 * 1024)),
    linger=st.sampled_from([0.0, 0.001, 0.003]),
)
def test_batches_are_the_events_in_order_within_bounds(
    coalescing: ModuleType, ops: list[tuple[str, int, float]], max_count: int, max_bytes: int, linger: float
) -> None:
    kwargs = dict(max_count=max_count, max_bytes=max_bytes, linger=linger)
    log = drive(coalescing, ops, **kwargs)
    assert log == drive(reference, ops, **kwargs)

    sent = [event(size, i) for i, (op, size, _) in enumerate(ops) if op == "add"]
    received: list[bytes] = []
    calls = [entry_ for entry_ in log if isinstance(entry_[0], str)]
    for op, batches in calls:
        for k, batch in enumerate(batches):
            events, partial = parse(batch)
            # Batches from add() were cut with a successor pending; poll/flush empty the queue.
            assert partial is (op == "add")
            assert batch == protobuf_batch(events, partial)
            assert 1 <= len(events) <= max_count
            assert len(batch) <= max_bytes or len(events) == 1
            if op == "add":
                # Cut only because the next event did not fit: the batch is as full as allowed.
                following = sent[len(received) + len(events)]
                assert len(events) == max_count or len(batch) + entry(following) > max_bytes
            received += events
    assert received == sent


@PROPS
@given(ops=OPS, linger=st.sampled_from([0.0, 0.002]))
def test_poll_hands_out_a_batch_exactly_when_it_is_due(
    coalescing: ModuleType, ops: list[tuple[str, int, float]], linger: float
) -> None:
    b = coalescing.EventBatcher(max_count=4, linger=linger)
    now = 0.0
    first_at: float | None = None
    for i, (op, size, dt) in enumerate(ops):
        now += dt
        if op == "add":
            cut = b.add(event(size, i), now=now)
            if first_at is None or cut:
                first_at = now
            assert b.deadline == first_at + linger
        elif op == "poll":
            due = b.deadline is not None and now >= b.deadline
            assert len(b.poll(now)) == int(due)
            if due:
                first_at = None
        else:
            b.flush()
            first_at = None
        assert (b.deadline is None) == (b.pending == 0) == (first_at is None)


# --- WriteCoalescer ---------------------------------------------------------------------------


def test_write_coalescer_hands_back_one_buffer_at_the_threshold(coalescing: ModuleType) -> None:
    w = coalescing.WriteCoalescer(max_bytes=10)
    assert w.pending_bytes == 0 and w.flush() == b""
    assert w.add(b"abc") is None
    assert w.add(b"defg") is None
    assert w.pending_bytes == 7
    assert w.add(b"hij") == b"abcdefghij"
    assert w.pending_bytes == 0
    assert w.add(b"x" * 25) == b"x" * 25  # a frame above the threshold goes at once, whole
    assert w.add(b"yz") is None
    assert w.flush() == b"yz"
    assert (w.flush(), w.pending_bytes) == (b"", 0)


def test_write_coalescer_copies_bytes_like_frames(coalescing: ModuleType) -> None:
    w = coalescing.WriteCoalescer()
    buf = bytearray(b"frame-1")
    w.add(buf)
    w.add(memoryview(b"frame-2"))
    buf[:] = b"XXXXXXX"
    assert w.flush() == b"frame-1frame-2"
    with pytest.raises(TypeError, match="bytes-like object is required, not 'int'"):
        w.add(5)  # type: ignore[arg-type]
    assert w.pending_bytes == 0


@pytest.mark.parametrize(
    ("max_bytes", "error", "message"),
    [
        (0, ValueError, r"max_bytes must be in \[1, 2\*\*62\), got 0"),
        ("1", TypeError, "'str' object cannot be interpreted as an integer"),
    ],
)
def test_write_coalescer_rejects_bad_bounds(coalescing: ModuleType, max_bytes: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        coalescing.WriteCoalescer(max_bytes=max_bytes)


@PROPS
@given(
    sizes=st.lists(st.integers(0, 300), max_size=100),
    flush_every=st.integers(1, 30),
    max_bytes=st.integers(1, 1000),
)
def test_write_coalescer_property(coalescing: ModuleType, sizes: list[int], flush_every: int, max_bytes: int) -> None:
    frames = [bytes([i % 256]) * n for i, n in enumerate(sizes)]

    def run(module: ModuleType) -> list[Any]:
        w = module.WriteCoalescer(max_bytes=max_bytes)
        out: list[Any] = []
        for i, frame in enumerate(frames, 1):
            before = w.pending_bytes
            joined = w.add(frame)
            if before + len(frame) >= max_bytes:
                assert joined is not None and len(joined) == before + len(frame)
                assert joined.endswith(frame)
                assert w.pending_bytes == 0
            else:
                assert joined is None
                assert w.pending_bytes == before + len(frame)
            out.append(joined)
            if i % flush_every == 0:
                out.append(w.flush())
        out.append(w.flush())
        return out

    out = run(coalescing)
    assert out == run(reference)
    assert b"".join(o for o in out if o is not None) == b"".join(frames)
