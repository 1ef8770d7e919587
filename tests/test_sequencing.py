"""Sequencer and Resequencer, run against both twins (``[c]`` and ``[py]``).

The pure-Python twin is the specification; properties compare each twin against it as well as
against the documented rules (``smith_fast/_sequencing_py.py``).
"""

from __future__ import annotations

import random
import time
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_fast import _sequencing_py as reference
from smith_fast import sequencing as facade
from smith_fast.pb import smith_pb2

from .conftest import assert_same_api, public_members

MAX = (1 << 63) - 1
PROPS = settings(max_examples=200, deadline=None)


# --- the twins are one API -------------------------------------------------------------------


def test_twins_share_names_signatures_and_docs(sequencing: ModuleType, impl: str) -> None:
    assert_same_api("sequencing", impl)
    assert sequencing.MAX_SEQUENCE == MAX


def test_compiled_twin_keeps_its_state_in_c_fields(sequencing: ModuleType, impl: str) -> None:
    # Cython finds the augmenting .pxd by the module's full name; if it ever stopped finding it,
    # the "c" module would silently be the Python code compiled untyped, with Python attributes.
    assert sequencing.__name__ == f"smith_fast._sequencing_{impl}"
    typed = impl == "c"
    assert hasattr(sequencing.Sequencer(), "_last") is not typed
    assert hasattr(sequencing.Resequencer(), "_held") is not typed


def test_facade_exports_the_chosen_twin(sequencing: ModuleType, impl: str) -> None:
    chosen = __import__(f"smith_fast._sequencing_{facade.IMPLEMENTATION}", fromlist=["*"])
    assert facade.IMPLEMENTATION in ("c", "py")
    for name in ("Sequencer", "Resequencer", "MAX_SEQUENCE"):
        assert getattr(facade, name) is getattr(chosen, name)
    assert public_members(facade.Resequencer).keys() == public_members(sequencing.Resequencer).keys()


def test_resequencer_is_subscriptable(sequencing: ModuleType) -> None:
    alias = sequencing.Resequencer[smith_pb2.Envelope]
    assert alias.__origin__ is sequencing.Resequencer
    assert alias.__args__ == (smith_pb2.Envelope,)


# --- Sequencer --------------------------------------------------------------------------------


class Clock:
    """A clock that returns the given readings in turn."""

    def __init__(self, *readings: int) -> None:
        self.readings = list(readings)

    def __call__(self) -> int:
        return self.readings.pop(0)


def test_sequencer_counts_from_start(sequencing: ModuleType) -> None:
    seq = sequencing.Sequencer(clock=Clock(10, 11, 12))
    assert seq.last == 0
    assert [seq.next() for _ in range(3)] == [(10, 1), (11, 2), (12, 3)]
    assert seq.last == 3
    later = sequencing.Sequencer(start=500, clock=Clock(7))
    assert later.last == 499
    assert later.next() == (7, 500)


def test_sequencer_default_clock_is_unix_milliseconds(sequencing: ModuleType) -> None:
    before = time.time_ns() // 1_000_000
    ts, seq = sequencing.Sequencer().next()
    after = time.time_ns() // 1_000_000
    assert before <= ts <= after
    assert type(ts) is int and seq == 1


def test_sequencer_holds_timestamp_when_clock_steps_back(sequencing: ModuleType) -> None:
    seq = sequencing.Sequencer(clock=Clock(1000, 990, 995, 1001, 1001))
    assert [seq.next() for _ in range(5)] == [(1000, 1), (1000, 2), (1000, 3), (1001, 4), (1001, 5)]


@PROPS
@given(readings=st.lists(st.integers(0, 1 << 50), min_size=1, max_size=60), start=st.integers(1, MAX))
def test_sequencer_property(sequencing: ModuleType, readings: list[int], start: int) -> None:
    mine = sequencing.Sequencer(start=start, clock=Clock(*readings))
    ref = reference.Sequencer(start=start, clock=Clock(*readings))
    issued: list[tuple[int, int]] = []
    for _ in readings:
        try:
            pair = mine.next()
        except OverflowError as exc:
            with pytest.raises(OverflowError, match=str(exc)):
                ref.next()
            break
        assert pair == ref.next()
        issued.append(pair)
    timestamps = [ts for ts, _ in issued]
    sequences = [s for _, s in issued]
    assert sequences == list(range(start, start + len(issued)))
    # Each timestamp is the highest reading so far: never below an earlier one.
    assert timestamps == [max(readings[: i + 1]) for i in range(len(issued))]
    assert mine.last == start - 1 + len(issued)


def test_sequencer_stamps_envelopes_in_place(sequencing: ModuleType) -> None:
    seq = sequencing.Sequencer(clock=Clock(1_700_000_000_000, 1_700_000_000_001))
    env = smith_pb2.Envelope(event=smith_pb2.Event(log=smith_pb2.LogEvent(message="hi")))
    assert seq.stamp(env) is env
    assert (env.timestamp, env.sequence) == (1_700_000_000_000, 1)
    again = smith_pb2.Envelope.FromString(seq.stamp(smith_pb2.Envelope()).SerializeToString())
    assert (again.timestamp, again.sequence) == (1_700_000_000_001, 2)


def test_sequencer_exhaustion_is_an_error_not_a_wrap(sequencing: ModuleType) -> None:
    seq = sequencing.Sequencer(start=MAX, clock=Clock(5, 6, 7))
    assert seq.next() == (5, MAX)
    with pytest.raises(OverflowError, match=r"sequence numbers exhausted: 9223372036854775807 was the last one"):
        seq.next()
    assert seq.last == MAX
    env = smith_pb2.Envelope()
    with pytest.raises(OverflowError):
        seq.stamp(env)
    assert env.sequence == 0


@pytest.mark.parametrize(
    ("start", "error", "message"),
    [
        (0, ValueError, r"start must be in \[1, 2\*\*63\), got 0"),
        (-3, ValueError, r"start must be in \[1, 2\*\*63\), got -3"),
        (1 << 63, ValueError, r"start must be in \[1, 2\*\*63\), got 9223372036854775808"),
        ("1", TypeError, "start must be an int, got str"),
        (1.0, TypeError, "start must be an int, got float"),
        (True, TypeError, "start must be an int, got bool"),
    ],
)
def test_sequencer_rejects_bad_start(sequencing: ModuleType, start: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        sequencing.Sequencer(start=start)


# --- Resequencer: examples --------------------------------------------------------------------


def counters(r: Any) -> dict[str, int]:
    names = ("expected", "delivered", "duplicates", "gaps", "reordered", "held", "window")
    return {name: getattr(r, name) for name in names}


def test_in_order_items_are_delivered_at_once(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer()
    assert [r.push(i, f"m{i}") for i in (1, 2, 3)] == [["m1"], ["m2"], ["m3"]]
    assert counters(r) == dict(expected=4, delivered=3, duplicates=0, gaps=0, reordered=0, held=0, window=1024)


def test_items_ahead_are_held_until_the_gap_fills(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer()
    assert r.push(3, "c") == []
    assert r.push(2, "b") == []
    assert (r.held, r.reordered, r.expected) == (2, 2, 1)
    assert r.push(1, "a") == ["a", "b", "c"]
    assert r.push(5, "e") == []
    assert r.push(4, "d") == ["d", "e"]
    assert counters(r) == dict(expected=6, delivered=5, duplicates=0, gaps=0, reordered=3, held=0, window=1024)


def test_duplicates_are_dropped_and_counted(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer()
    assert r.push(1, "a") == ["a"]
    assert r.push(1, "a again") == []  # already delivered
    assert r.push(3, "c") == []
    assert r.push(3, "c again") == []  # already held: the first copy is kept
    assert r.push(2, "b") == ["b", "c"]
    assert r.duplicates == 2
    assert r.delivered == 3


def test_first_sets_the_starting_point(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer(first=100)
    assert r.push(99, "old") == []  # before the stream as far as this receiver is concerned
    assert r.push(100, "x") == ["x"]
    assert (r.expected, r.duplicates, r.delivered) == (101, 1, 1)


def test_window_overflow_gives_up_on_the_oldest_missing(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer(window=3)
    # 1 is lost. 2..4 are within the window (at most 3 ahead of expected=1) and are held.
    assert [r.push(s, s) for s in (2, 3, 4)] == [[], [], []]
    # 5 is 4 ahead: stop waiting for 1 (a gap); 2, 3, 4, 5 now follow without a gap.
    assert r.push(5, 5) == [2, 3, 4, 5]
    assert counters(r) == dict(expected=6, delivered=4, duplicates=0, gaps=1, reordered=4, held=0, window=3)
    assert r.push(1, 1) == []  # the straggler is too late: a duplicate now
    assert r.duplicates == 1


def test_a_far_jump_skips_the_span_and_delivers_held_items_below_it(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer(window=4)
    assert r.push(3, "c") == []
    assert r.push(5, "e") == []
    # 1_000_000 is far ahead: expected moves to 1_000_000 - 4; held 3 and 5 come out on the way.
    assert r.push(1_000_000, "z") == ["c", "e"]
    assert r.expected == 999_996
    assert r.gaps == 999_995 - 2
    assert r.held == 1
    assert r.delivered + r.gaps == r.expected - 1
    assert r.flush() == ["z"]
    assert (r.expected, r.gaps, r.delivered) == (1_000_001, 999_997, 3)


def test_window_zero_never_holds(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer(window=0)
    assert r.push(1, "a") == ["a"]
    assert r.push(4, "d") == ["d"]
    assert r.push(3, "c") == []
    assert counters(r) == dict(expected=5, delivered=2, duplicates=1, gaps=2, reordered=0, held=0, window=0)


def test_flush_delivers_everything_held_and_counts_the_holes(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer()
    assert r.flush() == []
    for s in (9, 4, 6):
        assert r.push(s, s) == []
    assert r.flush() == [4, 6, 9]
    assert counters(r) == dict(expected=10, delivered=3, duplicates=0, gaps=6, reordered=3, held=0, window=1024)
    assert r.push(10, 10) == [10]


def test_sequence_numbers_up_to_the_limit(sequencing: ModuleType) -> None:
    r = sequencing.Resequencer(window=2, first=MAX - 2)
    assert r.push(MAX, "last") == []
    assert r.push(MAX - 2, "a") == ["a"]
    assert r.push(MAX - 1, "b") == ["b", "last"]
    assert r.expected == MAX + 1
    assert r.push(MAX, "again") == []


@pytest.mark.parametrize(
    ("sequence", "error", "message"),
    [
        (0, ValueError, r"sequence must be in \[1, 2\*\*63\), got 0"),
        (-1, ValueError, r"sequence must be in \[1, 2\*\*63\), got -1"),
        (1 << 63, ValueError, r"sequence must be in \[1, 2\*\*63\), got 9223372036854775808"),
        ("1", TypeError, "sequence must be an int, got str"),
        (1.0, TypeError, "sequence must be an int, got float"),
        (None, TypeError, "sequence must be an int, got NoneType"),
        (True, TypeError, "sequence must be an int, got bool"),
    ],
)
def test_push_rejects_bad_sequence_numbers(sequencing: ModuleType, sequence: Any, error: type, message: str) -> None:
    r = sequencing.Resequencer()
    r.push(2, "b")
    before = counters(r)
    with pytest.raises(error, match=f"^{message}$"):
        r.push(sequence, "x")
    assert counters(r) == before


def test_push_accepts_int_subclasses(sequencing: ModuleType) -> None:
    class Seq(int):
        pass

    r = sequencing.Resequencer()
    assert r.push(Seq(1), "a") == ["a"]
    assert r.expected == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"window": -1}, ValueError, r"window must be in \[0, 2\*\*63\), got -1"),
        ({"window": 1 << 63}, ValueError, r"window must be in \[0, 2\*\*63\), got 9223372036854775808"),
        ({"window": 2.5}, TypeError, "window must be an int, got float"),
        ({"window": False}, TypeError, "window must be an int, got bool"),
        ({"first": 0}, ValueError, r"first must be in \[1, 2\*\*63\), got 0"),
        ({"first": "1"}, TypeError, "first must be an int, got str"),
    ],
)
def test_resequencer_rejects_bad_arguments(
    sequencing: ModuleType, kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        sequencing.Resequencer(**kwargs)


# --- Resequencer: properties ------------------------------------------------------------------


@st.composite
def at_least_once(draw: st.DrawFn) -> tuple[int, list[int], int]:
    """A window, and an arrival order of 1..n in which each number arrives at most ``window``
    ahead of the lowest one still missing, with redeliveries of numbers already sent."""
    window = draw(st.integers(0, 40))
    n = draw(st.integers(0, 150))
    slack = draw(st.lists(st.integers(0, window), min_size=n, max_size=n))
    # Sorting on i + slack[i] moves a number ahead of a smaller one by at most ``window``.
    order = sorted(range(1, n + 1), key=lambda i: (i + slack[i - 1], i))
    redelivery = draw(st.sampled_from([0.0, 0.1, 0.5]))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    arrivals: list[int] = []
    for s in order:
        arrivals.append(s)
        while rnd.random() < redelivery:
            arrivals.append(rnd.choice(arrivals))  # a redelivery of anything already sent
    return window, arrivals, n


def replay(module: ModuleType, window: int, first: int, arrivals: list[int]) -> tuple[list[Any], list[Any]]:
    """Push ``arrivals`` (item = its number); return per-push outputs and the counters after
    each push, checking the invariants on the way."""
    r = module.Resequencer(window=window, first=first)
    outputs: list[Any] = []
    states: list[Any] = []
    for s in arrivals:
        out = r.push(s, s)
        outputs.append(out)
        states.append(counters(r))
        assert r.held <= window
        assert r.delivered + r.gaps == r.expected - first
    outputs.append(r.flush())
    states.append(counters(r))
    assert r.held == 0
    return outputs, states


@PROPS
@given(case=at_least_once())
def test_at_least_once_delivery_comes_out_exactly_once_in_order(
    sequencing: ModuleType, case: tuple[int, list[int], int]
) -> None:
    window, arrivals, n = case
    outputs, states = replay(sequencing, window, 1, arrivals)
    delivered = [item for out in outputs for item in out]
    assert delivered == list(range(1, n + 1))
    final = states[-1]
    assert final["gaps"] == 0
    assert final["duplicates"] == len(arrivals) - n
    assert final["delivered"] == n
    assert final["expected"] == n + 1
    assert (outputs, states) == replay(reference, window, 1, arrivals)


@PROPS
@given(
    window=st.integers(0, 20),
    first=st.integers(1, 50),
    arrivals=st.lists(st.integers(1, 120), max_size=120),
)
def test_any_arrivals_deliver_each_number_at_most_once_in_order(
    sequencing: ModuleType, window: int, first: int, arrivals: list[int]
) -> None:
    outputs, states = replay(sequencing, window, first, arrivals)
    delivered = [item for out in outputs for item in out]
    assert delivered == sorted(set(delivered))
    assert set(delivered) <= set(arrivals)
    final = states[-1]
    seen = [s for s in arrivals if s >= first]
    if seen:
        # After a flush everything up to the highest number seen is accounted for.
        assert final["expected"] == max(seen) + 1
        assert final["delivered"] + final["gaps"] == max(seen) - first + 1
    assert final["delivered"] + final["duplicates"] == len(arrivals)
    assert (outputs, states) == replay(reference, window, first, arrivals)


@PROPS
@given(
    window=st.integers(1, 8),
    steps=st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=60),
)
def test_long_jumps_match_the_reference(sequencing: ModuleType, window: int, steps: list[tuple[int, bool]]) -> None:
    # Numbers climb by random strides, sometimes huge, exercising both ways of skipping a span.
    arrivals: list[int] = []
    current = 1
    for stride, huge in steps:
        current += stride * (10**12 if huge else 1)
        arrivals.append(min(current, MAX))
    assert replay(sequencing, window, 1, arrivals) == replay(reference, window, 1, arrivals)
