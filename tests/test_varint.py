"""smith_fast._varint, the one varint implementation of the Python side, against protobuf's own."""

from __future__ import annotations

import pytest
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from hypothesis import given
from hypothesis import strategies as st

from smith_fast import _varint
from smith_fast.pb import smith_pb2

# Every length class: each group boundary and its neighbours, up to the 64-bit limit.
EDGES = sorted({max(0, (1 << bits) + d) for bits in range(0, 65, 7) for d in (-1, 0, 1)} - {1 << 64})


@pytest.mark.parametrize("value", EDGES)
def test_encode_at_every_length_boundary(value: int) -> None:
    assert _varint.encode(value) == _VarintBytes(value)
    assert _varint.size(value) == len(_VarintBytes(value))


@given(st.integers(0, 2**64 - 1))
def test_encode_matches_protobuf(value: int) -> None:
    encoded = _varint.encode(value)
    assert encoded == _VarintBytes(value)
    assert _varint.size(value) == len(encoded) <= _varint.MAX_LENGTH
    assert _DecodeVarint(encoded, 0) == (value, len(encoded))


@pytest.mark.parametrize("value", [-1, -(2**63), 2**64, 2**70])
def test_encode_refuses_what_a_uint64_cannot_hold(value: int) -> None:
    with pytest.raises(OverflowError, match=r"varint value must be in \[0, 2\*\*64\)"):
        _varint.encode(value)


@given(st.integers(-(2**31), 2**31 - 1))
def test_encode_int32_matches_protobuf(value: int) -> None:
    # What the runtime writes for an int32 field (LogEvent.level is an open enum: an int32 on the
    # wire, negatives sign-extended to ten bytes); zero is omitted.
    expected = smith_pb2.LogEvent(level=value).SerializeToString()  # type: ignore[arg-type]  # open enum: any int32
    assert (b"\x08" + _varint.encode_int32(value) if value else b"") == expected
    assert len(_varint.encode_int32(value)) == (10 if value < 0 else _varint.size(value))


@pytest.mark.parametrize("value", [-(2**31) - 1, 2**31])
def test_encode_int32_refuses_what_an_int32_cannot_hold(value: int) -> None:
    with pytest.raises(OverflowError):
        _varint.encode_int32(value)


def test_small_values_are_shared_objects() -> None:
    # The event encoders spot an omitted (zero) field by identity with ONE_BYTE[0].
    assert all(_varint.encode(n) is _varint.ONE_BYTE[n] for n in range(0x80))
    assert _varint.encode_int32(0) is _varint.ONE_BYTE[0]


@given(st.integers(0, 2**64 - 1), st.binary(max_size=4), st.binary(max_size=4))
def test_skip_lands_just_past_the_varint(value: int, before: bytes, after: bytes) -> None:
    data = before + _varint.encode(value) + after
    assert _varint.skip(data, len(before)) == len(data) - len(after)
    assert _varint.skip(memoryview(data), len(before)) == len(data) - len(after)
    assert _varint.skip(bytearray(data), len(before)) == len(data) - len(after)


def test_skip_of_a_varint_cut_short_raises() -> None:
    with pytest.raises(IndexError):
        _varint.skip(b"\x80\x80")
