"""The egress proxy's bounds: one dataclass, its defaults the documented ones (``serve``'s
``--egress-max-head``, ``--egress-handshake-timeout``, ``--egress-connect-timeout``,
``--egress-idle-timeout``, ``--egress-max-connections``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EgressLimits"]


@dataclass(frozen=True, slots=True)
class EgressLimits:
    """Bounds of one proxy, per served listener where it says so.

    Attributes:
        max_head: bytes of a request head (HTTP) or handshake (SOCKS5) before the proxy answers
            431 (or closes): a header bomb costs this much memory at most.
        handshake_timeout: seconds from accept until the destination is named (a silent client is closed).
        connect_timeout: seconds to resolve and connect to the destination (504 / SOCKS5 0x04 after).
        idle_timeout: seconds a tunnel may carry nothing either way before both ends are closed.
        max_connections: connections at once per served listener; more are closed at accept.

    A timeout of 0 is none (:meth:`within` gives what ``asyncio.wait_for`` takes).
    """

    max_head: int = 64 * 1024
    handshake_timeout: float = 10.0
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0
    max_connections: int = 256

    @staticmethod
    def within(seconds: float) -> float | None:
        """A timeout as ``asyncio.wait_for`` takes it: None for 0 (none)."""
        return seconds if seconds > 0 else None
