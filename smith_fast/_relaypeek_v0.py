"""Request ids and terminal states read off relayed v0 lines (the v1 pair is ``_relaypeek_py``).

The same questions as for v1 frames, for a frontend that speaks v0 JSON lines (PROTOCOL.md, "v0:
JSON lines"): which request ids a command line starts, and which a session's output lines end. v0
has no envelope, so there is no sequence to read. Python only: a v0 line is parsed by orjson in C
either way, and the lines worth parsing are few (a cheap substring test skips the rest).
"""

from __future__ import annotations

import orjson

from .errors import ProtocolError
from .jsonl._backends import MAX_NESTING, nesting_exceeds
from .jsonl._codec import JsonlCodec
from .jsonl._fields import COMMANDS_BY_ONEOF, STATE_NAMES, read_request_id
from .pb import smith_pb2 as pb

__all__ = ["v0_command_ids", "v0_event_marks"]

# The command variants that run and end with one terminal StateChange (service/commands.py COMMANDS,
# a row with a handler; tests/test_relaypeek.py holds the two together).
_REQUESTS = frozenset(
    COMMANDS_BY_ONEOF[oneof][0] for oneof in ("plan", "tool_call", "hook_load", "shell_exec", "list_processes", "attach")
)
_TERMINAL = frozenset({STATE_NAMES[pb.SERVICE_STATE_READY], STATE_NAMES[pb.SERVICE_STATE_ERROR]})
_MARK = b'"StateChange"'  # in every StateChange line; JSON escapes a quote inside a string
_CODEC = JsonlCodec()


def v0_command_ids(line: bytes | bytearray | memoryview) -> list[str]:
    """The request id one v0 command line starts: ``[id]`` or ``[]``.

    The service ends with one terminal ``StateChange`` every line whose ``data.request_id`` it can
    read as a UUID (PROTOCOL.md, "Terminal states"): a request variant (``Plan``, ``ToolCall``,
    ``HookLoad``, ``ShellExec``, ``ListProcesses``, ``Attach``), run or refused, and any other line
    it refuses for what is wrong with it (an unknown ``type``, a field of the wrong type); so those
    give their id, in the lowercase hyphenated form the service writes back. A well-formed
    ``Cancel``, ``Stdin`` or ``Resize`` has no states of its own, and a line whose id cannot be read
    (no UUID, invalid JSON or UTF-8, nested too deep) gets none: those give ``[]``. As with v1, an
    id may come again while its request runs. Never raises on any bytes.

    Args:
        line: one line, with or without its ``\\n``.
    """
    if type(line) is not bytes:
        line = memoryview(line).tobytes()
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return []
    if type(obj) is not dict:
        return []
    name = obj.get("type")
    rid = read_request_id(obj.get("data")) if type(name) is str else None
    if rid is None or nesting_exceeds(line, MAX_NESTING):  # the codec refuses such a line unread
        return []
    if name in _REQUESTS:
        return [rid]
    # Anything else ends only when the service refuses it with its id: the codec says whether.
    try:
        _CODEC.decode_command(line)
    except ProtocolError as exc:
        # One that only names unknown capabilities is decoded all the same (the handshake goes on).
        if exc.request_id and not isinstance(getattr(exc, "command", None), pb.Command):
            return [exc.request_id]
    return []


def v0_event_marks(buf: bytes | bytearray | memoryview) -> list[str]:
    """The request ids that the terminal ``StateChange`` lines (``Ready`` or ``Error``, with a
    non-empty ``request_id``) in ``buf`` end, in order.

    Args:
        buf: zero or more v0 event lines as the service writes them, each ending in ``\\n``; a line
            that does not parse (a fragment) is passed over. Never raises on any bytes.
    """
    if type(buf) is not bytes:
        buf = memoryview(buf).tobytes()
    if _MARK not in buf:
        return []
    ended: list[str] = []
    for line in buf.split(b"\n"):
        if _MARK not in line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if type(obj) is dict and obj.get("type") == "StateChange":
            data = obj.get("data")
            if type(data) is dict and data.get("state") in _TERMINAL:
                rid = data.get("request_id")
                if type(rid) is str and rid:
                    ended.append(rid)
    return ended
