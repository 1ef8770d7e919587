"""Names to addresses, for the proxy alone (the sandbox has no DNS).

:class:`SystemResolver` asks the host's resolver (``getaddrinfo`` on the loop's executor);
:class:`OverrideResolver` answers listed names from a table first, for tests only
(``--egress-resolve HOST=ADDR[,ADDR...]``: a test maps a made-up public name to a local server).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..errors import EgressRuleError
from .rules import normal_host, parse_address

__all__ = ["Resolver", "SystemResolver", "OverrideResolver", "parse_overrides"]


class Resolver(Protocol):
    """Resolves a host name to its addresses (text, in the resolver's order; empty: no such name)."""

    async def resolve(self, host: str) -> tuple[str, ...]: ...


class SystemResolver:
    """The host's resolver: every address ``getaddrinfo`` gives, IPv4 and IPv6, without duplicates."""

    async def resolve(self, host: str) -> tuple[str, ...]:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            return ()
        return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


class OverrideResolver:
    """Names from a table, the rest from ``fallback`` (None: a name not in the table does not resolve)."""

    def __init__(self, table: Mapping[str, Sequence[str]], fallback: Resolver | None = None) -> None:
        self._table = {normal_host(host): tuple(addresses) for host, addresses in table.items()}
        self._fallback = fallback

    async def resolve(self, host: str) -> tuple[str, ...]:
        found = self._table.get(host)
        if found is not None:
            return found
        return await self._fallback.resolve(host) if self._fallback is not None else ()


def parse_overrides(values: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``HOST=ADDR[,ADDR...]`` values (``--egress-resolve``) as a table.

    Raises:
        EgressRuleError: a value without ``=``, or an address that is no IP address.
    """
    table: dict[str, tuple[str, ...]] = {}
    for value in values:
        host, equals, addresses = value.partition("=")
        listed = tuple(a.strip() for a in addresses.split(",") if a.strip())
        if not equals or not host.strip() or not listed:
            raise EgressRuleError(f"--egress-resolve {value!r}: write HOST=ADDRESS[,ADDRESS...]")
        for address in listed:
            if parse_address(address) is None:
                raise EgressRuleError(f"--egress-resolve {value!r}: {address!r} is no IP address")
        table[normal_host(host)] = table.get(normal_host(host), ()) + listed
    return table
