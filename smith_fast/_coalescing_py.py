# cython: language_level=3, annotation_typing=False, boundscheck=True, wraparound=True
"""Batch coalescing: many small messages out as few writes.

:class:`EventBatcher` and :class:`CommandBatcher` gather already-serialized ``Event`` /
``Command`` messages into serialized ``BatchEvent`` / ``BatchCommand`` messages, for peers that
asked for batches (``Envelope.batch_event`` / ``batch_command``). They never build protobuf
objects: a ``BatchEvent`` is, per event, the tag ``0x0A`` (field 1, length-delimited), the
event's length as a varint and the event's bytes, then ``0x10 0x01`` (field 2, varint 1) when
``partial_batch`` is true; ``BatchCommand`` carries ``require_ordering`` as that field 2. This is
exactly what protobuf itself writes for the same message. :class:`WriteCoalescer` does the same
job one level down, for peers that take single envelopes: it joins framed envelopes into one
buffer per write.

This file is both twins: it runs as ``smith_fast._coalescing_py`` and is compiled unchanged by
Cython as ``smith_fast._coalescing_c``, typed by ``csrc/_coalescing_c.pxd``. The
annotations are for readers and type checkers only (``annotation_typing=False`` above), so the
compiled twin accepts and rejects exactly the same arguments, with the same messages.
"""

from __future__ import annotations

import operator
import time

from ._varint import encode as _varint

__all__ = ["CommandBatcher", "EventBatcher", "WriteCoalescer"]

# Field 2, wire type 0 (varint), value 1: BatchEvent.partial_batch / BatchCommand.require_ordering.
_FIELD2_TRUE = b"\x10\x01"
_HEADERS = [bytes((0x0A, n)) for n in range(0x80)]  # field 1, wire type 2, one-byte length


def _header(n: int) -> bytes:
    """Tag and length varint of a field-1 entry of ``n`` bytes; ``n >= 0x80``."""
    return b"\x0a" + _varint(n)


def _as_bytes(data: object) -> bytes:
    """A private ``bytes`` copy of a bytes-like ``data``: the caller may reuse its buffer."""
    return bytes(memoryview(data))  # type: ignore[arg-type]  # a probe: refusing non-buffers is the point


def _positive(value: object, what: str) -> int:
    n = operator.index(value)  # type: ignore[arg-type]  # a probe: refusing non-integers is the point
    if not 1 <= n < 1 << 62:
        raise ValueError(f"{what} must be in [1, 2**62), got {n}")
    return n


class _Batcher:
    """The batching logic shared by :class:`EventBatcher` and :class:`CommandBatcher`.

    A batch is cut when the next message does not fit in it: it already holds ``max_count``
    messages, or the message would take its entries past the byte budget. So every batch that
    :meth:`add` returns has a successor already pending, and the pending batch never holds more
    than one batch's worth.
    """

    __slots__ = (
        "_parts",
        "_count",
        "_size",
        "_deadline",
        "_max_count",
        "_budget",
        "_linger",
        "_more",
        "_last",
    )

    def __init__(
        self, max_count: int, max_bytes: int, linger: float, more: bytes, last: bytes
    ) -> None:
        max_count = _positive(max_count, "max_count")
        max_bytes = _positive(max_bytes, "max_bytes")
        if isinstance(linger, bool) or not isinstance(linger, (int, float)):
            raise TypeError(f"linger must be a number of seconds, got {type(linger).__name__}")
        linger = float(linger)
        if not 0.0 <= linger < float("inf"):
            raise ValueError(f"linger must be a finite number of seconds >= 0, got {linger}")
        self._parts: list[bytes] = []  # header, message, header, message, ...
        self._count: int = 0
        self._size: int = 0  # bytes of the pending entries, trailer excluded
        self._deadline: float = 0.0
        self._max_count: int = max_count
        # Room is kept for the longer trailer, so no batch of two or more messages, whichever
        # trailer it gets, ends up above max_bytes.
        self._budget: int = max_bytes - len(more)
        self._linger: float = linger
        self._more: bytes = more  # trailer of a batch cut while a successor is pending
        self._last: bytes = last  # trailer of the batch that empties the queue

    @property
    def pending(self) -> int:
        """Messages waiting in the pending batch."""
        return self._count

    @property
    def deadline(self) -> float | None:
        """Monotonic time at which the pending batch is due (see :meth:`poll`); None when empty."""
        return self._deadline if self._count else None

    def add(self, message: bytes, now: float | None = None) -> list[bytes]:
        """Queue one serialized message; return the batches this completes.

        Args:
            message: one serialized message (any bytes-like object; it is copied unless it is
                ``bytes``).
            now: the current ``time.monotonic()``; looked up when omitted. Only the first message
                of a batch reads it, to start the linger.

        Returns:
            The serialized batches completed by this call, oldest first: empty, or the pending
            batch that ``message`` did not fit in (with the "more follow" trailer).

        Raises:
            TypeError: ``message`` is not bytes-like, or ``now`` is not a number.
        """
        if type(message) is not bytes:
            message = _as_bytes(message)
        n = len(message)
        header = _HEADERS[n] if n < 0x80 else _header(n)
        size = len(header) + n
        count = self._count
        cut = count != 0 and (count >= self._max_count or self._size + size > self._budget)
        if count == 0 or cut:
            # Read before anything changes, so a bad ``now`` cannot lose the pending batch.
            deadline = (time.monotonic() if now is None else now) + self._linger
            self._deadline = deadline
        out = [self._cut(self._more)] if cut else []
        self._parts.append(header)
        self._parts.append(message)
        self._count += 1
        self._size += size
        return out

    def poll(self, now: float) -> list[bytes]:
        """Return the pending batch if its linger has run out by ``now``.

        Args:
            now: the current ``time.monotonic()``.

        Returns:
            ``[batch]`` when ``now >= deadline``, else ``[]``.
        """
        if self._count and now >= self._deadline:
            return [self._cut(self._last)]
        return []

    def flush(self) -> list[bytes]:
        """Return everything pending, linger or not.

        Returns:
            ``[batch]`` (the pending batch, which never exceeds the bounds), or ``[]``.
        """
        if self._count:
            return [self._cut(self._last)]
        return []

    def _cut(self, trailer: bytes) -> bytes:
        parts = self._parts
        if trailer:
            parts.append(trailer)
        batch = b"".join(parts)
        parts.clear()
        self._count = 0
        self._size = 0
        return batch


class EventBatcher(_Batcher):
    """Gathers serialized ``Event`` messages into serialized ``BatchEvent`` messages.

    A batch holds at most ``max_count`` events and is at most ``max_bytes`` long when serialized;
    an event that alone is too big for ``max_bytes`` still goes out, alone in its batch. Order is
    kept. A batch is cut when the next event does not fit; the batch left pending goes out when
    its linger runs out (:meth:`poll`, due at :attr:`deadline`: ``linger`` seconds after its first
    event) or on :meth:`flush`.

    ``partial_batch`` is true exactly on the batches that :meth:`add` returns: each was cut because
    another event of the same burst was already waiting behind it. The batch that empties the
    queue (from :meth:`poll` or :meth:`flush`) has ``partial_batch`` false, so a receiver can treat
    a run of partial batches and the non-partial one closing it as one burst.

    Args:
        max_count: the most events in one batch (at least 1).
        max_bytes: the longest serialized batch, in bytes (at least 1).
        linger: seconds a batch waits for more events after its first one (at least 0).

    Raises:
        TypeError: ``max_count`` or ``max_bytes`` is not an int, or ``linger`` not a number.
        ValueError: a bound is out of range.
    """

    __slots__ = ()

    def __init__(
        self, max_count: int = 256, max_bytes: int = 64 * 1024, linger: float = 0.001
    ) -> None:
        super().__init__(max_count, max_bytes, linger, _FIELD2_TRUE, b"")


class CommandBatcher(_Batcher):
    """Gathers serialized ``Command`` messages into serialized ``BatchCommand`` messages.

    Bounds, linger and order are those of :class:`EventBatcher`; every batch carries
    ``require_ordering`` as given here (``BatchCommand`` has no ``partial_batch``).

    Args:
        max_count: the most commands in one batch (at least 1).
        max_bytes: the longest serialized batch, in bytes (at least 1).
        linger: seconds a batch waits for more commands after its first one (at least 0).
        require_ordering: the ``require_ordering`` field of every batch.

    Raises:
        TypeError: ``max_count`` or ``max_bytes`` is not an int, or ``linger`` not a number.
        ValueError: a bound is out of range.
    """

    __slots__ = ()

    def __init__(
        self,
        max_count: int = 256,
        max_bytes: int = 64 * 1024,
        linger: float = 0.001,
        require_ordering: bool = True,
    ) -> None:
        trailer = _FIELD2_TRUE if require_ordering else b""
        super().__init__(max_count, max_bytes, linger, trailer, trailer)

    @property
    def require_ordering(self) -> bool:
        """The ``require_ordering`` field written on every batch."""
        return bool(self._last)


class WriteCoalescer:
    """Joins framed envelopes into one buffer per transport write.

    For peers that take one envelope at a time: instead of a ``write()`` per frame, frames are
    gathered and written together once ``max_bytes`` have accumulated, or when the caller flushes
    (typically once per event-loop iteration). Order is kept; frames are not split.

    Args:
        max_bytes: pending bytes at which :meth:`add` hands back the joined buffer (at least 1).

    Raises:
        TypeError: ``max_bytes`` is not an int.
        ValueError: ``max_bytes`` is out of range.
    """

    __slots__ = ("_frames", "_size", "_max")

    def __init__(self, max_bytes: int = 256 * 1024) -> None:
        self._max: int = _positive(max_bytes, "max_bytes")
        self._frames: list[bytes] = []
        self._size: int = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes gathered and not yet handed back."""
        return self._size

    def add(self, frame: bytes) -> bytes | None:
        """Gather one frame; hand everything back once ``max_bytes`` are pending.

        Args:
            frame: bytes to write (any bytes-like object; it is copied unless it is ``bytes``).

        Returns:
            All pending bytes, ``frame`` included, joined into one buffer when they reach
            ``max_bytes``; otherwise None.

        Raises:
            TypeError: ``frame`` is not bytes-like.
        """
        if type(frame) is not bytes:
            frame = _as_bytes(frame)
        self._frames.append(frame)
        self._size += len(frame)
        if self._size >= self._max:
            return self.flush()
        return None

    def flush(self) -> bytes:
        """Hand back everything pending as one buffer (``b""`` when nothing is).

        Returns:
            The pending frames, joined in order.
        """
        frames = self._frames
        if len(frames) == 1:
            data = frames[0]
        else:
            data = b"".join(frames)
        frames.clear()
        self._size = 0
        return data
