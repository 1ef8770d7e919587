"""Session resume (PROTOCOL.md, "Resume"): a v1 peer whose connection dropped reconnects and carries on.

A peer that asks for ``resume`` in its handshake (``client_info["smith_fast.accept"]``) gets a token
in ``Ready.resume_token``. From then on every envelope its session writes is also kept in the
session's :class:`Retention` ring. When its connection drops, the session is *parked* instead of torn
down: its requests go on, what they send goes into the ring only, and :class:`ParkedSessions` gives
it ``--resume-window`` seconds. A new connection whose handshake presents the token and the last
sequence it received takes the session over: ``Ready(resumed)``, the retained envelopes after that
sequence, then the live ones, all in the one sequence the session always had. The window passing
ends the session as a dropped connection always did (its processes killed).

Bounds (``--max-session-buffer``): while connected, the ring drops its oldest envelopes past the
limit (the peer most likely has them; a resume that needs one is refused, ``resume_gap``, never
answered with a hole). While parked, nothing is dropped (which of the last envelopes the peer got is
not known until it resumes): past the limit the session is paused as for a peer that does not read
(its child pipes are not read, no request starts), and what was written since the drop counts as
unsent in its output budget (:mod:`~smith_fast.service.flow`).

The session moves between connections through a :class:`Front`, which the socket front
(:class:`~smith_fast.service.connection.Connection`) and a gRPC ``Stream`` call implement; stdio has
none (nobody reconnects to a pipe), so it cannot resume.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Protocol

from .._varint import decode as decode_varint
from ..errors import ResumeRefused
from ..logs import get_logger
from ..pb import smith_pb2 as pb

__all__ = ["RESUME", "Front", "ParkedSessions", "Parkable", "Resumable", "ResumeRefused", "Retention", "sequence_of", "token_key"]

log = get_logger("smith_fast.resume")

RESUME = "resume"  # the handshake addition (negotiation.ACCEPTABLE)


class Front(Protocol):
    """What a resumable session needs of the connection that carries it."""

    @property
    def framed(self) -> bool:
        """Its envelopes carry a length prefix (sockets; a gRPC call's messages do not): a session
        resumes only on a front that frames as the one it started on, whose bytes it retained."""
        ...

    def write(self, data: bytes) -> None:
        """Queue one framed envelope for the peer."""

    def close(self) -> None:
        """Flush, then close the connection (the session is over)."""

    def unsent(self) -> int:
        """Bytes written for the peer that it has not taken yet."""
        ...

    def hold_input(self, held: bool) -> None:
        """Stop (True) or resume (False) reading the peer's commands."""

    def forward(self, to: Front | None) -> None:
        """This is the front the session's sink writes to: pass what it writes on to ``to`` (the
        connection that carries the session now), or drop it (None: parked; the ring has it)."""

    def carry(self, session: object) -> None:
        """Feed the peer's commands to ``session`` from now on (it resumed here)."""

    def release(self) -> None:
        """Another connection took the session over: drop this one without parking it again."""


def token_key(token: str) -> str:
    """What a resume token is kept under: its SHA-256 (hex). A token is never stored, so reading
    the service's memory or anything it writes does not let anybody take a session over."""
    import hashlib  # here, as secrets below: hashlib's OpenSSL start (~1 ms) is on no other start's path

    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def sequence_of(unit: bytes, framed: bool = True) -> int:
    """The ``Envelope.sequence`` (field 2) of one written envelope, 0 when it has none."""
    pos = decode_varint(unit, 0)[1] if framed else 0
    end = len(unit)
    while pos < end:
        tag, pos = decode_varint(unit, pos)
        if tag & 7 != 0:  # timestamp and sequence come first, both varints
            return 0
        value, pos = decode_varint(unit, pos)
        if tag >> 3 == 2:
            return value
    return 0


class Retention:
    """The envelopes a resumable session wrote: the newest ``limit`` bytes of them while it is
    connected; while it is parked, all it had then and all written since.

    Args:
        limit: ``--max-session-buffer``.
        on_full: called once a parked session's ring goes past ``limit`` (the session then
            pauses, so that it produces no more); again after each :meth:`attach`.
        framed: the units carry a length prefix (socket fronts).
    """

    __slots__ = ("limit", "units", "next", "size", "parked", "parked_bytes", "full", "_on_full", "_framed")

    def __init__(self, limit: int, on_full: Callable[[], None], framed: bool = True) -> None:
        self.limit = limit
        self.units: collections.deque[bytes] = collections.deque()
        self.next = 0  # the sequence of the next unit; 0 until the first one is seen
        self.size = 0
        self.parked = False
        self.parked_bytes = 0  # written since the park
        self.full = False
        self._on_full = on_full
        self._framed = framed

    @property
    def first(self) -> int:
        """The sequence of the oldest unit kept."""
        return self.next - len(self.units)

    def record(self, unit: bytes) -> None:
        """Keep one written unit (every write of the sink takes exactly one sequence, in order)."""
        if self.next == 0:
            self.next = sequence_of(unit, self._framed)
        self.next += 1
        self.units.append(unit)
        self.size += len(unit)
        if self.parked:
            self.parked_bytes += len(unit)
        if self.size > self.limit:
            self._trim()

    def _trim(self) -> None:
        if not self.parked:
            units = self.units
            while self.size > self.limit and units:
                self.size -= len(units.popleft())
        elif not self.full:
            self.full = True
            self._on_full()

    def park(self) -> None:
        self.parked = True
        self.parked_bytes = 0
        if self.size > self.limit:
            self._trim()

    def attach(self) -> None:
        self.parked = False
        self.parked_bytes = 0
        self.full = False
        if self.size > self.limit:
            self._trim()

    def replay(self, after: int) -> list[bytes]:
        """The units after sequence ``after`` (what the peer has not received); those up to it
        are dropped, as the peer has them.

        Raises:
            ResumeRefused: ``after`` is past what was sent (``resume_invalid``) or some of what
                follows it is no longer kept (``resume_gap``).
        """
        last = self.next - 1
        if after > last:
            raise ResumeRefused(
                f"resume_after {after} is past the last envelope this session sent ({last}); nothing was resumed",
                "resume_invalid",
                pb.ERROR_CODE_UNSPECIFIED,
            )
        if after + 1 < self.first:
            raise ResumeRefused(
                f"the session no longer holds envelopes {after + 1}..{self.first - 1} (more than --max-session-buffer "
                f"{self.limit} bytes were sent after them); it cannot be resumed without a loss, so it was not",
                "resume_gap",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
            )
        units = self.units
        while len(units) > last - after:
            self.size -= len(units.popleft())
        return list(units)


class Parkable(Protocol):
    """What :class:`ParkedSessions` calls on a parked session."""

    def expire_parked(self) -> None:
        """``--resume-window`` passed without a resume: end it as a dropped connection."""


class ParkedSessions:
    """The service's resumable sessions by token (kept by :func:`token_key`), and the window
    timers of the parked ones.

    Args:
        window: ``--resume-window`` seconds (0: nothing is resumable).
        limit: at most this many parked at once (``--max-connections``): one more is torn down.
        route: what each token starts with, before a ``.``: a NATS worker's id, so that a resume
            through any gateway reaches the worker the session lives on ("" for none).
    """

    def __init__(self, window: float, limit: int, route: str = "") -> None:
        self.window = window
        self.limit = limit
        self._prefix = f"{route}." if route else ""
        self._sessions: dict[str, Parkable] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        """Sessions parked now."""
        return len(self._timers)

    def issue(self, session: Parkable) -> tuple[str, str]:
        """A new unguessable token for ``session``, and the key it is kept under."""
        import secrets  # here: random and its seeding are on no other start's path

        token = self._prefix + secrets.token_urlsafe(24)
        key = token_key(token)
        self._sessions[key] = session
        return token, key

    def park(self, key: str) -> bool:
        """Start the window of the session kept under ``key``; False when too many are parked."""
        if key not in self._sessions or len(self._timers) >= self.limit:
            return False
        session = self._sessions[key]
        self._timers[key] = asyncio.get_running_loop().call_later(self.window, self._expire, key, session)
        return True

    def _expire(self, key: str, session: Parkable) -> None:
        self._timers.pop(key, None)
        self._sessions.pop(key, None)
        log.info("resume window passed", extra={"fields": {"window": self.window}})
        session.expire_parked()

    def find(self, token: str) -> Parkable | None:
        """The resumable session (parked or not) ``token`` names."""
        return self._sessions.get(token_key(token)) if token else None

    def unpark(self, key: str) -> None:
        """The session resumed: stop its window."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def forget(self, key: str) -> None:
        """The session ended: its token names nothing any more."""
        self.unpark(key)
        self._sessions.pop(key, None)


class Resumable:
    """A resumable session's resume state: its token, ring, and the fronts it is written through.

    Attributes:
        token: ``Ready.resume_token``.
        key: what :class:`ParkedSessions` keeps it under (:func:`token_key` of the token).
        retention: its ring.
        origin: the front its sink was made on (whose ``write`` the sink calls, and which passes
            the writes on to whichever front carries the session now).
    """

    __slots__ = ("token", "key", "retention", "origin")

    def __init__(self, token: str, key: str, retention: Retention, origin: Front) -> None:
        self.token = token
        self.key = key
        self.retention = retention
        self.origin = origin
