"""The per-request envelope of MCP 2026-07-28: what a stateless request says about itself.

There is no ``initialize``: each request carries in ``params._meta`` its protocol version and the
client's capabilities (both required), maybe the client's name and the log level it wants. Over
HTTP the ``MCP-Protocol-Version``, ``Mcp-Method`` and (``tools/call``) ``Mcp-Name`` headers must
say the same as the body, so that a proxy can route on headers alone (:func:`header_mismatch`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import protocol

__all__ = ["Envelope", "EnvelopeError", "is_modern", "envelope", "header_mismatch"]


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a stateless request's ``params._meta`` says: its protocol version, the client's
    capabilities and the log level it asked for."""

    version: str
    capabilities: Mapping[str, Any]
    log_level: str | None  # None: no notifications/message for this request

    @property
    def tasks(self) -> bool:
        """The client takes a task handle for an answer (the tasks extension)."""
        extensions = self.capabilities.get("extensions")
        return isinstance(extensions, dict) and protocol.TASKS_EXTENSION in extensions

    @property
    def answers_input(self) -> bool:
        """The client can answer an input request (a form elicitation): a command may wait for
        input, so its stdin is kept open for the answer."""
        return isinstance(self.capabilities.get("elicitation"), dict)


@dataclass(frozen=True, slots=True)
class EnvelopeError:
    """Why a stateless request's ``_meta`` is refused: the JSON-RPC error's code, message and data."""

    code: int
    message: str
    data: Any = None


def is_modern(params: object) -> bool:
    """A request of the stateless revision: its ``_meta`` names a protocol version."""
    if not isinstance(params, dict):
        return False
    meta = params.get("_meta")
    return isinstance(meta, dict) and protocol.VERSION_KEY in meta


def envelope(params: Mapping[str, Any]) -> Envelope | EnvelopeError:
    """The envelope of a request :func:`is_modern` said is one, or why it is not a valid one."""
    meta = params["_meta"]
    missing = [key for key in (protocol.VERSION_KEY, protocol.CAPABILITIES_KEY) if key not in meta]
    if missing:
        return EnvelopeError(protocol.INVALID_PARAMS, f"params._meta lacks {', '.join(missing)}")
    version, capabilities = meta[protocol.VERSION_KEY], meta[protocol.CAPABILITIES_KEY]
    if not isinstance(version, str) or not isinstance(capabilities, dict):
        return EnvelopeError(protocol.INVALID_PARAMS, "the protocol version must be a string and the client capabilities an object")
    if version != protocol.MODERN:
        return unsupported(version)
    level = meta.get(protocol.LOG_LEVEL_KEY)
    if level is not None and level not in protocol.LOG_LEVELS:
        return EnvelopeError(protocol.INVALID_PARAMS, f"the log level must be one of {', '.join(protocol.LOG_LEVELS)}")
    return Envelope(version, capabilities, level)


def unsupported(version: object) -> EnvelopeError:
    return EnvelopeError(
        protocol.UNSUPPORTED_VERSION, f"protocol version {version!r} is not supported",
        {"supported": [protocol.MODERN, *protocol.REVISIONS], "requested": version},
    )


# The methods whose Mcp-Name header names something of the body (the tasks extension's: the task).
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri", "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
_BASE64 = re.compile(r"^=\?base64\?(.*)\?=$")


def _decoded(value: str | None) -> str | None:
    """A header value as sent: verbatim, or the ``=?base64?…?=`` form of one that is not plain ASCII."""
    if value is None:
        return None
    match = _BASE64.fullmatch(value)
    if match is None:
        return value
    try:
        return base64.b64decode(match.group(1), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def header_mismatch(headers: Mapping[str, str], message: Mapping[str, Any]) -> str | None:
    """Why the routing headers of a stateless HTTP request disagree with its body, or None."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(protocol.VERSION_KEY) if isinstance(meta, dict) else None
    if headers.get("mcp-protocol-version") != version:
        return "the MCP-Protocol-Version header does not match params._meta's protocol version"
    method = message.get("method")
    if headers.get("mcp-method") != method:
        return "the Mcp-Method header does not match the method"
    key = _NAMED.get(method) if isinstance(method, str) else None
    if key is not None and isinstance(params, dict) and params.get(key) is not None:
        if _decoded(headers.get("mcp-name")) != params.get(key):
            return f"the Mcp-Name header does not match params.{key}"
    return None
