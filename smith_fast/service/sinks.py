"""Event sinks: how a session's events become bytes for one protocol version.

A session never builds wire bytes itself; it calls the sink, which for v1 stamps each event with the
sequencer and writes it with the hot encoders (no protobuf object per event), and for v0 writes the
JSON line the original Rust crate would. Rare events (Ready, HookResult, GraphDelta ...) arrive as
``smith_pb2.Event`` objects through :meth:`EventSink.event`.

A v1 sink can also batch (for a peer that asked for ``batch_event``): events then go into an
``EventBatcher`` as bare ``Event`` bytes and leave as ``Envelope.batch_event``, one envelope (one
timestamp, one sequence number) per batch. A batch is cut when full, and the rest when the front
calls :meth:`EventSink.flush_batch` (the socket front once per loop tick, the gRPC front whenever
it is ready to send), so batches grow exactly as far as the peer is behind.

Batched or not, a v1 event method is the same two lines: take a stamp, hand the encoder's bytes to
the output. Switching batching swaps what the stamp, the output and the framing are (:meth:`V1Sink._route`),
so no event method branches on it.
"""

from __future__ import annotations

import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Protocol

from .. import events
from .._varint import skip as skip_varint
from ..coalescing import EventBatcher
from ..jsonl import JsonlCodec
from ..pb import smith_pb2
from ..sequencing import Sequencer

__all__ = [
    "EventSink", "Recording", "as_text", "V0Sink", "V1Sink", "now_ms", "BATCH_MAX_EVENTS", "BATCH_MAX_BYTES"]

_EVENT_FIELD = smith_pb2.Envelope.DESCRIPTOR.fields_by_name["event"].number
_BATCH_FIELD = smith_pb2.Envelope.DESCRIPTOR.fields_by_name["batch_event"].number
BATCH_MAX_EVENTS = 1024
BATCH_MAX_BYTES = 256 * 1024


class Recording(Protocol):
    """Where a recorded session's output goes (:class:`~smith_fast.replay.SessionRecorder` is one)."""

    def record_out(self, envelope: bytes) -> None: ...

    def record_out_frame(self, frame: bytes) -> None: ...

    def record_event(self, event: smith_pb2.Event) -> None: ...


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class EventSink(ABC):
    """The interface sessions emit events through. ``write`` receives ready-to-send bytes.

    Every event method is abstract: a sink that lacks one cannot be made, so a front's sink
    missing a rare event (binary output, say) fails when the front is written, not on the
    first session that sends that event.
    """

    version: int = -1

    framed = True  # whether written units carry a length prefix (v1 sockets) or not (gRPC, v0 lines)

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write

    def tap(self, observer: Callable[[bytes], None]) -> None:
        """Show every written unit to ``observer`` first (session recording)."""
        write = self._write

        def tapped(data: bytes) -> None:
            observer(data)
            write(data)

        self._write = tapped

    @abstractmethod
    def record_to(self, recording: Recording) -> None:
        """Record every written unit as the v1 ``Envelope`` it is or carries."""

    @abstractmethod
    def event(self, event: smith_pb2.Event) -> None:
        """A rare event, built as a ``pb.Event`` (Ready, HookResult, GraphDelta ...)."""

    @abstractmethod
    def state_change(self, state: int, request_id: str | None = None) -> None:
        """The service's or a request's state (``PROCESSING``, ``READY``, ``ERROR`` ...)."""

    @abstractmethod
    def shell_output(
        self,
        request_id: str,
        stdout: str | None = None,
        stderr: str | None = None,
        exit_code: int | None = None,
        finished: bool = False,
    ) -> None:
        """A chunk of a command's text output, or its exit (``exit_code``, ``finished``)."""

    @abstractmethod
    def shell_output_bytes(self, request_id: str, fd: int, data: bytes | memoryview) -> None:
        """A chunk of raw output (a ShellExec with ``binary_output``): ``stdout_bytes`` (``fd`` 1) or ``stderr_bytes``."""

    @abstractmethod
    def tool_result(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int
    ) -> None:
        """A tool call's result."""

    def shell_exit_changes(self, request_id: str, exit_code: int, changes: smith_pb2.FileChanges) -> None:
        """A command's final ``ShellOutput`` with what it changed in the session's workspace (to a
        peer that accepted ``changes``; PROTOCOL.md, "Workspaces"). A sink whose peer cannot carry
        them sends the final event without them."""
        self.shell_output(request_id, exit_code=exit_code, finished=True)

    def tool_result_changes(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int, changes: smith_pb2.FileChanges
    ) -> None:
        """An ``fs.write``'s ``ToolResult`` with what it changed (as :meth:`shell_exit_changes`)."""
        self.tool_result(request_id, success, result, error, duration_ms)

    def tool_done(self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int) -> None:
        """A tool call that ran in one step: its ``PROCESSING``, its ``ToolResult`` and its ``READY``."""
        self.state_change(smith_pb2.SERVICE_STATE_PROCESSING, request_id)
        self.tool_result(request_id, success, result, error, duration_ms)
        self.state_change(smith_pb2.SERVICE_STATE_READY, request_id)

    @abstractmethod
    def log(
        self, level: int, message: str, request_id: str | None = None, fields: Mapping[str, str] | None = None
    ) -> None:
        """A log line for the peer."""

    @abstractmethod
    def error(
        self,
        code: int,
        message: str,
        request_id: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        """An ``ErrorEvent`` (``code`` an ``ErrorCode``)."""

    def envelope(self, field: int, payload: bytes) -> None:
        """Send a serialized message as Envelope oneof member ``field`` (the Envelope additions)."""
        raise NotImplementedError(f"protocol v{self.version} has no Envelope additions")

    def start_batching(self) -> None:
        """Send events in BatchEvents from now on (v1 only; a no-op elsewhere)."""

    def stop_batching(self) -> None:
        """Send pending batched events, then send events one per envelope again."""

    def flush_batch(self) -> None:
        """Send the pending batch, if any (the front calls this when it is ready to write)."""


class V1Sink(EventSink):
    """``Envelope`` messages, timestamped and sequenced.

    Args:
        write: receives each envelope's bytes.
        framed: prefix each envelope with its length (sockets); gRPC messages carry bare envelopes.
        notify: called whenever an event went into a pending batch, so the front can schedule
            :meth:`flush_batch`.
        write_frames: ``write_frames(data, n)`` writes ``n`` framed envelopes at once (the socket
            front's write, which counts frames); with it, a tool call that ran in one step leaves
            as one write (:meth:`tool_done`) while nothing batches or records.
        first_sequence: the sequence number of the first envelope (a NATS worker's session goes
            on after what the gateway said to the peer itself).
    """

    version = 1

    def __init__(
        self,
        write: Callable[[bytes], None],
        *,
        framed: bool = True,
        notify: Callable[[], None] | None = None,
        write_frames: Callable[[bytes, int], None] | None = None,
        first_sequence: int = 1,
    ) -> None:
        super().__init__(write)
        self._write_frames = write_frames if framed else None
        self._frames = self._write_frames  # None while batching or recording: one event at a time
        self._sequencer = Sequencer(first_sequence)
        self._next = self._sequencer.next
        self._framed = framed
        self.framed = framed
        self._notify: Callable[[], None] = notify or _nothing
        self._batcher: EventBatcher | None = None
        self._add: Callable[[bytes], list[bytes]] = _no_batch
        # How an event leaves (see _route): unbatched, stamped with the sequencer and written
        # framed as the front needs; batched, unstamped bare Envelopes into the batcher.
        self._stamp: Callable[[], tuple[int, int]] = self._next
        self._out: Callable[[bytes], None] = write
        self._frame = framed

    def _route(self) -> None:
        if self._batcher is None:
            self._stamp, self._out, self._frame = self._next, self._write, self._framed
            self._frames = self._write_frames
        else:
            self._stamp, self._out, self._frame = _unstamped, self._batched, False
            self._frames = None

    def tap(self, observer: Callable[[bytes], None]) -> None:
        super().tap(observer)
        self._write_frames = None  # the observer sees (records) each envelope by itself
        self._route()

    @property
    def last_sequence(self) -> int:
        """The sequence number of the last envelope written (0 before the first)."""
        return self._sequencer.last

    def record_to(self, recording: Recording) -> None:
        self.tap(recording.record_out_frame if self._framed else recording.record_out)

    # ---- batching ------------------------------------------------------------------------------

    @property
    def batching(self) -> bool:
        return self._batcher is not None

    def start_batching(self) -> None:
        if self._batcher is None:
            # linger is unused: the front decides when to flush
            self._batcher = EventBatcher(BATCH_MAX_EVENTS, BATCH_MAX_BYTES, 0.0)
            self._add = self._batcher.add
            self._route()

    def stop_batching(self) -> None:
        self.flush_batch()
        self._batcher = None
        self._add = _no_batch
        self._route()

    def flush_batch(self) -> None:
        batcher = self._batcher
        if batcher is not None and batcher.pending:
            for batch in batcher.flush():
                self._write_batch(batch)

    def _write_batch(self, batch: bytes) -> None:
        ts, seq = self._next()
        self._write(events.encode_envelope(ts, seq, _BATCH_FIELD, batch, framed=self._framed))

    def _batched(self, envelope: bytes) -> None:
        # The Event inside a bare Envelope whose timestamp and sequence are 0 (so omitted): after
        # the tag 0x5A and the Event's length. That length is one byte for an Event below 128 bytes,
        # the common case, stepped over inline: the call costs 7-9% of a batched event (bench_sinks).
        start = 2 if envelope[1] < 0x80 else skip_varint(envelope, 1)
        full = self._add(envelope[start:])
        if full:
            for batch in full:
                self._write_batch(batch)
        self._notify()

    def envelope(self, field: int, payload: bytes) -> None:
        self.flush_batch()  # keep the order: what was batched before goes first
        ts, seq = self._next()
        self._write(events.encode_envelope(ts, seq, field, payload, framed=self._framed))

    # ---- events --------------------------------------------------------------------------------

    # A stamp is (timestamp, sequence) of the Envelope; (0, 0) when batched, where the batch's
    # envelope carries them, and an event's own timestamp is then taken now.

    def event(self, event: smith_pb2.Event) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_envelope(ts, seq, _EVENT_FIELD, event.SerializeToString(), framed=self._frame))

    def state_change(self, state: int, request_id: str | None = None) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_state_change(ts, seq, state, request_id, ts or now_ms(), framed=self._frame))

    def shell_output(
        self,
        request_id: str,
        stdout: str | None = None,
        stderr: str | None = None,
        exit_code: int | None = None,
        finished: bool = False,
    ) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_shell_output(ts, seq, request_id, stdout, stderr, exit_code, finished, framed=self._frame))

    def shell_output_bytes(self, request_id: str, fd: int, data: bytes | memoryview) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_shell_output_bytes(ts, seq, request_id, data, fd != 1, framed=self._frame))

    def tool_result(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int
    ) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_tool_result(ts, seq, request_id, success, result, error, duration_ms, framed=self._frame))

    # The two events with changes are built with protobuf: only a peer that accepted ``changes``
    # gets them, once per request, so the hot encoders (events.py and its twin) need not know them.

    def shell_exit_changes(self, request_id: str, exit_code: int, changes: smith_pb2.FileChanges) -> None:
        self.event(smith_pb2.Event(shell_output=smith_pb2.ShellOutputEvent(
            request_id=request_id, exit_code=exit_code, finished=True, changes=changes)))

    def tool_result_changes(
        self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int, changes: smith_pb2.FileChanges
    ) -> None:
        self.event(smith_pb2.Event(tool_result=smith_pb2.ToolResultEvent(
            request_id=request_id, success=success, result=result, error=error, duration_ms=duration_ms, changes=changes)))

    def tool_done(self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int) -> None:
        write = self._frames
        if write is None:
            super().tool_done(request_id, success, result, error, duration_ms)
            return
        ts, seq = self._next()
        self._next()  # the three stamps the three events would take, one after the other
        self._next()
        write(events.encode_tool_done(ts, seq, request_id, success, result, error, duration_ms), 3)

    def log(
        self, level: int, message: str, request_id: str | None = None, fields: Mapping[str, str] | None = None
    ) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_log(ts, seq, level, message, ts or now_ms(), request_id, fields, framed=self._frame))

    def error(
        self,
        code: int,
        message: str,
        request_id: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        ts, seq = self._stamp()
        self._out(events.encode_error(ts, seq, code, message, request_id, ts or now_ms(), details, framed=self._frame))


def _nothing() -> None:
    pass


def _no_batch(_event: bytes) -> list[bytes]:
    raise AssertionError("an event was batched while not batching")


# The stamp of a batched event: (0, 0) every time, from a C-level callable (a Python function
# here would add a frame per event to the batched path).
_unstamped: Callable[[], tuple[int, int]] = itertools.repeat((0, 0)).__next__


class V0Sink(EventSink):
    """JSON lines in the original crate's shapes (fields v0 lacks are dropped)."""

    version = 0
    framed = False

    def __init__(self, write: Callable[[bytes], None], codec: JsonlCodec) -> None:
        super().__init__(write)
        self._codec = codec

    def decode(self, line: bytes) -> smith_pb2.Event:
        """The v1 event a written line carries (session recording stores v0 sessions as v1)."""
        return self._codec.decode_event(line)

    def record_to(self, recording: Recording) -> None:
        self.tap(lambda line: recording.record_event(self.decode(line)))

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

    def shell_output_bytes(self, request_id: str, fd: int, data: bytes | memoryview) -> None:
        as_text(self, request_id, fd, data)  # v0 has no bytes (its ShellExec cannot ask for them)

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


def as_text(sink: EventSink, request_id: str, fd: int, data: bytes | memoryview) -> None:
    """Raw output sent as text to a peer that has no bytes (v0, MCP): invalid UTF-8 replaced."""
    text = str(data, "utf-8", "replace")
    if fd == 1:
        sink.shell_output(request_id, stdout=text)
    else:
        sink.shell_output(request_id, stderr=text)
