"""What a handshake negotiates: protocol versions, the Envelope additions, capability names, and
the listeners a NegotiateResponse points a frontend at."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from ..pb import smith_pb2

__all__ = [
    "SUPPORTED_VERSIONS",
    "ACCEPTABLE",
    "ACCEPT_KEY",
    "ACCEPTED_KEY",
    "INTERVAL_KEY",
    "DEFAULT_METRICS_INTERVAL_MS",
    "MIN_METRICS_INTERVAL_MS",
    "MAX_METRICS_INTERVAL_MS",
    "Endpoint",
    "LISTENER_VERSIONS",
    "accept_additions",
    "capability_name",
    "endpoint_list",
    "wire_capabilities",
]

SUPPORTED_VERSIONS = (1, 0)  # in order of preference (PROTOCOL.md, "Negotiation")
# What a v1 peer may ask for in its handshake's client_info (PROTOCOL.md, "Envelope additions").
ACCEPTABLE = ("batch_event", "health", "metrics", "usage", "resume")
# Handshake client_info keys of the Envelope additions (PROTOCOL.md, "Asking for the additions").
ACCEPT_KEY = "smith_fast.accept"
INTERVAL_KEY = "smith_fast.metrics_interval_ms"
ACCEPTED_KEY = "smith_fast.accepted"
DEFAULT_METRICS_INTERVAL_MS = 1000
MIN_METRICS_INTERVAL_MS = 50
MAX_METRICS_INTERVAL_MS = 3_600_000

# The protocol versions a socket listener answers, by ``serve --protocol``.
LISTENER_VERSIONS: dict[str, tuple[int, ...]] = {"auto": (1, 0), "v1": (1,), "v0": (0,)}


@dataclass(frozen=True)
class Endpoint:
    """A listener a frontend can reach: its address (``unix:PATH``, ``tcp:HOST:PORT``,
    ``grpc:HOST:PORT``) and the protocol versions spoken there."""

    address: str
    versions: tuple[int, ...]


def wire_capabilities(numbers: Iterable[int]) -> list[smith_pb2.Capability]:
    """Capability numbers as the stubs type a ``repeated Capability`` field.

    ``smith_pb2.Capability`` is an ``int`` subclass for checkers only: at run time an enum value is
    a plain int, so this is a cast, not a conversion.
    """
    return cast("list[smith_pb2.Capability]", list(numbers))


def endpoint_list(addresses: Sequence[str]) -> str:
    """Addresses as one ``service_metadata`` value: comma-separated, with ``%`` and ``,`` inside an
    address written ``%25`` and ``%2C`` (a Unix socket's path may hold either)."""
    return ",".join(a.replace("%", "%25").replace(",", "%2C") for a in addresses)


def accept_additions(client_info: Mapping[str, str]) -> tuple[list[str], int, list[tuple[str, dict[str, str]]]]:
    """Which Envelope additions a v1 peer asked for (in :data:`ACCEPTABLE` order), its metrics
    interval in ms, and warnings (message, fields) about what was not understood."""
    warnings: list[tuple[str, dict[str, str]]] = []
    asked = [item.strip() for item in client_info.get(ACCEPT_KEY, "").split(",") if item.strip()]
    accepted = [item for item in ACCEPTABLE if item in asked]
    unknown = [item for item in asked if item not in ACCEPTABLE]
    if unknown:
        warnings.append(
            (
                f"{ACCEPT_KEY}: {', '.join(unknown)} not known and ignored (known: {', '.join(ACCEPTABLE)})",
                {"key": ACCEPT_KEY, "ignored": ",".join(unknown)},
            )
        )
    interval = DEFAULT_METRICS_INTERVAL_MS
    raw = client_info.get(INTERVAL_KEY)
    if raw is not None:
        try:
            interval = min(max(int(raw), MIN_METRICS_INTERVAL_MS), MAX_METRICS_INTERVAL_MS)
        except ValueError:
            warnings.append((f"{INTERVAL_KEY}={raw!r} is not a number of milliseconds; using {interval}", {"key": INTERVAL_KEY}))
    return accepted, interval, warnings


def capability_name(value: int) -> str:
    """``CAPABILITY_SHELL_EXEC`` → ``shell_exec``; unknown numbers as their decimal value."""
    try:
        return smith_pb2.Capability.Name(value).removeprefix("CAPABILITY_").lower()
    except ValueError:
        return str(value)
