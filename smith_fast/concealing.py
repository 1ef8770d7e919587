"""Keeping a secret (the service's token, a session's resume token) out of bytes that are written
down (session recordings) while the peer still gets the bytes as they are.

A secret inside a serialized ``Envelope`` cannot be replaced by something shorter without
re-encoding every length around it (a ``BatchEvent`` nests them), so it is replaced by a mask of
the same length: ``<redacted>`` followed by ``*`` (cut to the secret's length). The bytes stay a
valid Envelope, and nothing of the secret is left.
"""

from __future__ import annotations

__all__ = ["MASK", "conceal", "mask"]

MASK = b"<redacted>"


def mask(secret: bytes) -> bytes:
    """What takes ``secret``'s place: as many bytes as it has."""
    return (MASK + b"*" * len(secret))[: len(secret)]


def conceal(data: bytes | bytearray | memoryview, secrets: tuple[bytes, ...]) -> bytes:
    """``data`` with every occurrence of each of ``secrets`` masked (:func:`mask`); ``data`` itself
    (as bytes) when none occurs. One substring search per secret."""
    out = data if type(data) is bytes else bytes(data)
    for secret in secrets:
        if secret in out:
            out = out.replace(secret, mask(secret))
    return out
