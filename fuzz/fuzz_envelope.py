"""Fuzz v1 envelope handling: what ``Connection._feed_v1`` does with a byte stream, up to ``Session.handle``.

Input layout: byte 0 picks ``max_frame_size`` from :data:`LIMITS`, byte 1 the feed size (0: the
whole stream at once); the rest is the stream a v1 peer sends.

:func:`handle_stream` is the service's read path without a service: frames from ``FrameDecoder``
(both twins, which must agree), each parsed as ``smith_pb2.Envelope``, its ``payload`` inspected
and every field a handler reads read (``ShellExec.env`` as a dict, ``ToolCall.args`` parsed as JSON
the way the tool registry does, capabilities named ...). No command runs. Beyond "nothing but the
expected errors ever escapes", it checks that what a v1 peer sends survives the v1 → v0 bridge: a
command or event is encoded as a v0 line identically by both JSON backends (or refused with the
same ``EncodeError``), and re-decoding that line is stable.
"""

from __future__ import annotations

import json
from typing import Any

from fuzz._common import assert_same, fuzz_main, instrumented, outcome, twins

with instrumented(__name__):
    from google.protobuf.message import DecodeError

    _framing_c, _framing_py = twins("framing")
    from smith_fast.errors import EncodeError, FramingError, ProtocolError
    from smith_fast.jsonl import JsonlCodec
    from smith_fast.pb import smith_pb2 as pb

LIMITS = (0, 3, 16, 128, 1024, 1 << 16)
CODECS = (JsonlCodec("json"), JsonlCodec("orjson"))
_SLACK = _framing_py.MAX_VARINT_LENGTH
_FRAME_ATTRS = ("offset", "size", "limit", "frames")
_ERR_ATTRS = ("code", "details", "request_id", "command", "event")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_args(args: bytes) -> Any:
    """``ToolCallCommand.args`` as the tool registry reads them (``b""`` is ``{}``); None if invalid."""
    if not args:
        return {}
    try:
        return json.loads(bytes(args).decode("utf-8"), parse_constant=_reject_constant)
    except ValueError:  # invalid UTF-8 or JSON
        return None
    except RecursionError:
        # Found by this harness (fixed in the registry's decode_args, see fuzz/README.md): such
        # args are a failed call, never an escaping RecursionError.
        return None


def _capability_name(value: int) -> str:
    try:
        return pb.Capability.Name(value).removeprefix("CAPABILITY_").lower()
    except ValueError:  # an enum value this schema does not know: open enums keep it
        return str(value)


def inspect_command(command: Any) -> str:
    """Read every field ``Session.handle`` and its handlers read; returns the command kind."""
    kind = command.WhichOneof("command_type")
    if kind is None:
        return "empty"
    request = getattr(command, kind)
    if kind == "handshake":
        names = [_capability_name(cap) for cap in request.capabilities]
        assert len(names) == len(request.capabilities)
        dict(request.client_info)
        assert 0 <= request.version < 1 << 32
    elif kind == "shell_exec":
        assert type(request.request_id) is str and type(request.command) is str
        _ = request.shell if request.HasField("shell") else None
        _ = request.cwd if request.HasField("cwd") else None
        env = dict(request.env)
        assert all(type(k) is str and type(v) is str for k, v in env.items())
        _ = request.timeout_ms if request.HasField("timeout_ms") else None
    elif kind == "tool_call":
        assert type(request.tool) is str
        parse_args(request.args)
        _ = request.timeout_ms if request.HasField("timeout_ms") else None
    elif kind == "hook_load":
        _ = (request.request_id, request.hook_type, request.script)
    elif kind == "plan":
        _ = (request.request_id, request.goal, dict(request.context))
    return kind


def _bridge(kind: str, message: Any) -> None:
    """v1 → v0 and back: both backends agree, and a second round trip changes nothing."""
    results = [outcome(getattr(codec, f"encode_{kind}"), message) for codec in CODECS]
    assert results[0] == results[1], f"encode_{kind}: backends disagree on {message!r:.500}: {results!r:.800}"
    if results[0][0] == "err":
        assert results[0][1] is EncodeError, f"encode_{kind} raised {results[0][1].__name__}: {results[0][2]}"
        return
    for codec in CODECS:
        decoded = outcome(getattr(codec, f"decode_{kind}"), results[0][1], attrs=_ERR_ATTRS)
        if decoded[0] == "err":
            # v0 is narrower (ids must be UUIDs ...): a refusal is fine, a crash is not
            assert decoded[1] is ProtocolError, f"decode_{kind} raised {decoded[1].__name__}: {decoded[2]}"
            continue
        line = getattr(codec, f"encode_{kind}")(decoded[1])
        assert getattr(codec, f"decode_{kind}")(line) == decoded[1], f"{kind} {line!r:.500} is not stable"


def handle_frame(frame: bytes) -> str:
    """One frame, as ``Connection._feed_v1`` handles it; returns what it was (for the tests)."""
    try:
        env = pb.Envelope.FromString(frame)
    except DecodeError:
        return "invalid"  # reported as invalid_envelope and skipped
    assert 0 <= env.timestamp < 1 << 64 and 0 <= env.sequence < 1 << 64
    kind = env.WhichOneof("payload")
    if kind == "command":
        _bridge("command", env.command)
        return "command:" + inspect_command(env.command)
    if kind == "batch_command":
        batch = env.batch_command
        _ = batch.require_ordering
        kinds = [inspect_command(command) for command in list(batch.commands)]
        for command in list(batch.commands)[:4]:
            _bridge("command", command)
        return "batch:" + ",".join(kinds)
    if kind == "event":  # unexpected from a client, but what the SDK reads from a service
        _bridge("event", env.event)
        return "event:" + str(env.event.WhichOneof("event_type"))
    return f"unexpected:{kind}"


def handle_stream(stream: bytes, limit: int, step: int) -> tuple[list[str], Any]:
    """The read path of a v1 connection over ``stream`` fed ``step`` bytes at a time."""
    dc, dp = _framing_c.FrameDecoder(limit), _framing_py.FrameDecoder(limit)
    seen: list[str] = []
    fatal = None
    for pos in range(0, len(stream), step or len(stream) or 1):
        piece = memoryview(stream)[pos : pos + step] if step else stream
        rc = outcome(dc.feed, piece, attrs=_FRAME_ATTRS)
        rp = outcome(dp.feed, piece, attrs=_FRAME_ATTRS)
        assert_same(rc, rp, f"feed at {pos}")
        assert dc.buffered == dp.buffered <= limit + _SLACK, (dc.buffered, dp.buffered, limit)
        if rc[0] == "err":
            assert issubclass(rc[1], FramingError), f"{rc[1].__name__}: {rc[2]}"
            frames, fatal = rc[3]["frames"], rc
        else:
            frames = rc[1]
        seen += [handle_frame(frame) for frame in frames]
        if fatal is not None:
            break  # the connection reports it and stops reading
    return seen, fatal


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    handle_stream(data[2:], LIMITS[data[0] % len(LIMITS)], data[1])


if __name__ == "__main__":
    fuzz_main(test_one_input)
