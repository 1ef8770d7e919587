"""One byte stream (socket or stdio pipes) carrying a Smith session, v1 or v0.

Reads go through ``asyncio.BufferedProtocol``: the loop reads straight into one preallocated buffer
and the decoder copies out only complete frames. Writes are gathered and flushed once per loop tick
(or as soon as 256 KiB are pending) with a single transport write. The transport's
``pause_writing``/``resume_writing`` pause the session: its child pipes, the start of its further
requests and the reading of its commands (the transport's ``pause_reading``), and what the
transport still buffers counts against the session's ``--max-session-buffer``
(:mod:`~smith_fast.service.flow`), so a peer that does not read cannot make the service buffer
without bound.

Which protocol a connection speaks is decided by its first two bytes (PROTOCOL.md, "Telling v0 from v1"): ``{``
followed by ``"``, ``}`` or JSON whitespace is v0 JSONL; anything else is v1.

A network connection over ``--max-connections`` gets no session: the service waits up to
:data:`REFUSAL_WAIT` seconds for its first two bytes, so that it can say "too many connections" in
the protocol the peer speaks (a v0 peer could not parse a v1 frame), then answers with an
``ErrorEvent`` (``ERROR_CODE_RESOURCE_EXHAUSTED``) and closes. A peer that sends nothing gets the
v1 frame. At most :data:`MAX_REFUSING` such connections wait at once; beyond that they are
answered at once.

Until its first accepted handshake (authenticated, when the service has a token) a connection may
send frames and lines of at most ``--max-handshake-frame-size`` bytes, declared or received: one
that declares or sends more is told so and closed. The check runs after the frames of a read were
handled, so a client that pipelines a large command right behind its handshake is not refused.

Closing is a half-close first (``write_eof``): the peer reads everything sent, then closes, or
the service closes :data:`LINGER` seconds later. A plain ``close()`` with bytes of the peer still
unread would make TCP reset the connection, and the peer could lose the last events (the error
saying why it was closed, most of all).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Callable, Mapping
from typing import cast


from .. import events
from ..coalescing import WriteCoalescer
from ..errors import FramingError, FrameTooLarge, ProtocolError
from ..framing import MAX_VARINT_LENGTH, FrameDecoder, encode_varint, varint_size
from ..jsonl import JsonlCodec, LineDecoder
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .auth import TOKEN_KEY
from .connections import ConnectionGate
from .core import ServiceCore
from .deadlines import Deadlines
from .redact import redacted_line
from .resume import Front
from .session import Session
from .sinks import EventSink, V0Sink, V1Sink, now_ms

__all__ = ["Connection", "StdoutProtocol", "sniff_version"]

log = get_logger("smith_fast.connection")

READ_BUFFER_SIZE = 256 * 1024
# Until its first accepted handshake a connection reads into a buffer this size: 1024 idle
# unauthenticated connections (--max-connections) held 256 MiB with READ_BUFFER_SIZE each.
GUARDED_READ_BUFFER_SIZE = 16 * 1024
# What a tick's answers have gathered goes out once this much is pending, not only at the tick's
# end: a peer with many calls in flight then starts on the first answers (and sends the next
# calls) while the rest are computed, instead of both ends taking turns to idle. Measured
# (`python -m bench.report.calls`): pipelined 72 B reads, 64 in flight, 45k -> 55k calls/s against
# 256 KiB (and 4 KiB: 52k; more writes); bulk output 464 -> 588 MB/s.
WRITE_FLUSH_BYTES = 8 * 1024
_V0_SECOND_BYTES = frozenset(b'"} \t\r\n')
REFUSAL_WAIT = 1.0
MAX_REFUSING = 64
LINGER = 2.0


def sniff_version(head: bytes) -> int:
    """0 for v0 JSONL, 1 for v1, from (at least) the first two bytes of a connection."""
    return 0 if head[0] == 0x7B and head[1] in _V0_SECOND_BYTES else 1


def tcp_address(host: str, port: int) -> str:
    """``tcp:HOST:PORT`` (an IPv6 host in brackets), as listeners are named and ``--tcp`` is written."""
    return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"


def describe_peer(transport: asyncio.BaseTransport) -> str:
    """The peer for logs, metrics and span attributes: ``tcp:HOST:PORT``, or for a Unix socket
    (whose clients are unnamed) the listener's path and the client's pid and uid (``SO_PEERCRED``)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return tcp_address(str(peer[0]), peer[1])
    if peer:  # a named Unix client socket, or something else that names itself
        return f"unix:{peer}" if isinstance(peer, str) else str(peer)
    text = f"unix:{transport.get_extra_info('sockname') or '?'}"
    sock = transport.get_extra_info("socket")
    if sock is not None and hasattr(socket, "SO_PEERCRED"):
        try:
            pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        except OSError:
            return text
        text += f" pid={pid} uid={uid}"
    return text


class Connection(asyncio.BufferedProtocol):
    """A Smith session over a byte stream.

    Args:
        core: the service core.
        protocol: ``auto``, ``v1`` or ``v0``.
        writer: the transport to write to when it is not the one that reads (stdio).
        on_closed: called once when the connection is gone.
        peer: a printable peer name for logs (default: the transport's peer address).
        trusted: the peer started the service (stdio): no token, no connection limit, no deadlines.
        gate: the server's count of live connections (``--max-connections``), this one handed to
            it on arrival; None: not counted.
        finish_on_eof: the end of the input means the peer sends nothing more, not that it left
            (stdin is a file): the running requests end, then the session closes.
        first_sequence: the sequence number of the session's first envelope (a NATS gateway may
            have said something to the peer before the worker's session took over).
    """

    def __init__(
        self,
        core: ServiceCore,
        *,
        protocol: str = "auto",
        writer: asyncio.WriteTransport | None = None,
        on_closed: Callable[[], None] | None = None,
        peer: str | None = None,
        trusted: bool = False,
        finish_on_eof: bool = False,
        gate: ConnectionGate | None = None,
        first_sequence: int = 1,
    ) -> None:
        self.core = core
        self._first_sequence = first_sequence
        self._gate = None if trusted else gate
        self.trusted = trusted
        self._finish_on_eof = finish_on_eof
        self._finishing: asyncio.Task[None] | None = None
        self.protocol = protocol
        self.session: Session | None = None
        self.peer = peer or "?"
        self._buffer = bytearray(READ_BUFFER_SIZE if trusted else GUARDED_READ_BUFFER_SIZE)
        self._view = memoryview(self._buffer)
        self._head = b""
        self._feed: Callable[[bytes | memoryview], None] | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._writer = writer
        self._out = WriteCoalescer(WRITE_FLUSH_BYTES)
        self._flush_scheduled = False
        self._closed = False
        self._on_closed = on_closed
        self._loop = asyncio.get_event_loop()
        self._io = core.metrics.io["v1"]  # replaced once the protocol is known
        self._refusing: asyncio.TimerHandle | None = None  # over the limit: answered when this fires
        self._deadlines: Deadlines | None = None
        self._shut = False  # closed, by us or the peer: nothing more is written
        self._fed = 0  # v1 bytes fed to the decoder before the current feed
        self._tail = b""  # while recording: the last bytes of the previous v1 feed (a split prefix)
        self._guarded = True  # no accepted handshake yet: --max-handshake-frame-size applies
        # Its session resumed on another connection: what its sink writes here goes there (resume.py).
        self._onward: Connection | None = None

    # ---- asyncio protocol callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if self._writer is None:
            # A stream protocol's transport writes too; BaseTransport is only what the Protocol API promises.
            self._writer = cast("asyncio.WriteTransport", transport)
        self._loop = asyncio.get_running_loop()
        if self.peer == "?":
            self.peer = describe_peer(transport)
        log.debug("connection", extra={"fields": {"peer": self.peer}})
        if self.trusted:
            return
        core = self.core
        gate = self._gate
        if gate is not None and not gate.admit(self):
            log.warning("too many connections", extra={"fields": {"peer": self.peer, "max_connections": gate.limit}})
            if gate.wait(self):
                self._refusing = self._loop.call_later(REFUSAL_WAIT, self._refuse_over_limit)
            else:
                self._refuse_over_limit()
            return
        self._deadlines = Deadlines(core.limits, lambda: self.session, self._expire)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._view[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:  # pipes on stdlib asyncio call this
        if self._closed:
            return
        if self._feed is None:
            self._head += bytes(data)
            if len(self._head) < 2 and self.protocol == "auto":
                return
            if self._refusing is not None:
                self._refuse_over_limit()  # in the protocol the two bytes tell
                return
            data, self._head = self._head, b""
            self._start_session(data)
        assert self._feed is not None
        if self._flush_scheduled:  # a flush is due this tick already: it takes these answers too
            self._feed(data)
            return
        # What these bytes' commands write (all of a small call's answer) goes out as this step
        # ends, not from a call_soon'd flush: a sequential caller's call then costs the loop no
        # callback handle and no idle wake-up of its own. Writes of later callbacks in this tick
        # schedule their flush as before.
        self._flush_scheduled = True
        try:
            self._feed(data)
        finally:
            self._flush()

    def eof_received(self) -> bool:
        session = self.session
        if not self._finish_on_eof or session is None or self._closed:
            # The peer is gone (or closed its sending side): its requests die with it, children included.
            return False
        # A file of requests has ended: they run to their end, then the session closes (and so this).
        self._finishing = self._loop.create_task(session.finish())
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._shut = True
        self._buffer = bytearray()  # of no use once the socket is gone (see _drop_partial)
        self._view = memoryview(self._buffer)
        self._drop_partial()
        if self._gate is not None:
            self._gate.release(self)
        if self._refusing is not None:
            self._refusing.cancel()
            self._refusing = None
        if self._deadlines is not None:
            self._deadlines.cancel()
        if self.session is not None:
            self.session.connection_lost()
        if self._on_closed is not None:
            self._on_closed()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.pause()

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.resume()

    # ---- flow control ------------------------------------------------------------------------

    def _unsent(self) -> int:
        """Bytes written for the peer that it has not taken yet (the session's output budget)."""
        writer = self._writer
        buffered = writer.get_write_buffer_size() if writer is not None and not self._shut else 0
        return buffered + self._out.pending_bytes

    def unsent(self) -> int:
        return self._unsent()

    def hold_input(self, held: bool) -> None:
        self._hold_input(held)

    def _hold_input(self, held: bool) -> None:
        """Stop (or resume) reading the peer's commands: the socket's buffers fill, and so the peer's."""
        transport = self._transport
        if transport is None or self._closed or transport.is_closing():
            return
        try:
            if held:
                transport.pause_reading()  # type: ignore[attr-defined]  # a ReadTransport here (socket, pipe); typed as the base
            else:
                transport.resume_reading()  # type: ignore[attr-defined]  # likewise
        except (AttributeError, RuntimeError):  # not a reading transport, or one already closing
            pass

    # ---- reading -----------------------------------------------------------------------------

    def _version(self, head: bytes) -> int:
        version = {"v1": 1, "v0": 0}.get(self.protocol)
        if version is None:
            version = sniff_version(head) if len(head) >= 2 else 1
        return version

    def _start_session(self, head: bytes) -> None:
        version = self._version(head)
        self._io = self.core.metrics.io[f"v{version}"]
        sink: EventSink
        if version == 1:
            sink = V1Sink(self.write, notify=self._schedule_flush, write_frames=self.write, first_sequence=self._first_sequence)
            self._decoder = FrameDecoder(self.core.limits.max_frame_size)
            self._feed = self._feed_v1
        else:
            codec = JsonlCodec(self.core.config.jsonl_backend)
            sink = V0Sink(self.write, codec)
            self._codec = codec
            self._lines = LineDecoder(self.core.limits.max_frame_size)
            self._feed = self._feed_v0
        self.session = self.core.new_session(
            sink, close=self.close, peer=self.peer, unsent=self._unsent, hold_input=self._hold_input, front=None if self.trusted else self
        )
        if self.trusted:
            self.session.authenticated = True

    def _admitted(self, session: Session) -> bool:
        """Past the first accepted handshake: the guard of ``--max-handshake-frame-size`` is lifted
        for good (it is only ever checked while ``_guarded``)."""
        if self._guarded and session.handshaken and session.authenticated:
            self._guarded = False
            if len(self._buffer) < READ_BUFFER_SIZE and not self._closed:
                self._buffer = bytearray(READ_BUFFER_SIZE)  # what reads a slice of the old one keeps it
                self._view = memoryview(self._buffer)
        return not self._guarded

    def _too_large_before_handshake(self, session: Session, offset: int | None, size: int, what: str) -> None:
        """A frame or line over ``--max-handshake-frame-size`` before an accepted handshake: say
        so, then close (the peer has not shown it may use the service, so it is not read on)."""
        limit = self.core.limits.max_handshake_frame_size
        where = "" if offset is None else f" at byte offset {offset}"
        details = {"reason": "handshake_frame_too_large", "size": str(size), "limit": str(limit)}
        if offset is not None:
            details["offset"] = str(offset)
            if session.recorder is not None and session.version == 1:
                session.recorder.record_discarded(offset, size, complete=False, head=encode_varint(size))
        session.protocol_error(
            ProtocolError(
                f"{what}{where} is {size} bytes, above the {limit} allowed before an accepted "
                "handshake (--max-handshake-frame-size); closing the connection",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                details=details,
            )
        )
        self._loop.create_task(session.shutdown())
        self._feed = self._discard
        self._drop_partial()

    def _drop_partial(self) -> None:
        """Drop what arrived of a frame or line not yet whole now, not when this object goes: it
        may live on (a parked session; its reference cycles until the collector's next full pass),
        and 40 refused connections a second held 80 MiB until then."""
        if self._feed is None:
            return
        limit = self.core.limits.max_frame_size
        if self.session is not None and self.session.version == 1:
            self._decoder = FrameDecoder(limit)
        elif self.session is not None:
            self._lines = LineDecoder(limit)

    def _feed_v1(self, data: bytes | memoryview) -> None:
        session = self.session
        assert session is not None
        fatal: FramingError | None = None
        guard = self._guarded and not self._admitted(session)
        at = self._decoder.offset  # of the first frame this feed completes (while guarded)
        try:
            frames = self._decoder.feed(data)
        except FramingError as exc:
            frames, fatal = exc.frames, exc
        io = self._io
        io.bytes_in += len(data)
        io.frames_in += len(frames)
        fed, self._fed = self._fed, self._fed + len(data)
        for frame in frames:
            if guard and not self._admitted(session):
                if len(frame) > self.core.limits.max_handshake_frame_size:
                    self._too_large_before_handshake(session, at, len(frame), "the frame")
                    return
                at += varint_size(len(frame)) + len(frame)
            session.handle_frame(frame)
            if self.session is not session:  # it resumed another session (resume.py), or was taken over
                if self.session is None:
                    return
                session = self.session
        if fatal is None and guard and not session.closing and not self._admitted(session):
            pending = self._decoder.pending_size
            if pending > self.core.limits.max_handshake_frame_size:
                self._too_large_before_handshake(session, self._decoder.offset, pending, "the frame")
                return
        if fatal is not None:
            if session.recorder is not None:
                session.recorder.record_discarded(
                    fatal.offset,
                    fatal.size if isinstance(fatal, FrameTooLarge) else 0,
                    complete=False,
                    head=_prefix_at(self._tail + bytes(data), fatal.offset - (fed - len(self._tail))),
                )
            code = pb.ERROR_CODE_RESOURCE_EXHAUSTED if isinstance(fatal, FrameTooLarge) else pb.ERROR_CODE_UNSPECIFIED
            session.protocol_error(
                ProtocolError(
                    f"{fatal}; the stream cannot be resynchronised, closing the connection",
                    code,
                    details={"reason": "framing", "offset": str(fatal.offset)},
                )
            )
            self._loop.create_task(session.shutdown())
            self._feed = self._discard
        elif session.recorder is not None:
            self._tail = bytes(data[-MAX_VARINT_LENGTH:])

    def _feed_v0(self, data: bytes | memoryview) -> None:
        session = self.session
        assert session is not None
        error: FrameTooLarge | None = None
        try:
            lines = self._lines.feed(data)
        except FrameTooLarge as exc:  # not sticky for v0: the decoder resyncs at the next newline
            lines, error = exc.frames, exc
        io = self._io
        io.bytes_in += len(data)
        io.frames_in += len(lines)
        guard = self._guarded and not self._admitted(session)
        limit = self.core.limits.max_handshake_frame_size
        for i, line in enumerate(lines):
            if guard and not self._admitted(session):
                if error is not None and i == error.index:
                    self._too_large_before_handshake(session, error.offset, error.size, "the line")
                    return
                if len(line) > limit:
                    self._too_large_before_handshake(session, None, len(line), "a line")
                    return
            if error is not None and i == error.index:
                self._line_too_long(error)
            self._line(session, line)
        if guard and not session.closing and not self._admitted(session):
            if error is not None and error.index >= len(lines):
                self._too_large_before_handshake(session, error.offset, error.size, "the line")
                return
            if self._lines.buffered > limit:
                self._too_large_before_handshake(session, None, self._lines.buffered, "a line")
                return
        if error is not None and error.index >= len(lines):
            self._line_too_long(error)

    def _line(self, session: Session, line: bytes) -> None:
        recorder = session.recorder
        try:
            command = self._codec.decode_command(line)
        except ProtocolError as exc:
            if recorder is not None:  # kept as it arrived, so a replay sends it again
                recorder.record_line(redacted_line(line, self.core.config.token), malformed=True)
            # An unknown capability does not fail the handshake: the rest are still granted.
            partial = getattr(exc, "command", None)  # the codec's decoded command, unknown capabilities left out
            if not isinstance(partial, pb.Command):
                # A line whose request_id was readable is a refused request: its terminal state too.
                (session.refuse if exc.request_id else session.protocol_error)(exc)
                return
            command = partial
            session.protocol_error(exc)
        else:
            if recorder is not None:
                recorder.record_line(redacted_line(line, self.core.config.token))
        if not session.authenticated and command.WhichOneof("command_type") == "handshake":
            session.presented_token = _v0_token(line)
        session.handle(command)

    def _line_too_long(self, error: FrameTooLarge) -> None:
        assert self.session is not None
        if self.session.recorder is not None:  # its bytes are gone; where and how long it was is kept
            self.session.recorder.record_discarded(error.offset, error.size, complete=error.complete)
        self.session.protocol_error(
            ProtocolError(
                str(error),
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                details={"reason": "line_too_long", "offset": str(error.offset)},
            )
        )

    def _discard(self, data: bytes | memoryview) -> None:
        pass

    # ---- writing -----------------------------------------------------------------------------

    def write(self, data: bytes, frames: int = 1) -> None:
        """Queue ``data`` (``frames`` frames); it goes out with everything else written in this loop tick."""
        if self._shut:
            if self._onward is not None:
                self._onward.write(data, frames)
            return
        self._io.frames_out += frames
        full = self._out.add(data)
        if full is not None:
            self._send(full)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _schedule_flush(self) -> None:
        if self._onward is not None:
            self._onward._schedule_flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._shut:
            self._flush_scheduled = False
            return
        if self.session is not None:
            # the tick's batched events, as one (or few) BatchEvents; still flagged as scheduled,
            # so their write() does not schedule another flush
            self.session.sink.flush_batch()
        self._flush_scheduled = False
        data = self._out.flush()
        if data:
            self._send(data)

    def _send(self, data: bytes) -> None:
        """Write ``data`` to the peer once the session log has what it holds: the recorder writes at
        the end of the loop step, and a write before that (WRITE_FLUSH_BYTES pending, or a step's
        answers) would let a SIGKILL leave the peer with envelopes the log never got."""
        session = self.session
        if session is not None and session.recorder is not None:
            session.recorder.flush()
        self._io.bytes_out += len(data)
        self._writer.write(data)  # type: ignore[union-attr]  # set by connection_made, before any session writes

    def close(self) -> None:
        """Flush what is queued, then close (the transport sends buffered bytes first): a
        half-close, and the full close once the peer closed too or :data:`LINGER` seconds passed."""
        if self._shut:
            return
        self._flush()
        self._shut = True
        self._feed = self._discard
        if self._deadlines is not None:
            self._deadlines.cancel()
        transport = self._transport
        if self._writer is not None and self._writer is not transport:
            self._writer.close()
        if transport is None or transport.is_closing():
            return
        writer = self._writer
        if writer is transport and writer is not None and not self.core.shutting_down and writer.can_write_eof():
            writer.write_eof()
            self._loop.call_later(LINGER, writer.close)
            return
        transport.close()

    # ---- resume (a resume.Front) -----------------------------------------------------------------

    framed = True  # length-prefixed envelopes

    def forward(self, to: Front | None) -> None:
        assert to is None or isinstance(to, Connection)  # a socket session resumes on a socket
        self._onward = to
        if self._shut:  # its socket is gone: its read buffer and unsent bytes are of no use any more
            self._out.flush()
            self._buffer = bytearray()
            self._view = memoryview(self._buffer)

    def carry(self, session: object) -> None:
        assert isinstance(session, Session)
        self.session = session

    def release(self) -> None:
        """Its session was taken over by a newer connection: close this one at once, without
        parking the session again (what was unsent here is retained and was sent there)."""
        self.session = None
        self._shut = True
        self._feed = self._discard
        if self._deadlines is not None:
            self._deadlines.cancel()
        if self._transport is not None:
            self._transport.abort()  # type: ignore[attr-defined]  # a socket transport here; typed as the base

    # ---- refusing ----------------------------------------------------------------------------

    def _refuse(self, version: int, code: int, message: str, details: Mapping[str, str]) -> None:
        """Answer a connection that has no session with one ``ErrorEvent``, then close it."""
        ts = now_ms()
        if version == 1:
            data = events.encode_error(ts, 1, code, message, None, ts, details, framed=True)
        else:
            data = JsonlCodec(self.core.config.jsonl_backend).error(code, message, None, ts)
        self.core.metrics.error(code)
        self._io.frames_out += 1
        self._io.bytes_out += len(data)
        if self._writer is not None and not self._shut:
            self._writer.write(data)
        self.close()

    def _refuse_over_limit(self) -> None:
        if self._refusing is not None:
            self._refusing.cancel()
            self._refusing = None
        if self._gate is not None:
            self._gate.waited(self)
        limit = self._gate.limit if self._gate is not None else self.core.limits.max_connections
        self._refuse(
            self._version(self._head),
            pb.ERROR_CODE_RESOURCE_EXHAUSTED,
            f"too many connections (max {limit}); try again later",
            {"reason": "too_many_connections", "limit": str(limit)},
        )

    def _expire(self, reason: str, message: str) -> None:
        """A deadline passed (deadlines.Deadlines)."""
        if self.session is not None:
            self.session.expire(reason, message)
        else:  # nothing (or one byte) received: no protocol, no session
            log.info("closing connection", extra={"fields": {"peer": self.peer, "reason": reason}})
            self._refuse(self._version(self._head), pb.ERROR_CODE_UNSPECIFIED, message, {"reason": reason})


def _prefix_at(data: bytes, at: int) -> bytes:
    """The length prefix starting at ``data[at]`` that broke the framing: up to its last byte, at
    most ``MAX_VARINT_LENGTH`` bytes (what a replay must send to break it alike)."""
    head = data[max(at, 0) : max(at, 0) + MAX_VARINT_LENGTH]
    for i, b in enumerate(head):
        if b < 0x80:
            return head[: i + 1]
    return head


def _v0_token(line: bytes) -> str | None:
    """The ``"token"`` member of a v0 Handshake's ``data`` (v0 has no ``client_info``): the codec
    drops members it does not know, so it is read from the line itself, which the codec already
    found to be valid JSON of bounded nesting."""
    try:
        value = json.loads(line)["data"][TOKEN_KEY]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


class StdoutProtocol(asyncio.Protocol):
    """Forwards a stdout pipe's flow control and its end to the stdio front that writes to it
    (the v0/v1 :class:`Connection`, the MCP front)."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None], lost: Callable[[Exception | None], None]) -> None:
        self._pause, self._resume, self._lost = pause, resume, lost

    def pause_writing(self) -> None:
        self._pause()

    def resume_writing(self) -> None:
        self._resume()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)
