"""What a handshake negotiates: protocol versions, the Envelope additions, capability names."""

from __future__ import annotations

from ..pb import smith_pb2

__all__ = ["SUPPORTED_VERSIONS", "ACCEPTABLE", "capability_name"]

SUPPORTED_VERSIONS = (1, 0)  # in order of preference (wire_notes.md, "Negotiation")
# What a v1 peer may ask for in its handshake's client_info (PROTOCOL.md, "Envelope additions").
ACCEPTABLE = ("batch_event", "health", "metrics")


def capability_name(value: int) -> str:
    """``CAPABILITY_SHELL_EXEC`` → ``shell_exec``; unknown numbers as their decimal value."""
    try:
        return smith_pb2.Capability.Name(value).removeprefix("CAPABILITY_").lower()
    except ValueError:
        return str(value)
