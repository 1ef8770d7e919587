"""Fuzz the varint-delimited frame decoder and encoders, both twins in lockstep.

Input layout (so that seeds stay readable and the fuzzer controls every knob):

* byte 0: ``max_frame_size``, an index into :data:`LIMITS`;
* byte 1: bits 0-2 the number ``k`` of explicit feed sizes, bits 3-4 the buffer type each feed is
  passed as (bytes, bytearray, memoryview, a memoryview into a larger buffer), bit 5 feed the rest
  one byte at a time, bit 6 try to feed a non-bytes object after every feed;
* the next ``k`` bytes: sizes of the first ``k`` feeds; everything after: the stream.

Checked on every input: both twins return the same frames and raise the same error (class,
message, offset, size, limit, frames) on every feed, with the same ``offset`` and ``buffered``;
nothing is ever buffered beyond ``max_frame_size + MAX_VARINT_LENGTH``; a failed decoder holds
nothing and its error is sticky; an object that is not contiguous bytes is refused with the same
``TypeError`` by both twins and leaves the stream as it was; the
result does not depend on how the stream was split and matches a plain reference decoder; what
decodes re-encodes (all three encoders, both twins) and decodes back to the same frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fuzz._common import assert_same, fuzz_main, instrumented, outcome, twins

with instrumented(__name__):
    c, py = twins("framing")
    from smith_fast.errors import FramingError, FrameTooLarge

LIMITS = (0, 1, 2, 5, 127, 128, 129, 300, 16383, 16384, 65535, 1 << 20, py.DEFAULT_MAX_FRAME_SIZE, (1 << 32) - 1)
_ERR_ATTRS = ("offset", "size", "limit", "frames")
_SLACK = py.MAX_VARINT_LENGTH  # a pending frame holds at most its prefix plus max_frame_size bytes


def _as_bytes(piece: bytes) -> bytes:
    return piece


def _as_bytearray(piece: bytes) -> bytearray:
    return bytearray(piece)


def _as_memoryview(piece: bytes) -> memoryview:
    return memoryview(piece)


def _as_inner_view(piece: bytes) -> memoryview:
    # A view that starts inside a larger buffer: the decoder must honour the view's own start.
    return memoryview(b"\xff\x80" + piece + b"\x80")[2 : 2 + len(piece)]


WRAPPERS: tuple[Callable[[bytes], Any], ...] = (_as_bytes, _as_bytearray, _as_memoryview, _as_inner_view)
# Not contiguous bytes: refused without touching the stream (found by this harness: the twins used to
# raise different errors, BufferError vs TypeError, for a strided view).
NOT_BYTES: tuple[Any, ...] = ("\x01a", 7, None, memoryview(b"\x01.a.")[::2], [1, 97], memoryview(b"ab").toreadonly)


def split(data: bytes) -> tuple[int, Callable[[bytes], Any], bytes, list[bytes]] | None:
    """Decode the input layout: ``(max_frame_size, wrapper, stream, feeds)``; None if too short."""
    if len(data) < 2:
        return None
    limit = LIMITS[data[0] % len(LIMITS)]
    k = data[1] & 7
    wrap = WRAPPERS[(data[1] >> 3) & 3]
    bytewise = bool(data[1] & 0x20)
    steps = data[2 : 2 + k]
    stream = data[2 + k :]
    pieces: list[bytes] = []
    pos = 0
    for step in steps:
        pieces.append(stream[pos : pos + step])
        pos += step
    rest = stream[pos:]
    pieces += [rest[i : i + 1] for i in range(len(rest))] if bytewise else [rest]
    return limit, wrap, stream, pieces


def reference(stream: bytes, limit: int) -> tuple[list[bytes], tuple[type, int, int | None] | None]:
    """The frames of ``stream`` and ``(error class, offset, declared size)``, the obvious way."""
    frames: list[bytes] = []
    pos, n = 0, len(stream)
    while pos < n:
        value = 0
        end = pos
        while True:
            if end - pos == py.MAX_VARINT_LENGTH:
                return frames, (FramingError, pos, None)
            if end == n:
                return frames, None  # the prefix is not complete yet
            b = stream[end]
            value |= (b & 0x7F) << (7 * (end - pos))
            end += 1
            if b < 0x80:
                break
        if value >= 1 << 32:
            return frames, (FramingError, pos, None)
        if value > limit:
            return frames, (FrameTooLarge, pos, value)
        if end + value > n:
            return frames, None
        frames.append(stream[end : end + value])
        pos = end + value
    return frames, None


def test_one_input(data: bytes) -> None:
    parsed = split(data)
    if parsed is None:
        return
    limit, wrap, stream, pieces = parsed

    # Lockstep: the same outcome, offset and buffered after every feed.
    dc, dp = c.FrameDecoder(limit), py.FrameDecoder(limit)
    frames: list[bytes] = []
    error: Any = None
    for i, piece in enumerate(pieces):
        rc = outcome(dc.feed, wrap(piece), attrs=_ERR_ATTRS)
        rp = outcome(dp.feed, wrap(piece), attrs=_ERR_ATTRS)
        assert_same(rc, rp, f"feed #{i} ({len(piece)} bytes)")
        assert (dc.offset, dc.buffered) == (dp.offset, dp.buffered), (
            f"after feed #{i}: offset/buffered c={dc.offset}/{dc.buffered} py={dp.offset}/{dp.buffered}"
        )
        assert dp.buffered <= limit + _SLACK, f"{dp.buffered} bytes buffered with max_frame_size {limit}"
        if rc[0] == "err":
            assert issubclass(rc[1], FramingError), f"unexpected exception {rc[1].__name__}: {rc[2]}"
            frames += rc[3]["frames"]
            error = rc
            break
        assert all(type(f) is bytes for f in rc[1])
        frames += rc[1]
        if data[1] & 0x40:
            bogus = NOT_BYTES[i % len(NOT_BYTES)]
            state = (dp.offset, dp.buffered)
            rc, rp = outcome(dc.feed, bogus), outcome(dp.feed, bogus)
            assert_same(rc, rp, f"feed({bogus!r})")
            assert rc[0] == "err" and rc[1] is TypeError, rc
            assert (dc.offset, dc.buffered) == (dp.offset, dp.buffered) == state, "a refused feed moved the stream"

    if error is None:
        assert dp.offset + dp.buffered == len(stream), "offset + buffered must account for every byte fed"
    else:
        assert dc.buffered == dp.buffered == 0, "a failed decoder holds no bytes"
        # Sticky: the same error again, without the frames of the failing feed.
        for dec in (dc, dp):
            again = outcome(dec.feed, b"\x00", attrs=_ERR_ATTRS)
            assert again[0] == "err" and again[1:3] == error[1:3] and again[3]["frames"] == [], again

    # Split independence: one feed of the whole stream gives the same frames and the same error.
    for module in (c, py):
        whole = outcome(module.FrameDecoder(limit).feed, stream, attrs=_ERR_ATTRS)
        if error is None:
            assert whole == ("ok", frames), f"{module.__name__}: the outcome depends on the feed sizes"
        else:
            assert whole[0] == "err" and whole[1:3] == error[1:3], (whole, error)
            assert whole[3]["frames"] == frames

    # The obvious decoder agrees on the frames and on where (and why) the stream breaks.
    ref_frames, ref_error = reference(stream, limit)
    if error is None:
        assert (ref_frames, ref_error) == (frames, None)
    else:
        assert ref_frames == frames
        assert ref_error is not None and error[1] is ref_error[0] and error[3]["offset"] == ref_error[1], (
            error,
            ref_error,
        )
        if ref_error[2] is not None:
            assert (error[3]["size"], error[3]["limit"]) == (ref_error[2], limit)

    _check_encoders(frames, wrap)


def _check_encoders(frames: list[bytes], wrap: Callable[[bytes], Any]) -> None:
    wrapped = [wrap(f) for f in frames]
    joined = c.encode_frames(wrapped)
    assert joined == py.encode_frames(wrapped)
    assert joined == b"".join(c.encode_frame(w) for w in wrapped) == b"".join(py.encode_frame(w) for w in wrapped)
    for f in frames[:8]:
        assert c.encode_varint(len(f)) == py.encode_varint(len(f))
        assert c.varint_size(len(f)) == py.varint_size(len(f)) == len(py.encode_varint(len(f)))
    head = bytearray(b"hdr")
    buf_c, buf_py = bytearray(head), bytearray(head)
    assert c.encode_into(wrapped, buf_c, 3) == py.encode_into(wrapped, buf_py, 3) == 3 + len(joined)
    assert buf_c == buf_py == head + joined
    largest = max(map(len, frames), default=0)
    for module in (c, py):
        assert module.FrameDecoder(largest).feed(joined) == frames


if __name__ == "__main__":
    fuzz_main(test_one_input)
