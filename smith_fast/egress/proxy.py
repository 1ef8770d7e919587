"""EgressProxy: the listener, its connections and their relays (filled in by the next commit)."""

from __future__ import annotations

import asyncio
import socket

from .attempts import Observer
from .limits import EgressLimits
from .policy import EgressPolicy
from .resolver import Resolver

__all__ = ["EgressProxy", "Served"]


class Served:
    """One listener being served: :meth:`close` stops accepting and closes its connections."""

    def close(self) -> None:
        raise NotImplementedError

    async def wait_closed(self) -> None:
        raise NotImplementedError

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on."""
        raise NotImplementedError


class EgressProxy:
    """HTTP CONNECT, plain-HTTP forwarding and SOCKS5 on one listener, under one policy."""

    def __init__(self, policy: EgressPolicy, *, resolver: Resolver | None = None,
                 limits: EgressLimits | None = None) -> None:
        self.policy = policy
        self.limits = limits or EgressLimits()

    def serve(self, listener: socket.socket, observer: Observer) -> Served:
        raise NotImplementedError

    async def start_tcp(self, host: str, port: int, observer: Observer) -> Served:
        raise NotImplementedError
