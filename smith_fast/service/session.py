"""One client session: handshake, grants, token, command admission, flow control, teardown.

The connection decodes commands (v1 frames or v0 lines) into ``smith_pb2.Command`` objects and hands
them to :meth:`Session.handle`; everything the session says goes out through its
:class:`~smith_fast.service.sinks.EventSink`. What a command needs (capability, size limit,
handler) is its row in :data:`~smith_fast.service.commands.COMMANDS`; an admitted request runs as a
task of its own through the session's :class:`~smith_fast.service.runner.RequestRunner` (here, or
on a NATS worker), so the events of different requests interleave, each carrying its request_id.
Protocol-independent.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, MutableSet, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.message import DecodeError

from .. import events, tracing
from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..replay import RecordingStore, SessionRecorder
from . import audit, eager
from .auth import REDACTED, TOKEN_KEY, redacted_handshake, token_matches
from .redact import redacted_bytes
from .commands import COMMANDS, CommandSpec, Control
from .flow import OutputBudget, reservation
from .health import HealthSource, health_response
from .metrics import Gauges, ResourceSampler
from .negotiation import (
    ACCEPT_KEY,
    ACCEPTABLE,
    DEFAULT_METRICS_INTERVAL_MS,
    SUPPORTED_VERSIONS,
    accept_additions,
    capability_name,
    capability_refusal,
    wire_capabilities,
)
from .resume import RESUME, Front, ParkedSessions, Resumable, ResumeRefused, Retention
from .sizes import too_large
from .sinks import EventSink, now_ms

if TYPE_CHECKING:
    from .config import Limits, ServiceConfig
    from .runner import RequestRunner, RunnerFactory

__all__ = ["Session", "SessionCore"]

log = get_logger("smith_fast.session")

_HEALTH_RESPONSE = pb.Envelope.DESCRIPTOR.fields_by_name["health_check_response"].number
_METRICS = pb.Envelope.DESCRIPTOR.fields_by_name["metrics"].number
_RESOURCE_USAGE = pb.Envelope.DESCRIPTOR.fields_by_name["resource_usage"].number
_EVENT = pb.Envelope.DESCRIPTOR.fields_by_name["event"].number
# Commands of a batch handled per loop iteration: a large batch must not stall other sessions.
_BATCH_SLICE = 128
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
    def parked(self) -> ParkedSessions:
        """The resumable sessions (:mod:`~smith_fast.service.resume`)."""
        ...

    @property
    def capabilities(self) -> frozenset[int]:
        """What this service can grant."""
        ...

    def grant(self, requested: list[int]) -> tuple[list[int], list[int]]: ...

    def made_resumable(self, session: Session) -> None:
        """``session`` retains what it writes from now on (a gateway also journals it in NATS)."""

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
        protocol: the metrics label of its front: ``v1``, ``v0`` (socket or stdio), ``grpc`` or ``nats``.
        granted: the capabilities of a handshake answered elsewhere: the session starts
            handshaken with them (a NATS worker's session, whose gateway answered the handshake).
        span: the session's span to start with (a NATS worker's: the gateway session's).
        unsent: the bytes its front still holds for the peer (the transport's write buffer, a
            gRPC queue), counted against ``--max-session-buffer`` (:mod:`~smith_fast.service.flow`).
        hold_input: called with True when the peer's commands should no longer be read (the peer
            does not read, or the commands waiting for the budget hold over a quarter of it),
            with False when they may be again.
        front: the connection as a :class:`~smith_fast.service.resume.Front`, when the session
            can be resumed over another one after it dropped (Unix, TCP, gRPC; not stdio).
        session_id: its id (default: a new UUID; a session restored from a gateway's journal
            keeps the one it had).
    """

    def __init__(
        self,
        core: SessionCore,
        sink: EventSink,
        *,
        close: Callable[[], None],
        runner: RunnerFactory,
        peer: str = "?",
        protocol: str | None = None,
        granted: frozenset[int] | None = None,
        span: tracing.SpanHandle = tracing.NOOP,
        unsent: Callable[[], int] = lambda: 0,
        hold_input: Callable[[bool], None] | None = None,
        front: Front | None = None,
        session_id: str | None = None,
    ) -> None:
        self.core = core
        self.sink = sink
        self.peer = peer
        self.version = sink.version
        self.protocol = protocol or f"v{sink.version}"
        self.granted: frozenset[int] = granted or frozenset()
        self.accepted: frozenset[str] = frozenset()
        self.handshaken = granted is not None
        self.paused = False
        self.shutting = False
        self._unsent = unsent
        self.budget = OutputBudget(core.limits.max_session_buffer, self._pending)
        self._front = front  # the connection carrying it, when it can be resumed elsewhere (resume.py)
        self.resumable: Resumable | None = None  # once a handshake asked for resume
        self._peer_reading = asyncio.Event()  # clear while the front says the peer does not read
        self._peer_reading.set()
        self._hold_input = hold_input
        self._input_held = False
        self._waiting_bytes = 0  # of the commands waiting for the budget
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Read but not started (no PROCESSING sent yet); and those of them a resume's replay could
        # not show were read, whose one copy the resumed peer sends is refused (reattach).
        self._unstarted: set[str] = set()
        self._owed: set[str] = set()
        self._batches: set[asyncio.Task[None]] = set()  # BatchCommands being dispatched or run in order
        # While a large batch is dispatched slice by slice, what arrives after it waits here, so
        # envelopes are still handled in the order they came.
        self._backlog: collections.deque[tuple[pb.Envelope, str | None]] | None = None
        self._reporter: asyncio.Task[None] | None = None  # periodic MetricsEvents
        self._close = close
        self._closing = False
        self.session_id = session_id or str(uuid.uuid4())
        # With a token configured, nothing but a handshake presenting it is served (auth.py); the
        # front sets this for peers it trusts otherwise (stdio, a gRPC call's metadata).
        self.authenticated = core.config.token is None
        self.denied = False  # refused for a wrong or missing token
        self.presented_token: str | None = None  # v0 has no client_info: the connection puts it here
        self._loop = asyncio.get_running_loop()
        self.last_active = self._loop.time()  # of the last message received or request ended (Deadlines)
        self.span = span  # the session's span when tracing is granted
        self.recorder: SessionRecorder | None = None
        self.runner: RequestRunner = runner(self)
        if core.config.record_dir is not None:
            self._start_recording()
        core.sessions.add(self)
        core.metrics.sessions_total[self.protocol] = core.metrics.sessions_total.get(self.protocol, 0) + 1

    # ---- input -------------------------------------------------------------------------------

    def handle_frame(self, data: bytes) -> None:
        """Decode and dispatch one v1 envelope's bytes (socket frame or gRPC message); bytes that
        are no Envelope are recorded as they came (a replay sends them again) and answered with
        an ``ErrorEvent``, worded alike on both fronts. Never raises."""
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

    def handle_envelope(self, env: pb.Envelope) -> None:
        """Dispatch one decoded v1 envelope (socket frame or gRPC message). Never raises."""
        self.last_active = self._loop.time()
        kind = env.WhichOneof("payload")
        if self.recorder is not None:
            self.recorder.record_in(_loggable(env, kind))
        if self._backlog is not None:
            self._backlog.append((env, kind))
            return
        self._route(env, kind)

    def _route(self, env: pb.Envelope, kind: str | None) -> None:
        if kind == "command":
            self.handle(env.command)
        elif kind == "batch_command":
            self._batch(env.batch_command)
        elif not self.authenticated:
            self._deny(f"{kind or 'an empty envelope'} before an authenticated handshake: this service needs a token")
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
            self._deny(f"{kind or 'an empty command'} before an authenticated handshake: this service needs a token", self.request_id(command))
            return
        if kind is None:
            self.protocol_error(ProtocolError("empty Command: no command_type set", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "malformed"}))
            return
        request = getattr(command, kind)
        rid = getattr(request, "request_id", None)
        if rid is not None and _id_size(rid) > (limit := self.core.limits.max_request_id_size):
            # Not read as an id (it would be echoed in every event of the request): no terminal state.
            self.protocol_error(
                ProtocolError(
                    f"{kind}'s request_id is {_id_size(rid)} bytes, over the limit of {limit} (--max-request-id-size); nothing was run",
                    pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                    details={"reason": "request_id_too_long", "size": str(_id_size(rid)), "limit": str(limit)},
                )
            )
            return
        if not self.handshaken:
            self.refuse(
                ProtocolError(
                    f"{kind} before handshake: send a HandshakeCommand first",
                    pb.ERROR_CODE_UNSPECIFIED,
                    rid,
                    {"reason": "handshake_required"},
                )
            )
            return
        if kind == "shutdown":
            asyncio.get_running_loop().create_task(self.shutdown())
            return
        spec = COMMANDS.get(kind)
        if spec is not None and spec.control is not None:
            self._control(spec, spec.control, request)
            return
        if spec is None or spec.handler is None:
            self.refuse(ProtocolError(f"{kind} is not supported by this service", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "unsupported_command"}))
            return
        if spec.needs is not None and (needed := spec.needs(request)) not in self.granted:
            name = capability_name(needed) if isinstance(needed, int) else needed
            self.refuse(
                ProtocolError(f"{kind} needs capability {name}, which was not granted in the handshake", pb.ERROR_CODE_INVALID_CAPABILITY, rid)
            )
            return
        if spec.size is not None and (size := spec.size(request)) > self.core.limits.max_command_size:
            self.refuse(too_large(f"this {kind} command", size, self.core.limits.max_command_size, rid))
            return
        self._start(rid or "", spec, command)

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
        """The command's request id if it can be read as one: set, and not over
        ``--max-request-id-size`` (PROTOCOL.md, "Terminal states")."""
        kind = command.WhichOneof("command_type")
        rid = getattr(getattr(command, kind), "request_id", None) if kind else None
        return rid if rid and _id_size(rid) <= self.core.limits.max_request_id_size else None

    def _batch(self, batch: pb.BatchCommand) -> None:
        """Admit a ``BatchCommand``: refused whole over ``--max-batch-commands``; a large one is
        dispatched a slice per loop iteration, an ordered one command after command."""
        commands = batch.commands
        limit = self.core.limits.max_batch_commands
        if len(commands) > limit:
            self._refuse_batch(list(commands), limit)
            return
        if batch.require_ordering:
            self._in_task(self.run_ordered(list(commands)))
        elif len(commands) <= _BATCH_SLICE:
            for command in commands:
                self.handle(command)
        else:
            self._backlog = collections.deque()
            self._in_task(self._dispatch(list(commands)))

    def _in_task(self, work: Any) -> None:
        task = self._loop.create_task(work)
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _dispatch(self, commands: list[pb.Command], each: Callable[[pb.Command], None] | None = None) -> None:
        """Handle an unordered batch ``_BATCH_SLICE`` commands at a time (with ``each``, default
        :meth:`handle`), then what arrived meanwhile."""
        each = self.handle if each is None else each
        try:
            for start in range(0, len(commands), _BATCH_SLICE):
                for command in commands[start : start + _BATCH_SLICE]:
                    each(command)
                await asyncio.sleep(0)
        finally:
            backlog, self._backlog = self._backlog, None
            while backlog and not (self._closing or self.shutting):
                env, kind = backlog.popleft()
                self._route(env, kind)
                if self._backlog is not None:  # it started another large batch: the rest waits for it
                    self._backlog.extend(backlog)
                    break

    def _refuse_batch(self, commands: list[pb.Command], limit: int) -> None:
        """A batch over ``--max-batch-commands``: one error for the batch, nothing of it runs, and
        each readable request id in it (not that of a running request) ends ``ERROR``."""
        message = f"a BatchCommand of {len(commands)} commands is over the limit of {limit} (--max-batch-commands); none of it was run"
        if not self.authenticated:
            self._deny("a BatchCommand before an authenticated handshake: this service needs a token")
            return
        self.protocol_error(
            ProtocolError(
                message,
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                details={"reason": "batch_too_large", "size": str(len(commands)), "limit": str(limit)},
            )
        )
        ended: set[str] = set()

        def end(command: pb.Command) -> None:
            rid = self.request_id(command)
            if rid is not None and rid not in ended and rid not in self._tasks:
                ended.add(rid)
                self.sink.state_change(pb.SERVICE_STATE_ERROR, rid)

        if len(commands) <= _BATCH_SLICE:
            for command in commands:
                end(command)
        else:  # 200,000 terminal states in one step stalled every other session for a second
            self._backlog = collections.deque()
            self._in_task(self._dispatch(list(commands), end))

    async def run_ordered(self, commands: list[pb.Command]) -> None:
        """A ``BatchCommand`` with ``require_ordering``: each command starts after the previous one ended."""
        for i, command in enumerate(commands):
            if i % _BATCH_SLICE == _BATCH_SLICE - 1:
                await asyncio.sleep(0)  # refused commands start no task to wait for
            self.handle(command)
            kind = command.WhichOneof("command_type")
            rid = getattr(getattr(command, kind), "request_id", None) if kind else None
            task = self._tasks.get(rid) if rid else None
            if task is not None:
                await asyncio.wait([task])

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
        self.protocol_error(exc)
        audit.refused(self.session_id, self.peer, exc)
        if exc.request_id:
            self.sink.state_change(pb.SERVICE_STATE_ERROR, exc.request_id)

    def refuse(self, exc: ProtocolError) -> None:
        """Refuse a request before it starts (:meth:`reject`), unless a request with its id is
        running: then only the error, as the id's one terminal state is that request's own
        (PROTOCOL.md, "Terminal states")."""
        if exc.request_id and exc.request_id in self._tasks:
            self.protocol_error(exc)
        else:
            self.reject(exc)

    # ---- handshake ----------------------------------------------------------------------------

    def _handshake(self, hs: pb.HandshakeCommand) -> None:
        if not self.authenticated:
            presented = hs.client_info.get(TOKEN_KEY) if self.version == 1 else self.presented_token
            self.presented_token = None
            if not token_matches(self.core.config.token, presented):  # type: ignore[arg-type]  # not authenticated: a token is set
                self._deny("the handshake " + ("presents no token" if presented is None else "presents a wrong token"))
                return
            self.authenticated = True
        if hs.resume_token:
            self._resume_from(hs)
            return
        if hs.version not in SUPPORTED_VERSIONS:
            self.protocol_error(
                ProtocolError(
                    f"protocol version {hs.version} is not supported; this service speaks versions 1 and 0",
                    pb.ERROR_CODE_UNSUPPORTED_VERSION,
                    details={"supported_versions": "1,0"},
                )
            )
            return
        if self.version == 1 and hs.version == 0:
            self.protocol_error(
                ProtocolError(
                    "version 0 was requested on a v1 (varint-delimited protobuf) connection; "
                    "v0 is spoken as JSON lines",
                    pb.ERROR_CODE_UNSUPPORTED_VERSION,
                    details={"supported_versions": "1"},
                )
            )
            return
        granted, refused = self.core.grant(list(hs.capabilities))
        if refused:  # one ErrorEvent (and one log line) however many were refused
            message, details = capability_refusal(refused, self.core.capabilities)
            self.protocol_error(ProtocolError(message, pb.ERROR_CODE_INVALID_CAPABILITY, details=details))
        accepted, interval_ms, warnings = accept_additions(hs.client_info) if self.version == 1 else ([], 0, [])
        token = self._offer_resume() if RESUME in accepted else None
        if RESUME in accepted and token is None:
            accepted.remove(RESUME)
            warnings.append((f"{ACCEPT_KEY}: resume is not available here (stdio cannot resume; --resume-window 0 turns it off)",
                             {"key": ACCEPT_KEY, "ignored": RESUME}))
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
        event = pb.Event()
        ready = event.ready
        ready.version = self.version
        ready.capabilities.extend(wire_capabilities(granted))
        ready.service_id = self.core.service_id
        info = self.core.service_info(self.version, granted, accepted, interval_ms)
        if self.recorder is not None:
            info["smith_fast.recording"] = str(self.recorder.path)
        ready.service_info.update(info)
        if token is not None:
            ready.resume_token = token
        self.sink.event(event)
        self.sink.state_change(pb.SERVICE_STATE_READY)
        for message, fields in warnings:  # after the answer, so a client's handshake loop never eats them
            self.sink.log(pb.LOG_LEVEL_WARN, message, fields=fields)
        self._apply_accepted(frozenset(accepted), interval_ms)
        log.info("handshake", extra={"fields": {"peer": self.peer, "version": self.version, "granted": [capability_name(c) for c in granted], "accepted": accepted}})

    def _apply_accepted(self, accepted: frozenset[str], interval_ms: int) -> None:
        """Switch batching and the metrics reports on or off, as the latest handshake asked."""
        self.accepted = accepted
        if "batch_event" in accepted:
            self.sink.start_batching()
        else:
            self.sink.stop_batching()
        if self._reporter is not None:
            self._reporter.cancel()
            self._reporter = None
        if "metrics" in accepted:
            self._reporter = asyncio.get_running_loop().create_task(self._report_metrics(interval_ms / 1000))

    # ---- recording ---------------------------------------------------------------------------

    def _start_recording(self) -> None:
        """Record this session (every envelope in and out) in the core's recordings; a failure to
        start or to write is reported to the peer as a warning and the session goes on. Neither
        the service's token nor the session's resume token is ever written (``conceal``)."""
        try:
            self.recorder = self.core.recordings.open(
                session_id=self.session_id,
                protocol_version=self.version,
                service_id=self.core.service_id,
                on_error=lambda err: self.sink.log(pb.LOG_LEVEL_WARN, f"recording stopped: {err}", fields={"reason": "recording_failed"}),
                metadata={"peer": self.peer},
            )
        except OSError as exc:
            log.warning("cannot record session", extra={"fields": {"peer": self.peer, "error": str(exc)}})
            self.sink.log(pb.LOG_LEVEL_WARN, f"cannot record this session: {exc}", fields={"reason": "recording_failed"})
            return
        self.recorder.conceal(self.core.config.token)
        if self.resumable is not None:
            self.recorder.conceal(self.resumable.token)
        self.sink.record_to(self.recorder)

    # ---- metrics and health -------------------------------------------------------------------

    async def _report_metrics(self, interval: float) -> None:
        sampler = ResourceSampler()
        while True:
            await asyncio.sleep(interval)
            if self._closing:
                return
            if not self.paused:  # a peer that does not read would only make us buffer reports
                self.send_metrics(sampler)

    def send_metrics(self, sampler: ResourceSampler) -> None:
        """One report: a MetricsEvent per sample, then a ResourceUsageEvent."""
        core, sink = self.core, self.sink
        ts = now_ms()
        for name, labels, value in core.metrics.samples(core):
            sink.envelope(_METRICS, pb.MetricsEvent(metric_name=name, value=value, timestamp=ts, labels=labels).SerializeToString())
        usage = sampler.sample(core.network_connections())
        sink.envelope(_RESOURCE_USAGE, usage.event(ts).SerializeToString())

    # ---- requests -----------------------------------------------------------------------------

    def is_running(self, rid: str) -> bool:
        """Whether request ``rid`` was admitted and has not ended (its runner may not have started it yet)."""
        return rid in self._tasks

    def task(self, rid: str) -> asyncio.Task[None] | None:
        """The task running request ``rid`` (None: not running, or running eagerly, before its first suspension)."""
        return self._tasks.get(rid)

    @property
    def busy(self) -> bool:
        """Whether a request (or an ordered batch) is running."""
        return bool(self._tasks or self._batches)

    def _start(self, rid: str, spec: CommandSpec, command: pb.Command) -> None:
        if not rid:
            self.protocol_error(ProtocolError("request_id is empty", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "invalid_field"}))
            return
        if self._owed and rid in self._owed:
            # The copy a resumed peer sends of a request this session had read but not started
            # when the replay was taken: refused even when that request ended meanwhile, or it
            # would run twice (its PROCESSING and READY came after the replay, on the way to the peer).
            self._owed.discard(rid)
            self.protocol_error(ProtocolError(
                f"request {rid} was read before the connection dropped (its PROCESSING came after the replay); this copy was not run",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_request"},
            ))
            return
        if rid in self._tasks:
            self.protocol_error(ProtocolError(f"request {rid} is already running", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_request"}))
            return
        if len(self._tasks) >= self.core.limits.max_requests:
            self.reject(
                ProtocolError(f"too many requests in flight (max {self.core.limits.max_requests})", pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid)
            )
            return
        if spec.now is not None and self._ran_now(spec, rid, command):
            return
        self._unstarted.add(rid)
        coro = self._request(spec, rid, command)
        if spec.eager and asyncio.current_task(self._loop) is None:  # the loop given: no getpid() per call
            # Eager start (asyncio.eager_task_factory, 3.12+, done by hand for 3.11): run the
            # request at once up to its first suspension; most tool calls end there, without a
            # Task or a loop iteration. One that suspends goes on in a Task, in the same context.
            context = contextvars.copy_context()
            try:
                waiting = context.run(coro.send, None)
            except StopIteration:
                return
            task = self._loop.create_task(eager.resume(coro, waiting), context=context)
        else:
            task = self._loop.create_task(coro)
        self._tasks[rid] = task
        task.add_done_callback(functools.partial(self._forget, rid))

    def _ran_now(self, spec: CommandSpec, rid: str, command: pb.Command) -> bool:
        """The request run and ended in this step by the runner's ``run_now`` (RequestRunner), with
        what ``_request`` does around it: only while nothing holds or waits for the output budget
        (then reserving and releasing it is nothing) and the peer reads."""
        budget = self.budget
        if budget.waiting or budget.reserved or self.paused or self.shutting:
            return False
        run_now = getattr(self.runner, "run_now", None)
        if run_now is None:
            return False
        start = time.perf_counter()
        if not run_now(spec, rid, command):
            return False  # not run, or it goes on in _request (run knows how)
        self._update_input()
        self.last_active = self._loop.time()
        self.core.metrics.observe_request(spec.kind, time.perf_counter() - start)
        return True

    def _forget(self, rid: str, _task: asyncio.Task[None]) -> None:
        self._tasks.pop(rid, None)
        self._unstarted.discard(rid)  # cancelled before its first step

    async def _request(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        start = time.perf_counter()
        size = reservation(spec.kind, self.core.limits)
        budget = self.budget
        try:
            if budget.waiting or budget.reserved or self.paused:
                await self._admit(size, command.ByteSize())
            else:
                budget.reserved += size  # the common case: nothing else runs, the peer reads
        except asyncio.CancelledError:
            self._unstarted.discard(rid)
            self._not_started(rid)
            raise
        # The service's runner sends PROCESSING first thing (a gateway's NatsRunner relays its
        # worker's later: there a copy is refused only while the request runs).
        self._unstarted.discard(rid)
        if self.shutting:  # it waited for the budget while the session began shutting down
            budget.release(size)
            self._not_started(rid)
            return
        try:
            await self.runner.run(spec, rid, command)
        finally:
            budget.release(size)
            self._update_input()
            self.last_active = self._loop.time()
            self.core.metrics.observe_request(spec.kind, time.perf_counter() - start)

    def _not_started(self, rid: str) -> None:
        """A request that waited for the budget is cancelled by a shutdown: its one terminal
        state, as a running request's (nobody listens after a disconnect)."""
        if not self._closing:
            self.report_error(pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", rid, {"reason": "cancelled"})
            self.sink.state_change(pb.SERVICE_STATE_ERROR, rid)

    async def _admit(self, size: int, held: int) -> None:
        """Wait for the output budget, holding a ``held``-byte command meanwhile."""
        self._waiting_bytes += held
        self._update_input()
        try:
            await self.budget.acquire(size)
        finally:
            self._waiting_bytes -= held
            self._update_input()

    # ---- flow control and teardown --------------------------------------------------------------

    def pause(self) -> None:
        """The peer is not reading: stop producing output (child pipes), starting requests
        (:mod:`~smith_fast.service.flow`) and reading its commands, so memory stays bounded."""
        self.paused = True
        self._peer_reading.clear()
        self.budget.set_paused(True)
        self.runner.pause()
        self._update_input()

    def resume(self) -> None:
        self.paused = False
        self._peer_reading.set()
        self.runner.resume()
        self.budget.set_paused(False)
        self._update_input()

    async def reading(self) -> None:
        """Return once the peer reads (at once unless it is paused): a request that produces
        output step by step (a plan) waits here before each step."""
        if self.paused and not self.shutting:
            await self._peer_reading.wait()

    def _update_input(self) -> None:
        """Hold the peer's input while it is not reading, or while the commands waiting for the
        budget hold more than a quarter of it; a peer that reads can still send what addresses
        the running requests while a few wait."""
        held = self.paused or self._waiting_bytes > self.budget.limit // 4
        if held != self._input_held and self._hold_input is not None and not self._closing:
            self._input_held = held
            self._hold_input(held)

    @property
    def closing(self) -> bool:
        """The session is over: nothing is sent any more."""
        return self._closing

    async def _cancel_requests(self) -> None:
        tasks = [*self._batches, *self._tasks.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _end(self, *, handed_over: bool = False) -> None:
        """Mark the session over and leave the core; nothing is sent after this. Its runner is
        told it ended, unless the next process takes the session over (:meth:`hand_over`)."""
        if self._closing:
            return
        self._closing = True
        self.core.sessions.discard(self)
        if self.resumable is not None:
            self.core.parked.forget(self.resumable.key)
        if not handed_over:
            self.runner.end()
        self.span.end()

    def _stop_recording(self) -> None:
        """Close the session log once everything the session will ever send was written."""
        if self.recorder is not None:
            # fsync in a worker thread: a long session's log must not stall every other session
            task = asyncio.get_running_loop().create_task(self.recorder.aclose())
            _CLOSING_LOGS.add(task)
            task.add_done_callback(_CLOSING_LOGS.discard)
        if self._reporter is not None:
            self._reporter.cancel()
            self._reporter = None

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
        self._end()
        self.sink.flush_batch()
        self._close()
        self._stop_recording()

    async def finish(self) -> None:
        """The peer will send nothing more but still listens (a gRPC half-close): let the running
        requests end, then close."""
        while (self._tasks or self._batches) and not self._closing:
            await asyncio.wait([*self._batches, *self._tasks.values()])
        if self._closing:
            return
        self._end()
        self.sink.flush_batch()
        self._close()
        self._stop_recording()

    def _deny(self, message: str, rid: str | None = None) -> None:
        """A wrong or missing token: say so, end the refused request ``rid`` (if any), close (the
        gRPC front then fails the call UNAUTHENTICATED)."""
        if self._closing:  # what the peer sent after the refusal, in the same read
            return
        log.warning("authentication failed", extra={"fields": {"peer": self.peer, "error": message}})
        self.denied = True
        self.report_error(pb.ERROR_CODE_PERMISSION_DENIED, message + "; closing the connection", None, {"reason": "unauthenticated"})
        if rid:
            self.sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        self._teardown()

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
        self._teardown()

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
        self._teardown()

    def _teardown(self) -> None:
        self._end()
        self.runner.kill()
        for task in [*self._batches, *self._tasks.values()]:
            task.cancel()
        self.sink.flush_batch()
        self._close()
        self._stop_recording()

    def connection_lost(self) -> None:
        """The peer went away: nobody to report to, so kill children at once (a resumable session
        is parked instead, :meth:`_park`)."""
        if self._park():
            return
        self._lost()

    def _lost(self) -> None:
        self._end()
        self.runner.kill()
        for task in [*self._batches, *self._tasks.values()]:
            task.cancel()
        self._stop_recording()

    # ---- resume (service/resume.py) ---------------------------------------------------------------

    def _pending(self) -> int:
        """What the output budget counts as unsent: the front's, and while parked what was retained since."""
        resumable = self.resumable
        return self._unsent() + (resumable.retention.parked_bytes if resumable is not None else 0)

    def _offer_resume(self) -> str | None:
        """Make this session resumable (from now on what it writes is retained); its token, or
        None where it cannot be (no front, v0, ``--resume-window 0``)."""
        if self.resumable is not None:
            return self.resumable.token
        if self._front is None or self.version != 1 or self.core.parked.window <= 0:
            return None
        retention = Retention(self.core.limits.max_session_buffer, self.pause, framed=self.sink.framed)
        token, key = self.core.parked.issue(self)
        self.resumable = Resumable(token, key, retention, self._front)
        if self.recorder is not None:  # its Ready carries the token to the peer, never to the recording
            self.recorder.conceal(token)
        self.sink.tap(retention.record)
        self.core.made_resumable(self)
        return token

    def _park(self) -> bool:
        """The connection dropped: keep a resumable session running for ``--resume-window``."""
        resumable = self.resumable
        if resumable is None or self.shutting or self._closing or not self.core.parked.park(resumable.key):
            return False
        resumable.retention.park()
        resumable.origin.forward(None)
        self._front = None
        self._close, self._unsent, self._hold_input = _nothing, _none_unsent, None
        if self.paused:  # by the dropped connection's flow control: its requests go on, into the ring
            self.resume()
        log.info("session parked", extra={"fields": {"peer": self.peer, "window": self.core.parked.window, "requests": len(self._tasks)}})
        return True

    def expire_parked(self) -> None:
        """``--resume-window`` passed without a resume: end as a dropped connection always did."""
        self._lost()

    def _resume_from(self, hs: pb.HandshakeCommand) -> None:
        """A resume handshake: this connection carries the session its token names from now on,
        and this one, which never served, ends without a word. A refusal is an ``ErrorEvent``;
        the connection stays, for a fresh handshake."""
        try:
            if self._front is None or self.version != 1:
                raise ResumeRefused(
                    "this connection cannot resume a session: only v1 over Unix, TCP and gRPC can (PROTOCOL.md, \"Resume\")",
                    "resume_unsupported",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            if self.handshaken:
                raise ResumeRefused(
                    "a resume must be the first handshake of its connection; this one already carries a session",
                    "resume_invalid",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            other = self.core.parked.find(hs.resume_token)
            if other is None and self.core.parked.restoring:
                raise ResumeRefused(
                    "this service is still taking over the sessions of the process before it (a gateway restarting "
                    "with the same --gateway-id); send the resume handshake again in a moment",
                    "resume_not_ready",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            if not isinstance(other, Session) or other is self or other.closing:
                raise ResumeRefused(
                    "the resume token names no session that can be resumed here (a wrong token, an ended session, "
                    "or its --resume-window passed); send a fresh handshake",
                    "resume_unknown",
                )
            if other.sink.framed != self._front.framed:
                raise ResumeRefused(
                    "that session was started over gRPC (or a socket) and resumes only over the same kind of front",
                    "resume_unsupported",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            other.reattach(self._front, hs.resume_after, hs.resume_token)
        except ResumeRefused as exc:
            log.warning("resume refused", extra={"fields": {"peer": self.peer, "error": str(exc)}})
            self.protocol_error(exc)
            return
        self._end()
        self._stop_recording()

    def reattach(self, front: Front, after: int, token: str = "") -> None:
        """Carry on over ``front``: answer ``Ready(resumed)``, send what was retained after
        sequence ``after``, then go on live. A session still carried by another connection (one
        that has not noticed its peer is gone) is taken from it.

        Raises:
            ResumeRefused: what follows ``after`` cannot be sent exactly once; nothing changed.
        """
        resumable = self.resumable
        assert resumable is not None
        # What waits in a pending batch goes into the ring first: the replay must hold everything
        # written so far, or a peer would send again a request whose PROCESSING is still batched.
        self.sink.flush_batch()
        units = resumable.retention.replay(after)
        # A request read but not started (waiting for the budget, or read in this very loop
        # iteration, its task not run yet) has no PROCESSING in the replay: the peer will send it
        # again, once. It may well have ended by the time that copy arrives, so the copy is
        # refused by id (_start), not by its being still running.
        self._owed = set(self._unstarted)
        old, self._front = self._front, front
        if old is not None:
            old.release()
        self.core.parked.unpark(resumable.key)
        if token:  # a restored session learns its token back from its peer (only its key was kept)
            resumable.token = token
        self._close, self._unsent, self._hold_input = front.close, front.unsent, front.hold_input
        self._input_held = False
        front.carry(self)
        resumable.retention.attach()
        front.write(self._resumed(resumable.token, len(units)))
        for unit in units:
            front.write(unit)
        resumable.origin.forward(front)
        self.last_active = self._loop.time()
        if self.paused:
            self.resume()
        log.info("session resumed", extra={"fields": {"peer": self.peer, "after": after, "replayed": len(units), "took_over": old is not None}})

    def restore(self, key: str, granted: frozenset[int], accepted: frozenset[str], units: Sequence[bytes], interval_ms: int) -> bool:
        """Take over a session the process before this one handed over (a gateway restarting with
        the same ``--gateway-id``: smith_fast.nats.journal): handshaken as it was, what it sent
        retained, parked for ``--resume-window`` until its peer resumes it here. False: it could
        not be parked (too many are) and ended at once."""
        front = self._front
        assert front is not None and self.resumable is None
        self.granted, self.handshaken, self.authenticated = granted, True, True
        retention = Retention(self.core.limits.max_session_buffer, self.pause, framed=self.sink.framed)
        for unit in units:
            retention.record(unit)
        self.resumable = Resumable("", key, retention, front)
        self.core.parked.adopt(key, self)
        self.sink.tap(retention.record)
        self.core.made_resumable(self)
        self._apply_accepted(accepted, interval_ms)
        if self._park():
            return True
        self._lost()
        return False

    def adopt_request(self, rid: str, work: Coroutine[Any, Any, None]) -> None:
        """A request that runs already (a restored session's, on a worker): it counts as admitted
        here until ``work`` ends, as one this session started would."""
        task = self._loop.create_task(work)
        self._tasks[rid] = task
        task.add_done_callback(functools.partial(self._forget, rid))

    def hand_over(self) -> None:
        """The service stops and the next process takes this session over (a gateway with a fixed
        ``--gateway-id``: smith_fast.nats.journal): its requests go on where they run, the peer is
        told nothing, its connection is dropped so that it resumes on the next process. What it
        wrote so far is in the journal already (or on its way: the gateway waits for it)."""
        if self._closing:
            return
        self._end(handed_over=True)
        self.sink.flush_batch()
        for task in [*self._batches, *self._tasks.values()]:
            task.cancel()
        self._close()
        self._stop_recording()
        log.info("session handed over", extra={"fields": {"peer": self.peer, "session": self.session_id, "requests": len(self._tasks)}})

    def _resumed(self, token: str, replayed: int) -> bytes:
        """The answer to a resume handshake: outside the session's sequence (0), never retained."""
        event = pb.Event()
        ready = event.ready
        ready.version = self.version
        granted = sorted(self.granted)
        ready.capabilities.extend(wire_capabilities(granted))
        ready.service_id = self.core.service_id
        ready.service_info.update(self.core.service_info(self.version, granted, [a for a in ACCEPTABLE if a in self.accepted]))
        ready.service_info["smith_fast.replayed"] = str(replayed)
        ready.resume_token = token
        ready.resumed = True
        return events.encode_envelope(now_ms(), 0, _EVENT, event.SerializeToString(), framed=self.sink.framed)


def _nothing() -> None:
    pass


def _none_unsent() -> int:
    return 0


def _id_size(rid: str) -> int:
    """A request id's length in UTF-8 bytes."""
    return len(rid) if rid.isascii() else len(rid.encode("utf-8", "surrogatepass"))


_CLOSING_LOGS: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps only weak refs)


def _loggable(env: pb.Envelope, kind: str | None) -> bytes:
    """The bytes of ``env`` for the session log: a handshake's token and resume token replaced (auth.py)."""
    if kind == "command":
        if TOKEN_KEY in env.command.handshake.client_info or env.command.handshake.resume_token:
            env = redacted_handshake(env)
    elif kind == "batch_command" and any(
        TOKEN_KEY in c.handshake.client_info or c.handshake.resume_token for c in env.batch_command.commands
    ):
        env = redacted_handshake(env)
    return env.SerializeToString()
