"""The journal's framing (smith_fast.nats.journal): a loop iteration's envelopes cut into NATS
messages and put back together by the next gateway process, whatever the cut, and what it does
with a journal that lost messages."""

from __future__ import annotations

import random

import orjson
import pytest

from smith_fast.nats.journal import _reassemble, split_chunks


def _messages(flushes: list[list[bytes]], room: int) -> dict[int, tuple[int, bytes, bytes]]:
    """What a session's journal holds after ``flushes``: index -> (skip, snapshot, chunk)."""
    out: dict[int, tuple[int, bytes, bytes]] = {}
    index = 0
    for n, units in enumerate(flushes):
        snapshot = orjson.dumps({"flush": n})
        for chunk, skip in split_chunks(units, room):
            index += 1
            out[index] = (skip, snapshot, chunk)
    return out


@pytest.mark.parametrize("room", [1, 2, 3, 7, 64, 1000, 1 << 20])
def test_units_come_back_whole_and_in_order_whatever_the_cut(room: int) -> None:
    rng = random.Random(room)
    flushes = [[rng.randbytes(rng.choice([0, 1, 5, 127, 128, 300, 20000])) for _ in range(rng.randint(1, 6))] for _ in range(25)]
    saved = _reassemble("s", _messages(flushes, room))
    assert saved is not None
    assert saved.units == [u for units in flushes for u in units]
    assert saved.snapshot["flush"] == len(flushes) - 1  # the last message's


def test_a_lost_message_keeps_the_last_unbroken_run_starting_at_a_whole_unit() -> None:
    flushes = [[b"a" * 10, b"b" * 10], [b"c" * 10], [b"d" * 10, b"e" * 10]]
    messages = _messages(flushes, 7)  # every unit spans messages
    first_of_last_flush = min(i for i, (_, snap, _) in messages.items() if orjson.loads(snap)["flush"] == 2)
    del messages[first_of_last_flush - 1]  # a message of the second flush is missing
    saved = _reassemble("s", messages)
    assert saved is not None
    assert saved.units == [b"d" * 10, b"e" * 10]  # what follows the gap; the unit cut by it is dropped


def test_a_journal_ending_inside_a_unit_is_not_used() -> None:
    messages = _messages([[b"x" * 50]], 20)
    del messages[max(messages)]  # the flush's last message never stored
    # the run ends inside the unit, and the snapshot then describes envelopes that are not all there
    assert _reassemble("s", messages) is None


def test_skip_says_where_the_first_whole_unit_starts() -> None:
    chunks = split_chunks([b"12345", b"6789"], 4)
    # stream: 05 '12345' 04 '6789' = 11 bytes, cut at 4: [05 1 2 3] [4 5 04 6] [7 8 9]
    assert [skip for _, skip in chunks] == [0, 2, 3]
    assert b"".join(c for c, _ in chunks) == b"\x0512345\x046789"
