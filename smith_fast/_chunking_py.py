"""Shell-output chunking: the pure-Python twin of ``_chunking_c``.

A child's stdout and stderr arrive as raw reads of any size; ``ShellOutputEvent.stdout``/``stderr``
are protobuf ``string`` fields, so the bytes must become valid text in bounded pieces. One
:class:`OutputChunker` per stream turns the reads into those pieces.

The unit of work is the *unit*, the step Python's own UTF-8 decoder takes with
``errors="replace"``: a complete valid character (1 to 4 bytes, as many bytes on the wire), or one
maximal invalid subpart (1 to 3 bytes, Unicode's "maximal subpart" rule) that becomes one U+FFFD,
3 bytes on the wire. A unit is *closed* once the bytes after it show where it ends; only a valid
prefix of a character at the very end of the pending bytes (at most 3 bytes) is still *open*.
Chunks are only ever cut between closed units, and decoding one unit never depends on the bytes
around it, so the chunks of a stream always join up to ``stream.decode("utf-8", "replace")``,
whatever the read sizes and whenever ``drain`` runs.

This module is the specification: ``_chunking_c`` must return the same chunks and raise the same
errors, with the same messages, for every input.
"""

from __future__ import annotations

import operator
from codecs import utf_8_decode

__all__ = ["DEFAULT_MAX_CHUNK", "OutputChunker"]

DEFAULT_MAX_CHUNK = 64 * 1024
# A protobuf message is at most 2 GiB, so a chunk must stay below that.
_MAX_CHUNK_LIMIT = 1 << 31
# The longest unit on the wire: a 4-byte character. Every unit must fit in an empty chunk.
_MIN_CHUNK = 4
_REPLACEMENT = 3  # bytes of U+FFFD in UTF-8 (EF BF BD)
_LF = 0x0A
_CR = 0x0D
_FEED, _DRAIN, _FLUSH = 0, 1, 2


def _check_args(max_chunk: object, newline_window: object) -> tuple[int, int]:
    """Validate the constructor arguments; return ``(max_chunk, newline_window)`` as ints."""
    limit = operator.index(max_chunk)  # type: ignore[arg-type]  # a probe: refusing non-integers is the point
    if not _MIN_CHUNK <= limit < _MAX_CHUNK_LIMIT:
        raise ValueError(f"max_chunk must be in [{_MIN_CHUNK}, 2**31), got {limit}")
    if newline_window is None:
        return limit, limit // 8
    window = operator.index(newline_window)  # type: ignore[arg-type]  # a probe: refusing non-integers is the point
    if not 0 <= window <= limit:
        raise ValueError(f"newline_window must be in [0, max_chunk] = [0, {limit}], got {window}")
    return limit, window


def _not_bytes(data: object) -> TypeError:
    return TypeError(f"feed() needs a contiguous bytes-like object, not {type(data).__name__!r}")


def _char_size(lead: int) -> int:
    """Length of the valid character whose first byte is ``lead``."""
    if lead < 0x80:
        return 1
    if lead < 0xE0:
        return 2
    return 3 if lead < 0xF0 else 4


def _next_unit(view: memoryview, pos: int) -> tuple[int, int]:
    """Classify the unit at ``view[pos]``: ``(length, bytes on the wire)``, or ``(0, 0)`` if open.

    A unit is at most 4 bytes and its end is decided by at most the byte after a 3-byte prefix,
    so 4 bytes of lookahead settle it.
    """
    try:
        used = utf_8_decode(view[pos : pos + 4], "strict", False)[1]
    except UnicodeDecodeError as exc:
        if exc.start == 0:
            return exc.end, _REPLACEMENT
        used = exc.start
    if not used:
        # CPython's incremental decoder holds back a truncated surrogate (ED A0..BF) for the
        # sake of "surrogatepass", but no byte can make it valid UTF-8: ED alone is the unit.
        if view[pos] == 0xED and len(view) - pos == 2 and view[pos + 1] >= 0xA0:
            return 1, _REPLACEMENT
        return 0, 0
    size = _char_size(view[pos])
    return size, size


class OutputChunker:
    """Turns the raw reads of one output stream into ``ShellOutputEvent`` text chunks.

    Every chunk returned is a non-empty ``str`` whose UTF-8 encoding is at most ``max_chunk``
    bytes. Invalid UTF-8 is replaced with U+FFFD exactly as ``bytes.decode("utf-8", "replace")``
    does, and a chunk never ends inside a character or inside an invalid sequence: the chunks of
    a stream (everything ``feed``, ``drain`` and ``flush`` return, in order) always join up to the
    whole stream decoded at once, however the stream was split into reads and whenever ``drain``
    was called. Without ``drain`` calls, the chunk boundaries do not depend on the read sizes.

    A chunk is cut when the next character no longer fits. The cut goes right after the last
    ``\\n`` among the ``newline_window`` bytes before that limit; failing that, a ``\\r\\n`` pair
    straddling the limit is kept whole in the next chunk; failing that, the chunk is cut at the
    limit. ``newline_window=0`` turns all line awareness off.

    Use ``feed`` for every read, ``drain`` once per event-loop tick (so many small reads coalesce
    into one event) and ``flush`` at end of stream.

    Args:
        max_chunk: the wire bound, in UTF-8 bytes per chunk; at least 4 (so a 4-byte character
            fits) and below ``2**31``.
        newline_window: how many bytes back from the limit a newline is looked for, in
            ``[0, max_chunk]``; ``None`` means ``max_chunk // 8``.

    Raises:
        TypeError: an argument is not an integer.
        ValueError: an argument is out of range.
    """

    __slots__ = ("_max", "_window", "_buf", "_scan", "_out")

    def __init__(self, max_chunk: int = DEFAULT_MAX_CHUNK, newline_window: int | None = None) -> None:
        self._max, self._window = _check_args(max_chunk, newline_window)
        self._buf = bytearray()  # pending bytes; _buf[0] starts the next chunk
        self._scan = 0  # _buf[:_scan] is a run of closed units, all of which fit in one chunk
        self._out = 0  # their size on the wire

    @property
    def max_chunk(self) -> int:
        """The largest chunk, in UTF-8 bytes."""
        return self._max

    @property
    def newline_window(self) -> int:
        """How many bytes back from the limit a newline is looked for."""
        return self._window

    @property
    def pending(self) -> int:
        """Bytes held: at most ``max_chunk + 3`` after ``feed``, at most 3 after ``drain``."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[str]:
        """Add one read to the stream and return the full chunks it completes, in order.

        Small reads are only buffered (the result is ``[]``); ``drain`` hands them out.

        Args:
            data: any contiguous bytes-like object. A mutable buffer may be reused as soon as
                ``feed`` returns; an immutable ``bytes`` may be referenced instead of copied.

        Returns:
            Every chunk that can no longer grow: the next character would not fit.

        Raises:
            TypeError: ``data`` is not a contiguous bytes-like object.
        """
        try:
            self._buf += data
        except (TypeError, BufferError):
            raise _not_bytes(data) from None
        return self._run(_FEED)

    def drain(self) -> list[str]:
        """Return everything pending as chunks, except an incomplete character at the end.

        Call it at the end of each event-loop tick: the reads of that tick leave as one chunk
        (or more, if they exceed ``max_chunk``). The bytes kept back (at most 3) are a valid
        beginning of a character whose remaining bytes have not arrived yet.

        Returns:
            The chunks, possibly none.
        """
        return self._run(_DRAIN)

    def flush(self) -> list[str]:
        """End the stream: return everything pending as chunks and reset the chunker.

        An incomplete character at the end becomes one U+FFFD, as in a whole-stream decode.
        The chunker can then start a new stream.

        Returns:
            The chunks, possibly none.
        """
        chunks = self._run(_FLUSH)
        self._buf.clear()
        self._scan = self._out = 0
        return chunks

    def _run(self, mode: int) -> list[str]:
        """Walk the pending bytes from ``_scan``, cutting chunks; keep what ``mode`` holds back."""
        chunks: list[str] = []
        buf = self._buf
        n = len(buf)
        limit = self._max
        start = 0
        scan = self._scan
        out = self._out
        with memoryview(buf) as view:
            while True:
                # Fast path: complete valid characters are as long on the wire as in the input,
                # so let the C decoder find how many of them fit in the room left.
                try:
                    used = utf_8_decode(view[scan : scan + limit - out], "strict", False)[1]
                    step = cost = 0
                except UnicodeDecodeError as exc:
                    used = exc.start
                    step, cost = exc.end - exc.start, _REPLACEMENT
                scan += used
                out += used
                if not step:
                    if scan == n:
                        break
                    step, cost = _next_unit(view, scan)
                    if not step:
                        if mode != _FLUSH:
                            break
                        # End of stream: the open prefix is one U+FFFD, as a final decode makes it.
                        step, cost = n - scan, _REPLACEMENT
                if out + cost > limit:
                    cut = self._cut(buf, start, scan)
                    chunks.append(str(view[start:cut], "utf-8", "replace"))
                    # After a newline cut, the units between it and the limit are walked again.
                    start = scan = cut
                    out = 0
                else:
                    scan += step
                    out += cost
            if mode != _FEED and scan > start:
                chunks.append(str(view[start:scan], "utf-8", "replace"))
                start = scan
                out = 0
        if start:
            del buf[:start]  # CPython drops a bytearray's head in O(1): no copy of the rest
        self._scan = scan - start
        self._out = out
        return chunks

    def _cut(self, buf: bytearray, start: int, limit: int) -> int:
        """Where the chunk starting at ``start`` ends, given that ``buf[limit]``'s unit does not fit."""
        window = self._window
        if window:
            nl = buf.rfind(b"\n", max(start, limit - window), limit)
            if nl >= 0:
                return nl + 1
            # The 1-byte "\n" did not fit, so the chunk holds max_chunk >= 4 wire bytes: moving
            # back over the 1-byte "\r" never empties it.
            if buf[limit - 1] == _CR and buf[limit] == _LF:
                return limit - 1
        return limit
