"""Splitting a v0 byte stream into lines (see :class:`LineDecoder`)."""

from __future__ import annotations

from ..errors import FrameTooLarge

__all__ = ["DEFAULT_MAX_LINE_SIZE", "LineDecoder"]

DEFAULT_MAX_LINE_SIZE = 16 * 1024 * 1024
_BLANK = b" \t\r"


def _line_too_long(offset: int, size: int, limit: int, complete: bool) -> FrameTooLarge:
    more = "" if complete else " so far"
    return FrameTooLarge(
        f"line at byte offset {offset} exceeds max_line_size {limit} ({size} bytes{more}); "
        "it is discarded up to the next newline",
        offset,
        size,
        limit,
        complete=complete,
    )


class LineDecoder:
    """Incremental splitter of a v0 byte stream into lines.

    Feed it bytes as they arrive, split anywhere; it returns every line completed so far, without
    its ``\\n`` and without one trailing ``\\r``. Lines that are empty or hold only spaces and tabs
    are skipped. A line spread over many feeds is gathered in place, not re-copied on every feed.

    Unlike :class:`~smith_fast.framing.FrameDecoder`, errors are **not sticky**: a v0 stream can
    resynchronize at the next newline. An oversize line raises
    :class:`~smith_fast.errors.FrameTooLarge` in the feed where it crosses the limit; its bytes are
    dropped as they arrive (never buffered) up to the next ``\\n``, and decoding goes on from there.
    The lines that the failing feed did complete are on the exception: ``exc.frames`` holds them in
    stream order and ``exc.index`` is how many of them came before the oversize line;
    ``exc.complete`` says whether ``exc.size`` is the whole line's (its newline was seen). When one feed
    holds several oversize lines, all are dropped and the error describes the first.

    Args:
        max_line_size: the longest line accepted, counting its bytes before the ``\\n`` (a trailing
            ``\\r`` included).
    """

    __slots__ = ("_max", "_buf", "_start", "_fed", "_skipping")

    def __init__(self, max_line_size: int = DEFAULT_MAX_LINE_SIZE) -> None:
        if max_line_size < 0:
            raise ValueError(f"max_line_size must be >= 0, got {max_line_size}")
        self._max = max_line_size
        self._buf = bytearray()  # the pending (incomplete) line
        self._start = 0  # stream offset of the pending line's first byte
        self._fed = 0  # bytes fed so far: the stream offset of the next feed's first byte
        self._skipping = False  # dropping the rest of an oversize line

    @property
    def max_line_size(self) -> int:
        """The longest line this decoder accepts."""
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes held for the line that is not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data`` to the stream and return the lines it completes, in order.

        Args:
            data: any bytes-like object; it is not retained.

        Returns:
            The lines completed by this call, without line terminators; blank lines are skipped.

        Raises:
            FrameTooLarge: a line exceeds ``max_line_size``. ``offset`` is the stream offset of its
                first byte, ``size`` the bytes seen so far; ``frames``/``index`` as described above.
                The next ``feed`` carries on normally.
            TypeError: ``data`` is not a bytes-like object (the stream is left as it was).
        """
        if type(data) is not bytes:
            if type(data) is not memoryview:
                try:
                    data = memoryview(data)  # not bytes(data): bytes(3) would be three NULs
                except TypeError:
                    raise TypeError(f"feed() needs a bytes-like object, not {type(data).__name__!r}") from None
            data = data.tobytes()
        n = len(data)
        base = self._fed
        self._fed = base + n
        limit = self._max
        lines: list[bytes] = []
        err: FrameTooLarge | None = None
        index = 0
        pos = 0
        if self._skipping:
            pos = data.find(b"\n") + 1
            if not pos:
                return lines
            self._skipping = False
        buf = self._buf
        if buf:
            nl = data.find(b"\n", pos)
            size = len(buf) + (n if nl < 0 else nl) - pos
            if size > limit:
                err = _line_too_long(self._start, size, limit, nl >= 0)
                buf.clear()
                if nl < 0:
                    self._skipping = True
                    err.frames = lines
                    err.index = 0
                    raise err
            elif nl < 0:
                buf += memoryview(data)[pos:]
                return lines
            else:
                buf += memoryview(data)[pos:nl]
                _keep(lines, bytes(buf))
                buf.clear()
            pos = nl + 1
        parts = (data[pos:] if pos else data).split(b"\n")
        tail = parts.pop()
        if parts:
            if max(map(len, parts)) <= limit:
                append = lines.append
                for part in parts:  # _keep, inlined: this is the per-line hot loop
                    if part:
                        if part[-1] == 13:
                            part = part[:-1]
                        if part and (part[0] not in _BLANK or part.strip(_BLANK)):
                            append(part)
            else:
                offset = base + pos
                for part in parts:
                    if len(part) <= limit:
                        _keep(lines, part)
                    elif err is None:
                        err = _line_too_long(offset, len(part), limit, True)
                        index = len(lines)
                    offset += len(part) + 1
        if tail:
            if len(tail) > limit:
                if err is None:
                    err = _line_too_long(base + n - len(tail), len(tail), limit, False)
                    index = len(lines)
                self._skipping = True
            else:
                self._start = base + n - len(tail)
                buf += tail
        if err is not None:
            err.frames = lines
            err.index = index
            raise err
        return lines


def _keep(lines: list[bytes], line: bytes) -> None:
    if line:
        if line[-1] == 13:  # "\r" of a CRLF terminator
            line = line[:-1]
        if line and (line[0] not in _BLANK or line.strip(_BLANK)):
            lines.append(line)
