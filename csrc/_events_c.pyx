# cython: language_level=3, freethreading_compatible=False
"""Direct encoders of the hot v1 events: the compiled twin of ``_events_py``.

Each encoder sizes the whole frame first (string lengths, varint widths, nested message lengths),
allocates the result ``bytes`` once and writes every byte of it in place: no intermediate objects.
ASCII ``str`` values are copied straight from the string's storage; other strings go through
CPython's cached UTF-8 form. Behaviour, messages and public API are those of ``_events_py``, which
is the specification (and the typing source); the cold error path is its ``_invalid``.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_Size
from cpython.long cimport PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_Check
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcmp, memcpy

# Diagnosing a bad argument is cold: share the twin's code so the errors cannot drift.
from smith_fast._events_py import (
    _ENVELOPE_ARGS,
    _ERROR_ARGS,
    _LOG_ARGS,
    _SHELL_OUTPUT_ARGS,
    _SHELL_OUTPUT_BYTES_ARGS,
    _STATE_CHANGE_ARGS,
    _TOOL_RESULT_ARGS,
    _invalid,
)

__all__ = [
    "encode_envelope",
    "encode_error",
    "encode_log",
    "encode_shell_output",
    "encode_shell_output_bytes",
    "encode_state_change",
    "encode_tool_done",
    "encode_tool_result",
]

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL

cdef enum:
    _STACK_ENTRIES = 8  # map entries sorted on the C stack; larger maps use the heap


cdef struct Text:
    const char* data
    Py_ssize_t size


cdef struct Entry:
    Text key
    Text value


cdef inline int _text(object s, Text* out) except -1:
    """Point ``out`` at the UTF-8 bytes of ``s``; they live as long as ``s`` does."""
    if not PyUnicode_Check(s):
        raise TypeError  # _invalid words it
    if PyUnicode_IS_COMPACT_ASCII(s):
        out.data = <const char*>PyUnicode_DATA(s)
        out.size = PyUnicode_GET_LENGTH(s)
    else:
        out.data = PyUnicode_AsUTF8AndSize(s, &out.size)  # cached on the str; raises on surrogates
    return 0


cdef inline uint64_t _uint64(object value) except? 0xFFFFFFFFFFFFFFFF:
    # Cython's own conversion goes through __int__ and would truncate a float: accept ints only.
    if not PyLong_Check(value):
        value = PyNumber_Index(value)
    return value


cdef inline int32_t _int32(object value) except? -0x80000000:
    if not PyLong_Check(value):
        value = PyNumber_Index(value)
    return value


cdef inline Py_ssize_t _vsize(uint64_t value) noexcept:
    cdef Py_ssize_t n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


cdef inline char* _varint(char* p, uint64_t value) noexcept:
    while value >= 0x80:
        p[0] = <char>((value & 0x7F) | 0x80)
        value >>= 7
        p += 1
    p[0] = <char>value
    return p + 1


cdef inline Py_ssize_t _lsize(Py_ssize_t n) noexcept:
    """Size of a length-delimited field of ``n`` bytes with a one-byte tag."""
    return 1 + _vsize(<uint64_t>n) + n


cdef inline char* _delimited(char* p, char tag, const char* data, Py_ssize_t n) noexcept:
    p[0] = tag
    p = _varint(p + 1, <uint64_t>n)
    memcpy(p, data, n)
    return p + n


cdef inline char* _scalar(char* p, char tag, uint64_t value) noexcept:
    p[0] = tag
    return _varint(p + 1, value)


cdef inline uint64_t _int32_bits(int32_t value) noexcept:
    # protobuf sign-extends a negative int32 to 64 bits: a ten-byte varint.
    return <uint64_t><int64_t>value


cdef int _upb_order(const void* a, const void* b) noexcept nogil:
    """upb's deterministic map order: bytewise ascending, a proper prefix after its extensions."""
    cdef const Text* x = &(<const Entry*>a).key
    cdef const Text* y = &(<const Entry*>b).key
    cdef int c = memcmp(x.data, y.data, x.size if x.size < y.size else y.size)
    if c:
        return c
    return (x.size < y.size) - (x.size > y.size)


cdef Py_ssize_t _gather(object held, Entry* entries) except -1:
    """Fill ``entries`` from a dict or a list of pairs (which must outlive them), sorted for the wire."""
    cdef Py_ssize_t pos = 0, n = 0
    cdef PyObject* key
    cdef PyObject* value
    if PyDict_CheckExact(held):
        while PyDict_Next(held, &pos, &key, &value):
            _text(<object>key, &entries[n].key)
            _text(<object>value, &entries[n].value)
            n += 1
    else:
        for k, v in <list>held:
            _text(k, &entries[n].key)
            _text(v, &entries[n].value)
            n += 1
    if n > 1:
        qsort(entries, n, sizeof(Entry), _upb_order)
    return n


cdef inline Py_ssize_t _entry_size(const Entry* e) noexcept:
    return _lsize(e.key.size) + _lsize(e.value.size)


cdef Py_ssize_t _map_size(const Entry* entries, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i, size = 0
    for i in range(n):
        size += _lsize(_entry_size(&entries[i]))
    return size


cdef char* _map(char* p, char tag, const Entry* entries, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        p[0] = tag
        p = _varint(p + 1, <uint64_t>_entry_size(&entries[i]))
        p = _delimited(p, 0x0A, entries[i].key.data, entries[i].key.size)
        p = _delimited(p, 0x12, entries[i].value.data, entries[i].value.size)
    return p


cdef class _Map:
    """A map argument gathered for writing: its UTF-8 views, sorted, and what keeps them alive.

    For an exact dict the views borrow from the dict's own strings: between gathering and writing
    only C code and a ``bytes`` allocation run (no Python code, no garbage collection), so nothing
    can mutate the dict in between. Any other mapping is copied into a list of pairs first.
    """

    cdef Entry stack[_STACK_ENTRIES]
    cdef Entry* entries
    cdef Py_ssize_t count
    cdef object held  # the dict itself, or a list of its pairs

    cdef int gather(self, object mapping) except -1:
        cdef Py_ssize_t n
        if PyDict_CheckExact(mapping):
            self.held = mapping
            n = PyDict_Size(mapping)
        else:
            self.held = list(mapping.items())
            n = len(self.held)
        if n > _STACK_ENTRIES:
            self.entries = <Entry*>PyMem_Malloc(n * sizeof(Entry))
            if self.entries == NULL:
                raise MemoryError
        else:
            self.entries = self.stack
        self.count = _gather(self.held, self.entries)
        return 0

    def __dealloc__(self):
        if self.entries != NULL and self.entries != self.stack:
            PyMem_Free(self.entries)


cdef object _frame(uint64_t timestamp, uint64_t sequence, const char* tag, Py_ssize_t tag_size,
                   Py_ssize_t inner, bint event, char member, bint framed, char** body):
    """Allocate the frame for an ``Envelope`` whose payload member holds ``inner`` bytes.

    With ``event``, the payload is ``Event{member: <inner bytes>}``. Writes everything before the
    inner bytes and sets ``body`` to where they go.
    """
    cdef Py_ssize_t payload = _lsize(inner) if event else inner
    cdef Py_ssize_t size = tag_size + _vsize(<uint64_t>payload) + payload
    if timestamp:
        size += 1 + _vsize(timestamp)
    if sequence:
        size += 1 + _vsize(sequence)
    out = PyBytes_FromStringAndSize(NULL, size + _vsize(<uint64_t>size) if framed else size)
    cdef char* p = PyBytes_AS_STRING(out)
    if framed:
        p = _varint(p, <uint64_t>size)
    if timestamp:
        p = _scalar(p, 0x08, timestamp)
    if sequence:
        p = _scalar(p, 0x10, sequence)
    memcpy(p, tag, tag_size)
    p = _varint(p + tag_size, <uint64_t>payload)
    if event:
        p = _scalar(p, member, <uint64_t>inner)
    body[0] = p
    return out


cdef inline object _event_frame(uint64_t timestamp, uint64_t sequence, char member, Py_ssize_t inner,
                                bint framed, char** body):
    return _frame(timestamp, sequence, b"\x5a", 1, inner, True, member, framed, body)


cdef object _shell_output(object timestamp, object sequence, object request_id, object stdout,
                          object stderr, object exit_code, object finished, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef Text rid, out_text, err_text
    cdef int32_t code = 0
    cdef bint has_out = stdout is not None
    cdef bint has_err = stderr is not None
    cdef bint has_code = exit_code is not None
    cdef char* p
    _text(request_id, &rid)
    cdef Py_ssize_t size = _lsize(rid.size) if rid.size else 0
    if has_out:
        _text(stdout, &out_text)
        size += _lsize(out_text.size)
    if has_err:
        _text(stderr, &err_text)
        size += _lsize(err_text.size)
    if has_code:
        code = _int32(exit_code)
        size += 1 + _vsize(_int32_bits(code))
    cdef bint fin = finished
    if fin:
        size += 2
    out = _event_frame(ts, seq, 0x2A, size, framed, &p)
    if rid.size:
        p = _delimited(p, 0x0A, rid.data, rid.size)
    if has_out:
        p = _delimited(p, 0x12, out_text.data, out_text.size)
    if has_err:
        p = _delimited(p, 0x1A, err_text.data, err_text.size)
    if has_code:
        p = _scalar(p, 0x20, _int32_bits(code))
    if fin:
        p[0] = 0x28
        p[1] = 0x01
    return out


cdef object _shell_output_bytes(object timestamp, object sequence, object request_id, object data,
                                object stderr, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef Text rid
    cdef Py_buffer view
    cdef bint viewed = False
    cdef const char* chunk
    cdef Py_ssize_t n
    cdef char* p
    cdef char tag = 0x3A if stderr else 0x32
    _text(request_id, &rid)
    cdef Py_ssize_t size = _lsize(rid.size) if rid.size else 0
    if PyBytes_CheckExact(data):
        chunk = PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
    else:
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        viewed = True
        chunk = <const char*>view.buf
        n = view.len
    try:
        size += _lsize(n)
        out = _event_frame(ts, seq, 0x2A, size, framed, &p)
        if rid.size:
            p = _delimited(p, 0x0A, rid.data, rid.size)
        p = _delimited(p, tag, chunk, n)
        return out
    finally:
        if viewed:
            PyBuffer_Release(&view)


cdef object _log(object timestamp, object sequence, object level, object message, object log_timestamp,
                 object request_id, object fields, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef int32_t lv = _int32(level)
    cdef Text msg, rid
    cdef uint64_t log_ts = _uint64(log_timestamp)
    cdef bint has_rid = request_id is not None
    cdef _Map entries = None
    cdef char* p
    _text(message, &msg)
    cdef Py_ssize_t size = _lsize(msg.size) if msg.size else 0
    if lv:
        size += 1 + _vsize(_int32_bits(lv))
    if log_ts:
        size += 1 + _vsize(log_ts)
    if has_rid:
        _text(request_id, &rid)
        size += _lsize(rid.size)
    if fields is not None:
        entries = _Map.__new__(_Map)
        entries.gather(fields)
        size += _map_size(entries.entries, entries.count)
    out = _event_frame(ts, seq, 0x1A, size, framed, &p)
    if lv:
        p = _scalar(p, 0x08, _int32_bits(lv))
    if msg.size:
        p = _delimited(p, 0x12, msg.data, msg.size)
    if log_ts:
        p = _scalar(p, 0x18, log_ts)
    if has_rid:
        p = _delimited(p, 0x22, rid.data, rid.size)
    if entries is not None:
        _map(p, 0x2A, entries.entries, entries.count)
    return out


cdef object _state_change(object timestamp, object sequence, object state, object request_id,
                          object state_timestamp, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef int32_t st = _int32(state)
    cdef Text rid
    cdef bint has_rid = request_id is not None
    cdef uint64_t state_ts = _uint64(state_timestamp)
    cdef char* p
    cdef Py_ssize_t size = 0
    if has_rid:
        _text(request_id, &rid)
        size += _lsize(rid.size)
    if st:
        size += 1 + _vsize(_int32_bits(st))
    if state_ts:
        size += 1 + _vsize(state_ts)
    out = _event_frame(ts, seq, 0x12, size, framed, &p)
    if has_rid:
        p = _delimited(p, 0x0A, rid.data, rid.size)
    if st:
        p = _scalar(p, 0x10, _int32_bits(st))
    if state_ts:
        _scalar(p, 0x18, state_ts)
    return out


cdef object _tool_result(object timestamp, object sequence, object request_id, object success,
                         object result, object error, object duration_ms, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef Text rid, err
    cdef bint ok
    cdef bint has_err = error is not None
    cdef uint64_t duration
    cdef Py_buffer view
    cdef bint viewed = False
    cdef const char* data
    cdef Py_ssize_t n
    cdef char* p
    _text(request_id, &rid)
    cdef Py_ssize_t size = _lsize(rid.size) if rid.size else 0
    ok = success
    if ok:
        size += 2
    if PyBytes_CheckExact(result):
        data = PyBytes_AS_STRING(result)
        n = PyBytes_GET_SIZE(result)
    else:
        PyObject_GetBuffer(result, &view, PyBUF_SIMPLE)
        viewed = True
        data = <const char*>view.buf
        n = view.len
    try:
        if n:
            size += _lsize(n)
        if has_err:
            _text(error, &err)
            size += _lsize(err.size)
        duration = _uint64(duration_ms)
        if duration:
            size += 1 + _vsize(duration)
        out = _event_frame(ts, seq, 0x32, size, framed, &p)
        if rid.size:
            p = _delimited(p, 0x0A, rid.data, rid.size)
        if ok:
            p[0] = 0x10
            p[1] = 0x01
            p += 2
        if n:
            p = _delimited(p, 0x1A, data, n)
        if has_err:
            p = _delimited(p, 0x22, err.data, err.size)
        if duration:
            _scalar(p, 0x28, duration)
    finally:
        if viewed:
            PyBuffer_Release(&view)
    return out


cdef object _error(object timestamp, object sequence, object error_code, object message, object request_id,
                   object error_timestamp, object details, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef int32_t code = _int32(error_code)
    cdef Text msg, rid
    cdef bint has_rid = request_id is not None
    cdef uint64_t error_ts
    cdef _Map entries = None
    cdef char* p
    cdef Py_ssize_t size = 0
    if has_rid:
        _text(request_id, &rid)
        size += _lsize(rid.size)
    if code:
        size += 1 + _vsize(_int32_bits(code))
    _text(message, &msg)
    if msg.size:
        size += _lsize(msg.size)
    error_ts = _uint64(error_timestamp)
    if error_ts:
        size += 1 + _vsize(error_ts)
    if details is not None:
        entries = _Map.__new__(_Map)
        entries.gather(details)
        size += _map_size(entries.entries, entries.count)
    out = _event_frame(ts, seq, 0x4A, size, framed, &p)
    if has_rid:
        p = _delimited(p, 0x0A, rid.data, rid.size)
    if code:
        p = _scalar(p, 0x10, _int32_bits(code))
    if msg.size:
        p = _delimited(p, 0x1A, msg.data, msg.size)
    if error_ts:
        p = _scalar(p, 0x20, error_ts)
    if entries is not None:
        _map(p, 0x2A, entries.entries, entries.count)
    return out


cdef object _envelope(object timestamp, object sequence, object field, object payload, object framed):
    cdef uint64_t ts = _uint64(timestamp)
    cdef uint64_t seq = _uint64(sequence)
    cdef int32_t number = _int32(field)
    cdef char tag[2]
    cdef Py_ssize_t tag_size = 1
    cdef Py_buffer view
    cdef char* p
    if number == 10 or number == 11 or number == 12 or number == 13 or number == 14:
        tag[0] = <char>((number << 3) | 2)
    elif number == 16 or number == 17 or number == 18:
        tag[0] = <char>(((number << 3) | 2) | 0x80)
        tag[1] = 0x01
        tag_size = 2
    else:
        raise LookupError  # _invalid words it
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        out = _frame(ts, seq, tag, tag_size, view.len, False, 0, framed, &p)
        memcpy(p, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def encode_shell_output(timestamp, sequence, request_id, stdout=None, stderr=None, exit_code=None,
                        finished=False, *, framed=True):
    """Encode an ``Envelope`` carrying a ``ShellOutputEvent`` (``Event.shell_output``).

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        request_id: the request the output belongs to ("" is omitted).
        stdout: a chunk of standard output; written whenever not None, even when empty.
        stderr: a chunk of standard error; written whenever not None, even when empty.
        exit_code: the exit status (int32, negative allowed), in the final event only.
        finished: whether the command has completed.
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        return _shell_output(timestamp, sequence, request_id, stdout, stderr, exit_code, finished, framed)
    except Exception as exc:
        raise _invalid(exc, _SHELL_OUTPUT_ARGS, (timestamp, sequence, request_id, stdout, stderr, exit_code)) from None


def encode_shell_output_bytes(timestamp, sequence, request_id, data, stderr=False, *, framed=True):
    """Encode an ``Envelope`` carrying a ``ShellOutputEvent`` with a raw chunk (``binary_output``).

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        request_id: the request the output belongs to ("" is omitted).
        data: the chunk, as the command wrote it; written even when empty.
        stderr: the chunk is ``stderr_bytes`` (7), else ``stdout_bytes`` (6).
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        return _shell_output_bytes(timestamp, sequence, request_id, data, stderr, framed)
    except Exception as exc:
        raise _invalid(exc, _SHELL_OUTPUT_BYTES_ARGS, (timestamp, sequence, request_id, data)) from None


def encode_log(timestamp, sequence, level, message, log_timestamp=0, request_id=None, fields=None, *,
               framed=True):
    """Encode an ``Envelope`` carrying a ``LogEvent`` (``Event.log``).

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        level: a ``LogLevel`` value (enum, int32; 0 is omitted).
        message: the log message ("" is omitted).
        log_timestamp: ``LogEvent.timestamp`` (uint64; 0 is omitted).
        request_id: the associated request; written whenever not None, even when empty.
        fields: structured fields (``LogEvent.fields``), written sorted as the runtime does.
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        return _log(timestamp, sequence, level, message, log_timestamp, request_id, fields, framed)
    except Exception as exc:
        raise _invalid(exc, _LOG_ARGS, (timestamp, sequence, level, message, log_timestamp, request_id, fields)) from None


def encode_state_change(timestamp, sequence, state, request_id=None, state_timestamp=0, *, framed=True):
    """Encode an ``Envelope`` carrying a ``StateChangeEvent`` (``Event.state_change``).

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        state: a ``ServiceState`` value (enum, int32; 0 is omitted).
        request_id: the associated request; written whenever not None, even when empty.
        state_timestamp: ``StateChangeEvent.timestamp`` (uint64; 0 is omitted).
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        return _state_change(timestamp, sequence, state, request_id, state_timestamp, framed)
    except Exception as exc:
        raise _invalid(exc, _STATE_CHANGE_ARGS, (timestamp, sequence, state, request_id, state_timestamp)) from None


def encode_tool_result(timestamp, sequence, request_id, success, result=b"", error=None, duration_ms=0, *,
                       framed=True):
    """Encode an ``Envelope`` carrying a ``ToolResultEvent`` (``Event.tool_result``).

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        request_id: the request the result belongs to ("" is omitted).
        success: whether the tool succeeded.
        result: the JSON-encoded result, any C-contiguous bytes-like object (empty is omitted).
        error: the error message; written whenever not None, even when empty.
        duration_ms: execution time in milliseconds (uint64; 0 is omitted).
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        return _tool_result(timestamp, sequence, request_id, success, result, error, duration_ms, framed)
    except Exception as exc:
        raise _invalid(exc, _TOOL_RESULT_ARGS, (timestamp, sequence, request_id, result, error, duration_ms)) from None


def encode_tool_done(timestamp, sequence, request_id, success, result=b"", error=None, duration_ms=0):
    """Encode the three framed ``Envelope`` s of a tool call that ran in one step, as one ``bytes``:
    ``StateChange PROCESSING`` (``sequence``), its ``ToolResult`` (``sequence + 1``) and
    ``StateChange READY`` (``sequence + 2``), all at ``timestamp``, which is also the state changes'
    own timestamp.

    The same bytes as :func:`encode_state_change`, :func:`encode_tool_result` and
    :func:`encode_state_change` again with those arguments (``framed=True``), and the same errors:
    theirs, in that order.

    Args:
        timestamp: every ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: the first ``Envelope.sequence`` (uint64, as is ``sequence + 2``).
        request_id: the request.
        success: whether the tool succeeded.
        result: the JSON-encoded result, any C-contiguous bytes-like object (empty is omitted).
        error: the error message; written whenever not None, even when empty.
        duration_ms: execution time in milliseconds (uint64; 0 is omitted).

    Returns:
        The three frames, one after the other.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        first = _state_change(timestamp, sequence, 3, request_id, timestamp, True)
    except Exception as exc:
        raise _invalid(exc, _STATE_CHANGE_ARGS, (timestamp, sequence, 3, request_id, timestamp)) from None
    following = sequence + 1
    try:
        second = _tool_result(timestamp, following, request_id, success, result, error, duration_ms, True)
    except Exception as exc:
        raise _invalid(exc, _TOOL_RESULT_ARGS, (timestamp, following, request_id, result, error, duration_ms)) from None
    following = sequence + 2
    try:
        third = _state_change(timestamp, following, 2, request_id, timestamp, True)
    except Exception as exc:
        raise _invalid(exc, _STATE_CHANGE_ARGS, (timestamp, following, 2, request_id, timestamp)) from None
    cdef Py_ssize_t n1 = PyBytes_GET_SIZE(first), n2 = PyBytes_GET_SIZE(second), n3 = PyBytes_GET_SIZE(third)
    out = PyBytes_FromStringAndSize(NULL, n1 + n2 + n3)
    cdef char* p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(first), n1)
    memcpy(p + n1, PyBytes_AS_STRING(second), n2)
    memcpy(p + n1 + n2, PyBytes_AS_STRING(third), n3)
    return out


def encode_error(timestamp, sequence, error_code, message, request_id=None, error_timestamp=0, details=None,
                 *, framed=True):
    """Encode an ``Envelope`` carrying an ``ErrorEvent`` (``Event.error``).

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        error_code: an ``ErrorCode`` value (enum, int32; 0 is omitted).
        message: the human-readable message ("" is omitted).
        request_id: the associated request; written whenever not None, even when empty.
        error_timestamp: ``ErrorEvent.timestamp`` (uint64; 0 is omitted).
        details: extra fields (``ErrorEvent.details``), written sorted as the runtime does.
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of its field's range or a string has lone surrogates.
    """
    try:
        return _error(timestamp, sequence, error_code, message, request_id, error_timestamp, details, framed)
    except Exception as exc:
        raise _invalid(exc, _ERROR_ARGS, (timestamp, sequence, error_code, message, request_id, error_timestamp, details)) from None


def encode_envelope(timestamp, sequence, field, payload, *, framed=True):
    """Wrap an already-serialized message as ``Envelope`` oneof member ``field``.

    For the rare messages built with protobuf objects: ``field`` is the ``Envelope.payload`` member's
    field number (10 command, 11 event, 12 batch_command, 13 batch_event, 14 health_check_request,
    16 health_check_response, 17 metrics, 18 resource_usage). The member is always written, so an
    empty ``payload`` is an empty (present) message.

    Args:
        timestamp: ``Envelope.timestamp``, Unix milliseconds (uint64; 0 is omitted).
        sequence: ``Envelope.sequence`` (uint64; 0 is omitted).
        field: the ``Envelope.payload`` field number.
        payload: the serialized member message, any C-contiguous bytes-like object.
        framed: prefix the result with its length as a varint (one delimited frame).

    Returns:
        The framed (or, with ``framed=False``, bare) serialized ``Envelope``.

    Raises:
        TypeError: an argument has the wrong type.
        EncodeError: an integer is out of range or ``field`` is not an ``Envelope.payload`` member.
    """
    try:
        return _envelope(timestamp, sequence, field, payload, framed)
    except Exception as exc:
        raise _invalid(exc, _ENVELOPE_ARGS, (timestamp, sequence, field, payload)) from None
