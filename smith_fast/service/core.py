"""The service core: what every session of one ``smith-fast serve`` process shares."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from .. import __version__, framing
from ..pb import smith_pb2
from ..tools import ToolContext, ToolRegistry
from .config import ServiceConfig

if TYPE_CHECKING:
    from .session import Session

__all__ = ["ServiceCore", "SUPPORTED_VERSIONS", "capability_name"]

SUPPORTED_VERSIONS = (1, 0)  # in order of preference (wire_notes.md, "Negotiation")


def capability_name(value: int) -> str:
    """``CAPABILITY_SHELL_EXEC`` → ``shell_exec``; unknown numbers as their decimal value."""
    try:
        return smith_pb2.Capability.Name(value).removeprefix("CAPABILITY_").lower()
    except ValueError:
        return str(value)


class ServiceCore:
    """Shared state: identity, configuration, tools, capability set, process accounting, sessions.

    Args:
        config: the service configuration.
        loop_name: ``uvloop`` or ``asyncio``, reported in ``ReadyEvent.service_info``.
    """

    def __init__(self, config: ServiceConfig, *, loop_name: str = "asyncio") -> None:
        self.config = config
        self.limits = config.limits
        self.loop_name = loop_name
        self.service_id = str(uuid.uuid4())
        self.tools = ToolRegistry.default()
        self.tool_context = ToolContext(root=config.root.resolve(), max_output=config.limits.tool_max_output)
        self.capabilities: frozenset[int] = frozenset({smith_pb2.CAPABILITY_SHELL_EXEC})
        self.sessions: set[Session] = set()
        self.running_processes = 0
        self.shutting_down = False
        self.closed = asyncio.Event()

    def service_info(self, version: int, granted: list[int]) -> dict[str, str]:
        return {
            "service_name": "smith-fast",
            "version": __version__,
            "negotiated_version": str(version),
            "protobuf_support": "true",
            "implementation": framing.IMPLEMENTATION,
            "event_loop": self.loop_name,
            "granted_capabilities": ",".join(capability_name(c) for c in granted),
        }

    def acquire_process(self) -> bool:
        """Take a process slot; False when ``max_processes`` are already running."""
        if self.running_processes >= self.limits.max_processes:
            return False
        self.running_processes += 1
        return True

    def release_process(self) -> None:
        self.running_processes -= 1

    async def shutdown(self) -> None:
        """Shut every session down (SHUTTING, requests cancelled, final events flushed)."""
        self.shutting_down = True
        await asyncio.gather(*(s.shutdown() for s in list(self.sessions)), return_exceptions=True)
        self.closed.set()
