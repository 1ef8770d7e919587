# cython: language_level=3, freethreading_compatible=False
"""Shell-output chunking: the compiled twin of ``_chunking_py``.

The kernel walks a ``const unsigned char*`` acquired once per ``feed()``: runs of valid characters
in one tight loop (ASCII 8 and 32 bytes at a time), anything else through a UTF-8 automaton that
follows the decoder's maximal-subpart rule, the newline search with ``memrchr``. Bytes are only
classified once a chunk could be full (more than ``max_chunk / 3`` pending), so the reads of a
quiet tick cost one copy and one decode. When nothing is pending the caller's buffer is walked in
place and only the leftover is kept: by reference for a ``bytes`` read, else copied. Each chunk is
decoded by ``PyUnicode_DecodeUTF8(..., "replace")`` on the byte range the kernel chose, so its text
is exactly what ``_chunking_py`` produces. Behaviour, messages and public API are those of
``_chunking_py``, which is the specification (and the typing source).
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint64_t
from libc.string cimport memcpy, memmove

# Argument checks and error construction are cold: share the twin's so the messages cannot drift.
from smith_fast._chunking_py import DEFAULT_MAX_CHUNK, _check_args, _not_bytes

__all__ = ["DEFAULT_MAX_CHUNK", "OutputChunker"]


cdef extern from "Python.h":
    str PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)


cdef extern from *:
    """
    #if defined(__linux__)
    /* glibc and musl declare memrchr under _GNU_SOURCE, which pyconfig.h defines. */
    #define smith_memrchr(s, c, n) ((const unsigned char *)memrchr((s), (c), (n)))
    #else
    static const unsigned char *smith_memrchr(const unsigned char *s, int c, size_t n) {
        while (n) {
            if (s[--n] == (unsigned char)c) return s + n;
        }
        return NULL;
    }
    #endif
    #define SMITH_ASCII_MASK UINT64_C(0x8080808080808080)
    """
    const uint64_t SMITH_ASCII_MASK  # the high bit of each byte of a 64-bit word
    const unsigned char* smith_memrchr(const unsigned char* s, int c, size_t n) noexcept nogil


cdef enum:
    _FEED = 0
    _DRAIN = 1
    _FLUSH = 2
    _REPLACEMENT = 3  # bytes of U+FFFD in UTF-8
    _MIN_CAPACITY = 4096


cdef inline bint _ascii_word(const unsigned char* p) noexcept nogil:
    """Whether the 8 bytes at ``p`` are all ASCII."""
    cdef uint64_t w
    memcpy(&w, p, 8)  # unaligned-safe; compiles to one load
    return (w & SMITH_ASCII_MASK) == 0


cdef inline bint _ascii_block(const unsigned char* p) noexcept nogil:
    """Whether the 32 bytes at ``p`` are all ASCII."""
    cdef uint64_t w0, w1, w2, w3
    memcpy(&w0, p, 8)
    memcpy(&w1, p + 8, 8)
    memcpy(&w2, p + 16, 8)
    memcpy(&w3, p + 24, 8)
    return ((w0 | w1 | w2 | w3) & SMITH_ASCII_MASK) == 0


cdef inline bint _not_continuation(unsigned char c) noexcept nogil:
    """Whether ``c`` is anything but a continuation byte (10xxxxxx)."""
    return (c ^ 0x80) >= 0x40


cdef inline Py_ssize_t _valid_span(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Length of the longest prefix of ``p[:n]`` made of complete valid characters.

    The hot loop: such characters are one unit each and as long on the wire as in the input, so
    the kernel can take them in bulk. It stops at anything else (an invalid byte, a character
    crossing ``n``) and leaves that unit to ``_unit``.
    """
    cdef Py_ssize_t i = 0
    cdef unsigned char b, c1
    while i < n:
        b = p[i]
        if b < 0x80:
            i += 1
            # One cheap probe first: in mixed text the next non-ASCII byte is usually near.
            if i + 8 <= n and _ascii_word(p + i):
                i += 8
                while i + 32 <= n and _ascii_block(p + i):
                    i += 32
            continue
        if b < 0xE0:
            if b < 0xC2 or i + 1 >= n or _not_continuation(p[i + 1]):
                break
            i += 2
        elif b < 0xF0:
            if i + 2 >= n:
                break
            c1 = p[i + 1]
            if (_not_continuation(c1) or _not_continuation(p[i + 2])
                    or (b == 0xE0 and c1 < 0xA0) or (b == 0xED and c1 > 0x9F)):
                break
            i += 3
        else:
            if b > 0xF4 or i + 3 >= n:
                break
            c1 = p[i + 1]
            if (_not_continuation(c1) or _not_continuation(p[i + 2]) or _not_continuation(p[i + 3])
                    or (b == 0xF0 and c1 < 0x90) or (b == 0xF4 and c1 > 0x8F)):
                break
            i += 4
    return i


cdef inline Py_ssize_t _unit(const unsigned char* p, Py_ssize_t avail, Py_ssize_t* cost) noexcept nogil:
    """Length of the unit at ``p`` (``avail >= 1`` bytes visible), 0 if it is an open prefix.

    ``cost`` receives its size on the wire. The second-byte ranges are those of Unicode Table 3-7
    (no overlongs, no surrogates, nothing above U+10FFFF); the first byte that breaks the pattern
    ends a maximal invalid subpart, which becomes one U+FFFD, as in CPython's decoder.
    """
    cdef unsigned char b = p[0]
    cdef unsigned char lo = 0x80, hi = 0xBF
    cdef Py_ssize_t need, i
    if b < 0x80:
        cost[0] = 1
        return 1
    cost[0] = _REPLACEMENT
    if b < 0xC2 or b > 0xF4:
        return 1
    if b < 0xE0:
        need = 2
    elif b < 0xF0:
        need = 3
        if b == 0xE0:
            lo = 0xA0
        elif b == 0xED:
            hi = 0x9F
    else:
        need = 4
        if b == 0xF0:
            lo = 0x90
        elif b == 0xF4:
            hi = 0x8F
    for i in range(1, need):
        if i == avail:
            return 0
        if p[i] < lo or p[i] > hi:
            return i
        lo = 0x80
        hi = 0xBF
    cost[0] = need
    return need


cdef inline Py_ssize_t _open_tail(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Length of the open prefix that ends ``p[:n]``, 0 if there is none; ``p`` starts a unit.

    Bytes C2..F4 are never inside another unit, so the last non-continuation byte among the
    final 3 starts the last unit, and ``_unit`` tells whether that unit is still open.
    """
    cdef Py_ssize_t q = n, cost
    while q > 0 and n - q < 3:
        q -= 1
        if _not_continuation(p[q]):
            return n - q if _unit(p + q, n - q, &cost) == 0 else 0
    return 0


@cython.final
cdef class OutputChunker:
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

    # The pending bytes are either _buf[_start:_end], or, when _held is not None (and _buf is
    # then empty), _held[_hstart:]: the tail of a caller's immutable bytes object, kept by
    # reference instead of copied. _held is kept only while at least half of it is pending.
    cdef unsigned char* _buf
    cdef Py_ssize_t _cap, _start, _end
    cdef bytes _held
    cdef Py_ssize_t _hstart
    cdef Py_ssize_t _scan  # the first _scan pending bytes are closed units that fit in one chunk
    cdef Py_ssize_t _out  # their size on the wire
    cdef Py_ssize_t _max, _window

    def __cinit__(self):
        self._buf = NULL
        self._held = None
        self._cap = self._start = self._end = self._hstart = self._scan = self._out = 0

    def __dealloc__(self):
        PyMem_Free(self._buf)

    def __init__(self, max_chunk=DEFAULT_MAX_CHUNK, newline_window=None):
        self._max, self._window = _check_args(max_chunk, newline_window)
        self._release()

    @property
    def max_chunk(self):
        """The largest chunk, in UTF-8 bytes."""
        return self._max

    @property
    def newline_window(self):
        """How many bytes back from the limit a newline is looked for."""
        return self._window

    @property
    def pending(self):
        """Bytes held: at most ``max_chunk + 3`` after ``feed``, at most 3 after ``drain``."""
        return self._pending()

    def feed(self, data):
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
        cdef Py_buffer view
        cdef list chunks = []
        cdef Py_ssize_t used
        try:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        except (TypeError, BufferError):
            raise _not_bytes(data) from None
        try:
            if self._pending() == 0:
                # Nothing pending: walk the caller's bytes where they are, keep only the leftover.
                used = self._run(<const unsigned char*>view.buf, view.len, chunks, _FEED)
                if used < view.len and PyBytes_CheckExact(data):
                    self._held = data
                    self._hstart = 0
                    self._take(used)
                else:
                    self._append(<const unsigned char*>view.buf + used, view.len - used)
            else:
                if self._held is not None:
                    self._unhold()
                self._append(<const unsigned char*>view.buf, view.len)
                self._take(self._run(self._buf + self._start, self._end - self._start, chunks, _FEED))
        finally:
            PyBuffer_Release(&view)
        return chunks

    def drain(self):
        """Return everything pending as chunks, except an incomplete character at the end.

        Call it at the end of each event-loop tick: the reads of that tick leave as one chunk
        (or more, if they exceed ``max_chunk``). The bytes kept back (at most 3) are a valid
        beginning of a character whose remaining bytes have not arrived yet.

        Returns:
            The chunks, possibly none.
        """
        cdef list chunks = []
        cdef Py_ssize_t n = self._pending()
        if n:
            self._take(self._run(self._head(), n, chunks, _DRAIN))
        return chunks

    def flush(self):
        """End the stream: return everything pending as chunks and reset the chunker.

        An incomplete character at the end becomes one U+FFFD, as in a whole-stream decode.
        The chunker can then start a new stream.

        Returns:
            The chunks, possibly none.
        """
        cdef list chunks = []
        cdef Py_ssize_t n = self._pending()
        if n:
            self._run(self._head(), n, chunks, _FLUSH)
        self._release()
        return chunks

    cdef void _release(self) noexcept:
        PyMem_Free(self._buf)
        self._buf = NULL
        self._held = None
        self._cap = self._start = self._end = self._hstart = self._scan = self._out = 0

    cdef inline Py_ssize_t _pending(self) noexcept:
        if self._held is not None:
            return PyBytes_GET_SIZE(self._held) - self._hstart
        return self._end - self._start

    cdef inline const unsigned char* _head(self) noexcept:
        if self._held is not None:
            return <const unsigned char*>PyBytes_AS_STRING(self._held) + self._hstart
        return self._buf + self._start

    cdef int _take(self, Py_ssize_t used) except -1:
        """Drop the first ``used`` pending bytes: the chunks made of them have been returned."""
        cdef Py_ssize_t size
        if self._held is None:
            self._start += used
            if self._start == self._end:
                self._start = self._end = 0  # refill from the front: no compaction later
            return 0
        self._hstart += used
        size = PyBytes_GET_SIZE(self._held)
        if 2 * (size - self._hstart) < size:
            self._unhold()  # never keep a big object alive for a few pending bytes
        return 0

    cdef int _unhold(self) except -1:
        """Copy the held bytes into the buffer and let the caller's object go."""
        held = self._held
        self._held = None
        self._append(<const unsigned char*>PyBytes_AS_STRING(held) + self._hstart,
                     PyBytes_GET_SIZE(held) - self._hstart)
        return 0

    cdef int _append(self, const unsigned char* p, Py_ssize_t n) except -1:
        """Copy ``p[:n]`` after the pending bytes, sliding or growing the buffer as needed."""
        cdef Py_ssize_t live = self._end - self._start
        cdef Py_ssize_t cap
        cdef unsigned char* fresh
        if self._end + n > self._cap:
            if live + n <= self._cap // 2:
                # Half the buffer is free after the slide, so slides cost O(1) per byte appended.
                memmove(self._buf, self._buf + self._start, live)
            else:
                cap = 2 * (live + n)
                if cap < _MIN_CAPACITY:
                    cap = _MIN_CAPACITY
                fresh = <unsigned char*>PyMem_Malloc(cap)
                if fresh == NULL:
                    raise MemoryError()
                if live:
                    memcpy(fresh, self._buf + self._start, live)
                PyMem_Free(self._buf)
                self._buf = fresh
                self._cap = cap
            self._start = 0
            self._end = live
        if n:
            memcpy(self._buf + self._end, p, n)
            self._end += n
        return 0

    cdef Py_ssize_t _run(self, const unsigned char* p, Py_ssize_t n, list chunks, int mode) except -1:
        """Walk ``p[:n]`` (``p[0]`` starts the next chunk) from ``_scan``, cutting chunks.

        Returns how many bytes of ``p`` the chunks took; ``_scan``/``_out`` are left relative to
        the first byte not taken.
        """
        cdef Py_ssize_t limit = self._max
        cdef Py_ssize_t start = 0, scan = self._scan, out = self._out
        cdef Py_ssize_t step, cost = 0, cut
        if out + _REPLACEMENT * (n - scan) <= limit:
            # No unit costs more than 3 wire bytes per input byte, so no chunk can be full yet:
            # feed need not classify the new bytes, and drain or flush emit them all as one chunk
            # after looking at the last 3 bytes only. Same result as the walk below, far fewer
            # passes over the bytes when the reads of a tick are smaller than max_chunk / 3.
            if mode == _FEED:
                return 0
            if mode == _DRAIN:
                n -= _open_tail(p + scan, n - scan)
            if n:
                chunks.append(PyUnicode_DecodeUTF8(<const char*>p, n, "replace"))
            self._scan = self._out = 0
            return n
        while True:
            step = n - scan
            if step > limit - out:
                step = limit - out
            step = _valid_span(p + scan, step)
            scan += step
            out += step
            if scan == n:
                break
            step = _unit(p + scan, n - scan, &cost)
            if step == 0:
                if mode != _FLUSH:
                    break
                # End of stream: the open prefix is one U+FFFD, as a final decode makes it.
                step = n - scan
                cost = _REPLACEMENT
            if out + cost > limit:
                cut = self._cut(p, start, scan)
                chunks.append(PyUnicode_DecodeUTF8(<const char*>p + start, cut - start, "replace"))
                # After a newline cut, the units between it and the limit are walked again.
                start = scan = cut
                out = 0
            else:
                scan += step
                out += cost
        if mode != _FEED and scan > start:
            chunks.append(PyUnicode_DecodeUTF8(<const char*>p + start, scan - start, "replace"))
            start = scan
            out = 0
        self._scan = scan - start
        self._out = out
        return start

    cdef inline Py_ssize_t _cut(self, const unsigned char* p, Py_ssize_t start, Py_ssize_t limit) noexcept:
        """Where the chunk starting at ``start`` ends, given that the unit at ``limit`` does not fit."""
        cdef Py_ssize_t lo
        cdef const unsigned char* nl
        if self._window:
            lo = limit - self._window
            if lo < start:
                lo = start
            nl = smith_memrchr(p + lo, 0x0A, <size_t>(limit - lo))
            if nl != NULL:
                return nl - p + 1
            # The 1-byte "\n" did not fit, so the chunk holds max_chunk >= 4 wire bytes: moving
            # back over the 1-byte "\r" never empties it.
            if p[limit - 1] == 0x0D and p[limit] == 0x0A:
                return limit - 1
        return limit
