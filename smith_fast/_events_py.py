"""Direct encoders of the hot v1 events: the pure-Python twin of ``_events_c``.

Building a protobuf message object per event costs several times more than serializing it, so the
events a service sends most (shell output, logs, state changes, tool results, errors) are written
straight from Python values to the wire: each function returns one varint-delimited frame holding
``Envelope{timestamp=1, sequence=2, event=11{<member>}}`` (or, with ``framed=False``, the bare
``Envelope`` bytes). The bytes are identical to what the protobuf runtime produces for the same
message with ``SerializeToString(deterministic=True)``:

* fields in field-number order; proto3 scalars equal to their default (0, ``""``, ``False``) are
  omitted; ``optional`` fields are written whenever they are not ``None``, even when empty or zero;
* ``int32`` and enum values are varints, negative ones sign-extended to ten bytes;
* the ``Event`` submessage and the oneof member are always present, even when empty;
* map entries are ``{1: key, 2: value}`` messages with both fields always written, in the order of
  the runtime's deterministic serializer. That runtime is upb, whose string-key comparator
  (``upb/message/map_sorter.c``) yields bytewise-ascending keys except that a key which is a proper
  prefix of another comes *after* it (``"ab"`` before ``"a"``, ``""`` last). Other runtimes sort
  plain ascending; map order carries no meaning on the wire, so either parses the same.

Invalid arguments raise the same exception, with the same message, in both twins: ``TypeError``
for a value of the wrong type, :class:`~smith_fast.errors.EncodeError` for a value that the field
cannot hold (an integer out of range, a string with lone surrogates). When several arguments are
invalid, the first one in signature order is reported.

This module is the specification: ``_events_c`` must return the same bytes and raise the same
errors for every input.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from ._varint import ONE_BYTE as _ONE_BYTE
from ._varint import encode as _uvarint
from ._varint import encode_int32 as _ivarint
from .errors import EncodeError

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

_ZERO = _ONE_BYTE[0]  # what a default-valued scalar encodes to: the marker for "omit this field"

# Envelope oneof ``payload`` members (smith.proto): field number -> tag of a length-delimited field.
# 15 and 4 are deliberately unused (their tags would collide with the v0 sniffing rule).
_PAYLOAD_FIELDS = (10, 11, 12, 13, 14, 16, 17, 18)
_PAYLOAD_TAGS: list[bytes | None] = [None] * 19
for _field in _PAYLOAD_FIELDS:
    _tag = (_field << 3) | 2  # wire type 2: length-delimited
    _PAYLOAD_TAGS[_field] = bytes((_tag,)) if _tag < 0x80 else bytes(((_tag & 0x7F) | 0x80, _tag >> 7))
del _field, _tag

# Argument kinds, for diagnosing a failed call.
_U64 = 0  # uint64
_I32 = 1  # int32 or enum
_OPT_I32 = 2  # optional int32
_STR = 3  # string
_OPT_STR = 4  # optional string
_BYTES = 5  # bytes
_MAP = 6  # map<string, string>, None meaning empty
_FIELD = 7  # an Envelope payload field number


def _map_entries(tag: bytes, mapping: Mapping[str, str], parts: list[bytes]) -> None:
    """Append one ``tag, length, {1: key, 2: value}`` entry per item, in upb's deterministic order."""
    entries = []
    for key, value in mapping.items():
        k = key.encode()
        v = value.encode()
        # 0xFF never occurs in UTF-8: as a terminator it sorts a prefix after its extensions.
        entries.append((k + b"\xff", k, v))
    entries.sort()
    for _, k, v in entries:
        nk = len(k)
        nv = len(v)
        size = 2 + nk + nv + (1 if nk < 0x80 else len(_uvarint(nk))) + (1 if nv < 0x80 else len(_uvarint(nv)))
        parts += (
            tag,
            _ONE_BYTE[size] if size < 0x80 else _uvarint(size),
            b"\x0a",
            _ONE_BYTE[nk] if nk < 0x80 else _uvarint(nk),
            k,
            b"\x12",
            _ONE_BYTE[nv] if nv < 0x80 else _uvarint(nv),
            v,
        )


def _envelope(timestamp: int, sequence: int, tag: bytes, payload: Any, framed: object) -> bytes:
    """Wrap a serialized message as ``Envelope`` oneof member ``tag``, framed on request."""
    n = len(payload)
    payload_len = _ONE_BYTE[n] if n < 0x80 else _uvarint(n)
    size = len(tag) + len(payload_len) + n
    ts = _uvarint(timestamp)
    if ts is _ZERO:
        ts_tag = ts = b""
    else:
        ts_tag = b"\x08"
        size += 1 + len(ts)
    seq = _uvarint(sequence)
    if seq is _ZERO:
        seq_tag = seq = b""
    else:
        seq_tag = b"\x10"
        size += 1 + len(seq)
    prefix = (_ONE_BYTE[size] if size < 0x80 else _uvarint(size)) if framed else b""
    return b"".join((prefix, ts_tag, ts, seq_tag, seq, tag, payload_len, payload))


def _event(timestamp: int, sequence: int, member: bytes, body: bytes, framed: object) -> bytes:
    """Wrap an encoded event as ``Envelope.event{member}``; ``member`` is a one-byte tag."""
    n = len(body)
    body_len = _ONE_BYTE[n] if n < 0x80 else _uvarint(n)
    event = 1 + len(body_len) + n
    event_len = _ONE_BYTE[event] if event < 0x80 else _uvarint(event)
    size = 1 + len(event_len) + event
    ts = _uvarint(timestamp)
    if ts is _ZERO:
        ts_tag = ts = b""
    else:
        ts_tag = b"\x08"
        size += 1 + len(ts)
    seq = _uvarint(sequence)
    if seq is _ZERO:
        seq_tag = seq = b""
    else:
        seq_tag = b"\x10"
        size += 1 + len(seq)
    prefix = (_ONE_BYTE[size] if size < 0x80 else _uvarint(size)) if framed else b""
    return b"".join((prefix, ts_tag, ts, seq_tag, seq, b"\x5a", event_len, member, body_len, body))


def _check(name: str, kind: int, value: object) -> Exception | None:
    """The error one argument deserves, or None if it is valid."""
    if kind in (_OPT_STR, _OPT_I32) and value is None:
        return None
    if kind == _MAP:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return TypeError(f"{name} must be a mapping of str to str or None, not {type(value).__name__}")
        for key, item in value.items():
            err = _check(f"{name} key", _STR, key) or _check(f"{name}[{key!r}]", _STR, item)
            if err is not None:
                return err
        return None
    if kind in (_STR, _OPT_STR):
        if not isinstance(value, str):
            expected = "str" if kind == _STR else "str or None"
            return TypeError(f"{name} must be {expected}, not {type(value).__name__}")
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            return EncodeError(f"{name} cannot be encoded as UTF-8: {exc.reason} at index {exc.start}")
        return None
    if kind == _BYTES:
        try:
            memoryview(value).cast("B")  # type: ignore[arg-type]  # a probe: refusing non-buffers is the point
        except (TypeError, ValueError, BufferError):
            return TypeError(f"{name} must be a C-contiguous bytes-like object, not {type(value).__name__}")
        return None
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # a probe: refusing non-integers is the point
    except TypeError:
        expected = "int or None" if kind == _OPT_I32 else "int"
        return TypeError(f"{name} must be {expected}, not {type(value).__name__}")
    if kind == _U64 and not 0 <= number < 1 << 64:
        return EncodeError(f"{name} must be in [0, 2**64) (uint64), got {number}")
    if kind in (_I32, _OPT_I32) and not -(1 << 31) <= number < 1 << 31:
        return EncodeError(f"{name} must be in [-2**31, 2**31) (int32), got {number}")
    if kind == _FIELD and number not in _PAYLOAD_FIELDS:
        return EncodeError(f"field must be an Envelope payload field number {_PAYLOAD_FIELDS}, got {number}")
    return None


def _invalid(exc: Exception, spec: tuple[tuple[str, int], ...], values: tuple[object, ...]) -> Exception:
    """The error to raise for a failed call: the first invalid argument's, else ``exc`` itself.

    Both twins detect bad input on their fast path by whatever exception it happens to raise, then
    call this with the encoder's ``spec`` (below) and its arguments in signature order, so the error
    reported never depends on which twin ran or on the order in which it looked at the fields.
    """
    for (name, kind), value in zip(spec, values, strict=True):
        err = _check(name, kind, value)
        if err is not None:
            return err
    return exc


# Each encoder's checked arguments in signature order, and what each must be: one table for both
# twins, so their errors cannot drift.
_SHELL_OUTPUT_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("request_id", _STR), ("stdout", _OPT_STR),
    ("stderr", _OPT_STR), ("exit_code", _OPT_I32),
)
_SHELL_OUTPUT_BYTES_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("request_id", _STR), ("data", _BYTES),
)
_LOG_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("level", _I32), ("message", _STR), ("log_timestamp", _U64),
    ("request_id", _OPT_STR), ("fields", _MAP),
)
_STATE_CHANGE_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("state", _I32), ("request_id", _OPT_STR),
    ("state_timestamp", _U64),
)
_TOOL_RESULT_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("request_id", _STR), ("result", _BYTES), ("error", _OPT_STR),
    ("duration_ms", _U64),
)
_ERROR_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("error_code", _I32), ("message", _STR),
    ("request_id", _OPT_STR), ("error_timestamp", _U64), ("details", _MAP),
)
_ENVELOPE_ARGS = (
    ("timestamp", _U64), ("sequence", _U64), ("field", _FIELD), ("payload", _BYTES),
)


def encode_shell_output(
    timestamp: int,
    sequence: int,
    request_id: str,
    stdout: str | None = None,
    stderr: str | None = None,
    exit_code: int | None = None,
    finished: bool = False,
    *,
    framed: bool = True,
) -> bytes:
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
        rid = request_id.encode()
        n = len(rid)
        parts = [b"\x0a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), rid] if n else []
        if stdout is not None:
            data = stdout.encode()
            n = len(data)
            parts += (b"\x12", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)
        if stderr is not None:
            data = stderr.encode()
            n = len(data)
            parts += (b"\x1a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)
        if exit_code is not None:
            parts += (b"\x20", _ivarint(exit_code))
        if finished:
            parts.append(b"\x28\x01")
        return _event(timestamp, sequence, b"\x2a", b"".join(parts), framed)
    except Exception as exc:
        raise _invalid(exc, _SHELL_OUTPUT_ARGS, (timestamp, sequence, request_id, stdout, stderr, exit_code)) from None


def encode_shell_output_bytes(
    timestamp: int,
    sequence: int,
    request_id: str,
    data: bytes | bytearray | memoryview,
    stderr: bool = False,
    *,
    framed: bool = True,
) -> bytes:
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
        rid = request_id.encode()
        n = len(rid)
        parts = [b"\x0a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), rid] if n else []
        if data.__class__ is not bytes:
            data = memoryview(data).cast("B")  # len() counts bytes
        n = len(data)
        parts += (b"\x3a" if stderr else b"\x32", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)  # type: ignore[arg-type]  # a memoryview joins like bytes
        return _event(timestamp, sequence, b"\x2a", b"".join(parts), framed)
    except Exception as exc:
        raise _invalid(exc, _SHELL_OUTPUT_BYTES_ARGS, (timestamp, sequence, request_id, data)) from None


def encode_log(
    timestamp: int,
    sequence: int,
    level: int,
    message: str,
    log_timestamp: int = 0,
    request_id: str | None = None,
    fields: Mapping[str, str] | None = None,
    *,
    framed: bool = True,
) -> bytes:
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
        lv = _ivarint(level)
        parts = [] if lv is _ZERO else [b"\x08", lv]
        data = message.encode()
        n = len(data)
        if n:
            parts += (b"\x12", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)
        ts = _uvarint(log_timestamp)
        if ts is not _ZERO:
            parts += (b"\x18", ts)
        if request_id is not None:
            data = request_id.encode()
            n = len(data)
            parts += (b"\x22", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)
        if fields is not None:
            _map_entries(b"\x2a", fields, parts)
        return _event(timestamp, sequence, b"\x1a", b"".join(parts), framed)
    except Exception as exc:
        raise _invalid(exc, _LOG_ARGS, (timestamp, sequence, level, message, log_timestamp, request_id, fields)) from None


def encode_state_change(
    timestamp: int,
    sequence: int,
    state: int,
    request_id: str | None = None,
    state_timestamp: int = 0,
    *,
    framed: bool = True,
) -> bytes:
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
        if request_id is not None:
            data = request_id.encode()
            n = len(data)
            parts = [b"\x0a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data]
        else:
            parts = []
        st = _ivarint(state)
        if st is not _ZERO:
            parts += (b"\x10", st)
        ts = _uvarint(state_timestamp)
        if ts is not _ZERO:
            parts += (b"\x18", ts)
        return _event(timestamp, sequence, b"\x12", b"".join(parts), framed)
    except Exception as exc:
        raise _invalid(exc, _STATE_CHANGE_ARGS, (timestamp, sequence, state, request_id, state_timestamp)) from None


def encode_tool_result(
    timestamp: int,
    sequence: int,
    request_id: str,
    success: bool,
    result: bytes = b"",
    error: str | None = None,
    duration_ms: int = 0,
    *,
    framed: bool = True,
) -> bytes:
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
        rid = request_id.encode()
        n = len(rid)
        parts = [b"\x0a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), rid] if n else []
        if success:
            parts.append(b"\x10\x01")
        if result.__class__ is not bytes:
            result = memoryview(result).cast("B")  # type: ignore[assignment]  # len() counts bytes
        n = len(result)
        if n:
            parts += (b"\x1a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), result)
        if error is not None:
            data = error.encode()
            n = len(data)
            parts += (b"\x22", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)
        dur = _uvarint(duration_ms)
        if dur is not _ZERO:
            parts += (b"\x28", dur)
        return _event(timestamp, sequence, b"\x32", b"".join(parts), framed)
    except Exception as exc:
        raise _invalid(exc, _TOOL_RESULT_ARGS, (timestamp, sequence, request_id, result, error, duration_ms)) from None


_PROCESSING = 3  # ServiceState.SERVICE_STATE_PROCESSING
_READY = 2  # ServiceState.SERVICE_STATE_READY


def encode_tool_done(
    timestamp: int,
    sequence: int,
    request_id: str,
    success: bool,
    result: bytes = b"",
    error: str | None = None,
    duration_ms: int = 0,
) -> bytes:
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
    processing = encode_state_change(timestamp, sequence, _PROCESSING, request_id, timestamp)
    tool_result = encode_tool_result(timestamp, sequence + 1, request_id, success, result, error, duration_ms)
    return b"".join((processing, tool_result, encode_state_change(timestamp, sequence + 2, _READY, request_id, timestamp)))


def encode_error(
    timestamp: int,
    sequence: int,
    error_code: int,
    message: str,
    request_id: str | None = None,
    error_timestamp: int = 0,
    details: Mapping[str, str] | None = None,
    *,
    framed: bool = True,
) -> bytes:
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
        if request_id is not None:
            data = request_id.encode()
            n = len(data)
            parts = [b"\x0a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data]
        else:
            parts = []
        code = _ivarint(error_code)
        if code is not _ZERO:
            parts += (b"\x10", code)
        data = message.encode()
        n = len(data)
        if n:
            parts += (b"\x1a", _ONE_BYTE[n] if n < 0x80 else _uvarint(n), data)
        ts = _uvarint(error_timestamp)
        if ts is not _ZERO:
            parts += (b"\x20", ts)
        if details is not None:
            _map_entries(b"\x2a", details, parts)
        return _event(timestamp, sequence, b"\x4a", b"".join(parts), framed)
    except Exception as exc:
        raise _invalid(exc, _ERROR_ARGS, (timestamp, sequence, error_code, message, request_id, error_timestamp, details)) from None


def encode_envelope(
    timestamp: int,
    sequence: int,
    field: int,
    payload: bytes,
    *,
    framed: bool = True,
) -> bytes:
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
        tag = _PAYLOAD_TAGS[field] if 10 <= field <= 18 else None
        if tag is None:
            raise LookupError
        if payload.__class__ is not bytes:
            payload = memoryview(payload).cast("B")  # type: ignore[assignment]  # len() counts bytes
        return _envelope(timestamp, sequence, tag, payload, framed)
    except Exception as exc:
        raise _invalid(exc, _ENVELOPE_ARGS, (timestamp, sequence, field, payload)) from None
