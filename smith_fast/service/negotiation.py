"""What a handshake negotiates: protocol versions, the Envelope additions, capability names, and
the listeners a NegotiateResponse points a frontend at."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import cast

from ..pb import smith_pb2
from ..records import record

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
    "capability_refusal",
    "NAMED",
    "named",
    "endpoint_list",
    "wire_capabilities",
]

SUPPORTED_VERSIONS = (1, 0)  # in order of preference (PROTOCOL.md, "Negotiation")
# What a v1 peer may ask for in its handshake's client_info (PROTOCOL.md, "Envelope additions").
ACCEPTABLE = ("batch_event", "health", "metrics", "usage", "resume", "changes")
# Handshake client_info keys of the Envelope additions (PROTOCOL.md, "Asking for the additions").
ACCEPT_KEY = "smith_fast.accept"
INTERVAL_KEY = "smith_fast.metrics_interval_ms"
ACCEPTED_KEY = "smith_fast.accepted"
DEFAULT_METRICS_INTERVAL_MS = 1000
MIN_METRICS_INTERVAL_MS = 50
MAX_METRICS_INTERVAL_MS = 3_600_000

# At most this many distinct items a peer sent are named back in one message or log line (a
# handshake listing 13,000 unknown capabilities gets one ErrorEvent naming 16 and counting the rest).
NAMED = 16

# The protocol versions a socket listener answers, by ``serve --protocol``.
LISTENER_VERSIONS: dict[str, tuple[int, ...]] = {"auto": (1, 0), "v1": (1,), "v0": (0,)}


@record(frozen=True)
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
    # distinct items only: a value of one name repeated 100,000 times costs one
    asked = dict.fromkeys(item.strip() for item in client_info.get(ACCEPT_KEY, "").split(","))
    asked.pop("", None)
    accepted = [item for item in ACCEPTABLE if item in asked]
    unknown = [item for item in asked if item not in ACCEPTABLE]
    if unknown:
        warnings.append(
            (
                f"{ACCEPT_KEY}: {named(unknown)} not known and ignored (known: {', '.join(ACCEPTABLE)})",
                {"key": ACCEPT_KEY, "ignored": ",".join(unknown[:NAMED])},
            )
        )
    interval = DEFAULT_METRICS_INTERVAL_MS
    raw = client_info.get(INTERVAL_KEY)
    if raw is not None:
        try:
            interval = min(max(int(raw), MIN_METRICS_INTERVAL_MS), MAX_METRICS_INTERVAL_MS)
        except ValueError:
            warnings.append((f"{INTERVAL_KEY}={raw[:64]!r} is not a number of milliseconds; using {interval}", {"key": INTERVAL_KEY}))
    return accepted, interval, warnings


def capability_name(value: int) -> str:
    """``CAPABILITY_SHELL_EXEC`` → ``shell_exec``; unknown numbers as their decimal value."""
    try:
        return smith_pb2.Capability.Name(value).removeprefix("CAPABILITY_").lower()
    except ValueError:
        return str(value)


def named(items: Sequence[str], limit: int = NAMED) -> str:
    """``a, b, c``: at most ``limit`` items, then ``and N more``; what a peer sent, said back boundedly."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more"


def capability_refusal(refused: Sequence[int], available: Collection[int]) -> tuple[str, dict[str, str]]:
    """The one ``ErrorEvent`` (message, details) of a handshake for all the capabilities it could
    not grant (:meth:`ServiceCore.grant <smith_fast.service.core.ServiceCore.grant>`'s ``refused``,
    distinct): each unknown or unavailable one is named, up to :data:`NAMED` of them.

    ``details.capability`` lists the names (comma-separated, at most :data:`NAMED`),
    ``details.refused`` counts them all.
    """
    names = [capability_name(c) for c in refused[:NAMED]]
    unknown = [n for n, c in zip(names, refused) if n.isdigit() or c == 0]
    shown = ", ".join(names) + (f" and {len(refused) - NAMED} more" if len(refused) > NAMED else "")
    what = "is" if len(refused) == 1 else "are"
    if len(unknown) == len(names):
        reason = "unknown"
    elif not unknown:
        reason = "not available on this service"
    else:
        reason = "unknown or not available on this service"
    plural = "capability" if len(refused) == 1 else "capabilities"
    offered = ",".join(sorted(capability_name(c) for c in available))
    message = f"{plural} {shown} {what} {reason} (available: {offered}); the others are granted"
    return message, {"capability": ",".join(names), "refused": str(len(refused))}
