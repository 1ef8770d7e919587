"""Egress rule patterns: what ``--egress-allow`` and ``--egress-deny`` take, parsed once.

A pattern is one of (each with an optional ``:PORT``; without one it matches every port):

========================  ==============================================================
``pypi.org``              that name only
``*.pythonhosted.org``    every subdomain, at any depth, but NOT the apex
                          ``pythonhosted.org`` (write both to allow both): a rule that
                          names subdomains should not quietly hand out the parent's host
``*``                     every host name (never an IP literal: those need an address rule)
``10.0.0.0/8``            an address range (CIDR), IPv4 or IPv6 (``fd00::/8``)
``127.0.0.1``             one address; IPv6 with a port in brackets: ``[::1]:8080``
========================  ==============================================================

Names are compared case-insensitively, without a trailing dot. A name rule matches the name the
command asked for; an address rule matches an address (an IP literal the command asked for, or
one its name resolved to). Only an address rule can let a command reach a loopback, private,
link-local ... address (see :mod:`smith_fast.egress.addresses`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

from ..errors import EgressRuleError

__all__ = ["Rule", "IPAddress", "IPNetwork", "parse_rule", "parse_address", "normal_host"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A DNS label as registries hand them out (letters, digits, hyphen; underscore for SRV-like names).
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


@dataclass(frozen=True, slots=True)
class Rule:
    """One parsed pattern.

    Attributes:
        text: the pattern as the operator wrote it (what a verdict names).
        kind: ``"name"`` (exact), ``"subdomains"`` (``*.x``), ``"any-name"`` (``*``), ``"address"`` (IP or CIDR).
        host: the name, or the suffix of ``*.`` (lower case), ``""`` for the other kinds.
        network: the range of an address rule.
        port: the one port it matches, or None for every port.
    """

    text: str
    kind: Literal["name", "subdomains", "any-name", "address"]
    host: str = ""
    network: IPNetwork | None = None
    port: int | None = None

    def matches_name(self, host: str, port: int) -> bool:
        """Whether this rule matches a host name (already :func:`normal_host`) at ``port``."""
        if self.port is not None and self.port != port:
            return False
        if self.kind == "name":
            return host == self.host
        if self.kind == "subdomains":
            return host.endswith("." + self.host)
        return self.kind == "any-name"

    def matches_address(self, address: IPAddress, port: int) -> bool:
        """Whether this rule matches an address (already canonical: IPv4-mapped IPv6 as IPv4) at ``port``."""
        if self.port is not None and self.port != port:
            return False
        network = self.network
        return network is not None and address.version == network.version and address in network


def normal_host(host: str) -> str:
    """A host as rules compare it: lower case, no trailing dot, no IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") else host


def parse_address(text: str) -> IPAddress | None:
    """``text`` as an IP address, IPv4-mapped IPv6 (``::ffff:127.0.0.1``) given as its IPv4 form; None if no address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None  # fe80::1%eth0: a zone is the host's business, never a command's
        mapped = address.ipv4_mapped
        if mapped is not None:
            return mapped
    return address


def _network(text: str, pattern: str) -> IPNetwork | None:
    if "/" not in text:
        address = parse_address(text)
        return None if address is None else ipaddress.ip_network(address)
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            raise EgressRuleError(f"egress rule {pattern!r}: {text} has host bits set "
                                  f"(did you mean {ipaddress.ip_network(text, strict=False)}?)") from None
        raise EgressRuleError(f"egress rule {pattern!r}: {text} is no address range ({exc})") from None


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def _port(text: str, pattern: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise EgressRuleError(f"egress rule {pattern!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def parse_rule(pattern: str) -> Rule:
    """Parse one ``--egress-allow``/``--egress-deny`` pattern.

    Raises:
        EgressRuleError: (a ValueError) the pattern is none of the forms above; the message says why.
    """
    text = pattern.strip()
    if not text:
        raise EgressRuleError("egress rule '': empty pattern")
    port: int | None = None
    if text.startswith("["):
        inner, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise EgressRuleError(f"egress rule {pattern!r}: write an IPv6 address with a port as [ADDRESS]:PORT")
        if rest:
            port = _port(rest[1:], pattern)
        network = _network(inner, pattern)
        if network is None:
            raise EgressRuleError(f"egress rule {pattern!r}: {inner!r} is no IP address or range")
        return Rule(pattern, "address", network=network, port=port)
    if _is_network(text):
        whole = _network(text, pattern)
        if whole is not None:
            return Rule(pattern, "address", network=whole)
    head, colon, tail = text.rpartition(":")
    if colon:
        if ":" in head:
            raise EgressRuleError(f"egress rule {pattern!r}: write an IPv6 address with a port as [ADDRESS]:PORT")
        port = _port(tail, pattern)
        text = head
    if "/" in text or parse_address(text) is not None:
        network = _network(text, pattern)
        if network is not None:
            return Rule(pattern, "address", network=network, port=port)
    host = normal_host(text)
    if host == "*":
        return Rule(pattern, "any-name", port=port)
    kind: Literal["name", "subdomains"] = "name"
    if host.startswith("*."):
        kind, host = "subdomains", host[2:]
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise EgressRuleError(f"egress rule {pattern!r}: {host!r} is no host name "
                              "(a name, *.name for its subdomains, *, an IP address or a CIDR range)")
    return Rule(pattern, kind, host=host, port=port)
