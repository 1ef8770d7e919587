"""Varint-delimited framing of protobuf messages: the pure-Python twin of ``_framing_c``.

The format is protobuf's standard *delimited* encoding (Java ``writeDelimitedTo``, protobufjs
``encodeDelimited``, Go ``protodelim``): each message is preceded by its length as a base-128
varint, least significant group first. A v1 Smith stream is a sequence of such frames, each an
``Envelope`` (PROTOCOL.md, "v1: varint-delimited Envelopes").

This module is the specification: ``_framing_c`` must return the same frames and raise the same
errors, with the same messages, for every input.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._varint import MAX_LENGTH as MAX_VARINT_LENGTH
from ._varint import ONE_BYTE as _ONE_BYTE
from ._varint import encode as encode_varint
from ._varint import size as varint_size
from .errors import FramingError, FrameTooLarge

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "MAX_VARINT_LENGTH",
    "FrameDecoder",
    "encode_frame",
    "encode_frames",
    "encode_into",
    "encode_varint",
    "varint_size",
]

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
_LENGTH_LIMIT = 1 << 32  # protobuf messages are at most 2 GiB; lengths must fit uint32


def _too_long(offset: int) -> FramingError:
    return FramingError(
        f"frame length varint at byte offset {offset} is longer than {MAX_VARINT_LENGTH} bytes",
        offset,
    )


def _too_wide(offset: int) -> FramingError:
    return FramingError(f"frame length at byte offset {offset} does not fit in 32 bits", offset)


def _not_bytes(data: object) -> TypeError:
    return TypeError(f"feed() needs a contiguous bytes-like object, not {type(data).__name__!r}")


def _too_large(offset: int, size: int, limit: int) -> FrameTooLarge:
    return FrameTooLarge(
        f"frame at byte offset {offset} declares {size} bytes, above max_frame_size {limit}",
        offset,
        size,
        limit,
    )


class FrameDecoder:
    """Incremental decoder of a varint-delimited frame stream.

    Feed it bytes as they arrive, split anywhere; it returns every frame completed so far. A frame
    spread over many feeds is gathered once, not re-copied on every feed.

    Errors are sticky: after a :class:`~smith_fast.errors.FramingError` every later ``feed`` raises
    the same error again. The frames completed earlier in the failing ``feed`` call are not lost:
    they are on the exception's ``frames`` attribute (empty on the re-raises).

    Args:
        max_frame_size: the largest payload length accepted, in bytes (at most ``2**32 - 1``).
            A longer declared length raises :class:`~smith_fast.errors.FrameTooLarge` as soon as
            the length prefix is read, before any of the payload is buffered. A frame's buffer
            grows with the bytes that arrived, never to a declared length ahead of them.
    """

    __slots__ = ("_max", "_buf", "_need", "_hdr", "_offset", "_error")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 0 <= max_frame_size < _LENGTH_LIMIT:
            raise ValueError(f"max_frame_size must be in [0, 2**32), got {max_frame_size}")
        self._max = max_frame_size
        self._buf = bytearray()  # the pending frame, from its first prefix byte on
        self._need = -1  # prefix + payload length of the pending frame; -1 while the prefix is short
        self._hdr = 0  # prefix length of the pending frame
        self._offset = 0  # stream offset of the pending frame's first byte
        self._error: FramingError | None = None

    @property
    def max_frame_size(self) -> int:
        """The largest payload length this decoder accepts."""
        return self._max

    @property
    def offset(self) -> int:
        """Stream offset of the first byte not yet returned as part of a complete frame."""
        return self._offset

    @property
    def buffered(self) -> int:
        """Bytes held for the frame that is not complete yet (none once the decoder has failed)."""
        return len(self._buf)

    @property
    def pending_size(self) -> int:
        """The declared payload length of the frame that is not complete yet; 0 when none is."""
        return self._need - self._hdr if self._need >= 0 else 0

    def _prefix(self, data: bytes | bytearray | memoryview, pos: int, end: int, base: int) -> tuple[int, int]:
        """Parse a multi-byte length prefix at ``data[pos]``; ``(0, 0)`` when it is incomplete."""
        size = 0
        shift = 0
        i = pos
        stop = min(end, pos + MAX_VARINT_LENGTH)
        while i < stop:
            b = data[i]
            size |= (b & 0x7F) << shift
            i += 1
            if b < 0x80:
                hdr = i - pos
                if size >= _LENGTH_LIMIT:
                    raise _too_wide(base + pos)
                if size > self._max:
                    raise _too_large(base + pos, size, self._max)
                return hdr, size
            shift += 7
        if i - pos == MAX_VARINT_LENGTH:
            raise _too_long(base + pos)
        return 0, 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data`` to the stream and return the frames it completes, in order.

        Args:
            data: any bytes-like object; it is not retained.

        Returns:
            The payloads (without length prefixes) of the frames completed by this call.

        Raises:
            FrameTooLarge: a frame declares a length above ``max_frame_size``.
            FramingError: a length prefix is longer than 10 bytes or does not fit in 32 bits.
            TypeError: ``data`` is not a contiguous bytes-like object (the stream is left as it was).
        """
        if self._error is not None:
            self._error.frames = []
            raise self._error
        if type(data) is not bytes:
            try:
                data = memoryview(data).cast("B")
            except (TypeError, BufferError):
                raise _not_bytes(data) from None
        frames: list[bytes] = []
        try:
            self._feed(data, frames)
        except FramingError as exc:
            exc.frames = frames
            self._offset = exc.offset  # the frames before it were returned; the bad one was not
            self._error = exc
            self._buf = bytearray()  # a failed stream is never resumed: let its bytes go
            self._need = -1
            raise
        return frames

    def _feed(self, data: bytes | memoryview, frames: list[bytes]) -> None:
        n = len(data)
        pos = 0
        buf = self._buf
        if buf:
            if self._need < 0:
                # The prefix itself was split: it is at most 10 bytes, so top it up and retry.
                take = min(n, MAX_VARINT_LENGTH - len(buf))
                buf += data[:take]
                hdr, size = self._prefix(buf, 0, len(buf), self._offset)
                if hdr == 0:
                    return
                self._hdr = hdr
                self._need = hdr + size
                pos = take - max(0, len(buf) - self._need)
                del buf[self._need :]
            missing = self._need - len(buf)
            if missing > n - pos:
                buf += data[pos:]
                return
            buf += data[pos : pos + missing]
            pos += missing
            frames.append(bytes(buf[self._hdr :]))
            self._offset += self._need
            buf.clear()
            self._need = -1
        base = self._offset - pos  # stream offset of data[0]
        limit = self._max
        while pos < n:
            size = data[pos]
            hdr = 1
            if size >= 0x80:
                # Two-byte prefixes (frames of 128 B .. 16 KiB) are the common case after one-byte ones.
                if pos + 1 < n and data[pos + 1] < 0x80:
                    size = (size & 0x7F) | (data[pos + 1] << 7)
                    hdr = 2
                else:
                    hdr, size = self._prefix(data, pos, n, base)
                    if hdr == 0:
                        break
            if size > limit:
                raise _too_large(base + pos, size, limit)
            end = pos + hdr + size
            if end > n:
                self._hdr = hdr
                self._need = hdr + size
                break
            frames.append(bytes(data[pos + hdr : end]))
            pos = end
        self._offset = base + pos
        if pos < n:
            buf += data[pos:]


def encode_frame(message: bytes | bytearray | memoryview) -> bytes:
    """Return ``message`` preceded by its length as a varint: one delimited frame."""
    n = len(message) if type(message) is not memoryview else message.nbytes
    return encode_varint(n) + bytes(message)


def encode_frames(messages: Iterable[bytes | bytearray | memoryview]) -> bytes:
    """Frame every message and join them into one buffer, ready for a single write."""
    parts: list[bytes | bytearray | memoryview] = []
    append = parts.append
    for m in messages:
        n = len(m) if type(m) is not memoryview else m.nbytes
        append(_ONE_BYTE[n] if n < 0x80 else encode_varint(n))
        append(m)
    return b"".join(parts)


def encode_into(
    messages: Iterable[bytes | bytearray | memoryview], buffer: bytearray, offset: int = 0
) -> int:
    """Frame every message into ``buffer`` starting at ``offset`` (msgspec's ``encode_into`` idiom).

    The buffer is resized so that it ends exactly after the last frame; bytes before ``offset``
    are kept, so a caller can reserve room for a header or append to earlier output.

    Args:
        messages: the serialized messages to frame.
        buffer: the output buffer, reused across calls to avoid allocations.
        offset: where to start writing; ``-1`` means the current end of ``buffer``.

    Returns:
        The new length of ``buffer`` (the offset just past the last frame).
    """
    if offset == -1:
        offset = len(buffer)
    elif not 0 <= offset <= len(buffer):
        raise ValueError(f"offset {offset} is outside the buffer (length {len(buffer)})")
    buffer[offset:] = encode_frames(messages)
    return len(buffer)
