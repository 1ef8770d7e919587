# cython: language_level=3, freethreading_compatible=False
"""Request ids and terminal states read off relayed v1 bytes: the compiled twin of ``_relaypeek_py``.

The walk runs on a ``const unsigned char*`` acquired once per call, with no object made but the ids
it returns. It follows the one span of each message the normal encoders write; a message field
sent again (which the runtime merges with the earlier one) is rare enough to hand the whole frame
to the Python twin, which reads merged messages. Behaviour and public API are those of
``_relaypeek_py``, which is the specification (and the typing source).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint32_t, uint64_t

# The merged-message reader and the error builder are the twin's, so the two cannot drift.
from smith_fast._relaypeek_py import _frame_marks, _not_bytes
from smith_fast._relaypeek_py import batch_size as _merged_batch_size
from smith_fast._relaypeek_py import command_ids as _merged_command_ids

__all__ = ["batch_size", "command_ids", "event_marks", "tool_call"]

cdef enum:
    _OK = 0
    _BAD = 1  # bytes the runtime would refuse
    _MERGED = 2  # a message field sent again: the Python twin reads the frame
    _DEPTH = 100  # upb's: groups nested 100 deep in an Envelope, one less per message level

# Oneof members and field sets as bit masks over field numbers (all below 32)
cdef enum:
    _PAYLOADS = (1 << 10) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 14) | (1 << 16) | (1 << 17) | (1 << 18)
    _COMMAND_MEMBERS = 0xFFFE  # 1..15
    _REQUESTS = ((1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 10) | (1 << 11)
                 | (1 << 12) | (1 << 13) | (1 << 14) | (1 << 15))  # ... attach, checkpoint, restore, diff, undo
    _EVENT_MEMBERS = 0xFFE  # 1..11 (a WorkspaceEvent, 11, ends no request: its READY does)
    _TIMESTAMP = 1
    _SEQUENCE = 2
    _COMMAND = 10
    _TOOL_CALL = 3
    _EVENT = 11
    _BATCH_COMMAND = 12
    _BATCH_EVENT = 13
    _STATE_CHANGE = 2

ctypedef const unsigned char* Bytes


cdef struct Field:
    uint32_t number
    int wire  # 0 or 2: the others are stepped over
    uint64_t value
    Py_ssize_t a, b  # the span of a length-delimited value


cdef inline bint _member(uint32_t number, uint32_t mask) noexcept nogil:
    return number < 32 and (mask >> number) & 1


cdef inline bint _varint(Bytes p, Py_ssize_t* pos, Py_ssize_t end, int most, uint64_t* out) noexcept nogil:
    """The varint at ``p[pos]`` of at most ``most`` bytes, cut to 64 bits; False when it is longer
    or runs off the end."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef Py_ssize_t i = pos[0]
    cdef Py_ssize_t stop = i + most
    cdef unsigned char b
    if stop > end:
        stop = end
    while i < stop:
        b = p[i]
        i += 1
        value |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            pos[0] = i
            out[0] = value
            return True
        shift += 7
    return False


cdef int _skip(Bytes p, Py_ssize_t* pos, Py_ssize_t end, uint32_t number, int wire, int depth) noexcept nogil:
    """Step over the value of a field of wire type 1, 5 or 3 (a group, to its end tag); -1 when malformed."""
    cdef uint64_t tag, value
    cdef uint32_t inner
    if wire == 1 or wire == 5:
        value = 8 if wire == 1 else 4
        if <uint64_t>(end - pos[0]) < value:
            return -1
        pos[0] += value
        return 0
    if wire != 3 or depth == 0:  # an end tag without its start, wire types 6 and 7; too deep
        return -1
    while True:
        if pos[0] >= end:
            return -1
        if not _varint(p, pos, end, 5, &tag) or tag > 0xFFFFFFFFULL:
            return -1
        inner = <uint32_t>(tag >> 3)
        wire = tag & 7
        # field number 0 inside a skipped group: upb steps over it like any other (only a message's
        # own fields may not be 0), so the peek does too, or it would stop where the runtime reads on
        if wire == 4:
            return 0 if inner == number else -1
        if wire == 0:
            if not _varint(p, pos, end, 10, &value):
                return -1
        elif wire == 2:
            if not _varint(p, pos, end, 5, &value) or value > <uint64_t>(end - pos[0]):
                return -1
            pos[0] += value
        elif _skip(p, pos, end, inner, wire, depth - 1) < 0:
            return -1


cdef int _field(Bytes p, Py_ssize_t* pos, Py_ssize_t end, Field* f) noexcept nogil:
    """The field at ``p[pos:end]`` into ``f``: 1 for a varint or a length-delimited one (its value
    read); 2 for another wire type (``f.wire``; ``pos`` past its tag only); 0 at the end; -1 when
    malformed."""
    cdef uint64_t tag, size
    cdef int wire
    if pos[0] >= end:
        return 0
    tag = p[pos[0]]
    if tag < 0x80:
        pos[0] += 1
    elif not _varint(p, pos, end, 5, &tag) or tag > 0xFFFFFFFFULL:
        return -1
    f.number = <uint32_t>(tag >> 3)
    wire = tag & 7
    f.wire = wire
    if wire == 2:
        if not _varint(p, pos, end, 5, &size) or size > <uint64_t>(end - pos[0]):
            return -1
        f.a = pos[0]
        f.b = pos[0] + <Py_ssize_t>size
        pos[0] = f.b
        return 1
    if wire == 0:
        return 1 if _varint(p, pos, end, 10, &f.value) else -1
    return 2


cdef int _next(Bytes p, Py_ssize_t* pos, Py_ssize_t end, int depth, Field* f) noexcept nogil:
    """The next varint or length-delimited field of ``p[pos:end]`` into ``f``: 1; 0 at the end; -1
    when malformed. Fixed-width fields and groups are stepped over."""
    cdef int r
    while True:
        r = _field(p, pos, end, f)
        if r <= 0:
            return r
        if f.number == 0:
            return -1
        if r == 1:
            return 1
        if _skip(p, pos, end, f.number, f.wire, depth) < 0:
            return -1


cdef int _oneof(Bytes p, Py_ssize_t start, Py_ssize_t end, int depth, uint32_t members,
                uint32_t* chosen, int* runs, Py_ssize_t* a, Py_ssize_t* b) noexcept nogil:
    """The oneof member the message ``p[start:end]`` ends with, how many times it came since it was
    chosen, and the span of its last value; ``_BAD`` when malformed."""
    cdef Field f
    cdef Py_ssize_t pos = start
    cdef int r
    chosen[0] = 0
    runs[0] = 0
    while True:
        r = _next(p, &pos, end, depth, &f)
        if r == 0:
            return _OK
        if r < 0:
            return _BAD
        if f.wire == 2 and _member(f.number, members):
            if f.number != chosen[0]:
                chosen[0] = f.number
                runs[0] = 0
            runs[0] += 1
            a[0] = f.a
            b[0] = f.b


cdef int _envelope(Bytes p, Py_ssize_t start, Py_ssize_t end, uint64_t* sequence,
                   uint32_t* chosen, int* runs, Py_ssize_t* a, Py_ssize_t* b) noexcept nogil:
    """An Envelope: its sequence, its payload member, how often it came, its last span."""
    cdef Field f
    cdef Py_ssize_t pos = start
    cdef int r
    sequence[0] = 0
    chosen[0] = 0
    runs[0] = 0
    while True:
        r = _next(p, &pos, end, _DEPTH, &f)
        if r == 0:
            return _OK
        if r < 0:
            return _BAD
        if f.wire == 2:
            if _member(f.number, _PAYLOADS):
                if f.number != chosen[0]:
                    chosen[0] = f.number
                    runs[0] = 0
                runs[0] += 1
                a[0] = f.a
                b[0] = f.b
        elif f.number == _SEQUENCE:
            sequence[0] = f.value


cdef object _text(Bytes p, Field* f):
    """The UTF-8 text of ``f``'s span; None when it is not valid UTF-8 (the runtime refuses the
    message: every occurrence of a string field is checked, not only the last)."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p + f.a, f.b - f.a, NULL)
    except UnicodeDecodeError:
        return None


cdef int _request_id(Bytes p, Py_ssize_t start, Py_ssize_t end, int depth, list ids) except -1:
    """A Command in ``p[start:end]``: appends its request's id (when it is a request with one)."""
    cdef uint32_t chosen
    cdef int runs, r
    cdef Py_ssize_t a = 0, b = 0
    cdef Field f
    cdef object rid = ""
    if _oneof(p, start, end, depth, _COMMAND_MEMBERS, &chosen, &runs, &a, &b) != _OK:
        return _BAD
    if not _member(chosen, _REQUESTS):
        return _OK
    if runs > 1:
        return _MERGED
    start = a
    while True:
        r = _next(p, &start, b, depth - 1, &f)
        if r == 0:
            break
        if r < 0:
            return _BAD
        if f.number == 1 and f.wire == 2:
            rid = _text(p, &f)
            if rid is None:
                return _BAD
    if rid:
        ids.append(rid)
    return _OK


ctypedef int (*_Reader)(Bytes p, Py_ssize_t start, Py_ssize_t end, int depth, list out) except -1


cdef int _members(Bytes p, uint32_t chosen, int runs, Py_ssize_t a, Py_ssize_t b, uint32_t one, uint32_t batch,
                  _Reader read, list out) except -1:
    """``read`` the Envelope member ``one`` in ``p[a:b]``, or each element of the member ``batch``:
    the shape a command and an event share (alone, or in a Batch*)."""
    cdef Field f
    cdef int r
    if chosen != one and chosen != batch:
        return _OK
    if runs > 1:
        return _MERGED
    if chosen == one:
        return read(p, a, b, _DEPTH - 1, out)
    while True:
        r = _next(p, &a, b, _DEPTH - 1, &f)
        if r == 0:
            return _OK
        if r < 0:
            return _BAD
        if f.number == 1 and f.wire == 2:
            r = read(p, f.a, f.b, _DEPTH - 2, out)
            if r != _OK:
                return r


cdef int _ids(Bytes p, Py_ssize_t n, list ids) except -1:
    cdef uint64_t sequence
    cdef uint32_t chosen
    cdef int runs
    cdef Py_ssize_t a = 0, b = 0
    if _envelope(p, 0, n, &sequence, &chosen, &runs, &a, &b) != _OK:
        return _BAD
    return _members(p, chosen, runs, a, b, _COMMAND, _BATCH_COMMAND, _request_id, ids)


cdef int _count(Bytes p, Py_ssize_t n, Py_ssize_t* count) noexcept nogil:
    """The elements of the Envelope's BatchCommand into ``count`` (-1: no batch)."""
    cdef uint64_t sequence
    cdef uint32_t chosen
    cdef int runs, r
    cdef Py_ssize_t a = 0, b = 0
    cdef Field f
    if _envelope(p, 0, n, &sequence, &chosen, &runs, &a, &b) != _OK:
        return _BAD
    count[0] = -1
    if chosen != _BATCH_COMMAND:
        return _OK
    if runs > 1:
        return _MERGED
    count[0] = 0
    while True:
        r = _next(p, &a, b, _DEPTH - 1, &f)
        if r == 0:
            return _OK
        if r < 0:
            return _BAD
        if f.number == 1 and f.wire == 2:
            count[0] += 1


cdef int _terminal(Bytes p, Py_ssize_t start, Py_ssize_t end, int depth, list ended) except -1:
    """An Event in ``p[start:end]``: appends the request id its terminal state ends, if it is one."""
    cdef uint32_t chosen
    cdef int runs, r
    cdef Py_ssize_t a = 0, b = 0
    cdef Field f
    cdef object rid = ""
    cdef uint64_t state = 0
    if _oneof(p, start, end, depth, _EVENT_MEMBERS, &chosen, &runs, &a, &b) != _OK:
        return _BAD
    if chosen != _STATE_CHANGE:
        return _OK
    if runs > 1:
        return _MERGED
    while True:
        r = _next(p, &a, b, depth - 1, &f)
        if r == 0:
            break
        if r < 0:
            return _BAD
        if f.number == 1:
            if f.wire == 2:
                rid = _text(p, &f)
                if rid is None:
                    return _BAD
        elif f.number == 2 and f.wire == 0:
            state = f.value & 0xFFFFFFFFULL  # an enum is an int32
    if (state == 2 or state == 4) and rid:  # SERVICE_STATE_READY, SERVICE_STATE_ERROR
        ended.append(rid)
    return _OK


cdef int _marks(Bytes p, Py_ssize_t start, Py_ssize_t end, uint64_t* sequence, list ended) except -1:
    """One Envelope in ``p[start:end]``: its sequence, and its terminal states' ids into ``ended``."""
    cdef uint32_t chosen
    cdef int runs
    cdef Py_ssize_t a = 0, b = 0
    if _envelope(p, start, end, sequence, &chosen, &runs, &a, &b) != _OK:
        return _BAD
    return _members(p, chosen, runs, a, b, _EVENT, _BATCH_EVENT, _terminal, ended)


def command_ids(frame):
    """The ids of the requests one v1 ``Envelope`` from a frontend starts, in order.

    A request is a ``Command`` that runs and ends with one terminal ``StateChange`` (``READY`` or
    ``ERROR``) carrying its id: ``plan``, ``tool_call``, ``hook_load``, ``shell_exec``,
    ``list_processes``, ``attach``, ``checkpoint``, ``restore``, ``diff`` and ``undo``, alone
    (``Envelope.command``) or in a ``BatchCommand``. An
    empty id is skipped (the service cannot end it). Everything else gives nothing: events, health
    checks, the handshake, shutdown, ``cancel``/``stdin``/``resize`` (no states of their own), and
    bytes that are no ``Envelope``. An id may come again while its request runs (the service then
    refuses the duplicate without a terminal state), so a caller keeps a set. A request the service
    refuses before it runs still ends with ``ERROR``, except one whose id is longer than
    ``--max-request-id-size``: that id gets no terminal state.

    Args:
        frame: one ``Envelope``, without its length prefix; any contiguous bytes-like object.

    Returns:
        The request ids; never raises on any bytes.

    Raises:
        TypeError: ``frame`` is not a contiguous bytes-like object.
    """
    cdef Py_buffer view
    cdef list ids = []
    cdef int r
    try:
        PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    except (TypeError, BufferError):
        raise _not_bytes("command_ids", frame) from None
    try:
        r = _ids(<Bytes>view.buf, view.len, ids)
    finally:
        PyBuffer_Release(&view)
    if r == _OK:
        return ids
    if r == _MERGED:
        return _merged_command_ids(frame)
    return []


def batch_size(frame):
    """How many commands the ``BatchCommand`` of one v1 ``Envelope`` holds, without decoding them.

    The service refuses a batch over ``--max-batch-commands`` whole; counting first spares it the
    decoding of, say, 200,000 commands (60 MB of objects) only to refuse them.

    Args:
        frame: one ``Envelope``, without its length prefix; any contiguous bytes-like object.

    Returns:
        The elements of ``BatchCommand.commands`` (of every occurrence of the field, as the runtime
        merges them), each counted without being read; ``-1`` when the ``Envelope``'s payload is
        no ``batch_command``, or when the ``Envelope``'s or the batch's own fields are malformed.
        Never raises on any bytes.

    Raises:
        TypeError: ``frame`` is not a contiguous bytes-like object.
    """
    cdef Py_buffer view
    cdef Py_ssize_t count = -1
    cdef int r
    try:
        PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    except (TypeError, BufferError):
        raise _not_bytes("batch_size", frame) from None
    try:
        r = _count(<Bytes>view.buf, view.len, &count)
    finally:
        PyBuffer_Release(&view)
    if r == _MERGED:
        return _merged_batch_size(frame)
    return count if r == _OK else -1


def event_marks(buf):
    """The last sequence and the ended request ids in what a session wrote.

    Args:
        buf: zero or more complete length-prefixed v1 ``Envelope``s, as the service writes them.

    Returns:
        ``(sequence, ended)``: the largest ``Envelope.sequence`` seen (0 when none), and the
        request ids of the terminal states (``StateChange`` ``READY`` or ``ERROR`` with a non-empty
        ``request_id``, alone or in a ``BatchEvent``), in order. Never raises on any bytes: it stops
        at the first frame that is malformed or incomplete, with what the frames before it held.

    Raises:
        TypeError: ``buf`` is not a contiguous bytes-like object.
    """
    cdef Py_buffer view
    cdef list ended = []
    cdef Py_ssize_t pos = 0, end, before
    cdef uint64_t size, sequence, top = 0
    cdef Bytes p
    cdef int r
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    except (TypeError, BufferError):
        raise _not_bytes("event_marks", buf) from None
    try:
        p = <Bytes>view.buf
        end = view.len
        while pos < end:
            size = p[pos]
            if size < 0x80:
                pos += 1
            elif not _wide_prefix(p, &pos, end, &size):
                break
            if size > 0xFFFFFFFFULL or size > <uint64_t>(end - pos):  # a length prefix is 32 bits wide at most
                break
            before = len(ended)
            r = _marks(p, pos, pos + <Py_ssize_t>size, &sequence, ended)
            if r == _MERGED:
                del ended[before:]
                marks = _frame_marks(PyBytes_FromStringAndSize(<const char*>p + pos, <Py_ssize_t>size))
                if marks is None:
                    break
                sequence = marks[0]
                ended += marks[1]
            elif r != _OK:
                del ended[before:]
                break
            if sequence > top:
                top = sequence
            pos += <Py_ssize_t>size
    finally:
        PyBuffer_Release(&view)
    return top, ended


cdef inline bint _wide_prefix(Bytes p, Py_ssize_t* pos, Py_ssize_t end, uint64_t* size) noexcept nogil:
    """A length prefix of two to ten bytes; one whose value needs more than 35 bits reads as
    ``2**32`` (too wide, as it is). False when it is longer than ten bytes or runs off the end."""
    cdef uint64_t value = 0
    cdef bint wide = False
    cdef Py_ssize_t i = pos[0]
    cdef Py_ssize_t stop = i + 10
    cdef int group = 0
    cdef unsigned char b
    if stop > end:
        stop = end
    while i < stop:
        b = p[i]
        i += 1
        if group < 5:
            value |= (<uint64_t>(b & 0x7F)) << (7 * group)
        elif b & 0x7F:
            wide = True
        group += 1
        if b < 0x80:
            pos[0] = i
            size[0] = (<uint64_t>1 << 32) if wide else value
            return True
    return False


cdef bint _plain(Bytes p, Py_ssize_t pos, Py_ssize_t end, uint32_t varints, uint32_t spans, Field* out, int size) noexcept nogil:
    """The fields of the message ``p[pos:end]`` into ``out[number]`` (``size`` of them, each
    cleared to ``wire`` -1 here): True when each field is one of ``varints`` (wire type 0) or
    ``spans`` (length-delimited) with its wire type and none comes twice (``_plain`` of the twin)."""
    cdef Field f
    cdef int r, k
    for k in range(size):
        out[k].wire = -1
        out[k].a = out[k].b = 0
    while True:
        r = _field(p, &pos, end, &f)
        if r == 0:
            return True
        if r != 1 or f.number >= <uint32_t>size or not (((spans if f.wire == 2 else varints) >> f.number) & 1):
            return False
        if out[f.number].wire != -1:
            return False
        out[f.number] = f


def tool_call(frame):
    """The ``ToolCallCommand`` of one v1 ``Envelope`` that is a tool call and nothing more, read
    without the protobuf runtime (the session's quick path for the commonest frame).

    Only the plainest shape is read: the ``Envelope`` with its ``timestamp`` and ``sequence``
    (varints) and its ``command``; the ``Command`` with its ``tool_call`` alone; the
    ``ToolCallCommand`` with its four fields (ids and names valid UTF-8, ``timeout_ms`` at most
    ``2**63 - 1``). Each at most once, each with its own wire type. Then what the runtime would
    read is not in question: no unknown field, no merge, no last-one-wins. Anything else gives
    None, and the caller decodes the frame with the runtime as before.

    Args:
        frame: one ``Envelope``, without its length prefix, as ``bytes`` (anything else gives None).

    Returns:
        ``(request_id, tool, args, timeout_ms)``, ``timeout_ms`` -1 when it is not set; or None.
        Never raises.
    """
    cdef Bytes p
    cdef Field envelope[_COMMAND + 1]
    cdef Field command[_TOOL_CALL + 1]
    cdef Field fields[5]  # request_id (1), tool (2), args (3), timeout_ms (4)
    cdef long long timeout = -1
    if not PyBytes_CheckExact(frame):
        return None
    p = <Bytes>PyBytes_AS_STRING(frame)
    if not _plain(p, 0, PyBytes_GET_SIZE(frame), (1 << _TIMESTAMP) | (1 << _SEQUENCE), 1 << _COMMAND, envelope, _COMMAND + 1):
        return None
    if envelope[_COMMAND].wire != 2:
        return None
    if not _plain(p, envelope[_COMMAND].a, envelope[_COMMAND].b, 0, 1 << _TOOL_CALL, command, _TOOL_CALL + 1):
        return None
    if command[_TOOL_CALL].wire != 2:
        return None
    if not _plain(p, command[_TOOL_CALL].a, command[_TOOL_CALL].b, 1 << 4, (1 << 1) | (1 << 2) | (1 << 3), fields, 5):
        return None
    if fields[4].wire == 0:
        if fields[4].value > 0x7FFFFFFFFFFFFFFFULL:
            return None  # past a C long long: left to the runtime, as the twin does
        timeout = <long long>fields[4].value
    try:
        rid = PyUnicode_DecodeUTF8(<const char*>p + fields[1].a, fields[1].b - fields[1].a, NULL)
        tool = PyUnicode_DecodeUTF8(<const char*>p + fields[2].a, fields[2].b - fields[2].a, NULL)
    except UnicodeDecodeError:
        return None
    return rid, tool, PyBytes_FromStringAndSize(<const char*>p + fields[3].a, fields[3].b - fields[3].a), timeout
