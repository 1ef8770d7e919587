"""How the client SDK's envelopes travel: the :class:`Link` seam, and its stream implementation.

A :class:`~smith_fast.client.Client` says what to send and routes what it receives; a link
carries the bytes. :class:`StreamLink` is an asyncio stream pair (Unix, TCP, or a spawned
service's pipes: v1 frames or v0 lines); :class:`~smith_fast.grpc_link.GrpcLink` is one gRPC
``Stream`` call. Resuming a session (PROTOCOL.md, "Resume") replaces a stream link's connection
(:meth:`StreamLink.replace`) after :func:`resume_exchange` on a new one.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from .framing import FrameDecoder, encode_frame
from .jsonl import LineDecoder
from .pb import smith_pb2 as pb

__all__ = ["Link", "StreamLink", "open_stream", "resume_exchange"]

_READ_SIZE = 1 << 20  # what one read asks for; also the stream reader's buffer limit

Receive = Callable[[bytes], None]
"""Takes one unit the service sent: a v1 envelope's bytes, or a v0 line."""

Dispatch = Callable[[pb.Event], None]
"""Takes an event the link made itself (a gRPC call refused before its stream began)."""

Reconnect = Callable[[], Awaitable[bool]]
"""Called when the connection dropped: True once the session goes on over a new one."""


class Link(abc.ABC):
    """What carries a client's envelopes to a service and back."""

    @abc.abstractmethod
    def send(self, envelope: bytes) -> None:
        """Send one v1 envelope (its serialized bytes; a stream link frames them)."""

    def send_soon(self, envelope: bytes) -> None:
        """:meth:`send`, but it may wait until the loop step ends, to go with the step's others
        (the SDK's request helpers: pipelined calls send one each as answers come in)."""
        self.send(envelope)

    @abc.abstractmethod
    def send_line(self, line: bytes) -> None:
        """Send one v0 JSON line (with its newline).

        Raises:
            ValueError: this link carries v1 only.
        """

    @abc.abstractmethod
    async def pump(self, receive: Receive, dispatch: Dispatch, reconnect: Reconnect) -> BaseException:
        """Read until the connection ends, handing each unit to ``receive``.

        Returns:
            Why it ended (the client's close reason).
        """

    @abc.abstractmethod
    async def flush(self) -> None:
        """Return once what was sent is on its way (a shutdown waits for it)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection; :meth:`pump` returns soon after."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Free what the link holds once :meth:`pump` ended (a gRPC channel)."""


async def open_stream(target: str | tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a Unix socket path or a ``(host, port)``.

    Raises:
        OSError: nothing accepts connections there.
    """
    if isinstance(target, str):
        return await asyncio.open_unix_connection(target, limit=_READ_SIZE)
    return await asyncio.open_connection(*target, limit=_READ_SIZE)


class StreamLink(Link):
    """An asyncio stream pair carrying v1 frames or v0 lines.

    Args:
        reader, writer: the connection (or a spawned service's stdout and stdin).
        decoder: cuts what arrives into units (a ``FrameDecoder`` for v1, a ``LineDecoder`` for v0).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: FrameDecoder | LineDecoder) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = decoder
        # What one loop step sends with send_soon goes out in one write as the step ends: the
        # requests that pipelined calls send in a step (one each, as their answers come in) cost one
        # system call, not one each (a fifth of the client's CPU per call). send writes at once, after
        # them (a caller that blocks the loop next still has its command sent).
        self._pending: list[bytes] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def replace(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: FrameDecoder) -> None:
        """Go on over a new connection (a resumed session); :meth:`pump` reads it next. What the old
        one had not written yet is dropped, as what the drop lost: the resume sends the requests the
        service did not read again (client_wire.py)."""
        self.reader, self.writer, self.decoder = reader, writer, decoder
        self._pending = []

    def send(self, envelope: bytes) -> None:
        self._write_now(encode_frame(envelope))

    def send_soon(self, envelope: bytes) -> None:
        self._queue(encode_frame(envelope))

    def send_line(self, line: bytes) -> None:
        self._write_now(line)

    def _write_now(self, data: bytes) -> None:
        if self._pending:  # in order: what this step queued goes first, in the same write
            pending, self._pending = self._pending, []
            data = b"".join([*pending, data])
        self.writer.write(data)

    def _queue(self, data: bytes) -> None:
        if not self._pending:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._write_pending)
        self._pending.append(data)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or self.writer.is_closing():
            return  # a connection that dropped meanwhile: its reader sees the end (a resume, or ConnectionClosed)
        try:
            self.writer.write(pending[0] if len(pending) == 1 else b"".join(pending))
        except (ConnectionError, RuntimeError):  # closed under it (uvloop raises RuntimeError)
            pass

    async def pump(self, receive: Receive, dispatch: Dispatch, reconnect: Reconnect) -> BaseException:
        while True:
            try:
                data = await self.reader.read(_READ_SIZE)
            except (ConnectionError, OSError) as exc:
                if await reconnect():
                    continue
                return exc
            if not data:
                if await reconnect():
                    continue
                return EOFError("the service closed the connection")
            for unit in self.decoder.feed(data):
                receive(unit)

    async def flush(self) -> None:
        self._write_pending()
        await self.writer.drain()

    async def close(self) -> None:
        self._write_pending()
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    async def release(self) -> None:
        pass


async def resume_exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handshake: bytes, decoder: FrameDecoder
) -> tuple[pb.ReadyEvent, list[bytes]]:
    """Send a resume handshake (``handshake``: its stamped envelope) on a new connection.

    Returns:
        The answer (a Ready; ``resumed`` false when refused, with the error in
        ``service_info["error"]`` and its reason in ``service_info["reason"]``) and the envelopes
        read behind it.

    Raises:
        EOFError: the connection closed before an answer.
        OSError: the connection failed.
    """
    writer.write(encode_frame(handshake))
    units: list[bytes] = []
    while not units:
        data = await reader.read(_READ_SIZE)
        if not data:
            raise EOFError("closed during the resume")
        units = decoder.feed(data)
    first = pb.Envelope.FromString(units[0])
    if first.event.WhichOneof("event_type") == "ready" and first.event.ready.resumed:
        return first.event.ready, units[1:]
    refused = pb.ReadyEvent()
    refused.service_info["error"] = first.event.error.message or str(first)
    refused.service_info["reason"] = first.event.error.details.get("reason", "")
    return refused, []
