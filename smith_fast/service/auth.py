"""What keeps hostile or forgotten peers from holding the service: the shared-secret token, the
handshake and idle deadlines, and the size limit on commands.

* **Token** (``serve --token`` / ``SMITH_TOKEN``): socket peers present it in their handshake's
  ``client_info["token"]`` (v0 peers as a ``"token"`` member of the Handshake's ``data``), gRPC
  peers there or in the call metadata (``authorization: Bearer …`` or ``smith-token``). It is
  compared with :func:`hmac.compare_digest`, so the time taken does not tell how much of a guess
  was right. The token is never logged and never recorded (:func:`redacted_handshake`).
* **Deadlines** (:class:`Deadlines`): one timer per connection, re-armed lazily: receiving a
  message only stores a timestamp, and the timer, when it fires, looks at it and sleeps again for
  what is left. So the hot path pays one attribute store per message, not a timer per message.
* **Command size** (:func:`command_size`): measured before anything runs (and again after hooks
  transformed the command), so an oversize command never reaches a hook or a shell.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb

if TYPE_CHECKING:
    from .config import Limits
    from .session import Session

__all__ = [
    "TOKEN_KEY",
    "REDACTED",
    "Deadlines",
    "token_matches",
    "metadata_token",
    "redacted_handshake",
    "command_size",
    "request_size",
    "too_large",
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
    """``env`` with the token of its handshakes (a command, or commands of a batch) replaced by
    :data:`REDACTED`, for the session log. A copy: ``env`` is left as it was."""
    copy = pb.Envelope()
    copy.CopyFrom(env)
    commands = [copy.command] if copy.HasField("command") else list(copy.batch_command.commands)
    for command in commands:
        if command.WhichOneof("command_type") == "handshake" and TOKEN_KEY in command.handshake.client_info:
            command.handshake.client_info[TOKEN_KEY] = REDACTED
    return copy


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def command_size(cmd: pb.ShellExecCommand) -> int:
    """Bytes a ShellExec asks the service to hand to ``exec``: the command string plus its env
    (``NAME=value`` entries), in UTF-8."""
    size = _text_size(cmd.command)
    for name, value in cmd.env.items():
        size += _text_size(name) + _text_size(value) + 2
    return size


def request_size(kind: str, request: Any) -> int:
    """The size ``--max-command-size`` limits of a request: a ShellExec's :func:`command_size`,
    a ToolCall's ``args``, a PlanCommand's goal plus its context; 0 for other commands."""
    if kind == "tool_call":
        return len(request.args)
    if kind == "shell_exec":
        return command_size(request)
    if kind == "plan":
        return _text_size(request.goal) + sum(_text_size(k) + _text_size(v) for k, v in request.context.items())
    return 0


def too_large(what: str, size: int, limit: int, rid: str | None) -> ProtocolError:
    """The error for a command over ``--max-command-size``: ``ERROR_CODE_RESOURCE_EXHAUSTED``."""
    return ProtocolError(
        f"{what} is {size} bytes, over the limit of {limit} (--max-command-size); nothing was run",
        pb.ERROR_CODE_RESOURCE_EXHAUSTED,
        rid,
        {"reason": "too_large", "size": str(size), "limit": str(limit)},
    )


class Deadlines:
    """The handshake and idle deadlines of one connection (or gRPC stream).

    Until its session completed an (authenticated) handshake, a connection has
    ``limits.handshake_timeout`` seconds from when it was opened; then it is closed as half-open.
    And at any time it is closed once no request ran and no message arrived for
    ``limits.idle_timeout`` seconds (``Session.last_active`` says when that last happened; before
    a session exists, the opening counts).

    Args:
        limits: the service limits (a timeout of 0 turns that deadline off).
        session: returns the connection's session, or None before it has one (no byte received).
        expire: called once, as ``expire(reason, message)``, with ``reason`` ``handshake_timeout``
            or ``idle_timeout``; it closes the connection.
    """

    __slots__ = ("_loop", "_handshake", "_idle", "_session", "_expire", "_opened", "_handle")

    def __init__(
        self, limits: Limits, session: Callable[[], Session | None], expire: Callable[[str, str], None]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._handshake = limits.handshake_timeout
        self._idle = limits.idle_timeout
        self._session = session
        self._expire = expire
        self._opened = self._loop.time()
        self._handle: asyncio.TimerHandle | None = None
        first = min((t for t in (self._handshake, self._idle) if t > 0), default=0.0)
        if first > 0:
            self._handle = self._loop.call_at(self._opened + first, self._check)

    def cancel(self) -> None:
        """Stop watching (the connection is gone)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        session = self._session()
        now = self._loop.time()
        due = math.inf
        if self._handshake > 0 and (session is None or not (session.handshaken and session.authenticated)):
            due = self._opened + self._handshake
            if now >= due:
                self._expire("handshake_timeout", f"no handshake within {self._handshake:g} s of connecting; closing the connection")
                return
        if self._idle > 0:
            if session is not None and session.busy:
                idle_due = now + self._idle  # look again then: the clock restarts when the request ends
            else:
                idle_due = (self._opened if session is None else session.last_active) + self._idle
                if now >= idle_due:
                    self._expire(
                        "idle_timeout",
                        f"idle for {self._idle:g} s (no message received, no request running); closing the connection",
                    )
                    return
            due = min(due, idle_due)
        if due != math.inf:
            self._handle = self._loop.call_at(due, self._check)
