"""What the proxy tells the service about each connection: the seam between the two.

The proxy (:class:`~smith_fast.egress.proxy.EgressProxy`) knows nothing of sessions, hooks, peers
or audit logs; the service gives each served listener an :class:`Observer` and hears of every
attempt through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["Via", "Attempt", "Verdict", "Record", "Observer", "NullObserver"]

Via = Literal["connect", "http", "socks5"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """A destination a command asked the proxy for.

    Attributes:
        host: as asked (lower case, no trailing dot, IPv6 without brackets): a name or an IP literal;
            ``""`` when the client never named one (bytes that are no proxy request).
        port: 1-65535 (0 with ``host == ""``).
        via: ``"connect"`` (HTTP CONNECT), ``"http"`` (a plain-HTTP request forwarded), ``"socks5"``.
    """

    host: str
    port: int
    via: Via


@dataclass(frozen=True, slots=True)
class Verdict:
    """A decision on an attempt.

    Attributes:
        allowed: whether the proxy connects.
        rule: the ``--egress-allow``/``--egress-deny`` pattern that decided, or a fixed name:
            ``"not-allowed"`` (no rule allows it), ``"private-address"`` (a resolved address in a
            range only an address rule opens), ``"hook:<id>"`` (a beforeConnect hook's own name),
            ``"hook-failed"`` (the hook raised or took too long: refused), ``"bad-request"`` (no
            proxy request), ``"head-too-large"``, ``"limit"`` (too many connections),
            ``"unresolved"`` (the name has no address), ``"unreachable"`` (connecting failed),
            ``"timeout"`` (resolving or connecting took too long).
        reason: one line for a person: what was refused and why.
    """

    allowed: bool
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Record:
    """One connection, when it ended: exactly one per accepted connection.

    Attributes:
        attempt: what it asked for.
        address: the address connected to, or None (refused, or connecting failed).
        verdict: how it ended: the allowing rule when it connected, else why not.
        bytes_up: bytes from the command to the destination.
        bytes_down: bytes from the destination to the command.
    """

    attempt: Attempt
    address: str | None
    verdict: Verdict
    bytes_up: int
    bytes_down: int


class Observer(Protocol):
    """What the service does with a served listener's connections (one per session, or per request)."""

    async def before_connect(self, attempt: Attempt) -> Verdict | None:
        """A hook's word on an attempt the deny rules let through: a Verdict, or None to let the rules decide."""
        ...

    def refused(self, attempt: Attempt, verdict: Verdict) -> None:
        """An attempt was refused (say so to the peer: a LogEvent)."""
        ...

    def closed(self, record: Record) -> None:
        """A connection ended (an audit line)."""
        ...


class NullObserver:
    """An observer that hears nothing: the rules alone decide."""

    async def before_connect(self, attempt: Attempt) -> Verdict | None:
        return None

    def refused(self, attempt: Attempt, verdict: Verdict) -> None:
        return None

    def closed(self, record: Record) -> None:
        return None
