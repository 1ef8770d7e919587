"""The service core: what every session of one ``smith-fast serve`` process shares."""

from __future__ import annotations

import abc
import asyncio
import functools
import os
import pathlib
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import framing, logs
from .._version import __version__
from ..errors import EgressRuleError, StartupError
from ..hooks import Hook, HookLimits, kind_available
from ..pb import smith_pb2
from ..sandbox import Sandbox, UnsafeRoot, service_files_in
from ..tools import ToolContext, ToolRegistry, default_registry
from .commands import COMMANDS
from .config import ServiceConfig
from .metrics import PROTOCOLS, ResourceSampler, ServiceMetrics
from .negotiation import (
    ACCEPT_KEY,
    ACCEPTABLE,
    ACCEPTED_KEY,
    DEFAULT_METRICS_INTERVAL_MS,
    INTERVAL_KEY,
    LISTENER_VERSIONS,
    SUPPORTED_VERSIONS,
    Endpoint,
    accept_additions,
    capability_name,
    capability_refusal,
    endpoint_list,
)
from .resume import ParkedSessions
from .session_home import Homes
from .runner import RunnerFactory, local_runner
from .session import Session

if TYPE_CHECKING:
    from ..plan import Planner
    from ..replay import RecordingStore
    from ..workspaces.store import WorkspaceStore
    from .background import BackgroundTable
    from .egress import EgressHub
    from .sinks import EventSink

__all__ = [
    "Backend",
    "ServiceCore",
    "SUPPORTED_VERSIONS",
    "ACCEPTABLE",
    "ACCEPT_KEY",
    "ACCEPTED_KEY",
    "INTERVAL_KEY",
    "DEFAULT_METRICS_INTERVAL_MS",
    "Endpoint",
    "LISTENER_VERSIONS",
    "accept_additions",
    "capability_name",
    "capability_refusal",
    "endpoint_list",
    "permitted_capabilities",
]


_DEFAULT_OFF = frozenset({smith_pb2.CAPABILITY_HOOKS_RUST, smith_pb2.CAPABILITY_REPLAY})
"""Granted only when ``--capabilities`` names them: a Rust hook is native code (HOOKS.md, "Trust");
``replay`` makes the service write down everything a session sends and receives (README, "Security")."""
_HOOK_KINDS = {smith_pb2.CAPABILITY_HOOKS_JS: "js", smith_pb2.CAPABILITY_HOOKS_RUST: "rust"}


def permitted_capabilities(names: frozenset[str] | None) -> frozenset[int]:
    """The capabilities the operator lets this service grant (``--capabilities``).

    Args:
        names: capability names (``shell_exec``, ``hooks_rust`` ...); None for the default, every
            capability but those off by default (``hooks_rust``, ``replay``).

    Raises:
        ValueError: a name is not a capability (the message lists them).
    """
    known = {capability_name(v): v for v in smith_pb2.Capability.values() if v != smith_pb2.CAPABILITY_UNSPECIFIED}
    if names is None:
        return frozenset(known.values()) - _DEFAULT_OFF
    unknown = sorted(n for n in names if n not in known)
    if unknown:
        raise ValueError(f"--capabilities: unknown capability {', '.join(unknown)} (the capabilities are: {', '.join(sorted(known))})")
    return frozenset(known[n] for n in names)


def _installation() -> list[tuple[str, str]]:
    """What the service runs and loads: its package (the sandbox program among it) and its venv."""
    out = [("its installation", str(pathlib.Path(__file__).resolve().parent.parent))]
    if sys.prefix != sys.base_prefix:
        out.append(("its virtual environment", sys.prefix))
    return out


def _private_files(config: ServiceConfig, sockets: Sequence[str]) -> list[tuple[str, str]]:
    """The service's files no command may reach: its sockets, recordings and state (covered in
    every command's view, and never inside the root)."""
    out = [("its socket", os.path.abspath(path)) for path in sockets]
    out.append(("its state directory", str(config.state_dir)))
    if config.record_dir is not None:
        out.append(("its recordings", str(config.record_dir)))
    return out


def _homes(config: ServiceConfig, root: pathlib.Path, private: Sequence[tuple[str, str]]) -> Homes:
    """``--home-dir``, made, once it is known to lie apart from the root and the service's own files."""
    top = os.path.realpath(config.home_dir)
    clash = [f"{what} {path}" for what, path in [("the root", str(root)), *private] if _nested(top, os.path.realpath(path))]
    if clash:
        # Inside the root, a command would see every session's home (the root is put back over the
        # cover); inside the state directory, the directory hidden from commands would hide the homes.
        raise UnsafeRoot(f"--home-dir {top} overlaps {'; '.join(clash)}: give the sessions' homes a directory of their own")
    try:
        return Homes(pathlib.Path(top), config.limits.max_home_bytes)
    except OSError as exc:  # $XDG_CACHE_HOME (or ~/.cache) missing or read-only: which setting, and the way out
        raise StartupError(f"--home-dir {top}: cannot make the sessions' homes there ({exc.strerror or exc}): give a writable "
                           "directory with --home-dir, or set $XDG_CACHE_HOME") from None


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _workspace_store(config: ServiceConfig, sandbox: Sandbox, context: ToolContext, route: str) -> WorkspaceStore:
    """The store of ``--workspaces``: the process entered its namespace at start-up (:func:`smith_fast.workspaces.namespace.enter`)."""
    from ..errors import SandboxUnavailable
    from ..workspaces import namespace
    from ..workspaces.store import WorkspaceStore

    assert config.workspaces is not None
    if not sandbox.confines_files:
        raise SandboxUnavailable(f"--workspaces needs the sandbox (--sandbox workspace-write or read-only, not {config.sandbox}): "
                                 "without its view a command of one session would see every other session's workspace")
    host = namespace.current()
    if host is None:
        raise SandboxUnavailable("--workspaces: this process has not entered its own mount namespace (smith_fast.workspaces.namespace.enter "
                                 "runs at start-up, before the event loop)")
    return WorkspaceStore(config.workspaces, config.template_map(), config.limits, host, sandbox, context, route)


class Backend(abc.ABC):
    """What a core serves besides its own sessions, and what that changes of its answers: a NATS
    gateway (its sessions live on workers: :class:`smith_fast.nats.gateway.Gateway`) or a NATS
    worker (:class:`smith_fast.nats.worker.Worker`).

    The core calls it; what it stands for composes the core (``ServiceCore(backend=...)``) rather
    than subclassing it.
    """

    runs_commands: bool = False
    """Commands run in this process (a worker): the sandbox must be usable here."""

    route: str = ""
    """What the resume tokens of its sessions start with (a worker's id: smith_fast.service.resume)."""

    @abc.abstractmethod
    def unavailable(self) -> str | None:
        """Why the service cannot serve now although it runs, or None (health, ``service_info``)."""

    @abc.abstractmethod
    def service_info(self) -> dict[str, str]:
        """What a handshake's ``service_info`` says of it, besides what the core says."""

    def refusing(self) -> tuple[str, str] | None:
        """``(reason, message)`` while sessions may start no new request (a worker draining)."""
        return None

    async def stop(self) -> None:
        """The service stops: called first by :meth:`ServiceCore.shutdown` (a gateway ends its relays)."""


def _nothing_to_check() -> None:
    """The sandbox check of a core that runs no command (a gateway's)."""


class ServiceCore:
    """Shared state: identity, configuration, tools, capability set, process accounting, sessions.

    Args:
        config: the service configuration.
        loop_name: ``uvloop`` or ``asyncio``, reported in ``ReadyEvent.service_info``.
        backend: the NATS side of ``smith-fast gateway`` or ``worker`` (:class:`Backend`): its
            health, its part of ``service_info``, what resume tokens start with, what stops
            first; None for ``serve``. A gateway's core runs no command (it relays each
            connection to a worker), so its sandbox is not checked.
        sockets: the service's Unix socket paths, hidden from every command.
        check_sandbox_at_once: wait here for the sandbox's trial run; False: it runs on while the
            caller goes on, until :attr:`sandbox_checked` is called (``serve``, before it listens).

    Raises:
        SandboxUnavailable: requests run here and the kernel lacks what ``--sandbox``/``--network``
            need (fail closed: nothing is served).
    """

    def __init__(self, config: ServiceConfig, *, loop_name: str = "asyncio", backend: Backend | None = None,
                 sockets: Sequence[str] = (), check_sandbox_at_once: bool = True) -> None:
        self.config = config
        self._backend = backend
        self.limits = config.limits
        logs.conceal(config.token)  # whatever quotes it (a command's text in the audit line)
        self.loop_name = loop_name
        self.service_id = str(uuid.uuid4())
        self.tools = default_registry()
        root = config.root.resolve()
        private = _private_files(config, sockets)
        self.sandbox = Sandbox(
            config.sandbox, config.network, str(root), deny_read=tuple(map(str, config.sandbox_deny_read)),
            hidden=tuple(path for _, path in private), tmp_size=config.limits.max_tmp_per_command,
            file_size=config.limits.max_file_size,
        )
        self.runs_locally = backend is None or backend.runs_commands
        # The sandbox's trial run (sandbox-exec --probe, a few ms) may go on while the caller starts
        # (check_sandbox_at_once=False: `serve` imports its fronts meanwhile); this waits for it,
        # raising SandboxUnavailable when it failed. Called before any listener opens and by
        # new_session, so no command can start before the sandbox is known to work.
        self.sandbox_checked: Callable[[], None] = _nothing_to_check
        # --network allow: the one egress proxy of the service's commands (a gateway's are its workers').
        self.egress: EgressHub | None = None
        if config.network == "allow" and self.runs_locally:
            from .egress import EgressHub  # the proxy's modules only with --network allow

            self.egress = EgressHub(config)
        elif config.egress_allow or config.egress_deny or config.egress_secrets or config.egress_resolve:
            raise EgressRuleError(f"--egress-allow, --egress-deny, --egress-secret and --egress-resolve need --network allow, "
                                  f"not --network {config.network}")
        if self.runs_locally:
            if self.sandbox.confines_files and not config.allow_service_files_in_root:
                clash = service_files_in(str(root), [*_installation(), *private])
                if clash:
                    raise UnsafeRoot(
                        f"--root {root} holds the service's own files ({'; '.join(clash)}): a command could replace them. "
                        "Serve a directory that holds none of them (`make serve` serves ~/smith-fast-workspace), put them "
                        "elsewhere (--unix PATH, --record DIR), or pass --allow-service-files-in-root if nothing hostile "
                        "writes to the root"
                    )
            self.sandbox_checked = self.sandbox.start_check()
            if check_sandbox_at_once:
                self.sandbox_checked()
        self.tool_context = ToolContext(
            root=root,
            max_output=config.limits.tool_max_output,
            allow_env=config.allow_env,
            env_policy=config.env_policy,
            sandbox=self.sandbox,
            command_limits=config.limits.command_limits(),
        )
        self.workspaces: WorkspaceStore | None = None
        if config.workspaces is not None and self.runs_locally:
            self.workspaces = _workspace_store(config, self.sandbox, self.tool_context, backend.route if backend is not None else "")
        # Without workspaces, a session's home is a directory of --home-dir (with them, of its volume).
        self.homes: Homes | None = None
        if self.workspaces is None and self.runs_locally and self.sandbox.mode == "workspace-write":
            self.homes = _homes(config, root, private)
        self.permitted: frozenset[int] = permitted_capabilities(config.capabilities)
        # a hook kind is looked for only when permitted: rustc --version, on the way to the first
        # answer, costs 15-40 ms, for Rust hooks that are off unless listed in --capabilities
        hooks = {cap for cap, kind in _HOOK_KINDS.items() if cap in self.permitted and kind_available(kind)}
        self.capabilities: frozenset[int] = self.permitted & frozenset(
            {smith_pb2.CAPABILITY_SHELL_EXEC, smith_pb2.CAPABILITY_REPLAY, smith_pb2.CAPABILITY_TRACING}
            | hooks
            | ({smith_pb2.CAPABILITY_WORKSPACES} if self.workspaces is not None else set())
        )
        self.global_hooks: list[Hook] = []  # serve --hook: loaded by the server before it listens
        self.hook_limits = HookLimits(
            memory_bytes=config.limits.hook_memory,
            session_hooks=config.limits.max_hooks_per_session,
            session_memory_bytes=config.limits.max_session_hook_memory,
            sandbox=self.sandbox,
        )
        if config.record_dir is not None or smith_pb2.CAPABILITY_REPLAY in self.capabilities:
            self.recordings.check()  # private, or the service does not start
        if config.planner != "rules":
            self.planner  # noqa: B018 -- made now: a wrong --planner-url or --planner-model fails the start
        self.sessions: set[Session] = set()
        # dropped sessions kept for a resume; as many as connections may be open
        self.parked = ParkedSessions(config.limits.resume_window, config.limits.max_connections, backend.route if backend is not None else "")
        self.running_processes = 0
        self.shutting_down = False
        self.closed = asyncio.Event()
        self.metrics = ServiceMetrics(timed=[kind for kind, spec in COMMANDS.items() if spec.timed])
        self.health_sampler = ResourceSampler()  # CPU % of in-stream health checks: since the last one
        self.endpoints: list[Endpoint] = []  # the listeners, in the order opened (NegotiateResponse)
        self.make_runner: RunnerFactory = local_runner(self)
        self._health_watchers: list[Callable[[], None]] = []

    # The planner, the recordings and the background table are made when first used: their modules
    # (the planner's HTTP client and graph, the recording format, the process stack) are not on
    # the way to a start's first answer.
    @functools.cached_property
    def planner(self) -> Planner:
        """The ``--planner`` of ``plan`` commands."""
        from ..plan import planner_from_options

        return planner_from_options(self.config.planner, self.config.planner_url, self.config.planner_model,
                                    tools={t.name: t.description for t in self.tools.tools()})

    @functools.cached_property
    def recordings(self) -> RecordingStore:
        """Where sessions are recorded (``--record``, or those granted ``replay``): made at start
        when either is on (its directory checked), else never."""
        from ..replay import RecordingStore

        return RecordingStore(self.config.recordings_dir, self.config.limits.record_max_bytes)

    @functools.cached_property
    def background(self) -> BackgroundTable:
        """The background processes: they outlive their sessions and end with the service."""
        from .background import BackgroundTable

        return BackgroundTable(self.limits)

    def unavailable(self) -> str | None:
        """Why this service cannot serve although it runs, or None (a plain ``serve`` always can;
        ``smith-fast gateway``'s backend says so without NATS or workers)."""
        return None if self._backend is None else self._backend.unavailable()

    def refusing(self) -> tuple[str, str] | None:
        """``(reason, message)`` while sessions may start no new request, else None (``serve``: never)."""
        return None if self._backend is None else self._backend.refusing()

    def offer(self, capability: int, available: bool) -> None:
        """Grant ``capability`` from now on, if ``--capabilities`` permits it, or no longer grant it:
        for a part whose availability changes while the service runs (a gateway grants ``nats``
        while it is connected). Sessions keep what their handshake granted."""
        if available:
            self.capabilities = self.capabilities | ({capability} & self.permitted)
        else:
            self.capabilities = self.capabilities - {capability}

    def watch_health(self, watcher: Callable[[], None]) -> None:
        """Call ``watcher`` whenever :meth:`unavailable` may have changed (the gRPC health service)."""
        self._health_watchers.append(watcher)

    def health_changed(self) -> None:
        """Tell the watchers that :meth:`unavailable` may say something else now."""
        for watcher in list(self._health_watchers):
            watcher()

    def new_session(self, sink: EventSink, **kwargs: Any) -> Session:
        """The session of a new connection or gRPC stream, its requests run by this core's runner.

        Args:
            sink: where its events go.
            **kwargs: the other arguments of :class:`~smith_fast.service.session.Session`.

        Returns:
            The session.

        Raises:
            SandboxUnavailable: the sandbox's start-up check failed (when it was not waited for at start).
        """
        self.sandbox_checked()
        return Session(self, sink, runner=self.make_runner, **kwargs)

    def grant(self, requested: list[int]) -> tuple[list[int], list[int]]:
        """Capability negotiation (PROTOCOL.md, "Negotiation"): requested ∩ available, in request order.

        Args:
            requested: capability numbers as the peer listed them (duplicates allowed: each
                distinct number is looked at once, so a list of one number repeated costs one).

        Returns:
            ``(granted, refused)``, each without duplicates, in the order first listed; ``refused``
            holds the unknown or unavailable ones (:func:`capability_refusal` words them).
        """
        granted: list[int] = []
        refused: list[int] = []
        for cap in dict.fromkeys(requested):
            (granted if cap in self.capabilities else refused).append(cap)
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

    def service_info(
        self, version: int, granted: list[int], accepted: Sequence[str] = (), interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    ) -> dict[str, str]:
        """What a handshake's ``Ready.service_info`` and ``NegotiateResponse.service_metadata`` say
        about the service (PROTOCOL.md, "Negotiate"); one function so that the two cannot drift.

        Args:
            version: the negotiated protocol version.
            granted: the granted capabilities, in the order the peer asked for them.
            accepted: the Envelope additions granted (v1 only: v0 has none, and no key for them).
            interval_ms: the metrics interval, reported when ``metrics`` is accepted.
        """
        info = {
            "service_name": "smith-fast",
            "version": __version__,
            "negotiated_version": str(version),
            "protobuf_support": "true",
            "implementation": framing.IMPLEMENTATION,
            "event_loop": self.loop_name,
            "granted_capabilities": ",".join(capability_name(c) for c in granted),
        }
        if self.runs_locally:  # a gateway's workers say what confines them, not the gateway
            info.update(self.sandbox.info())
        if version == 1:
            info[ACCEPTED_KEY] = ",".join(accepted)
            if "metrics" in accepted:
                info[INTERVAL_KEY] = str(interval_ms)
        if self._backend is not None:
            info.update(self._backend.service_info())
        return info

    def versions(self) -> tuple[int, ...]:
        """The protocol versions spoken on some listener, in :data:`SUPPORTED_VERSIONS` order."""
        spoken = {v for e in self.endpoints for v in e.versions}
        return tuple(v for v in SUPPORTED_VERSIONS if v in spoken)

    def addresses(self, version: int) -> list[str]:
        """The listeners where ``version`` is spoken, in the order they were opened."""
        return [e.address for e in self.endpoints if version in e.versions]

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
        if self._backend is not None:
            await self._backend.stop()
        await asyncio.gather(
            *(s.shutdown() for s in list(self.sessions)),
            *((self.background.shutdown(self.limits.kill_grace),) if "background" in self.__dict__ else ()),  # none made: none to end
            return_exceptions=True,
        )
        if self.workspaces is not None:
            self.workspaces.close()
        if self.homes is not None:
            self.homes.close()  # what the sessions' ends left (a removal still under way, a process killed last)
        self.closed.set()
