"""Who may use the service: the shared-secret token, and keeping it out of logs and recordings.

The other two guards against hostile or forgotten peers live beside this one: the handshake and
idle deadlines in :mod:`~smith_fast.service.deadlines`, the size limit on commands in
:mod:`~smith_fast.service.sizes`.

* **Token** (``serve --token`` / ``SMITH_TOKEN``): socket peers present it in their handshake's
  ``client_info["token"]`` (v0 peers as a ``"token"`` member of the Handshake's ``data``), gRPC
  peers there or in the call metadata (``authorization: Bearer …`` or ``smith-token``). It is
  compared with :func:`hmac.compare_digest`, so the time taken does not tell how much of a guess
  was right. The token is never logged and never recorded (:func:`redacted_handshake`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..pb import smith_pb2 as pb

__all__ = [
    "TOKEN_KEY",
    "REDACTED",
    "token_matches",
    "metadata_token",
    "redacted_handshake",
]

TOKEN_KEY = "token"
"""The ``HandshakeCommand.client_info`` key (and v0 Handshake ``data`` member) carrying the token."""
REDACTED = "<redacted>"
"""What a recorded handshake holds in place of the token."""
GRPC_TOKEN_HEADER = "smith-token"


def token_matches(expected: str, presented: str | None) -> bool:
    """Whether ``presented`` is the token, compared in constant time.

    Args:
        expected: the service's token.
        presented: what the peer sent, or None when it sent nothing.

    Returns:
        True when they are equal.
    """
    if presented is None:
        return False
    import hmac  # here: its OpenSSL start (~0.7 ms) would be on every start, and only a token needs it

    # bytes, not str: compare_digest only takes ASCII str, and a token may be any text
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def metadata_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token in gRPC call metadata: ``smith-token: T`` or ``authorization: Bearer T``.

    Args:
        metadata: the call's invocation metadata (keys are lower case on the wire).

    Returns:
        The token, or None when neither header is there.
    """
    for key, value in metadata or ():
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if key == GRPC_TOKEN_HEADER:
            return text
        if key == "authorization":
            scheme, _, credential = text.partition(" ")
            if scheme.lower() == "bearer":
                return credential.strip()
    return None


def redacted_handshake(env: pb.Envelope) -> pb.Envelope:
    """``env`` with the token and the resume token of its handshakes (a command, or commands of a
    batch) replaced by :data:`REDACTED`, for the session log. A copy: ``env`` is left as it was."""
    copy = pb.Envelope()
    copy.CopyFrom(env)
    commands = [copy.command] if copy.HasField("command") else list(copy.batch_command.commands)
    for command in commands:
        if command.WhichOneof("command_type") != "handshake":
            continue
        if TOKEN_KEY in command.handshake.client_info:
            command.handshake.client_info[TOKEN_KEY] = REDACTED
        if command.handshake.resume_token:  # it would take the session over
            command.handshake.resume_token = REDACTED
    return copy
