"""One client session: handshake, grants, token, command admission, flow control, teardown.

The connection decodes commands (v1 frames or v0 lines) into ``smith_pb2.Command`` objects and hands
them to :meth:`Session.handle`; everything the session says goes out through its
:class:`~smith_fast.service.sinks.EventSink`. What a command needs (capability, size limit,
handler) is its row in :data:`~smith_fast.service.commands.COMMANDS`; an admitted request runs as a
task of its own through the session's :class:`~smith_fast.service.runner.RequestRunner`, so the
events of different requests interleave, each carrying its request_id. Protocol-independent (a NATS
worker serves a relayed connection with this same session).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, MutableSet, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.message import DecodeError

from .. import relaypeek, tracing
from ..errors import EgressRuleError, ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .admission import id_too_long, readable_id, ready_event, refusal, version_refusal
from .auth import REDACTED, TOKEN_KEY, token_matches
from .commands import COMMANDS, CommandSpec, Control
from .egress import EGRESS_ALLOW_KEY
from .flow import SessionFlow
from .health import HealthSource, health_response
from .metrics import Gauges
from .negotiation import (
    ACCEPT_KEY,
    DEFAULT_METRICS_INTERVAL_MS,
    accept_additions,
    capability_name,
    capability_refusal,
)
from .redact import redacted_bytes
from .request import Request
from .request_start import RequestStarter
from .request_table import RequestTable
from .resume import RESUME, Front, ParkedSessions, Resumable
from .session_batches import Batches
from .session_reports import MetricsReporter, close_recording, loggable, open_recording
from .session_resume import SessionResume
from .session_workspace import SessionWorkspaceView
from .sizes import too_large
from .sinks import EventSink

if TYPE_CHECKING:
    from ..relaypeek import ToolCall
    from ..replay import RecordingStore, SessionRecorder
    from ..workspaces.store import WorkspaceStore
    from ..workspaces.workspace import Workspace
    from .config import Limits, ServiceConfig
    from .egress import EgressHub, SessionEgress
    from .execution import BackgroundProcesses
    from .runner import RequestRunner, RunnerFactory

__all__ = ["Session", "SessionCore"]

log = get_logger("smith_fast.session")

_HEALTH_RESPONSE = pb.Envelope.DESCRIPTOR.fields_by_name["health_check_response"].number
_TOOL_CALL = COMMANDS["tool_call"]
# The quick read of a plain tool call (relaypeek.tool_call), when compiled: the Python twin's walk
# costs more than the runtime's decoding it spares.
_read_tool_call = relaypeek.tool_call if relaypeek.IMPLEMENTATION == "c" else None
_TRACE_KEYS = ("traceparent", "tracestate")


class SessionCore(HealthSource, Gauges, Protocol):
    """What a session uses of the service core (:class:`~smith_fast.service.core.ServiceCore`)."""

    @property
    def config(self) -> ServiceConfig: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def recordings(self) -> RecordingStore:
        """Where sessions are recorded (``--record``, or those granted ``replay``)."""
        ...

    @property
    def sessions(self) -> MutableSet[Session]: ...

    @property
    def egress(self) -> EgressHub | None:
        """The service's egress proxy (``--network allow``), None without it."""
        ...

    @property
    def workspaces(self) -> WorkspaceStore | None:
        """The sessions' workspaces (``--workspaces``), None for one shared root."""
        ...

    @property
    def background(self) -> BackgroundProcesses: ...

    @property
    def parked(self) -> ParkedSessions:
        """The resumable sessions (:mod:`~smith_fast.service.resume`)."""
        ...

    @property
    def capabilities(self) -> frozenset[int]:
        """What this service can grant."""
        ...

    def grant(self, requested: list[int]) -> tuple[list[int], list[int]]: ...

    def refusing(self) -> tuple[str, str] | None:
        """``(reason, message)`` while no new request may start (a NATS worker draining), else None."""
        ...

    def service_info(
        self, version: int, granted: list[int], accepted: Sequence[str] = (), interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    ) -> dict[str, str]: ...


class Session:
    """The state of one connection (or one gRPC stream).

    Args:
        core: the shared service core.
        sink: where events go; its ``version`` is the wire protocol of the connection.
        close: called once the session is over and its output flushed (closes the transport).
        runner: makes the runner of the session's requests (``core.new_session`` passes the core's).
        peer: a printable peer name for logs.
        protocol: the metrics label of its front: ``v1``, ``v0`` (socket or stdio), ``grpc`` or ``mcp``.
        unsent: the bytes its front still holds for the peer (the transport's write buffer, a
            gRPC queue), counted against ``--max-session-buffer`` (:mod:`~smith_fast.service.flow`).
        hold_input: called with True when the peer's commands should no longer be read (the peer
            does not read, or the commands waiting for the budget hold over a quarter of it),
            with False when they may be again.
        front: the connection as a :class:`~smith_fast.service.resume.Front`, when the session
            can be resumed over another one after it dropped (Unix, TCP, gRPC; not stdio).
    """

    # its fields (session.pxd makes them a C struct, compiled)
    __slots__ = (
        "core", "sink", "peer", "version", "protocol", "granted", "accepted", "handshaken", "shutting",
        "flow", "requests", "session_id", "authenticated", "denied", "presented_token", "last_active", "span",
        "recorder", "runner", "workspace", "egress", "_unsent", "_resume", "_starter", "_batches",
        "_reporter", "_close", "_closing", "_loop",
    )

    def __init__(
        self,
        core: SessionCore,
        sink: EventSink,
        *,
        close: Callable[[], None],
        runner: RunnerFactory,
        peer: str = "?",
        protocol: str | None = None,
        unsent: Callable[[], int] = lambda: 0,
        hold_input: Callable[[bool], None] | None = None,
        front: Front | None = None,
    ) -> None:
        self.core = core
        self.sink = sink
        self.peer = peer
        self.version = sink.version
        self.protocol = protocol or f"v{sink.version}"
        self.granted: frozenset[int] = frozenset()
        self.accepted: frozenset[str] = frozenset()
        self.handshaken = False
        self.shutting = False
        self._unsent = unsent
        self.flow = SessionFlow(core.limits.max_session_buffer, self._pending, hold_input)
        self._resume = SessionResume(self, front)
        self.requests = RequestTable(self, core.limits)
        self._starter = RequestStarter(self, self.flow, core.limits, core.metrics)
        self._batches = Batches(self, core.limits.max_batch_commands, core.limits.max_request_id_size)
        self._reporter: MetricsReporter | None = None  # periodic MetricsEvents
        self._close = close
        self._closing = False
        self.session_id = str(uuid.uuid4())
        # With a token configured, nothing but a handshake presenting it is served (auth.py); the
        # front sets this for peers it trusts otherwise (stdio, a gRPC call's metadata).
        self.authenticated = core.config.token is None
        self.denied = False  # refused for a wrong or missing token
        self.presented_token: str | None = None  # v0 has no client_info: the connection puts it here
        self._loop = asyncio.get_running_loop()
        self.last_active = self._loop.time()  # of the last message received or request ended (Deadlines)
        self.span: tracing.SpanHandle = tracing.NOOP  # the session's span once tracing is granted
        self.recorder: SessionRecorder | None = None
        self.runner: RequestRunner = runner(self)
        self.workspace: Workspace | None = None  # its own (serve --workspaces), from its handshake on
        self.egress: SessionEgress | None = None  # its own (--network allow), from its first handshake on: never widened after
        if core.config.record_dir is not None:
            self._start_recording()
        core.sessions.add(self)
        core.metrics.sessions_total[self.protocol] = core.metrics.sessions_total.get(self.protocol, 0) + 1

    # ---- input -------------------------------------------------------------------------------

    def handle_frame(self, data: bytes) -> None:
        """Decode and dispatch one v1 envelope's bytes (socket frame or gRPC message); bytes that
        are no Envelope are recorded as they came (a replay sends them again) and answered with
        an ``ErrorEvent``, worded alike on both fronts. Never raises."""
        if len(data) > self._batches.peek_above and self.recorder is None and self._batches.take_unread(data):
            self.last_active = self._loop.time()
            return
        if _read_tool_call is not None and (call := _read_tool_call(data)) is not None and self.start_tool_call(call):
            return
        try:
            env = pb.Envelope.FromString(data)
        except DecodeError as exc:
            if self.recorder is not None:
                self.recorder.record_malformed(redacted_bytes(data, self.core.config.token))
            self.protocol_error(ProtocolError(
                f"a {len(data)}-byte message is not a valid Envelope ({exc}); it was skipped",
                pb.ERROR_CODE_UNSPECIFIED,
                details={"reason": "invalid_envelope"},
            ))
            return
        self.handle_envelope(env)

    def start_tool_call(self, call: ToolCall) -> bool:
        """Start a plain tool call as :meth:`handle` would start its ``pb.Command`` (the same
        checks, counts and start), the command made only if something asks for it
        (:attr:`Request.command`): a frame read by ``relaypeek.tool_call``, or a front's own call
        (MCP's ``tools/call``). False, having done nothing, when the session or any check needs
        the whole way: the caller then hands :meth:`handle` the command, which says why (or
        records it: a recording session takes the whole way)."""
        rid, _tool, args, _timeout = call
        core = self.core
        limits = core.limits
        if (
            not self.handshaken or not self.authenticated or self.recorder is not None or self._batches.backlog is not None
            or self._closing or not rid or len(args) > limits.max_command_size
            or id_too_long("tool_call", rid, limits.max_request_id_size) is not None or core.refusing() is not None
        ):
            return False
        self.last_active = self._loop.time()
        core.metrics.commands["tool_call"] += 1
        self._starter.start(rid, _TOOL_CALL, None, call)
        return True

    def handle_envelope(self, env: pb.Envelope) -> None:
        """Dispatch one decoded v1 envelope (socket frame or gRPC message). Never raises."""
        self.last_active = self._loop.time()
        kind = env.WhichOneof("payload")
        if self.recorder is not None:
            self.recorder.record_in(loggable(env, kind))
        backlog = self._batches.backlog
        if backlog is not None:
            backlog.append((env, kind))
            return
        self.route(env, kind)

    def route(self, env: pb.Envelope, kind: str | None) -> None:
        """Handle one envelope now (:meth:`handle_envelope` passes a batch's backlog in order)."""
        if kind == "command":
            self.handle(env.command)
        elif kind == "batch_command":
            self._batches.admit(env.batch_command)
        elif not self.authenticated:
            self.deny(f"{kind or 'an empty envelope'} before an authenticated handshake: this service needs a token")
        elif kind == "health_check_request" and "health" in self.accepted:
            self.sink.envelope(_HEALTH_RESPONSE, health_response(self.core, env.health_check_request.service_name).SerializeToString())
        elif kind == "health_check_request":
            self.protocol_error(
                ProtocolError(
                    f"health checks were not asked for: send {ACCEPT_KEY}=health in the handshake's client_info",
                    pb.ERROR_CODE_UNSPECIFIED,
                    details={"reason": "unexpected_payload"},
                )
            )
        else:
            self.protocol_error(
                ProtocolError(
                    f"unexpected Envelope payload {kind or 'none'!r} from a client; expected a command",
                    pb.ERROR_CODE_UNSPECIFIED,
                    details={"reason": "unexpected_payload"},
                )
            )

    def handle(self, command: pb.Command) -> None:
        """Dispatch one decoded command. Never raises: problems become ErrorEvents."""
        kind = command.WhichOneof("command_type")
        if self._closing:
            return
        self.last_active = self._loop.time()
        if kind is not None:
            self.core.metrics.commands[kind] += 1
        if kind == "handshake":
            self._handshake(command.handshake)
            return
        rid: str | None
        if not self.authenticated:
            self.deny(f"{kind or 'an empty command'} before an authenticated handshake: this service needs a token", self.request_id(command))
            return
        if kind is None:
            self.protocol_error(ProtocolError("empty Command: no command_type set", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "malformed"}))
            return
        request = getattr(command, kind)
        rid = getattr(request, "request_id", None)
        limits = self.core.limits
        if rid is not None and (error := id_too_long(kind, rid, limits.max_request_id_size)) is not None:
            self.protocol_error(error)
            return
        if not self.handshaken:
            self.refuse(ProtocolError(f"{kind} before handshake: send a HandshakeCommand first", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "handshake_required"}))
            return
        if kind == "shutdown":
            asyncio.get_running_loop().create_task(self.shutdown())
            return
        spec = COMMANDS.get(kind)
        if spec is not None and spec.control is not None:
            self._control(spec, spec.control, request)
            return
        if spec is None or spec.handler is None or spec.needs is not None or (
            spec.size is not None and spec.size(request) > limits.max_command_size
        ):
            if (error := refusal(kind, spec, request, rid, self.granted, limits.max_command_size)) is not None:
                self.refuse(error)
                return
            assert spec is not None
        if (refusing := self.core.refusing()) is not None:  # a NATS worker draining: no new request
            self.refuse(ProtocolError(refusing[1], pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid, {"reason": refusing[0]}))
            return
        self._starter.start(rid or "", spec, command)

    def cancel(self, rid: str) -> None:
        """Cancel running request ``rid`` as a ``CancelCommand`` would (for a front with a cancel of
        its own, MCP's ``notifications/cancelled``); what cannot be done is an ``ErrorEvent``."""
        self.handle(pb.Command(cancel=pb.CancelCommand(request_id=rid)))

    def _control(self, spec: CommandSpec, control: Control, request: Any) -> None:
        """A command on a running request (cancel, stdin, resize): the runner does it now; it has
        no states of its own, so what it cannot do is only an ``ErrorEvent`` (PROTOCOL.md, "Process control")."""
        if spec.size is not None and (size := spec.size(request)) > self.core.limits.max_command_size:
            self.protocol_error(too_large(f"this {spec.kind} command", size, self.core.limits.max_command_size, request.request_id))
            return
        try:
            control(self.runner, request)
        except ProtocolError as exc:
            exc.request_id = exc.request_id or request.request_id or None
            self.protocol_error(exc)

    def request_id(self, command: pb.Command) -> str | None:
        """The command's request id if it can be read as one (PROTOCOL.md, "Terminal states")."""
        return readable_id(command, self.core.limits.max_request_id_size)

    def protocol_error(self, exc: ProtocolError) -> None:
        """Report a problem with the peer's input; the session carries on."""
        log.info("protocol error", extra={"fields": {"peer": self.peer, "error": str(exc), "code": exc.code}})
        self.report_error(exc.code, str(exc), exc.request_id, exc.details)

    def report_error(self, code: int, message: str, rid: str | None = None, details: Mapping[str, str] | None = None) -> None:
        """Send (and count) an ``ErrorEvent``."""
        self.core.metrics.error(code)
        self.sink.error(code, message, rid, details)

    def reject(self, exc: ProtocolError) -> None:
        """End a request that did not run: its error, then its terminal ERROR state."""
        if not exc.request_id:
            self.protocol_error(exc)
            return
        log.info("protocol error", extra={"fields": {"peer": self.peer, "error": str(exc), "code": exc.code}})
        Request(self, exc.request_id, None, None).refuse(exc, self.session_id, self.peer)

    def end_refused(self, rid: str) -> None:
        """Send the terminal ``ERROR`` of request ``rid``, which did not run (its error was told)."""
        Request(self, rid, None, None).refuse(None)

    def refuse(self, exc: ProtocolError) -> None:
        """Refuse a request before it starts (:meth:`reject`), unless a request with its id is
        running: then only the error, as the id's one terminal state is that request's own
        (PROTOCOL.md, "Terminal states")."""
        if exc.request_id and exc.request_id in self.requests:
            self.protocol_error(exc)
        else:
            self.reject(exc)

    # ---- handshake ----------------------------------------------------------------------------

    def _handshake(self, hs: pb.HandshakeCommand) -> None:
        if not self.authenticated:
            presented = hs.client_info.get(TOKEN_KEY) if self.version == 1 else self.presented_token
            self.presented_token = None
            if not token_matches(self.core.config.token, presented):  # type: ignore[arg-type]  # not authenticated: a token is set
                self.deny("the handshake " + ("presents no token" if presented is None else "presents a wrong token"))
                return
            self.authenticated = True
        if hs.resume_token:
            self._resume.resume_from(hs)
            return
        if (error := version_refusal(hs.version, self.version)) is not None:
            self.protocol_error(error)
            return
        granted, refused = self.core.grant(list(hs.capabilities))
        if refused:  # one ErrorEvent (and one log line) however many were refused
            message, details = capability_refusal(refused, self.core.capabilities)
            self.protocol_error(ProtocolError(message, pb.ERROR_CODE_INVALID_CAPABILITY, details=details))
        accepted, interval_ms, warnings = accept_additions(hs.client_info) if self.version == 1 else ([], 0, [])
        token = self._resume.offer() if RESUME in accepted else None
        if RESUME in accepted and token is None:
            accepted.remove(RESUME)
            warnings.append((f"{ACCEPT_KEY}: resume is not available here (stdio cannot resume; --resume-window 0 turns it off)",
                             {"key": ACCEPT_KEY, "ignored": RESUME}))
        store = self.core.workspaces
        if store is not None and self.workspace is None:
            # only with --workspaces: not on every start's way to its first answer
            from ..workspaces import FORK_KEY, TEMPLATE_KEY
            from ..workspaces.workspace import open_workspace

            info_keys = hs.client_info
            try:
                self.workspace = open_workspace(store, SessionWorkspaceView(self.requests, self.core.background),
                                                info_keys.get(TEMPLATE_KEY), info_keys.get(FORK_KEY))
            except ProtocolError as exc:  # no Ready: the connection may try another handshake
                self.protocol_error(exc)
                return
            self.runner.use_workspace(self.workspace)
        if self.workspace is not None:
            self.workspace.recording = "changes" in accepted
        hub = self.core.egress
        if hub is None and EGRESS_ALLOW_KEY in hs.client_info:
            warnings.append((f"{EGRESS_ALLOW_KEY} is ignored: commands here run with --network {self.core.config.network}",
                             {"key": EGRESS_ALLOW_KEY}))
        elif hub is not None and self.egress is None:
            try:
                self.egress = hub.for_session(self.session_id, self.peer, hs.client_info.get(EGRESS_ALLOW_KEY))
            except EgressRuleError as exc:  # no Ready: the connection may try another handshake
                self.protocol_error(ProtocolError(str(exc), pb.ERROR_CODE_UNSPECIFIED,
                                                  details={"reason": "egress_allow", "key": EGRESS_ALLOW_KEY}))
                return
            self.runner.use_egress(self.egress)
        self.granted = frozenset(granted)
        self.handshaken = True
        if pb.CAPABILITY_REPLAY in self.granted and self.recorder is None:
            self._start_recording()
            if self.recorder is not None:
                command = pb.Command(handshake=hs)
                if TOKEN_KEY in command.handshake.client_info:
                    command.handshake.client_info[TOKEN_KEY] = REDACTED
                self.recorder.record_command(command)
        if pb.CAPABILITY_TRACING in self.granted and self.span is tracing.NOOP:
            # only the trace context: the rest of client_info (the token among it) stays out of spans
            self.span = tracing.session_span(self.peer, self.version, {k: hs.client_info[k] for k in _TRACE_KEYS if k in hs.client_info})
        self.sink.state_change(pb.SERVICE_STATE_STARTING)
        info = self.core.service_info(self.version, granted, accepted, interval_ms)
        if self.recorder is not None:
            info["smith_fast.recording"] = str(self.recorder.path)
        if self.workspace is not None:
            info.update(self.workspace.info())
        if self.egress is not None:
            info.update(self.egress.info())
        self.sink.event(ready_event(self.core, self.version, granted, info, token))
        self.sink.state_change(pb.SERVICE_STATE_READY)
        for message, fields in warnings:  # after the answer, so a client's handshake loop never eats them
            self.sink.log(pb.LOG_LEVEL_WARN, message, fields=fields)
        self.apply_accepted(frozenset(accepted), interval_ms)
        log.info("handshake", extra={"fields": {"peer": self.peer, "version": self.version, "granted": [capability_name(c) for c in granted], "accepted": accepted}})

    def apply_accepted(self, accepted: frozenset[str], interval_ms: int) -> None:
        """Switch batching and the metrics reports on or off, as the latest handshake asked."""
        self.accepted = accepted
        if "batch_event" in accepted:
            self.sink.start_batching()
        else:
            self.sink.stop_batching()
        if self._reporter is not None:
            self._reporter.stop()
            self._reporter = None
        if "metrics" in accepted:
            self._reporter = MetricsReporter(self, self.core, self.sink, interval_ms / 1000)

    # ---- recording ---------------------------------------------------------------------------

    def _start_recording(self) -> None:
        resumable = self._resume.resumable
        self.recorder = open_recording(
            self.core.recordings, self.sink, session_id=self.session_id, version=self.version, service_id=self.core.service_id,
            peer=self.peer, conceal=[self.core.config.token, resumable.token if resumable is not None else None],
        )

    def _stop_recording(self) -> None:
        """Close the session log once everything the session will ever send was written."""
        if self.recorder is not None:
            close_recording(self.recorder)
        if self._reporter is not None:
            self._reporter.stop()
            self._reporter = None

    # ---- requests -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a request (or an ordered batch) is running."""
        return bool(self.requests.live or self._batches.tasks)

    def request_ended(self, request: Request) -> None:
        self.requests.ended(request)

    # ---- flow control and teardown --------------------------------------------------------------

    @property
    def paused(self) -> bool:
        """The peer is not reading (its front said so)."""
        return self.flow.paused

    def pause(self) -> None:
        """The peer is not reading: stop producing output (child pipes), starting requests
        (:mod:`~smith_fast.service.flow`) and reading its commands, so memory stays bounded."""
        self.flow.set_paused(True)
        self.runner.pause()
        self.update_input()

    def resume(self) -> None:
        self.runner.resume()
        self.flow.set_paused(False)
        self.update_input()

    async def reading(self) -> None:
        """Return once the peer reads (at once unless it is paused): a request that produces
        output step by step (a plan) waits here before each step."""
        if self.flow.paused and not self.shutting:
            await self.flow.reading()

    def update_input(self) -> None:
        """Hold or release the peer's input (:meth:`SessionFlow.update <smith_fast.service.flow.SessionFlow.update>`)."""
        if not self._closing:
            self.flow.update()

    @property
    def closing(self) -> bool:
        """The session is over: nothing is sent any more."""
        return self._closing

    async def _cancel_requests(self) -> None:
        tasks = self._running_tasks()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _over(self, *, kill: bool = False, close: bool = True) -> None:
        """The end every way shares: the session leaves the core, its runner is told it ended and
        nothing is sent after this; with ``kill`` what runs is killed and its tasks cancelled;
        with ``close`` what is batched is flushed and the transport closed; then the session log
        is closed."""
        if not self._closing:
            self._closing = True
            self.core.sessions.discard(self)
            if self._resume.resumable is not None:
                self.core.parked.forget(self._resume.resumable.key)
            self.runner.end()
            self.span.end()
        if kill:
            self.runner.kill()
            for task in self._running_tasks():
                task.cancel()
        if self.workspace is not None and not self.workspace.closed:
            self.workspace.close()  # its processes were killed (or ended): their views of it go with them
        if close:
            self.sink.flush_batch()
            self._close()
        self._stop_recording()

    async def shutdown(self) -> None:
        """SHUTTING, cancel running requests (their final events are sent), flush, close."""
        if self._closing:
            return
        self.shutting = True
        self.sink.state_change(pb.SERVICE_STATE_SHUTTING)
        self.resume()
        # Let the runner stop what runs gracefully first, so the last output and exit codes are
        # still delivered; then cancel whatever is left (tool calls).
        await self.runner.shutdown(self.core.limits.kill_grace)
        await self._cancel_requests()
        self._over()

    async def finish(self) -> None:
        """The peer will send nothing more but still listens (a gRPC half-close): let the running
        requests end, then close."""
        while self.busy and not self._closing:
            await asyncio.wait(self._running_tasks())
        if not self._closing:
            self._over()

    def deny(self, message: str, rid: str | None = None) -> None:
        """A wrong or missing token: say so, end the refused request ``rid`` (if any), close (the
        gRPC front then fails the call UNAUTHENTICATED)."""
        if self._closing:  # what the peer sent after the refusal, in the same read
            return
        log.warning("authentication failed", extra={"fields": {"peer": self.peer, "error": message}})
        self.denied = True
        self.report_error(pb.ERROR_CODE_PERMISSION_DENIED, message + "; closing the connection", None, {"reason": "unauthenticated"})
        if rid:
            self.end_refused(rid)
        self._over(kill=True)

    def expire(self, reason: str, message: str) -> None:
        """A deadline passed (:class:`~smith_fast.service.deadlines.Deadlines`): say why, then close.

        Args:
            reason: ``handshake_timeout`` (an ``ErrorEvent``) or ``idle_timeout`` (a WARN
                ``LogEvent``, then ``StateChange(SHUTTING)``).
            message: the sentence the peer is told.
        """
        log.info("closing connection", extra={"fields": {"peer": self.peer, "reason": reason}})
        if reason != "idle_timeout":
            self.abort(pb.ERROR_CODE_UNSPECIFIED, message, {"reason": reason})
            return
        if self._closing:
            return
        self.sink.log(pb.LOG_LEVEL_WARN, message, fields={"reason": reason})
        self.sink.state_change(pb.SERVICE_STATE_SHUTTING)
        self._over(kill=True)

    def abort(self, code: int, message: str, details: Mapping[str, str] | None = None) -> None:
        """Send an ``ErrorEvent`` saying why, then close the connection; anything running is killed.

        Args:
            code: the ``ErrorCode``.
            message: the sentence the peer is told.
            details: ``ErrorEvent.details``.
        """
        if self._closing:
            return
        self.report_error(code, message, None, details)
        self._over(kill=True)

    def _running_tasks(self) -> list[asyncio.Task[None]]:
        return [*self._batches.tasks, *(r.task for r in self.requests.live.values() if r.task is not None)]

    def connection_lost(self) -> None:
        """The peer went away: nobody to report to, so kill children at once (a resumable session
        is parked instead: service/session_resume.py)."""
        if self._resume.park():
            return
        self.lost()

    def lost(self) -> None:
        """End as a dropped connection does: what runs is killed, nothing more is sent."""
        self._over(kill=True, close=False)

    # ---- resume (service/session_resume.py) -------------------------------------------------------

    @property
    def resumable(self) -> Resumable | None:
        """Its token, key and retention ring once a handshake asked for resume."""
        return self._resume.resumable

    def _pending(self) -> int:
        """What the output budget counts as unsent: the front's, and while parked what was retained since."""
        return self._unsent() + self._resume.parked_bytes()

    def carry_over(self, front: Front | None) -> None:
        """Write to, read from and close ``front`` from now on (None: nothing, while parked)."""
        if front is None:
            self._close, self._unsent = _nothing, _none_unsent
            self.flow.bind(None)
        else:
            self._close, self._unsent = front.close, front.unsent
            self.flow.bind(front.hold_input)

    def now(self) -> float:
        return self._loop.time()

    def end_quietly(self) -> None:
        """This connection resumed another session: it ends without a word."""
        self._over(close=False)

    def expire_parked(self) -> None:
        """``--resume-window`` passed without a resume: end as a dropped connection always did."""
        self.lost()

    def reattach(self, front: Front, after: int) -> None:
        """Carry on over ``front`` (:meth:`SessionResume.reattach <smith_fast.service.session_resume.SessionResume.reattach>`)."""
        self._resume.reattach(front, after)


def _nothing() -> None:
    pass


def _none_unsent() -> int:
    return 0
