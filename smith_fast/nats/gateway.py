"""``smith-fast gateway``: the listeners of ``smith-fast serve``, with the commands run by workers.

Frontends connect exactly as to ``serve`` (v1 or v0 on Unix, TCP and stdio, v1 on gRPC). Each
connection gets a plain :class:`~smith_fast.service.session.Session`, which answers the handshake,
health checks and everything else session-wide itself and admits each request as ``serve`` would;
its :class:`NatsRunner` (the gateway's :class:`~smith_fast.service.runner.RequestRunner`) forwards
each admitted request (ShellExec, ToolCall, HookLoad, Plan) into the command stream instead of
running it. The workers' events come back on the gateway's own event subjects; a
:class:`~.wire.RequestStream` per request turns them into what a single ``serve`` would have sent:
in order, each final event exactly once. The session's sink then stamps them (v1) or writes them
as JSON lines (v0).

``ReadyEvent`` grants ``nats`` while the gateway is connected to NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from .. import events
from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.config import ServiceConfig
from ..service.core import DEFAULT_METRICS_INTERVAL_MS, ServiceCore
from .config import NatsConfig, is_token
from .jetstream import PayloadTooLarge, Publisher, PublishError, PullFeed, connect, ensure_gateway_consumer, ensure_streams
from .wire import CONTROL, MSG_ID, CommandMeta, RequestStream, command_headers, hook_key, parse_event_msg_id

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext

    from ..service.commands import CommandSpec
    from ..service.runner import RequestHost

__all__ = ["GatewayCore", "NatsRunner", "Bridge"]

log = get_logger("smith_fast.gateway")

_COMMAND_FIELD = pb.Envelope.DESCRIPTOR.fields_by_name["command"].number
_STREAM_FULL = frozenset({10077, 10078})  # JetStream: maximum messages / bytes exceeded


class _Remote:
    """One forwarded request: its number in the session, and what the frontend saw of it."""

    __slots__ = ("number", "rid", "kind", "stream", "done", "seq", "key")

    def __init__(self, number: int, rid: str, kind: str, key: str | None) -> None:
        self.number = number
        self.rid = rid
        self.kind = kind
        self.stream = RequestStream(rid)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.seq = 0  # the command's sequence number in the command stream, once stored
        self.key = key  # HookLoad: the hook's key in the hooks bucket


class NatsRunner:
    """Runs a session's requests on workers (the gateway's request runner).

    Every check a request passes before it starts is the session's own (authentication,
    handshake, capability, sizes, request id, ``--max-requests``): only the running differs.
    Where ``serve`` would run the request, this runner publishes the command and waits for the
    workers' events; it sends no ``PROCESSING``/``READY`` of its own, the workers' pass through.

    Args:
        core: the gateway's core (its bridge, limits and error counters).
        host: the session.
    """

    def __init__(self, core: GatewayCore, host: RequestHost) -> None:
        self.core = core
        self.bridge = core.bridge
        self._host = host
        self.session_id = host.session_id
        self.hook_keys: list[str] = []  # hooks loaded by this session, in load order
        self._remote: dict[int, _Remote] = {}
        self._numbers = 0
        self._paused = False
        self._released = False
        self.bridge.sessions[self.session_id] = self

    async def run(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        await self._forward(rid, spec.kind, command)

    # Control commands (issue 16): not forwarded to the worker running the request yet.
    def _no_control(self, rid: str, what: str) -> ProtocolError:
        return ProtocolError(
            f"{what} is not supported through the NATS gateway yet; connect to a service (serve) to {what} request {rid}",
            pb.ERROR_CODE_UNSPECIFIED,
            rid,
            {"reason": "unsupported_command"},
        )

    def cancel(self, rid: str) -> None:
        raise self._no_control(rid, "cancel")

    def write_stdin(self, rid: str, data: bytes, eof: bool) -> None:
        raise self._no_control(rid, "stdin")

    def resize(self, rid: str, rows: int, cols: int) -> None:
        raise self._no_control(rid, "resize")

    async def _forward(self, rid: str, kind: str, command: pb.Command) -> None:
        self._numbers += 1
        key = hook_key(command.hook_load.hook_type, command.hook_load.script) if kind == "hook_load" else None
        remote = _Remote(self._numbers, rid, kind, key)
        self._remote[remote.number] = remote
        host = self._host
        meta = CommandMeta(
            session=self.session_id,
            number=remote.number,
            reply=self.bridge.event_subject(self.session_id),
            capabilities=host.granted,
            hooks=tuple(self.hook_keys),
            traceparent=host.span.traceparent,  # None unless tracing was granted
        )
        payload = events.encode_envelope(0, 0, _COMMAND_FIELD, command.SerializeToString(), framed=False)
        try:
            try:
                remote.seq = await self.bridge.submit(meta, payload)
            except PayloadTooLarge as exc:
                self._fail(
                    remote,
                    pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                    f"this {kind} command does not fit in a NATS message: {exc} (the nats-server's max_payload; "
                    "raise it there, or send less); nothing was run",
                    "too_large_for_nats",
                    {"size": str(exc.size), "limit": str(exc.limit)},
                )
                return
            except PublishError as exc:
                full = exc.code in _STREAM_FULL
                self._fail(
                    remote,
                    pb.ERROR_CODE_RESOURCE_EXHAUSTED if full else pb.ERROR_CODE_INTERNAL_ERROR,
                    f"the command could not be queued for a worker: {exc}",
                    "queue_full" if full else "nats_unavailable",
                )
                return
            self.bridge.track(remote.seq, self, remote)
            await asyncio.shield(remote.done)  # a cancellation must not cancel the future itself
        except asyncio.CancelledError:
            if not host.closing and not remote.stream.finished:
                # Shutdown (somebody listens): the workers were told to stop this session's
                # commands; their final events are on the way, unless the command never started.
                if remote.seq:
                    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                        await asyncio.wait_for(asyncio.shield(remote.done), self.core.limits.kill_grace + 5)
                self._fail(remote, pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", "cancelled")
            raise
        except Exception as exc:  # a bug of ours: report it, keep the session
            log.exception("forwarding failed", extra={"fields": {"peer": host.peer, "request_id": rid}})
            self._fail(remote, pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", "internal")
        finally:
            self.bridge.untrack(remote.seq)
            self._remote.pop(remote.number, None)
            if remote.key is not None and remote.stream.state == pb.SERVICE_STATE_READY:
                self.hook_keys.append(remote.key)  # later commands carry it

    def _fail(self, remote: _Remote, code: int, message: str, reason: str, details: dict[str, str] | None = None) -> None:
        """End a request here (the workers could not): its error, then its terminal ERROR."""
        if remote.stream.finished or self._host.closing:
            return
        remote.stream.finished = True
        remote.stream.state = pb.SERVICE_STATE_ERROR
        self._host.reject(ProtocolError(message, code, remote.rid, {"reason": reason, **(details or {})}))
        if not remote.done.done():
            remote.done.set_result(None)

    def fail_request(self, remote: _Remote, code: int, message: str, reason: str) -> None:
        """End a request the workers gave up on (max deliveries)."""
        self._fail(remote, code, message, reason)

    # ---- events from the workers -------------------------------------------------------------------

    def deliver(self, number: int, attempt: int, index: int, env: pb.Envelope) -> None:
        """One event message (an event or a batch of them) of request ``number``: send what it
        makes deliverable."""
        remote = self._remote.get(number)
        if remote is None or self._host.closing:
            return
        kind = env.WhichOneof("payload")
        if kind == "batch_event":
            carried: Sequence[pb.Event] = env.batch_event.events
        elif kind == "event":
            carried = (env.event,)
        else:
            return
        stream = remote.stream
        sink = self._host.sink
        metrics = self.core.metrics
        for event in stream.push(attempt, index, carried):
            if event.WhichOneof("event_type") == "error":
                metrics.error(event.error.error_code)
            sink.event(event)
        if stream.finished:
            if not remote.done.done():
                remote.done.set_result(None)

    # ---- flow control and teardown ----------------------------------------------------------------

    def pause(self) -> None:
        self._paused = True
        self.bridge.control(self.session_id, "pause")

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self.bridge.control(self.session_id, "resume")

    async def shutdown(self, grace: float) -> None:
        if self._remote:
            self.bridge.control(self.session_id, "shutdown")  # the workers stop them, final events still sent

    def kill(self) -> None:
        """Nothing here: :meth:`end` (which follows) tells the workers."""

    def end(self) -> None:
        # Every way a session ends (shutdown, half-close, disconnect, a deadline) passes here.
        if not self._released:
            self._released = True
            self.bridge.end_session(self)  # workers kill its commands and forget it; queued ones go


class Bridge:
    """A gateway's NATS side: publishes commands, routes events to sessions, tells workers.

    Args:
        core: the gateway's core; ``nats`` is added to its capabilities while connected.
        config: NATS names and limits.
        gateway_id: names this gateway's event subjects and consumer (default: a fresh id).
    """

    def __init__(self, core: GatewayCore, config: NatsConfig, gateway_id: str | None = None) -> None:
        self.core = core
        self.config = config
        self.gateway_id = gateway_id or uuid.uuid4().hex
        if not is_token(self.gateway_id):
            raise ValueError(f"gateway id {self.gateway_id!r} may hold only letters, digits, '-' and '_'")
        self.sessions: dict[str, NatsRunner] = {}
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.publisher: Publisher | None = None
        self.feed: PullFeed | None = None
        self._by_seq: dict[int, tuple[NatsRunner, _Remote]] = {}
        self._last: Msg | None = None
        self._ack_scheduled = False
        self._background: set[asyncio.Task[Any]] = set()
        self.events_received = 0

    def event_subject(self, session_id: str) -> str:
        return self.config.event_subject(self.gateway_id, session_id)

    async def start(self) -> None:
        """Connect, create what is missing, start consuming this gateway's events."""
        config = self.config
        self.nc = await connect(config, name=f"smith-fast gateway {self.gateway_id}", on_disconnect=self._disconnected, on_reconnect=self._reconnected)
        self.js = self.nc.jetstream(timeout=config.publish_timeout)
        await ensure_streams(self.js, config)
        await ensure_gateway_consumer(self.js, config, self.gateway_id)
        self.publisher = Publisher(self.nc, timeout=config.publish_timeout)
        await self.publisher.start()
        self.feed = PullFeed(
            self.nc, config.event_stream, config.gateway_consumer(self.gateway_id),
            capacity=4096, on_message=self._event, auto_release=True, on_gone=self._recreate_consumer,
        )
        await self.feed.start()
        advisory = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{config.command_stream}.{config.worker_consumer}"
        await self.nc.subscribe(advisory, cb=self._max_deliveries)
        self.core.capabilities = self.core.capabilities | ({pb.CAPABILITY_NATS} & self.core.permitted)
        log.info("nats connected", extra={"fields": {"gateway": self.gateway_id, "servers": list(config.servers)}})

    async def close(self) -> None:
        """Stop consuming, remove this gateway's consumer, close the connection."""
        if self.feed is not None:
            await self.feed.close()
        self._ack_last()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 2)
        if self.js is not None:
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.config.event_stream, self.config.gateway_consumer(self.gateway_id))
        if self.publisher is not None:
            await self.publisher.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 5)
            with contextlib.suppress(Exception):
                await self.nc.close()

    def _disconnected(self) -> None:
        self.core.capabilities = self.core.capabilities - {pb.CAPABILITY_NATS}

    def _reconnected(self) -> None:
        self.core.capabilities = self.core.capabilities | ({pb.CAPABILITY_NATS} & self.core.permitted)
        if self.feed is not None:
            self.feed.reset()

    async def _recreate_consumer(self) -> None:
        assert self.js is not None
        with contextlib.suppress(Exception):
            await ensure_gateway_consumer(self.js, self.config, self.gateway_id)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- commands --------------------------------------------------------------------------------

    async def submit(self, meta: CommandMeta, payload: bytes) -> int:
        """Store one command in the command stream; returns its stream sequence number.

        Raises:
            PublishError: the stream refused it (full) or NATS stayed away ``submit_timeout`` s.
        """
        assert self.publisher is not None
        deadline = time.monotonic() + self.config.submit_timeout
        subject = self.config.command_subject(self.gateway_id, meta.session)
        return await self.publisher.publish(subject, payload, command_headers(meta), deadline=deadline)

    def track(self, seq: int, session: NatsRunner, remote: _Remote) -> None:
        self._by_seq[seq] = (session, remote)

    def untrack(self, seq: int) -> None:
        self._by_seq.pop(seq, None)

    async def _max_deliveries(self, msg: Msg) -> None:
        try:
            advisory = json.loads(msg.data)
            seq = int(advisory["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return
        entry = self._by_seq.pop(seq, None)
        if entry is None:
            return
        session, remote = entry
        deliveries = advisory.get("deliveries", self.config.max_deliver)
        log.warning("command given up", extra={"fields": {"session": session.session_id, "request_id": remote.rid, "deliveries": deliveries}})
        session.fail_request(
            remote,
            pb.ERROR_CODE_INTERNAL_ERROR,
            f"request {remote.rid} was handed to a worker {deliveries} times and never finished (each worker stopped or held it "
            "past the ack wait); giving up",
            "max_deliveries",
        )
        if self.js is not None:
            with contextlib.suppress(Exception):
                await self.js.delete_msg(self.config.command_stream, seq)

    def control(self, session_id: str, action: str) -> None:
        """Tell every worker about a session (pause, resume, shutdown, end); best effort."""
        if self.nc is None or self.nc.is_closed:
            return
        self._spawn(self.nc.publish(self.config.control_subject(session_id), b"", headers={CONTROL: action}))

    def end_session(self, session: NatsRunner) -> None:
        """The session is over: workers kill its commands and forget it; queued commands are purged."""
        self.sessions.pop(session.session_id, None)
        self.control(session.session_id, "end")
        if self.js is not None and self.nc is not None and not self.nc.is_closed:
            subject = self.config.command_subject(self.gateway_id, session.session_id)
            self._spawn(self._purge(subject))

    async def _purge(self, subject: str) -> None:
        assert self.js is not None
        with contextlib.suppress(Exception):
            await self.js.purge_stream(self.config.command_stream, subject=subject)

    # ---- events ------------------------------------------------------------------------------------

    def _event(self, msg: Msg) -> None:
        self.events_received += 1
        session = self.sessions.get(msg.subject.rpartition(".")[2])
        if session is not None:
            try:
                number, attempt, index = parse_event_msg_id((msg.headers or {})[MSG_ID])
                env = pb.Envelope.FromString(msg.data)
            except Exception as exc:  # not from a worker of ours: drop it, keep going
                log.warning("malformed event message dropped", extra={"fields": {"subject": msg.subject, "error": repr(exc)}})
            else:
                session.deliver(number, attempt, index, env)
        # Ack-all: one acknowledgement covers everything delivered before it.
        self._last = msg
        if not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._ack_last)

    def _ack_last(self) -> None:
        self._ack_scheduled = False
        last, self._last = self._last, None
        if last is not None and last.reply and self.nc is not None and not self.nc.is_closed:
            self._spawn(self.nc.publish(last.reply, b"+ACK"))


class GatewayCore(ServiceCore):
    """A service core whose sessions forward their requests to workers over NATS.

    Args:
        config: the service configuration (limits, protocol, JSON backend).
        nats_config: NATS names and limits.
        loop_name: reported in ``ReadyEvent.service_info``.
        gateway_id: names this gateway's subjects and consumer.
    """

    def __init__(self, config: ServiceConfig, nats_config: NatsConfig, *, loop_name: str = "asyncio", gateway_id: str | None = None) -> None:
        super().__init__(config, loop_name=loop_name, runner=self._forwarding)
        self.bridge = Bridge(self, nats_config, gateway_id)

    def _forwarding(self, host: RequestHost) -> NatsRunner:
        return NatsRunner(self, host)

    def service_info(
        self, version: int, granted: list[int], accepted: Sequence[str] = (), interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    ) -> dict[str, str]:
        info = super().service_info(version, granted, accepted, interval_ms)
        info["smith_fast.gateway"] = self.bridge.gateway_id
        return info

