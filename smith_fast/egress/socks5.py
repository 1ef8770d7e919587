"""SOCKS5 (RFC 1928) as far as a proxy needs: no authentication, the CONNECT command.

The client's greeting and request are read from one buffer (clients often send both at once);
names (``socks5h://``: address type 3) are resolved by the proxy, under its rules.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["Greeting", "Request", "read_greeting", "read_request", "reply", "NO_AUTH", "NO_METHOD",
           "SUCCEEDED", "FAILURE", "NOT_ALLOWED", "UNREACHABLE", "REFUSED", "BAD_COMMAND", "BAD_ADDRESS"]

NO_AUTH = b"\x05\x00"
NO_METHOD = b"\x05\xff"  # "no acceptable methods": then the client closes
# Reply codes (RFC 1928 section 6).
SUCCEEDED, FAILURE, NOT_ALLOWED, UNREACHABLE, REFUSED, BAD_COMMAND, BAD_ADDRESS = 0, 1, 2, 4, 5, 7, 8


@dataclass(frozen=True, slots=True)
class Greeting:
    """The client's greeting: whether it offers "no authentication", and its length."""

    no_auth: bool
    size: int


@dataclass(frozen=True, slots=True)
class Request:
    """A request: its command (1 = CONNECT), host (a name, or an IP literal as text), port, length;
    ``error``: the reply code of bytes that are no SOCKS5 request (0: none)."""

    command: int
    host: str
    port: int
    size: int
    error: int = 0


def read_greeting(data: bytes | bytearray) -> Greeting | None:
    """The greeting at the start of ``data``, or None until it is all there."""
    if len(data) < 2:
        return None
    size = 2 + data[1]
    if len(data) < size:
        return None
    return Greeting(0 in data[2:size], size)


def read_request(data: bytes | bytearray, start: int) -> Request | None:
    """The request at ``data[start:]``, or None until it is all there.

    Not version 5, an address type that does not exist, a name that is not ASCII: a Request
    whose ``error`` is the reply code to send before closing.
    """
    head = data[start:start + 5]
    if len(head) < 5:
        return None
    if head[0] != 5:
        return Request(0, "", 0, 0, FAILURE)
    kind = head[3]
    if kind == 1:
        size, host_at = 4 + 4 + 2, start + 4
    elif kind == 4:
        size, host_at = 4 + 16 + 2, start + 4
    elif kind == 3:
        size, host_at = 4 + 1 + head[4] + 2, start + 5
    else:
        return Request(0, "", 0, 0, BAD_ADDRESS)
    if len(data) < start + size:
        return None
    end = start + size - 2
    raw = bytes(data[host_at:end])
    if kind == 1:
        host = str(ipaddress.IPv4Address(raw))
    elif kind == 4:
        host = str(ipaddress.IPv6Address(raw))
    else:
        try:
            host = raw.decode("ascii")
        except UnicodeDecodeError:
            return Request(0, "", 0, 0, BAD_ADDRESS)
        if not host:
            return Request(0, "", 0, 0, BAD_ADDRESS)
    port = int.from_bytes(data[end:end + 2], "big")
    return Request(head[1], host, port, size)


def reply(code: int) -> bytes:
    """A reply with ``code`` and an all-zero bound address (clients do not use it)."""
    return bytes((5, code, 0, 1, 0, 0, 0, 0, 0, 0))
