"""Where a Smith service listens, as the client SDK and the command line name it.

``unix:PATH``, ``tcp:HOST:PORT``, ``HOST:PORT``, ``grpc:HOST:PORT`` or a bare path
(:data:`~smith_fast.options.ADDRESS_FORMS`): :func:`parse_address` reads one,
:func:`format_address` writes it back, :func:`unreachable` words why connecting to it failed.
"""

from __future__ import annotations

import socket

from .errors import AddressError, ConnectError
from .options import ADDRESS_FORMS

__all__ = ["ADDRESS_FORMS", "format_address", "parse_address", "split_host_port", "unreachable"]

_REASONS = {  # errno → what to say; "is it running?" where that is the likely cause
    FileNotFoundError: "no such file (is smith-fast serve running there?)",
    ConnectionRefusedError: "connection refused (is smith-fast serve running there?)",
    PermissionError: "permission denied (the socket is mode 0600: connect as the user running the service)",
    TimeoutError: "timed out",
}


def _reason(exc: OSError) -> str:
    for cls, text in _REASONS.items():
        if isinstance(exc, cls):
            return text
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror})"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def unreachable(name: str, exc: OSError) -> ConnectError:
    """The error for a connection to ``name`` (:func:`format_address`) that failed with ``exc``:
    it names the address and the likely cause (``cannot connect to unix:x.sock: no such file (is
    smith-fast serve running there?)``)."""
    return ConnectError(f"cannot connect to {name}: {_reason(exc)}")


def split_host_port(text: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` → (host, port), an empty host being 127.0.0.1;
    None when it is not one (no port, a port over 65535 or in other digits than ASCII's, a stray
    bracket). What a client connects to and what ``serve`` listens on are read alike."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 address, [::1]
    # isascii: str.isdigit takes other scripts' digits, which int() reads; a port over 65535 the
    # socket would take modulo 65536 (--tcp 127.0.0.1:99999 listened on 34463)
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535 or "[" in host or "]" in host:
        return None
    return host or "127.0.0.1", int(port)


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """``unix:PATH``, ``tcp:HOST:PORT``, ``grpc:HOST:PORT``, ``HOST:PORT`` or a path → (kind, target).

    ``grpc`` targets are returned as the ``HOST:PORT`` string grpcio takes.

    Raises:
        AddressError: an empty path, or a ``tcp:``/``grpc:`` address without a numeric port.
    """
    if "://" in address and not address.startswith("unix:"):  # http://..., nats://...: a URL, which no form is
        raise AddressError(f"address {address!r} is a URL, not an address of a Smith service (forms: {ADDRESS_FORMS}; "
                           "MCP over HTTP is for MCP clients)")
    if address.startswith("unix:") or ("/" in address and not address.startswith(("tcp:", "grpc:"))) or (
        ":" not in address and address
    ):
        path = address.removeprefix("unix:")
        if not path:
            raise AddressError(f"address {address!r} names no socket path (forms: {ADDRESS_FORMS})")
        return "unix", path
    kind = "grpc" if address.startswith("grpc:") else "tcp"
    split = split_host_port(address.removeprefix(f"{kind}:"))
    if split is None:
        raise AddressError(f"address {address!r} is not {kind}:HOST:PORT with a port number (forms: {ADDRESS_FORMS})")
    host, port = split
    if kind == "grpc":
        return "grpc", f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    return "tcp", (host, int(port))


def format_address(kind: str, target: str | tuple[str, int]) -> str:
    """The inverse of :func:`parse_address`: ``unix:PATH``, ``tcp:HOST:PORT``, ``grpc:HOST:PORT``."""
    if isinstance(target, tuple):
        host, port = target
        return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"
    return f"{kind}:{target}"
