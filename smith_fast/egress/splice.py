"""Zero-copy relaying: bytes moved socket → pipe → socket by ``splice(2)``, driven by the loop.

A :class:`Pump` moves one direction. When the source is readable it splices what is there into
its pipe and at once from the pipe into the destination; the bytes never enter the process (no
``bytes`` object, no copy through userspace, no Python work per byte). When the destination is
full the pump stops watching the source and watches the destination instead, so a slow reader
holds at most one pipe of data per direction (flow control without a buffer of our own).

Measured against a relay of asyncio protocols (``data_received`` → ``transport.write``, uvloop)
in ``bench/bench_egress.py``: see that module and the commit that brought this one.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
from typing import Protocol

__all__ = ["Pump", "PIPE_SIZE", "DOWN_PIPE_SIZE"]

PIPE_SIZE = 256 * 1024
DOWN_PIPE_SIZE = 1 << 20
# Most a splice moves at once: the pipe's size. A larger pipe moves more per splice and per loop
# wake-up: bench/bench_egress_relay.py measured a 1 MiB pipe at about two thirds of the CPU per MB
# of a 256 KiB one for a download (0.29-0.31 against 0.43-0.50 ms/MB), the kernel's work per
# splice being most of the relay's cost. But an unprivileged user's pipes share a quota
# (/proc/sys/fs/pipe-user-pages-soft, 64 MiB by default; over it a resize is refused and the pipe
# keeps the kernel's default): so the direction that carries downloads, destination to client, gets
# DOWN_PIPE_SIZE and the other PIPE_SIZE, which keeps about 50 connections inside the quota.
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class Pump:
    """One direction of a relay, ``src`` to ``dst``; ``done`` is set at the source's EOF (after the
    destination got everything and a FIN) or at an error of either socket.

    Args:
        counter: called with the bytes moved (and reset idle time); a bound method of the owner.
        pipe_size: the pipe asked for (:data:`PIPE_SIZE`, or :data:`DOWN_PIPE_SIZE` for a download).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket,
                 counter: "Counter", pipe_size: int = PIPE_SIZE) -> None:
        self.loop = loop
        self.src = src.fileno()
        self.dst = dst.fileno()
        self.dst_socket = dst
        self.counter = counter
        self.held = 0       # bytes in the pipe, not yet in dst
        self.eof = False
        self.done: asyncio.Future[OSError | None] = loop.create_future()
        self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(self.pipe_w, _F_SETPIPE_SZ, pipe_size)
        except OSError:
            pass  # over the user's pipe quota: the default size still works, in smaller steps
        self.size = fcntl.fcntl(self.pipe_w, getattr(fcntl, "F_GETPIPE_SZ", 1032))
        self.watching = "src"
        loop.add_reader(self.src, self._readable)

    def _readable(self) -> None:
        # Move until the source has nothing more (or the destination is full): one wake-up of
        # the loop then carries all that arrived, not one pipe-full.
        while self.watching == "src":
            try:
                moved = os.splice(self.src, self.pipe_w, self.size, flags=_FLAGS)
            except BlockingIOError:
                return
            except OSError as exc:
                self._finish(exc)
                return
            if moved == 0:
                self.eof = True
                self.loop.remove_reader(self.src)
                self.watching = ""
                if self.held == 0:
                    self._end()
                return
            self.held += moved
            self.counter.moved(self, moved)
            self._drain()

    def _drain(self) -> None:
        while self.held:
            try:
                moved = os.splice(self.pipe_r, self.dst, self.held, flags=_FLAGS)
            except BlockingIOError:
                if self.watching == "src":
                    self.loop.remove_reader(self.src)
                    self.loop.add_writer(self.dst, self._writable)
                    self.watching = "dst"
                return
            except OSError as exc:
                self._finish(exc)
                return
            self.held -= moved
        if self.eof:
            self._end()
        elif self.watching == "dst":
            self.loop.remove_writer(self.dst)
            self.loop.add_reader(self.src, self._readable)
            self.watching = "src"

    def _writable(self) -> None:
        self._drain()

    def _end(self) -> None:
        try:
            self.dst_socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._finish(None)

    def _finish(self, error: OSError | None) -> None:
        self.stop()
        if not self.done.done():
            self.done.set_result(error)

    def stop(self) -> None:
        """Stop watching both sockets and close the pipe (the sockets are the owner's)."""
        if self.watching == "src":
            self.loop.remove_reader(self.src)
        elif self.watching == "dst":
            self.loop.remove_writer(self.dst)
        self.watching = ""
        if self.pipe_r >= 0:
            os.close(self.pipe_r)
            os.close(self.pipe_w)
            self.pipe_r = self.pipe_w = -1


class Counter(Protocol):
    """What a pump reports to: its owner, counting bytes each way and idle time."""

    def moved(self, pump: Pump, count: int) -> None: ...
