"""The exceptions smith-fast raises: one small hierarchy under :class:`SmithFastError`.

Both twins of every wire-core module raise these exact classes with the exact same messages, so
callers can catch them without knowing which implementation is active.
"""

from __future__ import annotations

__all__ = [
    "SmithFastError",
    "FramingError",
    "FrameTooLarge",
    "EncodeError",
    "ProtocolError",
    "ListenError",
]


class SmithFastError(Exception):
    """Base class of every error smith-fast raises on purpose."""


class FramingError(SmithFastError, ValueError):
    """The byte stream is not a valid sequence of varint-delimited frames.

    A decoder's ``feed`` raises it after decoding what it could of the data it was given: those
    frames are not lost, they travel on the exception.

    Attributes:
        offset: byte offset in the stream (counted from the first byte ever fed) of the start of
            the frame whose length prefix is bad.
        frames: the frames completed by the failing ``feed`` call, in order (empty when a sticky
            error is raised again).
        index: where the bad frame stood among ``frames``: ``frames[:index]`` came before it. A v1
            :class:`~smith_fast.framing.FrameDecoder` stops at the bad frame, so by default every
            frame came before it (``len(frames)``); the v0 line decoder resyncs at the next newline
            and sets it.
    """

    def __init__(
        self, message: str, offset: int, *, frames: list[bytes] | None = None, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.frames: list[bytes] = [] if frames is None else frames
        self._index = index

    @property
    def index(self) -> int:
        return len(self.frames) if self._index is None else self._index

    @index.setter
    def index(self, value: int) -> None:
        self._index = value

    def __reduce__(self) -> tuple[type[FramingError], tuple[object, ...]]:
        return (type(self), (self.args[0], self.offset))


class FrameTooLarge(FramingError):
    """A frame declares a length above the decoder's ``max_frame_size``.

    Raised as soon as the length prefix is read, before any of the payload is buffered.

    Attributes:
        offset: byte offset of the frame's length prefix.
        size: the declared payload length.
        limit: the decoder's ``max_frame_size``.
        complete: whether ``size`` is the whole unit's; False for a v0 line whose newline was not
            seen yet (``size`` is then the bytes so far). Session logs keep it.
    """

    def __init__(
        self,
        message: str,
        offset: int,
        size: int,
        limit: int,
        *,
        frames: list[bytes] | None = None,
        index: int | None = None,
        complete: bool = True,
    ) -> None:
        super().__init__(message, offset, frames=frames, index=index)
        self.size = size
        self.limit = limit
        self.complete = complete

    def __reduce__(self) -> tuple[type[FramingError], tuple[object, ...]]:
        return (type(self), (self.args[0], self.offset, self.size, self.limit))


class EncodeError(SmithFastError, ValueError):
    """A value cannot be encoded on the wire (for example a string with lone surrogates)."""


class ProtocolError(SmithFastError):
    """A peer broke the Smith protocol; ``code`` is the ``smith.v1.ErrorCode`` value to report.

    Attributes:
        code: an ``ErrorCode`` enum value (``smith_fast.pb.smith_pb2.ERROR_CODE_*``).
        request_id: the request the error belongs to, when known.
        details: extra string fields for ``ErrorEvent.details`` (e.g. ``{"reason": "invalid_json"}``).
    """

    def __init__(
        self,
        message: str,
        code: int,
        request_id: str | None = None,
        details: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id
        self.details = details or {}


class ListenError(SmithFastError):
    """A listener cannot be opened as asked (non-loopback without consent, live socket in the way ...)."""


# ---- HTTP ---------------------------------------------------------------------------------------
# The shared HTTP/1.1 server (smith_fast/http: the MCP front, /metrics) and the planner's client.

__all__ += ["HttpRefused", "HeadError", "HttpError"]


class HttpRefused(SmithFastError):
    """A request the HTTP server answers with an error status instead of serving it.

    Attributes:
        status: the HTTP status of the answer.
        close: the connection cannot go on after it (a body left unread, a broken head).
        headers: extra response headers (``WWW-Authenticate``, ``Allow`` ...).
    """

    def __init__(self, status: int, message: str, *, close: bool = False, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.headers = headers


class HeadError(HttpRefused):
    """A request head refused as malformed or ambiguous (or too large): answered, then the
    connection is closed, since where the next request would start is unknown."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message, close=True)


class HttpError(SmithFastError):
    """An HTTP exchange of the client failed below HTTP semantics: bad URL, no connection, a
    malformed, truncated or oversize response.

    Attributes:
        connect: ``True`` when no connection could be made (nothing was sent).
    """

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
