"""``smith-fast serve --mcp``: MCP over stdin/stdout, as MCP clients spawn their servers.

Messages are newline-delimited JSON-RPC (one message per line, no embedded newlines), decoded with
orjson. Whoever holds the pipes started the service, so the session is trusted (no token). Output
is gathered and written once per loop tick, so pipelined calls answered in the same tick leave in
one write. When the pipe to the client is full, the session's child pipes are paused and stdin
is no longer read, so neither output nor requests pile up in memory.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson

from ..logs import get_logger
from ..service.connection import StdoutProtocol
from ..service.stdio import take_stdio
from . import protocol
from .endpoint import McpEndpoint

if TYPE_CHECKING:
    from ..service.core import ServiceCore

__all__ = ["McpStdio", "open_mcp_stdio"]

log = get_logger("smith_fast.mcp")


class McpStdio(asyncio.Protocol):
    """Reads stdin (as the read pipe's protocol) and writes stdout (through ``writer``)."""

    def __init__(self, core: ServiceCore, on_closed: asyncio.Event) -> None:
        self.core = core
        self._limit = core.limits.max_frame_size
        self._buffer = bytearray()
        self._discarding = False  # inside a line longer than the limit
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._writer: asyncio.WriteTransport | None = None
        self._reader: asyncio.ReadTransport | None = None
        self._on_closed = on_closed
        self._finishing: asyncio.Task[None] | None = None
        self._loop = asyncio.get_event_loop()
        self._io = core.metrics.io["mcp"]
        self.endpoint = McpEndpoint(core, peer="stdio", close=self._close, authenticated=True, notify=self)

    # ---- writing -----------------------------------------------------------------------------

    def send(self, data: bytes, final: bool) -> None:
        """The Channel of every request: one line on stdout."""
        if self._writer is None or self._writer.is_closing():
            return
        self._out.append(data)
        self._io.frames_out += 1
        self._io.bytes_out += len(data) + 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._writer is not None and not self._writer.is_closing():
            self._out.append(b"")
            self._writer.write(b"\n".join(self._out))
        self._out.clear()

    def pause_writing(self) -> None:
        self.endpoint.pause()
        if self._reader is not None:
            self._reader.pause_reading()

    def resume_writing(self) -> None:
        self.endpoint.resume()
        if self._reader is not None:
            self._reader.resume_reading()

    # ---- reading -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._reader = transport  # type: ignore[assignment]  # a read pipe's protocol is given a ReadTransport
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        start = len(buffer)
        buffer += data
        end = buffer.find(b"\n", start)
        if end < 0:
            if len(buffer) > self._limit:
                self._too_long()
            return
        begin = 0
        endpoint = self.endpoint
        while end >= 0:
            if self._discarding:
                self._discarding = False
            elif end - begin > self._limit:
                self._reject_long()
            else:
                line = bytes(buffer[begin:end])
                if line.strip():
                    self._io.frames_in += 1
                    self._io.bytes_in += len(line) + 1
                    self._message(line, endpoint)
            begin = end + 1
            end = buffer.find(b"\n", begin)
        del buffer[:begin]
        if len(buffer) > self._limit:
            self._too_long()

    def _message(self, line: bytes, endpoint: McpEndpoint) -> None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            self.send(protocol.error_response(None, protocol.PARSE_ERROR, f"the line is not JSON: {exc}"), True)
            return
        if isinstance(message, list):  # a 2025-03-26 batch: each member on its own
            for item in message:
                endpoint.handle(item, self)
        else:
            endpoint.handle(message, self)

    def _too_long(self) -> None:
        """A line over the limit with no end yet: drop what we hold of it and the rest up to its newline."""
        if not self._discarding:
            self._reject_long()
        self._discarding = True
        self._buffer.clear()

    def _reject_long(self) -> None:
        log.info("line too long", extra={"fields": {"peer": "stdio", "limit": self._limit}})
        self.send(
            protocol.error_response(None, protocol.INVALID_REQUEST, f"message longer than {self._limit} bytes (--max-frame-size); it was dropped"),
            True,
        )

    def eof_received(self) -> bool | None:
        self._start_finish()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._start_finish()

    def _start_finish(self) -> None:
        """The client sends no more (EOF or a broken pipe): end once the running calls have."""
        if self._finishing is None and not self.endpoint.closing:
            self._finishing = self._loop.create_task(self._finish())

    async def _finish(self) -> None:
        await self.endpoint.finish()
        self._close()

    def _close(self) -> None:
        self._flush()
        if self._writer is not None and not self._writer.is_closing():
            self._writer.close()
        self._on_closed.set()


async def open_mcp_stdio(core: ServiceCore, closed: asyncio.Event) -> McpStdio:
    """Serve MCP on the process's stdin/stdout; ``closed`` is set when the client is done."""
    stdio = take_stdio()  # pipes, files or /dev/null (service/stdio.py)
    front = McpStdio(core, closed)
    front._writer = await stdio.write_to(StdoutProtocol(front.pause_writing, front.resume_writing, lambda _exc: front.endpoint.connection_lost()))  # noqa: SLF001 (set before any byte is read)
    await stdio.read_into(front)
    return front
