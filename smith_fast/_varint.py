"""Base-128 varints, protobuf's encoding of integers and lengths: the one copy the Python side uses.

Every pure-Python twin (``_framing_py``, ``_events_py``, ``_coalescing_py``) and every writer that
steps over a length prefix takes its varints from here; the Cython kernels (``csrc/*.pyx``) keep
their own C loops inline. A varint is the value in 7-bit groups, least significant first, each byte
but the last with its top bit set; a ``uint64`` takes at most ten bytes.

Values below 128 are one byte, and :data:`ONE_BYTE` holds those bytes objects, so a hot loop can
write ``ONE_BYTE[n] if n < 0x80 else encode(n)`` and skip the call for the common case. The
objects are shared: ``encode(0) is ONE_BYTE[0]``, which the event encoders use to spot a default
(omitted) field without comparing bytes. ``encode`` and ``size`` are also the public
``smith_fast.framing.encode_varint`` and ``varint_size`` of the Python twin, so their docstrings are
the ones the compiled twin has (tests/conftest.py ``assert_same_api``).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_LENGTH", "ONE_BYTE", "decode", "encode", "encode_int32", "size", "skip"]

MAX_LENGTH: Final = 10  # a uint64 needs at most ten 7-bit groups
"""The longest varint: ten bytes (a ``uint64``, or a negative ``int32`` sign-extended to 64 bits)."""

ONE_BYTE: Final[list[bytes]] = [bytes((i,)) for i in range(0x80)]
"""``ONE_BYTE[n]`` is the varint of ``n`` for ``0 <= n < 128``, one shared object per value."""

_CONT_BYTE: Final = [bytes((i | 0x80,)) for i in range(0x80)]  # a 7-bit group with more to follow
_GROUPS: Final = [max(1, (bits + 6) // 7) for bits in range(65)]  # varint length by bit length
_CONTINUATION: Final = [int.from_bytes(b"\x80" * (n - 1), "little") if n else 0 for n in range(9)]
_UINT64_MASK: Final = (1 << 64) - 1


def encode(value: int) -> bytes:
    """Encode a non-negative integer below ``2**64`` as a base-128 varint.

    Raises:
        OverflowError: ``value`` is negative or does not fit in 64 bits.
    """
    if 0 <= value < 0x80:
        return ONE_BYTE[value]
    if 0 < value < 0x4000:
        return _CONT_BYTE[value & 0x7F] + ONE_BYTE[value >> 7]
    if value >> 56 or value < 0:
        return _encode_long(value)
    # Up to eight 7-bit groups: spread them one per byte with three mask-and-shift steps, set the
    # continuation bits, and let int.to_bytes do the byte loop in C.
    spread = (value & 0xFFFFFFF) | (value >> 28 << 32)
    spread = (spread & 0x00003FFF00003FFF) | ((spread & 0x0FFFC0000FFFC000) << 2)
    spread = (spread & 0x007F007F007F007F) | ((spread & 0x3F803F803F803F80) << 1)
    n = _GROUPS[value.bit_length()]
    return (spread | _CONTINUATION[n]).to_bytes(n, "little")


def _encode_long(value: int) -> bytes:
    """Nine or ten groups (values of 2**56 and above), or the error for a value out of range."""
    if value >> 64 or value < 0:
        raise OverflowError(f"varint value must be in [0, 2**64), got {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_int32(value: int) -> bytes:
    """The varint of an ``int32`` (or enum) field: protobuf sign-extends negatives to ten bytes.

    Raises:
        OverflowError: ``value`` does not fit in 32 bits.
    """
    if 0 <= value < 0x80:
        return ONE_BYTE[value]
    if not -0x80000000 <= value < 0x80000000:
        raise OverflowError(f"int32 value must be in [-2**31, 2**31), got {value}")
    return encode(value & _UINT64_MASK)


def size(value: int) -> int:
    """Number of bytes of ``value`` (a non-negative int below 2**64) as a base-128 varint."""
    if value < 0x80:
        return 1
    return (value.bit_length() + 6) // 7


def skip(data: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The index just past the varint that starts at ``data[pos]``.

    For varints this process wrote itself (a length prefix in front of a frame it framed), so it
    does not check them: a varint that runs off the end raises ``IndexError``.
    """
    while data[pos] & 0x80:
        pos += 1
    return pos + 1


def decode(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """The varint that starts at ``data[pos]`` and the index just past it.

    Like :func:`skip`, for varints this process wrote itself (a written envelope's fields): it does
    not check them, and one that runs off the end raises ``IndexError``.
    """
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
