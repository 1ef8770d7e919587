"""Request ids and terminal states read off relayed v1 bytes: the pure-Python twin of ``_relaypeek_c``.

The NATS gateway relays a frontend's bytes to one worker without decoding them. When that worker is
gone, the gateway owes every request still open exactly one terminal state, stamped with the
sequence numbers that come next (PROTOCOL.md, "Terminal states"). So per relayed frame it needs, and
only needs: the request ids a frontend's ``Envelope`` starts (:func:`command_ids`), and in what the
session wrote back the request ids that ended and the last ``Envelope.sequence`` (:func:`event_marks`).
Decoding every frame with the protobuf runtime to learn that would cost the gateway more than the
relay itself; these functions walk the wire format only as deep as the answer lies.

What they read is what the protobuf runtime (upb) would read from the same bytes:

* a oneof takes its last member; a message field seen again is merged into the earlier one (the
  concatenation of its occurrences), unless another member of its oneof came between them;
* a string field takes its last occurrence, and every occurrence must be valid UTF-8;
* a known field sent with another wire type is an unknown field; unknown fields of every wire type
  (0, 1, 2, 5, and groups, 3 to 4, nested at most as deep as upb allows) are stepped over;
* a varint has at most ten bytes (its value cut to 64 bits), a tag or a length at most five, a tag
  below 2**32 and a field number above 0; an enum value is an ``int32``, the low 32 bits.

Bytes the runtime would refuse at the levels walked give nothing: the service skips such an
``Envelope`` (an ``ErrorEvent``, no terminal state). What lies deeper than the walk (a
``ShellExecCommand``'s ``env`` entries, its ``command`` string) is not checked, so an ``Envelope``
the service refuses for that alone still names its ids. Which requests get a terminal state, and the
rest of the rule, are in :func:`command_ids`.

This module is the specification: ``_relaypeek_c`` must return the same for every input (it hands
the rare frame that repeats a message field back to :func:`_frame_ids` and :func:`_frame_marks`).
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import FramingError

__all__ = ["batch_size", "command_ids", "event_marks", "tool_call"]

_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_I64 = (1 << 63) - 1

# Envelope
_SEQUENCE = 2
_COMMAND = 10
_EVENT = 11
_BATCH_COMMAND = 12
_BATCH_EVENT = 13
_PAYLOADS = frozenset({10, 11, 12, 13, 14, 16, 17, 18})  # its `payload` oneof
# Command: its `command_type` oneof, and the members that are requests: they run, and end with one
# terminal StateChange (service/commands.py COMMANDS, a row with a handler). The others are the
# handshake, shutdown and the control commands (cancel, stdin, resize), which have no states.
_COMMAND_MEMBERS = frozenset(range(1, 16))
# plan, tool_call, hook_load, shell_exec, list_processes, attach, checkpoint, restore, diff, undo
_REQUESTS = frozenset({2, 3, 4, 5, 10, 11, 12, 13, 14, 15})
_REQUEST_ID = 1  # field 1 of every one of them, and of StateChangeEvent
_ELEMENTS = 1  # BatchCommand.commands, BatchEvent.events
# Event: its `event_type` oneof (a WorkspaceEvent, 11, answers a request but ends none: its READY does)
_EVENT_MEMBERS = frozenset(range(1, 12))
_STATE_CHANGE = 2
_STATE = 2  # StateChangeEvent.state
_TERMINAL = frozenset({2, 4})  # SERVICE_STATE_READY, SERVICE_STATE_ERROR
# upb's depth limit: an Envelope may hold groups nested 100 deep, each message level one less
_DEPTH = 100

# Envelope.command.tool_call, as tool_call() reads it: field number -> its wire type
_TIMESTAMP = 1
_TOOL_CALL = 3
_PLAIN_ENVELOPE = {_TIMESTAMP: 0, _SEQUENCE: 0, _COMMAND: 2}
_PLAIN_COMMAND = {_TOOL_CALL: 2}
_TOOL_CALL_FIELDS = {1: 2, 2: 2, 3: 2, 4: 0}  # request_id, tool, args, timeout_ms

ToolCall = tuple[str, str, bytes, int]
"""A ``ToolCallCommand`` read by :func:`tool_call`: request id, tool, args, ``timeout_ms`` (-1: unset)."""

_Field = tuple[int, int, int, int]  # number, wire type, then (value, 0) for a varint, (start, stop) for a length


class _Malformed(FramingError):
    """Bytes the protobuf runtime would refuse; caught before it leaves the module."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"malformed protobuf at byte {offset}", offset)


def _varint(data: bytes, pos: int, end: int, most: int) -> tuple[int, int]:
    """The varint at ``data[pos]`` of at most ``most`` bytes (uncut) and the index past it."""
    value = shift = 0
    stop = min(end, pos + most)
    while pos < stop:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Malformed(pos)


def _fields(data: bytes, pos: int, end: int, depth: int, strict: bool = False) -> list[_Field]:
    """The fields of the message ``data[pos:end]``, groups and fixed-width ones stepped over (with
    ``strict``, malformed: :func:`tool_call` reads none)."""
    out: list[_Field] = []
    append = out.append
    while pos < end:
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(data, pos, end, 5)
            if tag > _U32:
                raise _Malformed(pos)
        number = tag >> 3
        kind = tag & 7
        if number == 0:
            raise _Malformed(pos)
        if kind == 2:
            size, pos = _varint(data, pos, end, 5)
            if size > end - pos:
                raise _Malformed(pos)
            append((number, 2, pos, pos + size))
            pos += size
        elif kind == 0:
            value, pos = _varint(data, pos, end, 10)
            append((number, 0, value & _U64, 0))
        elif strict:
            raise _Malformed(pos)
        else:
            pos = _skip(data, pos, end, number, kind, depth)
    return out


def _skip(data: bytes, pos: int, end: int, number: int, kind: int, depth: int) -> int:
    """Step over the value of a field of wire type 1, 5 or 3 (a group, to its end tag)."""
    if kind == 1 or kind == 5:
        pos += 8 if kind == 1 else 4
        if pos > end:
            raise _Malformed(end)
        return pos
    if kind != 3 or depth == 0:  # an end tag without its start, wire types 6 and 7; too deep
        raise _Malformed(pos)
    while True:
        if pos >= end:
            raise _Malformed(pos)
        tag, pos = _varint(data, pos, end, 5)
        inner, kind = tag >> 3, tag & 7
        if tag > _U32:  # field number 0 inside a skipped group: upb steps over it (see _fields)
            raise _Malformed(pos)
        if kind == 4:
            if inner != number:
                raise _Malformed(pos)
            return pos
        if kind == 0:
            pos = _varint(data, pos, end, 10)[1]
        elif kind == 2:
            size, pos = _varint(data, pos, end, 5)
            if size > end - pos:
                raise _Malformed(pos)
            pos += size
        else:
            pos = _skip(data, pos, end, inner, kind, depth - 1)


def _oneof(data: bytes, spans: list[tuple[int, int]], members: frozenset[int], depth: int) -> tuple[int, list[tuple[int, int]]]:
    """The oneof member the message made of ``spans`` ends with, and the spans of its value (more
    than one when it was sent again: merged, unless another member came between)."""
    chosen = 0
    run: list[tuple[int, int]] = []
    for start, stop in spans:
        for number, kind, a, b in _fields(data, start, stop, depth):
            if kind == 2 and number in members:
                if number != chosen:
                    chosen = number
                    run = []
                run.append((a, b))
    return chosen, run


def _string(data: bytes, a: int, b: int) -> str:
    try:
        return str(data[a:b], "utf-8")
    except UnicodeDecodeError:
        raise _Malformed(a) from None


def _envelope(data: bytes, end: int, pos: int = 0) -> tuple[int, int, list[tuple[int, int]]]:
    """The Envelope in ``data[pos:end]``: its sequence, its payload member and that member's spans."""
    sequence = 0
    chosen = 0
    run: list[tuple[int, int]] = []
    for number, kind, a, b in _fields(data, pos, end, _DEPTH):
        if kind == 2:
            if number in _PAYLOADS:
                if number != chosen:
                    chosen = number
                    run = []
                run.append((a, b))
        elif number == _SEQUENCE:
            sequence = a
    return sequence, chosen, run


def _request_id(data: bytes, spans: list[tuple[int, int]], depth: int) -> str:
    """The merged ``spans`` of a Command: its request's id, or ``""`` when it is no request."""
    kind, run = _oneof(data, spans, _COMMAND_MEMBERS, depth)
    rid = ""
    if kind in _REQUESTS:
        for start, stop in run:
            for number, wire, a, b in _fields(data, start, stop, depth - 1):
                if number == _REQUEST_ID and wire == 2:
                    rid = _string(data, a, b)
    return rid


def _members(data: bytes, chosen: int, run: list[tuple[int, int]], one: int, batch: int,
             read: Callable[[bytes, list[tuple[int, int]], int], str]) -> list[str]:
    """What ``read`` finds (non-empty) in the Envelope member ``one``, or in each element of the
    member ``batch``: the shape a command and an event share (alone, or in a Batch*)."""
    if chosen == one:
        found = [read(data, run, _DEPTH - 1)]
    elif chosen == batch:
        found = [read(data, [(a, b)], _DEPTH - 2) for start, stop in run
                 for number, wire, a, b in _fields(data, start, stop, _DEPTH - 1) if number == _ELEMENTS and wire == 2]
    else:
        return []
    return [rid for rid in found if rid]


def _frame_ids(data: bytes) -> list[str]:
    """:func:`command_ids` of bytes; raises ``_Malformed``."""
    _, chosen, run = _envelope(data, len(data))
    return _members(data, chosen, run, _COMMAND, _BATCH_COMMAND, _request_id)


def _terminal(data: bytes, spans: list[tuple[int, int]], depth: int) -> str:
    """The merged ``spans`` of an Event: the request id its terminal state ends, else ``""``."""
    kind, run = _oneof(data, spans, _EVENT_MEMBERS, depth)
    if kind != _STATE_CHANGE:
        return ""
    rid = ""
    state = 0
    for start, stop in run:
        for number, wire, a, b in _fields(data, start, stop, depth - 1):
            if number == _REQUEST_ID and wire == 2:
                rid = _string(data, a, b)
            elif number == _STATE and wire == 0:
                state = a & _U32
    return rid if state in _TERMINAL else ""


def _frame_marks(data: bytes, start: int = 0, end: int | None = None) -> tuple[int, list[str]] | None:
    """The sequence and the ended request ids of the one Envelope ``data[start:end]``; None when it
    is malformed."""
    if end is None:
        end = len(data)
    try:
        sequence, chosen, run = _envelope(data, end, start)
        ended = _members(data, chosen, run, _EVENT, _BATCH_EVENT, _terminal)
    except _Malformed:
        return None
    return sequence, ended


def _not_bytes(what: str, data: object) -> TypeError:
    return TypeError(f"{what}() needs a contiguous bytes-like object, not {type(data).__name__!r}")


def _as_bytes(what: str, data: object) -> bytes:
    if type(data) is bytes:
        return data
    try:
        view = memoryview(data)  # type: ignore[arg-type]  # any object: what is no buffer raises below
    except TypeError:
        raise _not_bytes(what, data) from None
    if not view.contiguous:
        raise _not_bytes(what, data)
    return view.tobytes()


def command_ids(frame: bytes | bytearray | memoryview) -> list[str]:
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
    data = _as_bytes("command_ids", frame)
    try:
        return _frame_ids(data)
    except _Malformed:
        return []


def batch_size(frame: bytes | bytearray | memoryview) -> int:
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
    data = _as_bytes("batch_size", frame)
    try:
        _, chosen, run = _envelope(data, len(data))
        if chosen != _BATCH_COMMAND:
            return -1
        return sum(number == _ELEMENTS and wire == 2 for start, stop in run for number, wire, _, _ in _fields(data, start, stop, _DEPTH - 1))
    except _Malformed:
        return -1


def event_marks(buf: bytes | bytearray | memoryview) -> tuple[int, list[str]]:
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
    data = _as_bytes("event_marks", buf)
    end = len(data)
    pos = 0
    top = 0
    ended: list[str] = []
    while pos < end:
        size = data[pos]
        if size < 0x80:
            pos += 1
        else:
            try:
                size, pos = _varint(data, pos, end, 10)
            except _Malformed:
                break
        if size > _U32 or size > end - pos:  # a length prefix is 32 bits wide at most (framing.py)
            break
        marks = _frame_marks(data, pos, pos + size)
        if marks is None:
            break
        sequence, ids = marks
        if sequence > top:
            top = sequence
        ended += ids
        pos += size
    return top, ended


def _plain(data: bytes, pos: int, end: int, wires: dict[int, int]) -> dict[int, _Field] | None:
    """The fields of the message ``data[pos:end]`` by number (:func:`_fields`' tuples) when each
    is one of ``wires`` with its wire type (a varint or length-delimited) and none comes twice;
    None for anything else or malformed bytes."""
    try:
        fields = _fields(data, pos, end, 0, strict=True)
    except _Malformed:
        return None
    out: dict[int, _Field] = {}
    for field in fields:
        number = field[0]
        if wires.get(number) != field[1] or number in out:
            return None
        out[number] = field
    return out


def tool_call(frame: bytes) -> ToolCall | None:
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
    if type(frame) is not bytes:
        return None
    envelope = _plain(frame, 0, len(frame), _PLAIN_ENVELOPE)
    command = None if envelope is None else envelope.get(_COMMAND)
    inner = None if command is None else _plain(frame, command[2], command[3], _PLAIN_COMMAND)
    call = None if inner is None else inner.get(_TOOL_CALL)
    fields = None if call is None else _plain(frame, call[2], call[3], _TOOL_CALL_FIELDS)
    if fields is None:
        return None
    timeout = fields[4][2] if 4 in fields else -1
    if timeout > _I64:
        return None  # past an int64: left to the runtime (the compiled twin holds a C long long)
    rid, tool, args = (frame[field[2]:field[3]] if (field := fields.get(number)) else b"" for number in (1, 2, 3))
    try:
        return str(rid, "utf-8"), str(tool, "utf-8"), args, timeout
    except UnicodeDecodeError:
        return None
