# cython: language_level=3, freethreading_compatible=False
"""Varint-delimited framing of protobuf messages: the compiled twin of ``_framing_py``.

The kernel walks a ``const unsigned char*`` acquired once per ``feed()``; a frame that spans
several feeds is gathered straight into the ``bytes`` object that is finally returned, so its
payload is copied exactly once. Behaviour, messages and public API are those of ``_framing_py``,
which is the specification (and the typing source).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_XDECREF, Py_XINCREF
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

# Error construction is cold: share the twin's builders so the messages cannot drift.
from smith_fast._framing_py import (
    DEFAULT_MAX_FRAME_SIZE,
    MAX_VARINT_LENGTH,
    _not_bytes,
    _too_large,
    _too_long,
    _too_wide,
)
from smith_fast.errors import FramingError

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

cdef extern from "Python.h":
    int _PyBytes_Resize(PyObject** string, Py_ssize_t newsize) except -1

cdef enum:
    _MAXLEN = 10
    _LOW_GROUPS = 5  # groups 0..4 hold bits 0..34; any set bit past them means >= 2**35
    _MIN_GATHER = 16 * 1024  # the first allocation of a frame that spans feeds, if it is larger


cdef inline int _prefix(const unsigned char* p, Py_ssize_t avail, uint64_t limit,
                        uint64_t offset, Py_ssize_t* hdr, uint64_t* size) except -1:
    """Parse a length prefix; 1 and ``hdr``/``size`` set when complete, 0 when more bytes are needed."""
    cdef uint64_t value = 0
    cdef bint wide = False
    cdef Py_ssize_t i
    cdef Py_ssize_t stop = avail if avail < _MAXLEN else _MAXLEN
    cdef unsigned char b
    for i in range(stop):
        b = p[i]
        if i < _LOW_GROUPS:
            value |= (<uint64_t>(b & 0x7F)) << (7 * i)
        elif b & 0x7F:
            wide = True
        if b < 0x80:
            if wide or value > 0xFFFFFFFF:
                raise _too_wide(offset)
            if value > limit:
                raise _too_large(offset, value, limit)
            hdr[0] = i + 1
            size[0] = value
            return 1
    if stop == _MAXLEN:
        raise _too_long(offset)
    return 0


cdef class FrameDecoder:
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

    cdef uint64_t _max
    cdef unsigned char _pre[_MAXLEN]  # a length prefix split across feeds
    cdef Py_ssize_t _pre_len
    cdef object _frame  # the bytes object being filled (its size is its capacity), or None
    cdef Py_ssize_t _hdr, _size, _filled, _cap
    cdef uint64_t _offset  # stream offset of the pending frame's first byte
    cdef object _error

    def __init__(self, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
        if not 0 <= max_frame_size < (1 << 32):
            raise ValueError(f"max_frame_size must be in [0, 2**32), got {max_frame_size}")
        self._max = max_frame_size
        self._pre_len = 0
        self._frame = None
        self._hdr = self._size = self._filled = self._cap = 0
        self._offset = 0
        self._error = None

    @property
    def max_frame_size(self):
        """The largest payload length this decoder accepts."""
        return self._max

    @property
    def offset(self):
        """Stream offset of the first byte not yet returned as part of a complete frame."""
        return self._offset

    @property
    def buffered(self):
        """Bytes held for the frame that is not complete yet (none once the decoder has failed)."""
        if self._frame is not None:
            return self._hdr + self._filled
        return self._pre_len

    @property
    def pending_size(self):
        """The declared payload length of the frame that is not complete yet; 0 when none is."""
        return self._size if self._frame is not None else 0

    def feed(self, data):
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
        cdef Py_buffer view
        cdef list frames = []
        if self._error is not None:
            self._error.frames = []
            raise self._error
        try:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        except (TypeError, BufferError):
            raise _not_bytes(data) from None
        try:
            self._feed(<const unsigned char*>view.buf, view.len, frames)
        except FramingError as exc:
            exc.frames = frames
            self._error = exc
            self._frame = None  # a failed stream is never resumed: let its bytes go
            self._pre_len = 0
            raise
        finally:
            PyBuffer_Release(&view)
        return frames

    cdef Py_ssize_t _start(self, const unsigned char* p, Py_ssize_t avail, Py_ssize_t hdr,
                           Py_ssize_t size, list frames) except -1:
        """Begin a frame whose prefix is parsed; returns the bytes of ``p`` it consumed."""
        if avail >= size:
            frames.append(PyBytes_FromStringAndSize(<const char*>p, size))
            self._offset += hdr + size
            return size
        # Room for what arrived, not for what the prefix declares: a peer that declares 16 MiB
        # and sends a few bytes costs a few bytes (the frame grows as its bytes arrive, _grow).
        cdef Py_ssize_t cap = 2 * avail
        if cap < _MIN_GATHER:
            cap = _MIN_GATHER
        if cap > size:
            cap = size
        self._frame = PyBytes_FromStringAndSize(NULL, cap)
        memcpy(PyBytes_AS_STRING(self._frame), p, avail)
        self._hdr = hdr
        self._size = size
        self._filled = avail
        self._cap = cap
        return avail

    cdef int _grow(self, Py_ssize_t need) except -1:
        """Make the pending frame hold at least ``need`` bytes: doubling, at most its declared size.

        The bytes object is private to the decoder until it is returned (one reference), so it is
        resized in place (realloc; large blocks are remapped, not copied) rather than gathered in a
        second buffer and copied out at the end."""
        cdef Py_ssize_t cap = 2 * self._cap
        if cap < need:
            cap = need
        if cap > self._size:
            cap = self._size
        cdef PyObject* raw = <PyObject*>self._frame
        Py_XINCREF(raw)  # our own reference, so dropping the attribute's leaves exactly one
        self._frame = None
        _PyBytes_Resize(&raw, cap)  # on failure it frees the object and raises MemoryError
        self._frame = <object>raw
        Py_XDECREF(raw)
        self._cap = cap
        return 0

    cdef int _feed(self, const unsigned char* p, Py_ssize_t n, list frames) except -1:
        cdef Py_ssize_t pos = 0, take, hdr = 0
        cdef uint64_t size = 0
        cdef unsigned char b
        cdef uint64_t limit = self._max
        if self._frame is not None:
            take = self._size - self._filled
            if take > n:
                take = n
            if self._filled + take > self._cap:
                self._grow(self._filled + take)
            memcpy(PyBytes_AS_STRING(self._frame) + self._filled, p, take)
            self._filled += take
            if self._filled < self._size:
                return 0
            frames.append(self._frame)
            self._frame = None
            self._offset += self._hdr + self._size
            pos = take
        elif self._pre_len:
            take = _MAXLEN - self._pre_len
            if take > n:
                take = n
            memcpy(self._pre + self._pre_len, p, take)
            if not _prefix(self._pre, self._pre_len + take, limit, self._offset, &hdr, &size):
                self._pre_len += take
                return 0
            pos = hdr - self._pre_len
            self._pre_len = 0
            pos += self._start(p + pos, n - pos, hdr, size, frames)
            if self._frame is not None:
                return 0
        while pos < n:
            b = p[pos]
            if b < 0x80 and b <= limit:
                hdr = 1
                size = b
            elif not _prefix(p + pos, n - pos, limit, self._offset, &hdr, &size):
                memcpy(self._pre, p + pos, n - pos)
                self._pre_len = n - pos
                return 0
            pos += hdr
            pos += self._start(p + pos, n - pos, hdr, size, frames)
        return 0


def varint_size(value):
    """Number of bytes of ``value`` (a non-negative int below 2**64) as a base-128 varint."""
    return _varint_size(value)


cdef inline Py_ssize_t _varint_size(uint64_t value) noexcept:
    cdef Py_ssize_t n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


cdef inline Py_ssize_t _write_varint(char* out, uint64_t value) noexcept:
    cdef Py_ssize_t i = 0
    while value >= 0x80:
        out[i] = <char>((value & 0x7F) | 0x80)
        value >>= 7
        i += 1
    out[i] = <char>value
    return i + 1


def encode_varint(value):
    """Encode a non-negative integer below ``2**64`` as a base-128 varint.

    Raises:
        OverflowError: ``value`` is negative or does not fit in 64 bits.
    """
    cdef char out[_MAXLEN]
    if value < 0 or value >> 64:
        raise OverflowError(f"varint value must be in [0, 2**64), got {value}")
    return PyBytes_FromStringAndSize(out, _write_varint(out, value))


def encode_frame(message):
    """Return ``message`` preceded by its length as a varint: one delimited frame."""
    cdef Py_buffer view
    PyObject_GetBuffer(message, &view, PyBUF_SIMPLE)
    try:
        out = PyBytes_FromStringAndSize(NULL, _varint_size(view.len) + view.len)
        _write_frame(PyBytes_AS_STRING(out), <const char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


cdef inline Py_ssize_t _write_frame(char* out, const char* src, Py_ssize_t n) noexcept:
    cdef Py_ssize_t k = _write_varint(out, n)
    memcpy(out + k, src, n)
    return k + n


cdef Py_ssize_t _framed_size(list messages) except -1:
    cdef Py_ssize_t total = 0, n
    cdef Py_buffer view
    for m in messages:
        if PyBytes_CheckExact(m):
            n = PyBytes_GET_SIZE(m)
        else:
            PyObject_GetBuffer(m, &view, PyBUF_SIMPLE)
            n = view.len
            PyBuffer_Release(&view)
        total += _varint_size(n) + n
    return total


cdef Py_ssize_t _write_frames(char* out, list messages) except -1:
    cdef Py_ssize_t pos = 0
    cdef Py_buffer view
    for m in messages:
        if PyBytes_CheckExact(m):
            pos += _write_frame(out + pos, PyBytes_AS_STRING(m), PyBytes_GET_SIZE(m))
        else:
            PyObject_GetBuffer(m, &view, PyBUF_SIMPLE)
            pos += _write_frame(out + pos, <const char*>view.buf, view.len)
            PyBuffer_Release(&view)
    return pos


def encode_frames(messages):
    """Frame every message and join them into one buffer, ready for a single write."""
    cdef list items = messages if type(messages) is list else list(messages)
    out = PyBytes_FromStringAndSize(NULL, _framed_size(items))
    _write_frames(PyBytes_AS_STRING(out), items)
    return out


def encode_into(messages, bytearray buffer, Py_ssize_t offset=0):
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
    cdef list items = messages if type(messages) is list else list(messages)
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buffer)
    if offset == -1:
        offset = size
    elif not 0 <= offset <= size:
        raise ValueError(f"offset {offset} is outside the buffer (length {size})")
    cdef Py_ssize_t end = offset + _framed_size(items)
    PyByteArray_Resize(buffer, end)
    _write_frames(PyByteArray_AS_STRING(buffer) + offset, items)
    return end
