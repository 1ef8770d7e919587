"""How a benchmark client turns commands into bytes and received bytes into event views.

A driver never looks at which protocol it speaks: it gets, from every wire, the same small
tuples (:data:`View`) holding just what its bookkeeping needs. Each wire does the least a real
client must do to learn those fields, so neither protocol pays for the other's habits:

* :class:`V1Wire`: ``FrameDecoder`` + ``Envelope.FromString`` (upb, compiled) and the few
  fields read; ``BatchEvent`` envelopes (granted with ``smith_fast.accept=batch_event``) are
  unpacked transparently. :func:`envelope_views` does the same for one bare gRPC message.
* :class:`V0Wire`: ``LineDecoder`` + a JSON parser per line (orjson when installed, else the
  stdlib) and the same fields read from the resulting dicts. Converting each line into protobuf
  objects (``JsonlCodec.decode_event``) would cost a v0 client ~6x more per event than the
  parse itself, a handicap no serious JSONL client would carry.

Command encoding happens before a timed region starts, so its cost is never measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.jsonl import JsonlCodec, LineDecoder
from smith_fast.pb import smith_pb2 as pb

__all__ = [
    "ERROR",
    "OTHER",
    "OUTPUT",
    "RESULT",
    "STATE",
    "View",
    "V0Wire",
    "V1Wire",
    "WIRES",
    "Wire",
    "batch_command",
    "batch_item",
    "envelope_views",
    "handshake_command",
    "shell_exec_command",
    "tool_call_command",
]

# View kinds. A view is (kind, request_id, a, b):
#   STATE  (rid or "", ServiceState value, None)
#   RESULT (rid, success, error text or None)
#   OUTPUT (rid, characters of stdout + stderr, exit code when finished (-1 if absent) else None)
#   ERROR  (rid or "", message, None)
#   OTHER  ("", kind name, None)   Ready, Log, ... : counted, otherwise ignored
STATE, RESULT, OUTPUT, ERROR, OTHER = range(5)
View = tuple[int, str, Any, Any]

_MAX_UNIT = 1 << 27
_V0_STATES = {"Ready": pb.SERVICE_STATE_READY, "Processing": pb.SERVICE_STATE_PROCESSING,
              "Error": pb.SERVICE_STATE_ERROR, "Starting": pb.SERVICE_STATE_STARTING}


def handshake_command(version: int, capabilities: Iterable[pb.Capability] = (pb.CAPABILITY_SHELL_EXEC,),
                      accept: str | None = None) -> pb.Command:
    """A ``HandshakeCommand``; ``accept`` goes to ``client_info["smith_fast.accept"]`` (PROTOCOL.md)."""
    cmd = pb.Command()
    cmd.handshake.version = version
    cmd.handshake.capabilities.extend(capabilities)
    if accept:
        cmd.handshake.client_info["smith_fast.accept"] = accept
    return cmd


def tool_call_command(request_id: str, tool: str, args: bytes) -> pb.Command:
    """A ``ToolCallCommand``; ``args`` is UTF-8 JSON."""
    cmd = pb.Command()
    cmd.tool_call.request_id = request_id
    cmd.tool_call.tool = tool
    cmd.tool_call.args = args
    return cmd


def shell_exec_command(request_id: str, command: str) -> pb.Command:
    """A ``ShellExecCommand`` with the default shell, cwd and environment."""
    cmd = pb.Command()
    cmd.shell_exec.request_id = request_id
    cmd.shell_exec.command = command
    return cmd


def _event_view(event: pb.Event) -> View:
    kind = event.WhichOneof("event_type")
    if kind == "state_change":
        sc = event.state_change
        return (STATE, sc.request_id, sc.state, None)
    if kind == "tool_result":
        tr = event.tool_result
        return (RESULT, tr.request_id, tr.success, tr.error if tr.HasField("error") else None)
    if kind == "shell_output":
        so = event.shell_output
        code = (so.exit_code if so.HasField("exit_code") else -1) if so.finished else None
        return (OUTPUT, so.request_id, len(so.stdout) + len(so.stderr), code)
    if kind == "error":
        return (ERROR, event.error.request_id, event.error.message, None)
    return (OTHER, "", kind, None)


def envelope_views(raw: bytes) -> list[View]:
    """The views of one serialized ``Envelope``: its event, or every event of its ``BatchEvent``."""
    env = pb.Envelope.FromString(raw)
    payload = env.WhichOneof("payload")
    if payload == "event":
        return [_event_view(env.event)]
    if payload == "batch_event":
        return [_event_view(e) for e in env.batch_event.events]
    return [(OTHER, "", payload, None)]


# The bytes of Envelope{batch_command: BatchCommand{commands: [...]}} are built by concatenation:
# field 1 of BatchCommand (tag 0x0a) per command, field 12 of Envelope (tag 0x62) around them, so
# a batch of already encoded commands costs one join instead of re-serializing message objects.
def batch_item(command: pb.Command) -> bytes:
    """``command`` encoded as one ``BatchCommand.commands`` entry, for :func:`batch_command`."""
    return b"\x0a" + encode_frame(command.SerializeToString())


def batch_command(items: list[bytes]) -> bytes:
    """A serialized ``Envelope`` holding a ``BatchCommand`` of :func:`batch_item` entries."""
    return b"\x62" + encode_frame(b"".join(items))


class Wire:
    """One protocol on a byte stream: :meth:`encode` a ``Command``, :meth:`decode` received bytes.

    ``decode`` takes the stream in any pieces and returns the views of the events they complete.
    """

    name = "?"
    version = -1

    def encode(self, command: pb.Command) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> list[View]:
        raise NotImplementedError

    def handshake(self, capabilities: Iterable[pb.Capability] = (pb.CAPABILITY_SHELL_EXEC,), accept: str | None = None) -> bytes:
        """An encoded ``HandshakeCommand`` for this wire's protocol version."""
        return self.encode(handshake_command(self.version, capabilities, accept))

    def tool_call(self, request_id: str, tool: str, args: bytes) -> bytes:
        """An encoded ``ToolCallCommand``; ``args`` is UTF-8 JSON."""
        return self.encode(tool_call_command(request_id, tool, args))

    def shell_exec(self, request_id: str, command: str) -> bytes:
        """An encoded ``ShellExecCommand``."""
        return self.encode(shell_exec_command(request_id, command))


class V1Wire(Wire):
    """Varint-delimited protobuf ``Envelope`` frames."""

    name = "v1"
    version = 1

    def __init__(self) -> None:
        self._frames = FrameDecoder(_MAX_UNIT)

    def encode(self, command: pb.Command) -> bytes:
        env = pb.Envelope()
        env.command.CopyFrom(command)
        return encode_frame(env.SerializeToString())

    def decode(self, data: bytes) -> list[View]:
        out: list[View] = []
        for frame in self._frames.feed(data):
            out += envelope_views(frame)
        return out


def _loads() -> Callable[[bytes], Any]:
    try:
        import orjson
    except ImportError:  # the package without its orjson extra: the stdlib parser, same dicts
        return json.loads
    return orjson.loads


class V0Wire(Wire):
    """JSON lines (PROTOCOL.md, "v0: JSON lines"), parsed into dicts and read like a JSONL client would."""

    name = "v0"
    version = 0

    def __init__(self) -> None:
        self.codec = JsonlCodec("auto")
        self._lines = LineDecoder(_MAX_UNIT)
        self._loads = _loads()

    def encode(self, command: pb.Command) -> bytes:
        return self.codec.encode_command(command)

    def decode(self, data: bytes) -> list[View]:
        loads = self._loads
        out: list[View] = []
        for line in self._lines.feed(data):
            obj = loads(line)
            kind = obj["type"]
            d = obj.get("data") or {}
            if kind == "StateChange":
                out.append((STATE, d["request_id"] or "", _V0_STATES.get(d["state"], 0), None))
            elif kind == "ToolResult":
                out.append((RESULT, d["request_id"], d["success"], d["error"]))
            elif kind == "ShellOutput":
                n = len(d["stdout"] or "") + len(d["stderr"] or "")
                code = d["exit_code"] if d["exit_code"] is not None else -1
                out.append((OUTPUT, d["request_id"], n, code if d["finished"] else None))
            elif kind == "Error":
                out.append((ERROR, d.get("request_id") or "", d.get("message"), None))
            else:
                out.append((OTHER, "", kind, None))
        return out


WIRES: dict[str, type[Wire]] = {"v1": V1Wire, "v0": V0Wire}
