"""The checks a command passes before the session makes it a request (PROTOCOL.md, "Terminal
states"): its request id readable, the session handshaken, the command type served, its
capability granted, its size within ``--max-command-size``; and the handshake's version checks
and its ``Ready`` answer. Each check gives the error to send, or None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from .negotiation import SUPPORTED_VERSIONS, capability_name, wire_capabilities
from .sizes import too_large

if TYPE_CHECKING:
    from .commands import CommandSpec

__all__ = ["ReadyCore", "id_size", "id_too_long", "readable_id", "ready_event", "refusal", "version_refusal"]


def id_size(rid: str) -> int:
    """A request id's length in UTF-8 bytes."""
    return len(rid) if rid.isascii() else len(rid.encode("utf-8", "surrogatepass"))


def readable_id(command: pb.Command, limit: int) -> str | None:
    """The command's request id if it can be read as one: set, and not over ``limit``
    (``--max-request-id-size``)."""
    kind = command.WhichOneof("command_type")
    rid = getattr(getattr(command, kind), "request_id", None) if kind else None
    return rid if rid and id_size(rid) <= limit else None


def id_too_long(kind: str, rid: str, limit: int) -> ProtocolError | None:
    """A request id over ``--max-request-id-size`` is not read as an id (it would be echoed in
    every event of the request): the error has no request id, and no terminal state follows."""
    if (len(rid) if rid.isascii() else id_size(rid)) <= limit:
        return None
    size = id_size(rid)
    return ProtocolError(
        f"{kind}'s request_id is {size} bytes, over the limit of {limit} (--max-request-id-size); nothing was run",
        pb.ERROR_CODE_RESOURCE_EXHAUSTED,
        details={"reason": "request_id_too_long", "size": str(size), "limit": str(limit)},
    )


def refusal(kind: str, spec: CommandSpec | None, request: Any, rid: str | None, granted: frozenset[int], max_size: int) -> ProtocolError | None:
    """Why a handshaken session does not run request ``rid`` of ``kind`` (None: it may)."""
    if spec is None or spec.handler is None:
        return ProtocolError(f"{kind} is not supported by this service", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "unsupported_command"})
    if spec.needs is not None and (needed := spec.needs(request)) not in granted:
        name = capability_name(needed) if isinstance(needed, int) else needed
        return ProtocolError(f"{kind} needs capability {name}, which was not granted in the handshake", pb.ERROR_CODE_INVALID_CAPABILITY, rid)
    if spec.size is not None and (size := spec.size(request)) > max_size:
        return too_large(f"this {kind} command", size, max_size, rid)
    return None


def version_refusal(asked: int, spoken: int) -> ProtocolError | None:
    """Why a handshake asking for protocol ``asked`` on a connection speaking ``spoken`` is refused."""
    if asked not in SUPPORTED_VERSIONS:
        return ProtocolError(
            f"protocol version {asked} is not supported; this service speaks versions 1 and 0",
            pb.ERROR_CODE_UNSUPPORTED_VERSION,
            details={"supported_versions": "1,0"},
        )
    if spoken == 1 and asked == 0:
        return ProtocolError(
            "version 0 was requested on a v1 (varint-delimited protobuf) connection; v0 is spoken as JSON lines",
            pb.ERROR_CODE_UNSUPPORTED_VERSION,
            details={"supported_versions": "1"},
        )
    return None


class ReadyCore(Protocol):
    @property
    def service_id(self) -> str: ...

    def service_info(self, version: int, granted: list[int], accepted: Any = (), interval_ms: int = ...) -> dict[str, str]: ...


def ready_event(
    core: ReadyCore, version: int, granted: list[int], info: Mapping[str, str], token: str | None = None, resumed: bool = False
) -> pb.Event:
    """The handshake's answer: ``Ready`` with the version, the granted capabilities, the service's
    id and ``info`` (its service_info), and a resume token when one was issued."""
    event = pb.Event()
    ready = event.ready
    ready.version = version
    ready.capabilities.extend(wire_capabilities(granted))
    ready.service_id = core.service_id
    ready.service_info.update(info)
    if token is not None:
        ready.resume_token = token
    if resumed:
        ready.resumed = True
    return event
