"""The service core: what every session of one ``smith-fast serve`` process shares."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from .. import __version__, framing
from ..hooks import Hook, HookLimits, available_kinds
from ..pb import smith_pb2
from ..plan import Planner, planner_from_options
from ..tools import ToolContext, ToolRegistry
from .commands import COMMANDS
from .config import ServiceConfig
from .metrics import PROTOCOLS, ResourceSampler, ServiceMetrics
from .negotiation import ACCEPTABLE, SUPPORTED_VERSIONS, capability_name
from .runner import RunnerFactory, local_runner
from .session import Session

if TYPE_CHECKING:
    from .sinks import EventSink

__all__ = ["ServiceCore", "SUPPORTED_VERSIONS", "ACCEPTABLE", "capability_name"]


class ServiceCore:
    """Shared state: identity, configuration, tools, capability set, process accounting, sessions.

    Args:
        config: the service configuration.
        loop_name: ``uvloop`` or ``asyncio``, reported in ``ReadyEvent.service_info``.
        runner: makes each session's request runner (default: requests run here; ``smith-fast
            gateway`` passes one that forwards them to workers).
    """

    def __init__(self, config: ServiceConfig, *, loop_name: str = "asyncio", runner: RunnerFactory | None = None) -> None:
        self.config = config
        self.limits = config.limits
        self.loop_name = loop_name
        self.service_id = str(uuid.uuid4())
        self.tools = ToolRegistry.default()
        self.tool_context = ToolContext(
            root=config.root.resolve(), max_output=config.limits.tool_max_output, allow_env=config.allow_env
        )
        kinds = available_kinds()
        self.capabilities: frozenset[int] = frozenset(
            {smith_pb2.CAPABILITY_SHELL_EXEC, smith_pb2.CAPABILITY_REPLAY, smith_pb2.CAPABILITY_TRACING}
            | ({smith_pb2.CAPABILITY_HOOKS_JS} if "js" in kinds else set())
            | ({smith_pb2.CAPABILITY_HOOKS_RUST} if "rust" in kinds else set())
        )
        self.global_hooks: list[Hook] = []  # serve --hook: loaded by the server before it listens
        self.hook_limits = HookLimits()
        self.record_dir = config.record_dir or config.replay_dir
        self.planner: Planner = planner_from_options(
            config.planner,
            config.planner_url,
            config.planner_model,
            tools={t.name: t.description for t in self.tools.tools()},
        )
        self.sessions: set[Session] = set()
        self.connections = 0  # live network connections and gRPC Stream calls (--max-connections)
        self.refusing = 0  # connections over the limit, waiting to be told so (connection.py)
        self.running_processes = 0
        self.shutting_down = False
        self.closed = asyncio.Event()
        self.metrics = ServiceMetrics(timed=[kind for kind, spec in COMMANDS.items() if spec.timed])
        self.health_sampler = ResourceSampler()  # CPU % of in-stream health checks: since the last one
        self.endpoints: list[str] = []  # listener addresses, for NegotiateResponse on fallback
        self.make_runner: RunnerFactory = runner or local_runner(self)

    def new_session(self, sink: EventSink, **kwargs: Any) -> Session:
        """The session of a new connection or gRPC stream, its requests run by this core's runner.

        Args:
            sink: where its events go.
            **kwargs: the other arguments of :class:`~smith_fast.service.session.Session`.

        Returns:
            The session.
        """
        return Session(self, sink, runner=self.make_runner, **kwargs)

    def grant(self, requested: list[int]) -> tuple[list[int], list[tuple[int, str]]]:
        """Capability negotiation (wire_notes.md): granted = requested ∩ available, in request order.

        Args:
            requested: capability numbers as the peer listed them (duplicates allowed).

        Returns:
            ``(granted, refused)``; ``refused`` holds ``(capability, why)`` for each unknown or
            unavailable one, ``why`` a sentence that names it and lists what is available.
        """
        granted: list[int] = []
        refused: list[tuple[int, str]] = []
        for cap in requested:
            if cap in self.capabilities:
                if cap not in granted:
                    granted.append(cap)
                continue
            available = ",".join(sorted(capability_name(c) for c in self.capabilities))
            reason = "unknown" if capability_name(cap).isdigit() or cap == 0 else "not available on this service"
            refused.append((cap, f"capability {capability_name(cap)} is {reason} (available: {available}); the others are granted"))
        return granted, refused

    def sessions_by_protocol(self) -> dict[str, int]:
        """Live sessions per protocol label (v1, v0, grpc)."""
        out = dict.fromkeys(PROTOCOLS, 0)
        for session in self.sessions:
            out[session.protocol] = out.get(session.protocol, 0) + 1
        return out

    def network_connections(self) -> int:
        """Live sessions over a network listener (Unix, TCP, gRPC; stdio is not one)."""
        return sum(1 for s in self.sessions if s.peer != "stdio")

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
