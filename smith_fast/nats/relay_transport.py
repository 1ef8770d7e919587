"""The worker's end of one relayed frontend connection: an asyncio transport over NATS.

The worker serves a relayed frontend with the very :class:`~smith_fast.service.connection.Connection`
that ``serve`` gives a socket, so sniffing, framing, limits, deadlines, the handshake, resume and
every command behave as on ``serve``. Only the transport differs: what the connection writes is
published to the gateway (one message per write; the connection already writes once per loop
tick, and the worker's :class:`~smith_fast.nats.relay.Outbox` writes the messages of an iteration to
NATS at once), and what the gateway relays is handed to the connection as received bytes.

Flow control crosses the relay as the asyncio calls it stands for: the connection's
``pause_reading`` becomes ``READ_PAUSE`` (the gateway stops reading the frontend's socket), and
the gateway's socket filling up arrives as ``WRITE_PAUSE`` (the connection's ``pause_writing``:
the session stops reading its commands' output). While paused, what is still published counts as
the transport's write buffer, so ``--max-session-buffer`` bounds the whole path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .._varint import encode as encode_varint
from ..logs import get_logger
from .relay import ACK, CLOSE, DATA, EOF, READ_PAUSE, READ_RESUME, WRITE_PAUSE, WRITE_RESUME, Outbox, pack, unpack

__all__ = ["RelayTransport"]

log = get_logger("smith_fast.worker")


class RelayTransport(asyncio.Transport):
    """One relayed connection, as its :class:`~smith_fast.service.connection.Connection` sees it.

    Args:
        outbox: what the worker publishes through (its NATS connection's).
        subject: where what the connection writes goes (the gateway's subject for it).
        peer: the frontend as the gateway saw it (``get_extra_info("peername")``).
        max_payload: the largest message the server takes; longer writes are split.
        gone: called once the connection is over (the worker forgets it).
        first_in, first_out: the sequence numbers already used each way (the OPEN and its answer).
        acks: the gateway gathers (relay.py, "Gathering"): every DATA gets a message back.
    """

    def __init__(self, outbox: Outbox, subject: str, peer: str, max_payload: int, gone: Callable[[RelayTransport], None], *,
                 first_in: int = 0, first_out: int = 0, acks: bool = False) -> None:
        super().__init__()
        self._acks = acks
        self._owed = 0  # DATAs read and not acknowledged yet
        self._ack_cb: Callable[[], None] = self._ack
        self._outbox = outbox
        self.subject = subject
        self._peer = peer
        self._chunk = max(1024, max_payload - 64)  # room for the relay header and the protocol line
        self._gone = gone
        self._protocol: asyncio.BufferedProtocol | None = None
        self._out_seq = first_out
        self._in_seq = first_in
        self._closing = False
        self._lost = False
        self._reading = True
        self._held: list[memoryview] = []  # relayed while reading was paused
        self._write_paused = False
        self._piled = 0  # bytes published since the gateway said its frontend does not take them
        # What the gateway hears when the session closes: "end" (it ended), or why the worker ended
        # it ("worker_stopping": the gateway then tells the frontend to start a new session).
        self.close_reason = "end"

    # ---- asyncio.Transport ---------------------------------------------------------------------

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.BufferedProtocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        if self._owed:  # the acknowledgment goes with it, in the same write
            self._ack()
        size = len(data)
        if size <= self._chunk:
            self._send(DATA, bytes(data))
        else:
            view = memoryview(data)
            for at in range(0, size, self._chunk):
                self._send(DATA, bytes(view[at : at + self._chunk]))
        # The connection writes once per loop tick already: waiting for the end of the step would
        # gather nothing more, and cost a pipelined session a loop step per write (measured).
        # A held OPENED goes with it (the session's first write).
        self._outbox.flush()
        if self._write_paused:
            self._piled += size

    def get_write_buffer_size(self) -> int:
        return self._piled

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._send(READ_PAUSE)

    def resume_reading(self) -> None:
        if self._reading or self._closing:
            return
        self._reading = True
        self._send(READ_RESUME)
        held, self._held = self._held, []
        for body in held:
            if not self._reading or self._lost:
                self._held.append(body)
                continue
            self._feed(body)

    def is_reading(self) -> bool:
        return self._reading

    def close(self) -> None:
        """The session is over (its output is written): tell the gateway, which closes the frontend."""
        self.end(self.close_reason)

    def abort(self) -> None:
        """The session resumed over another connection (another gateway): this relay ends at once."""
        self.end("taken_over")

    # ---- the relay ------------------------------------------------------------------------------

    def end(self, reason: str) -> None:
        """Close the relay with ``reason`` for the gateway, and the connection with it."""
        if self._closing:
            return
        self._closing = True
        self._send(CLOSE, reason.encode())
        asyncio.get_running_loop().call_soon(self._connection_lost)

    def received(self, data: bytes) -> None:
        """One relay message from the gateway."""
        if self._lost:
            return
        try:
            seq, kind, body = unpack(data)
        except ValueError:
            log.warning("not a relay message", extra={"fields": {"subject": self.subject, "size": len(data)}})
            return
        if seq != self._in_seq + 1:  # a message was lost on the way (a NATS server restart)
            log.warning("relay lost", extra={"fields": {"subject": self.subject, "expected": self._in_seq + 1, "got": seq}})
            self.end("relay_lost")
            return
        self._in_seq = seq
        if kind == DATA:
            if self._acks:
                self._owed += 1
                if self._owed == 1:  # acknowledged with what the session answers in this step
                    asyncio.get_running_loop().call_soon(self._ack_cb)
            if self._reading and not self._held:
                self._feed(body)
            else:
                self._held.append(body)
        elif kind == EOF:  # the frontend sends nothing more, but reads: its requests may end first
            if self._protocol is not None and not self._protocol.eof_received():
                self.end("end")
        elif kind == CLOSE:  # the frontend left (or its gateway stops): a dropped connection
            self._closing = True
            self._connection_lost()
        elif kind == WRITE_PAUSE:
            self._write_paused = True
            if self._protocol is not None:
                self._protocol.pause_writing()
        elif kind == WRITE_RESUME:
            self._write_paused = False
            self._piled = 0
            if self._protocol is not None:
                self._protocol.resume_writing()

    def gateway_gone(self) -> None:
        """The gateway went silent (no heartbeat for ``--gateway-lease``): the frontend is gone."""
        if not self._lost:
            self._closing = True
            self._connection_lost()

    def feed(self, body: memoryview) -> None:
        """Bytes of the frontend that came inside the OPEN (its first ones)."""
        if self._reading and not self._held:
            self._feed(body)
        else:
            self._held.append(body)

    def _feed(self, body: memoryview) -> None:
        protocol = self._protocol
        if protocol is None:
            return
        # The connection reads into its own buffer (a BufferedProtocol); it also takes bytes whole.
        protocol.data_received(body)  # type: ignore[attr-defined]  # Connection has it (pipes on stdlib asyncio call it)

    def _send(self, kind: int, body: bytes = b"") -> None:
        self._out_seq += 1
        self._outbox.publish(self.subject, pack(self._out_seq, kind, body))

    def _ack(self) -> None:
        owed, self._owed = self._owed, 0
        if owed and not self._closing:
            self._send(ACK, encode_varint(owed))

    def _connection_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        self._held = []
        if self._protocol is not None:
            self._protocol.connection_lost(None)
        self._gone(self)
