"""Which resolved addresses a command may not reach unless an address rule names them.

A name can resolve anywhere, so the proxy checks every address a name resolved to, and every IP
literal asked for, against one table of ranges that lead back into the host or its networks:
loopback (the service's own ports), link-local (``169.254.169.254`` is every cloud's metadata
service, with its credentials), private and shared (CGNAT) ranges, unspecified (``0.0.0.0``
reaches loopback on Linux), multicast, broadcast and reserved space, plus every address of the
host's own interfaces (a public IP of this machine reaches its services as loopback would).

IPv4 inside IPv6 is checked as the IPv4 it carries: IPv4-mapped ``::ffff:a.b.c.d`` (the kernel
connects it as IPv4), and the forms that a relay might turn into IPv4: NAT64 ``64:ff9b::/96``,
6to4 ``2002::/16``, IPv4-compatible ``::a.b.c.d``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from .rules import IPAddress, IPNetwork

__all__ = ["special_kind", "host_addresses", "OWN"]

OWN = "this host's own"

_V4, _V6 = ipaddress.IPv4Network, ipaddress.IPv6Network

# (range, what a refusal calls it); the first that holds an address names it.
SPECIAL: tuple[tuple[IPNetwork, str], ...] = (
    (_V4("127.0.0.0/8"), "loopback"),
    (_V6("::1/128"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local (cloud metadata)"),
    (_V6("fe80::/10"), "link-local"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.168.0.0/16"), "private"),
    (_V6("fc00::/7"), "private (unique local)"),
    (_V6("fec0::/10"), "private (site-local)"),
    (_V4("100.64.0.0/10"), "shared (CGNAT)"),
    (_V4("0.0.0.0/8"), "unspecified"),
    (_V6("::/128"), "unspecified"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V6("ff00::/8"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),
    (_V4("192.0.0.0/24"), "reserved"),
    (_V4("198.18.0.0/15"), "reserved (benchmarking)"),
)

_NAT64 = _V6("64:ff9b::/96")
_SIXTOFOUR = _V6("2002::/16")
_COMPATIBLE = _V6("::/96")


def _embedded(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address in _NAT64 or address in _COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIXTOFOUR:
        return address.sixtofour
    return None


def special_kind(address: IPAddress, own: frozenset[IPAddress] = frozenset()) -> str | None:
    """What makes ``address`` one a command may not reach by name alone, or None for a public address.

    Args:
        address: canonical (IPv4-mapped IPv6 already as IPv4: :func:`~smith_fast.egress.rules.parse_address`).
        own: the host's own addresses (:func:`host_addresses`).
    """
    for network, kind in SPECIAL:
        if address.version == network.version and address in network:
            return kind
    if address in own:
        return OWN
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded(address)
        if inner is not None:
            kind_inner = special_kind(inner, own)
            return None if kind_inner is None else f"{kind_inner} (embedded in IPv6)"
    if not address.is_global:
        return "reserved"
    return None


def host_addresses() -> frozenset[IPAddress]:
    """Every address of this host's interfaces, in the service's network namespace.

    From ``/proc/net/fib_trie`` (IPv4: the ``/32 host LOCAL`` entries) and ``/proc/net/if_inet6``,
    so no dependency is needed; empty where /proc does not say (the table above still holds).
    """
    found: set[IPAddress] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for previous, line in zip(lines, lines[1:]):
        if "/32 host LOCAL" in line:
            text = previous.strip().lstrip("|-+ ").strip()
            try:
                found.add(ipaddress.IPv4Address(text))
            except ValueError:
                continue
    try:
        rows = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        rows = []
    for row in rows:
        hexa = row.split()[0] if row.split() else ""
        if len(hexa) == 32:
            found.add(ipaddress.IPv6Address(int(hexa, 16)))
    # Not getaddrinfo(gethostname()): a resolver that hangs would hold the service's start, and
    # the interfaces above already hold every address the host answers on.
    return frozenset(found)
