"""The process's stdin and stdout as the transports of a stdio front (``serve --stdio``, ``--mcp``).

The event loop watches pipes, sockets and terminals; a regular file or ``/dev/null`` it cannot watch
(epoll refuses them with ``EPERM``: uvloop then aborts the process, asyncio raises). Those never
make a reader or writer wait, so they get transports of their own here: a file is read one chunk
per loop turn (so a long requests file neither stalls the loop nor is read faster than the front
takes it: ``pause_reading`` holds it), and written at once, whole, when the front writes.

Whichever the transports, the front owns the original descriptors; fds 0 and 1 are pointed
elsewhere (``/dev/null``, stderr) so that a stray ``print()`` or a library writing to stdout can
never corrupt the stream.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import stat
from ..records import record

__all__ = ["Stdio", "take_stdio"]

READ_CHUNK = 256 * 1024


def _watchable(fd: int, events: int) -> bool:
    """Whether the loop can watch ``fd``: a pipe, socket or terminal, not a file or ``/dev/null``."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
        return False  # asyncio refuses them by their mode whatever the selector says (kqueue takes files)
    with selectors.DefaultSelector() as selector:
        try:
            selector.register(fd, events)
        except PermissionError:  # epoll: EPERM, "the target file fd does not support poll"
            return False
    return True


@record(frozen=True)
class Stdio:
    """The front's own copies of stdin and stdout (:func:`take_stdio`).

    Attributes:
        input: the descriptor of the original stdin.
        output: the descriptor of the original stdout.
        input_is_file: stdin is a file or ``/dev/null``: its end means the peer sends nothing more,
            not that it went away (a pipe's end does: nobody is left to read the answers).
        output_is_file: stdout is a file or ``/dev/null``.
    """

    input: int
    output: int
    input_is_file: bool
    output_is_file: bool

    async def write_to(self, protocol: asyncio.BaseProtocol) -> asyncio.WriteTransport:
        """The transport writing to stdout, with ``protocol`` told of its flow control and end."""
        loop = asyncio.get_running_loop()
        if self.output_is_file:
            return _FileWriter(loop, self.output, protocol)
        transport, _ = await loop.connect_write_pipe(lambda: protocol, os.fdopen(self.output, "wb", buffering=0))
        return transport

    async def read_into(self, protocol: asyncio.Protocol | asyncio.BufferedProtocol) -> asyncio.ReadTransport:
        """Start reading stdin into ``protocol`` (a ``Protocol`` or a ``BufferedProtocol``)."""
        loop = asyncio.get_running_loop()
        if self.input_is_file:
            return _FileReader(loop, self.input, protocol)
        transport, _ = await loop.connect_read_pipe(lambda: protocol, os.fdopen(self.input, "rb", buffering=0))
        return transport


def take_stdio() -> Stdio:
    """Move stdin and stdout to new descriptors for a stdio front; fd 0 becomes ``/dev/null`` and
    fd 1 a copy of stderr."""
    stdio = Stdio(os.dup(0), os.dup(1), not _watchable(0, selectors.EVENT_READ), not _watchable(1, selectors.EVENT_WRITE))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return stdio


class _FdTransport(asyncio.BaseTransport):
    """What a transport on a file the loop cannot watch has of its own: the fd, the protocol told
    of it at once, and an end that tells the protocol (``connection_lost``) in a later loop step."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        self._loop = loop
        self._fd = fd
        self._protocol = protocol
        self._closing = False
        loop.call_soon(protocol.connection_made, self)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._lose(None)

    def _stop(self) -> None:
        """What a subclass stops when it ends (a scheduled read)."""

    def _lose(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._stop()
        self._loop.call_soon(self._lost, exc)

    def _lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            os.close(self._fd)


class _FileReader(_FdTransport, asyncio.ReadTransport):
    """Reads a file the loop cannot watch: one chunk per loop turn while reading is not paused.

    Its end is told as a pipe's is (``eof_received``), but the transport stays open while the
    protocol returns true from it, so a front may still finish what the file asked for.
    """

    _protocol: asyncio.Protocol | asyncio.BufferedProtocol

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, protocol: asyncio.Protocol | asyncio.BufferedProtocol) -> None:
        self._paused = False
        self._at_end = False
        self._handle: asyncio.Handle | None = None
        super().__init__(loop, fd, protocol)
        loop.call_soon(self._schedule)

    def _schedule(self) -> None:
        if self._handle is None and not (self._paused or self._closing or self._at_end):
            self._handle = self._loop.call_soon(self._read)

    def _read(self) -> None:
        self._handle = None
        if self._paused or self._closing:
            return
        protocol = self._protocol
        data = b""
        try:
            if isinstance(protocol, asyncio.BufferedProtocol):
                n = os.readv(self._fd, [protocol.get_buffer(READ_CHUNK)])
            else:
                data = os.read(self._fd, READ_CHUNK)
                n = len(data)
        except OSError as exc:
            self._lose(exc)
            return
        if n == 0:
            self._at_end = True
            if not protocol.eof_received():
                self.close()
            return
        if isinstance(protocol, asyncio.BufferedProtocol):
            protocol.buffer_updated(n)
        else:
            protocol.data_received(data)
        self._schedule()

    def pause_reading(self) -> None:
        self._paused = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def resume_reading(self) -> None:
        self._paused = False
        self._schedule()

    def is_reading(self) -> bool:
        return not (self._paused or self._closing or self._at_end)

    def _stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _FileWriter(_FdTransport, asyncio.WriteTransport):
    """Writes to a file the loop cannot watch, whole and at once: such a write never waits for a
    reader, so nothing is buffered and ``pause_writing`` is never called. A failed write (a full
    disk) ends the transport as a broken pipe would: ``connection_lost(error)``."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        view = memoryview(data).cast("B")
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:  # ENOSPC, EIO: nothing more can be written
            self._lose(exc)

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # nothing is ever buffered

    def abort(self) -> None:
        self._lose(None)
