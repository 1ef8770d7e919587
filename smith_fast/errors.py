"""The exceptions smith-fast raises: one small hierarchy under :class:`SmithFastError`.

Both twins of every wire-core module raise these exact classes with the exact same messages, so
callers can catch them without knowing which implementation is active.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .pb import smith_pb2 as pb

__all__ = [
    "SmithFastError",
    "FramingError",
    "FrameTooLarge",
    "EncodeError",
    "ProtocolError",
    "ListenError",
    # client and NATS
    "SmithError",
    "ConnectionClosed",
    "ConnectError",
    "NotASmithService",
    "AddressError",
    "GatewayIdInUse",
    "PublishError",
    "PayloadTooLarge",
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


# ---- client and NATS ------------------------------------------------------------------------------


class SmithError(SmithFastError):
    """The service answered a request with an ``ErrorEvent`` (raised by the client, ``smith_fast.client``).

    Attributes:
        code: the ``ErrorCode`` value; ``code_name`` its name (``ERROR_CODE_EXECUTION_TIMEOUT`` ...).
        request_id: the request it concerns, if any.
        details: ``ErrorEvent.details``.
    """

    def __init__(self, error: pb.ErrorEvent) -> None:
        from .pb import smith_pb2  # here, not at the top: the wire core raises these errors without protobuf loaded

        name = smith_pb2.ErrorCode.Name(error.error_code)
        super().__init__(f"{name}: {error.message}")
        self.code = error.error_code
        self.code_name = name
        self.request_id = error.request_id if error.HasField("request_id") else None
        self.details = dict(error.details)
        self.error = error


class ConnectionClosed(SmithFastError):
    """The connection ended before the awaited answer arrived."""


class ConnectError(ConnectionClosed, ConnectionError):
    """The service cannot be reached; the message names the address and says what to check.

    A :class:`ConnectionClosed` (what a handshake on a dead connection raised before) and an
    ``OSError`` (what connecting raised before), so that existing handlers of either still apply.
    """


class NotASmithService(ConnectError):
    """Something answers at the address, but not the Smith protocol (an HTTP server, a gRPC port
    reached as a socket, the metrics port ...), or nothing answered the handshake in time."""


class AddressError(SmithFastError, ValueError):
    """An address that is none of ``smith_fast.client.ADDRESS_FORMS``."""


class GatewayIdInUse(SmithFastError):
    """Another gateway process runs with this ``--gateway-id`` on the same NATS."""


class PublishError(SmithFastError):
    """A JetStream publish was refused for good (the stream is full ...) or timed out for good.

    Attributes:
        code: the JetStream API error code (``err_code``), or 0 for a timeout.
        status: the HTTP-like status (``code``), or 0.
    """

    def __init__(self, message: str, code: int = 0, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class PayloadTooLarge(PublishError):
    """A message larger than the NATS server's ``max_payload``: it can never be published (the
    server would close the connection on it), so it is failed at once and never retried.

    Attributes:
        size: the message's payload plus its header block, in bytes.
        limit: the server's ``max_payload`` (its INFO, as the connection last received it).
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the message is {size} bytes with its headers, over the NATS server's max_payload of {limit} bytes"
        )
        self.size = size
        self.limit = limit
