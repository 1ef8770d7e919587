"""A command's output pipes watched through one epoll of our own, which the loop watches once.

Every command has two pipes (three with a stdin) that live a few hundred microseconds for a
``true``. A loop reader per pipe costs more than the read itself: uvloop's ``add_reader`` looks the
descriptor up among its transports (a ``KeyError`` raised in Python), makes a poll handle, and
libuv checks the descriptor with an ``epoll_ctl`` add and delete before it adds it for real;
``remove_reader`` deletes it, and closing the handle deletes it twice more (``ENOENT``): 15 system
calls a command for its two pipes (``strace``). Here each pipe is one ``epoll_ctl`` in and one out,
on an epoll that the loop reads when any of them is ready. Level-triggered, as a loop reader is: a
callback that leaves data in its pipe is called again at the next turn of the loop.
"""

from __future__ import annotations

import asyncio
import select
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["FdWatch", "fd_watch"]

_EVENTS = 64  # descriptors dispatched per turn of the loop; more ready ones wait for the next turn


class FdWatch:
    """Readers on descriptors of one loop (:func:`fd_watch`), on an epoll of their own.

    A callback is called when its descriptor is readable or hung up, with the arguments it was
    added with; :meth:`remove` it before the descriptor is closed (a closed one leaves epoll only
    once no duplicate of it is left open anywhere).
    """

    __slots__ = ("_epoll", "_readers")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._epoll = select.epoll()
        self._readers: dict[int, tuple[Callable[..., None], tuple[Any, ...]]] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)

    def fileno(self) -> int:
        """The epoll's descriptor (the loop reads it)."""
        return self._epoll.fileno()

    def add(self, fd: int, callback: Callable[..., None], *args: Any) -> None:
        """Call ``callback(*args)`` whenever ``fd`` is readable (replacing its former reader).

        Registered with the epoll each time, never assumed from the table: a descriptor closed
        without :meth:`remove` left the epoll with its close, and a new one given its number must
        not be taken for it (its output would never be read)."""
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except FileExistsError:  # watched already: only the reader changes
            pass
        self._readers[fd] = (callback, args)

    def remove(self, fd: int) -> None:
        """Stop watching ``fd`` (nothing when it is not watched)."""
        if self._readers.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:  # EBADF: closed already (and so out of the epoll with its last copy)
                pass

    def _ready(self) -> None:
        readers = self._readers
        for fd, _ in self._epoll.poll(0, _EVENTS):
            reader = readers.get(fd)
            if reader is not None:  # an earlier callback of this turn may have removed it
                reader[0](*reader[1])


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FdWatch] = weakref.WeakKeyDictionary()
_last: tuple[weakref.ReferenceType[asyncio.AbstractEventLoop], FdWatch] | None = None


def fd_watch(loop: asyncio.AbstractEventLoop) -> FdWatch:
    """The :class:`FdWatch` of ``loop``, made at its first use; it goes with the loop."""
    global _last
    last = _last
    if last is not None and last[0]() is loop:  # a service has one loop: the common case is this
        return last[1]
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = FdWatch(loop)
    _last = (weakref.ref(loop), watch)
    return watch
