"""Event sinks: how a session's events become bytes for one protocol version.

A session never builds wire bytes itself; it calls the sink, which for v1 stamps each event with the
sequencer and writes it with the hot encoders (no protobuf object per event), and for v0 writes the
JSON line the original Rust crate would. Rare events (Ready, HookResult, GraphDelta ...) arrive as
``smith_pb2.Event`` objects through :meth:`EventSink.event`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from .. import events
from ..jsonl import JsonlCodec
from ..pb import smith_pb2
from ..sequencing import Sequencer

__all__ = ["EventSink", "V0Sink", "V1Sink", "now_ms"]

_EVENT_FIELD = smith_pb2.Envelope.DESCRIPTOR.fields_by_name["event"].number


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class EventSink:
    """The interface sessions emit events through. ``write`` receives ready-to-send bytes."""

    version: int = -1

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write

    def event(self, event: smith_pb2.Event) -> None:
        raise NotImplementedError

    def state_change(self, state: int, request_id: str | None = None) -> None:
        raise NotImplementedError

    def shell_output(
        self,
        request_id: str,
        stdout: str | None = None,
        stderr: str | None = None,
        exit_code: int | None = None,
        finished: bool = False,
    ) -> None:
        raise NotImplementedError

    def tool_result(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int
    ) -> None:
        raise NotImplementedError

    def log(
        self, level: int, message: str, request_id: str | None = None, fields: Mapping[str, str] | None = None
    ) -> None:
        raise NotImplementedError

    def error(
        self,
        code: int,
        message: str,
        request_id: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        raise NotImplementedError


class V1Sink(EventSink):
    """Varint-delimited ``Envelope`` frames, timestamped and sequenced."""

    version = 1

    def __init__(self, write: Callable[[bytes], None]) -> None:
        super().__init__(write)
        self._next = Sequencer().next

    def event(self, event: smith_pb2.Event) -> None:
        ts, seq = self._next()
        self._write(events.encode_envelope(ts, seq, _EVENT_FIELD, event.SerializeToString()))

    def state_change(self, state: int, request_id: str | None = None) -> None:
        ts, seq = self._next()
        self._write(events.encode_state_change(ts, seq, state, request_id, ts))

    def shell_output(
        self,
        request_id: str,
        stdout: str | None = None,
        stderr: str | None = None,
        exit_code: int | None = None,
        finished: bool = False,
    ) -> None:
        ts, seq = self._next()
        self._write(events.encode_shell_output(ts, seq, request_id, stdout, stderr, exit_code, finished))

    def tool_result(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int
    ) -> None:
        ts, seq = self._next()
        self._write(events.encode_tool_result(ts, seq, request_id, success, result, error, duration_ms))

    def log(
        self, level: int, message: str, request_id: str | None = None, fields: Mapping[str, str] | None = None
    ) -> None:
        ts, seq = self._next()
        self._write(events.encode_log(ts, seq, level, message, ts, request_id, fields))

    def error(
        self,
        code: int,
        message: str,
        request_id: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        ts, seq = self._next()
        self._write(events.encode_error(ts, seq, code, message, request_id, ts, details))


class V0Sink(EventSink):
    """JSON lines in the original crate's shapes (fields v0 lacks are dropped)."""

    version = 0

    def __init__(self, write: Callable[[bytes], None], codec: JsonlCodec) -> None:
        super().__init__(write)
        self._codec = codec

    def event(self, event: smith_pb2.Event) -> None:
        self._write(self._codec.encode_event(event))

    def state_change(self, state: int, request_id: str | None = None) -> None:
        self._write(self._codec.state_change(state, request_id, now_ms()))

    def shell_output(
        self,
        request_id: str,
        stdout: str | None = None,
        stderr: str | None = None,
        exit_code: int | None = None,
        finished: bool = False,
    ) -> None:
        self._write(self._codec.shell_output(request_id, stdout, stderr, exit_code, finished))

    def tool_result(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int
    ) -> None:
        self._write(self._codec.tool_result(request_id, success, result, error))

    def log(
        self, level: int, message: str, request_id: str | None = None, fields: Mapping[str, str] | None = None
    ) -> None:
        self._write(self._codec.log(level, message, now_ms(), request_id))

    def error(
        self,
        code: int,
        message: str,
        request_id: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        self._write(self._codec.error(code, message, request_id, now_ms()))
