"""A TCP proxy that drops its connections on demand: what a peer sees when its network fails.

Each connection to the proxy gets its own connection to the target; bytes are passed both ways
as they come. :meth:`CuttingProxy.cut` aborts every connection it carries on both sides at once
(the peer and the service each see the connection die, whatever was in flight is lost), as a
broken network would; new connections are served as before. ``cut(silent=True)`` drops only the
peer's side: the service's connection stays open and what it sends there is read and thrown away,
as when a NAT forgot the connection and the service has not noticed yet.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Self

__all__ = ["CuttingProxy"]


class CuttingProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (``tcp:HOST:PORT``); :attr:`address` is where to connect.

    Args:
        target: the service's TCP address.
    """

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("tcp:").rpartition(":")
        self._target = (host.strip("[]"), int(port))
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the pumps
        self._handlers: set[asyncio.Task[Any]] = set()  # one per connection (asyncio.start_server's)
        self.address = ""
        self.cuts = 0  # cuts that dropped at least one connection
        self._silenced: list[asyncio.StreamWriter] = []  # service sides left open by silent cuts

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"tcp:127.0.0.1:{port}"
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connections(self) -> int:
        """Connections carried now."""
        return len(self._pairs)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._carry(reader, writer)
        finally:
            self._handlers.discard(handler)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        pumps = [asyncio.ensure_future(self._pump(reader, up_writer)), asyncio.ensure_future(self._pump(up_reader, writer))]
        for task in pumps:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        self._drop(pair)
        await asyncio.gather(*pumps, return_exceptions=True)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()

    def _drop(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        if pair in self._pairs:
            self._pairs.discard(pair)
            for writer in pair:
                writer.transport.abort()

    def cut(self, silent: bool = False) -> int:
        """Drop every connection now (``silent``: only on the peer's side); how many were dropped."""
        pairs = list(self._pairs)
        for pair in pairs:
            if silent:
                self._silenced.append(pair[1])
                self._pairs.discard(pair)  # its pump from the service goes on, into a closed peer
                pair[0].transport.abort()
            else:
                self._drop(pair)
        if pairs:
            self.cuts += 1
        return len(pairs)

    async def close(self) -> None:
        self.cut()
        for writer in self._silenced:
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # a handler cancelled by the loop's shutdown would be reported by asyncio: let each end
        await asyncio.gather(*self._handlers, return_exceptions=True)
