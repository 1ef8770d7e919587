"""The handshake and idle deadlines that close half-open and forgotten connections.

One timer per connection, re-armed lazily: receiving a message only stores a timestamp, and the
timer, when it fires, looks at it and sleeps again for what is left. So the hot path pays one
attribute store per message, not a timer per message.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .config import Limits

__all__ = ["Deadlines", "Watched"]


class Watched(Protocol):
    """What the deadlines read of a session (:class:`~smith_fast.service.session.Session` is one)."""

    @property
    def handshaken(self) -> bool: ...

    @property
    def authenticated(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    @property
    def last_active(self) -> float: ...


class Deadlines:
    """The handshake and idle deadlines of one connection (or gRPC stream).

    Until its session completed an (authenticated) handshake, a connection has
    ``limits.handshake_timeout`` seconds from when it was opened; then it is closed as half-open.
    And at any time it is closed once no request ran and no message arrived for
    ``limits.idle_timeout`` seconds (``Session.last_active`` says when that last happened; before
    a session exists, the opening counts).

    Args:
        limits: the service limits (a timeout of 0 turns that deadline off).
        session: returns the connection's session, or None before it has one (no byte received).
        expire: called once, as ``expire(reason, message)``, with ``reason`` ``handshake_timeout``
            or ``idle_timeout``; it closes the connection.
    """

    __slots__ = ("_loop", "_handshake", "_idle", "_session", "_expire", "_opened", "_handle")

    def __init__(
        self, limits: Limits, session: Callable[[], Watched | None], expire: Callable[[str, str], None]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._handshake = limits.handshake_timeout
        self._idle = limits.idle_timeout
        self._session = session
        self._expire = expire
        self._opened = self._loop.time()
        self._handle: asyncio.TimerHandle | None = None
        first = min((t for t in (self._handshake, self._idle) if t > 0), default=0.0)
        if first > 0:
            self._handle = self._loop.call_at(self._opened + first, self._check)

    def cancel(self) -> None:
        """Stop watching (the connection is gone)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        session = self._session()
        now = self._loop.time()
        due = math.inf
        if self._handshake > 0 and (session is None or not (session.handshaken and session.authenticated)):
            due = self._opened + self._handshake
            if now >= due:
                self._expire("handshake_timeout", f"no handshake within {self._handshake:g} s of connecting; closing the connection")
                return
        if self._idle > 0:
            if session is not None and session.busy:
                idle_due = now + self._idle  # look again then: the clock restarts when the request ends
            else:
                idle_due = (self._opened if session is None else session.last_active) + self._idle
                if now >= idle_due:
                    self._expire(
                        "idle_timeout",
                        f"idle for {self._idle:g} s (no message received, no request running); closing the connection",
                    )
                    return
            due = min(due, idle_due)
        if due != math.inf:
            self._handle = self._loop.call_at(due, self._check)
