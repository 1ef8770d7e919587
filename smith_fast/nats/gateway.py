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
import collections
import contextlib
import functools
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError

from .. import events
from ..errors import ProtocolError, SmithFastError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.config import ServiceConfig
from ..service.core import DEFAULT_METRICS_INTERVAL_MS, ServiceCore
from ..service.metrics import Figure
from ..service.resume import DetachedFront
from ..service.shell_exec import terminal_size
from ..service.sinks import V1Sink
from .batching import CommandBatcher, SharedStream, Stored, batch_limit, split_events
from .config import NatsConfig, is_token
from .journal import Journal, Saved, SessionJournal
from .control import FORWARDED, InputChannel, interactive, not_running, only_stdin_written, request_subject
from .jetstream import (
    PayloadTooLarge,
    Publisher,
    PublishError,
    PullFeed,
    connect,
    ensure_gateway_consumer,
    ensure_journal_stream,
    ensure_streams,
    round_trip,
)
from .leases import Heartbeat, identity_subject, takeover_subject
from .metrics import NatsCounters, gateway_figures
from .presence import Announcement, LiveSet
from .processes import ProcessDirectory
from .wire import CONTROL, MSG_ID, REQUEST, CommandMeta, RequestStream, command_headers, hook_key, parse_event_msg_id

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext

    from ..service.commands import CommandSpec
    from ..service.runner import RequestHost
    from ..service.session import Session

__all__ = ["GatewayCore", "GatewayIdInUse", "NatsRunner", "Bridge"]

log = get_logger("smith_fast.gateway")

_COMMAND_FIELD = pb.Envelope.DESCRIPTOR.fields_by_name["command"].number
_STREAM_FULL = frozenset({10077, 10078})  # JetStream: maximum messages / bytes exceeded
_ENDED_KEPT = 1024  # recently ended request ids, so a late Cancel gets "has ended", not "unknown"
_CONFIRM_SLACK = 5.0  # seconds past --kill-grace a worker has to confirm a cancel
_NUMBERS_AHEAD = 1 << 16  # request numbers a journaled session reserves ahead of those it used
_ACK_DELAY = 0.05  # seconds an acknowledgement of the event consumer waits for the next ones (Bridge._event)


class GatewayIdInUse(SmithFastError):
    """Another gateway process runs with this ``--gateway-id`` on the same NATS."""


class _Remote:
    """One forwarded request: its number in the session, and what the frontend saw of it."""

    __slots__ = ("number", "rid", "kind", "stream", "done", "seq", "key", "attempt", "watch", "ctl", "cancelled", "cancel_seen", "overdue",
                 "timers", "over")

    def __init__(self, number: int, rid: str, kind: str, key: str | None) -> None:
        self.number = number
        self.rid = rid
        self.kind = kind
        self.stream = RequestStream(rid)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.seq = 0  # the command's sequence number in the command stream, once stored
        self.key = key  # HookLoad: the hook's key in the hooks bucket
        self.attempt = 0  # the delivery whose events came last; 0 while no worker took it
        # Process control (smith_fast.nats.control): only requests it concerns pay for it.
        self.watch = False  # its events are looked at on the way (ctl or cancelled)
        self.ctl: InputChannel | None = None  # an interactive ShellExec's stdin and terminal
        self.cancelled = False  # the peer cancelled it
        self.cancel_seen = False  # its worker reported it cancelled
        self.overdue: asyncio.TimerHandle | None = None  # ends it here if its worker never confirms the cancel
        self.timers: list[asyncio.TimerHandle] = []  # its queue notice and timeout (NatsRunner._queue_timers)
        self.over = False  # its forwarding ended here (NatsRunner._follow): a late storing confirmation changes nothing


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
        self._by_rid: dict[str, _Remote] = {}
        self._ended: collections.OrderedDict[str, bool] = collections.OrderedDict()  # recently ended id -> cancelled
        self._early: dict[str, InputChannel] = {}  # stdin / resize sent before its request was forwarded
        self._early_cancel: set[str] = set()  # cancelled before its request was forwarded
        self._shared: dict[int, SharedStream] = {}  # a batch run in one worker session, by its first number
        self._numbers = 0
        # A journaled session's request numbers are reserved in its journal before they are used
        # (snapshot "reserved"), so that the next process never numbers a request as one this
        # process may have sent: a number names its command and its events to JetStream's
        # deduplication and to the workers (a reused one would be dropped as a duplicate).
        self._reserved: float = 0
        self._reserving: asyncio.Future[None] | None = None
        self._paused = False
        self._released = False
        self._steering: asyncio.Task[None] | None = None  # the last control sent to a background process
        self._steer_bytes = 0  # stdin on its way to background processes
        self.journal: SessionJournal | None = None  # a resumable session of a gateway with a fixed id (journal.py)
        self.bridge.sessions[self.session_id] = self

    async def run(self, spec: CommandSpec, rid: str, command: pb.Command) -> None:
        route = FORWARDED.get(spec.kind)
        if route == "workers":
            await self._list_processes(rid)
        elif route == "worker":  # Attach: to the worker holding the process, which runs it as this session's request
            await self._forward(rid, spec.kind, command, direct=True)
        elif spec.kind == "shell_exec" and command.shell_exec.background:
            holder = self.bridge.processes.held(rid)
            if holder is not None:  # ids are unique per worker; the gateway keeps them unique across its workers it knows of
                self._host.reject(ProtocolError(
                    f"a background process with id {rid} already exists (on worker {holder}); give this ShellExec another request_id",
                    pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_id"},
                ))
                return
            await self._forward(rid, spec.kind, command)
        else:
            await self._forward(rid, spec.kind, command)

    # ---- background processes (smith_fast.nats.processes): on the worker that started them ------------

    async def _list_processes(self, rid: str) -> None:
        """ListProcesses: every live worker's, as one ProcessList, then READY."""
        sink = self._host.sink
        if self.bridge.nc is None:
            self._host.reject(ProtocolError("the gateway has not reached NATS yet: no worker can be asked for its processes",
                                            pb.ERROR_CODE_INTERNAL_ERROR, rid, {"reason": "nats_unavailable"}))
            return
        sink.state_change(pb.SERVICE_STATE_PROCESSING, rid)
        processes = await self.bridge.processes.listing()
        if rid in self._early_cancel:
            self._early_cancel.discard(rid)
            self._host.reject(ProtocolError(f"request {rid} cancelled by the peer", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"}))
            return
        sink.event(pb.Event(process_list=pb.ProcessListEvent(request_id=rid, processes=processes)))
        sink.state_change(pb.SERVICE_STATE_READY, rid)

    def _background(self, rid: str) -> bool:
        """Whether ``rid`` (not a request of this session) names a background process on a worker;
        steering one takes ``shell_exec``, as on serve."""
        if not self.bridge.processes.knows(rid):
            return False
        if pb.CAPABILITY_SHELL_EXEC not in self._host.granted:
            raise ProtocolError(
                f"background process {rid} can be steered only by a session granted shell_exec in its handshake",
                pb.ERROR_CODE_INVALID_CAPABILITY, rid, {"reason": "capability_required", "capability": "shell_exec"},
            )
        return True

    def _steer(self, rid: str, command: pb.Command, size: int = 0) -> None:
        """Cancel, Stdin or Resize of a background process, to its worker: one at a time, in the
        order the peer sent them; what the worker refuses comes back as the ErrorEvent serve sends."""
        limit = self.core.limits.max_stdin_buffer
        if size and self._steer_bytes + size > limit:
            raise ProtocolError(
                f"the stdin of background process {rid} is full: {self._steer_bytes} bytes are on their way to its worker "
                f"(max --max-stdin-buffer {limit}); this StdinCommand was refused whole, send it again later",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid, {"reason": "stdin_full"},
            )
        self._steer_bytes += size
        previous = self._steering
        self._steering = asyncio.get_running_loop().create_task(self._steer_after(previous, rid, command, size))

    async def _steer_after(self, previous: asyncio.Task[None] | None, rid: str, command: pb.Command, size: int) -> None:
        try:
            if previous is not None:
                await asyncio.wait([previous])
            await self.bridge.processes.steer(rid, command)
        except ProtocolError as exc:
            if not self._host.closing:
                self._host.protocol_error(exc)
        finally:
            self._steer_bytes -= size

    # ---- control (issue 16): cancel, stdin and resize reach the worker running the request -------------

    def cancel(self, rid: str) -> None:
        """Every worker hears the cancel (smith_fast.nats.control): the one running it stops it and
        reports it cancelled; one handed it later drops it. The command is also deleted from the
        stream, so it is never redelivered. A request no worker took ends here, at once."""
        remote = self._by_rid.get(rid)
        if remote is None:
            if self._unforwarded(rid):  # admitted, not forwarded yet: it ends at its start
                self._early_cancel.add(rid)
                return
            if self._background(rid):  # not this session's request: a background process on a worker
                self._steer(rid, pb.Command(cancel=pb.CancelCommand(request_id=rid)))
                return
            if self._ended.get(rid):
                return  # already cancelled and ended: cancelling twice is harmless
            raise not_running(rid, "cancel", rid in self._ended)
        if remote.cancelled:
            return  # a second Cancel while the first is under way
        if remote.stream.finished:  # its terminal state was sent; the forwarding task ends next
            raise not_running(rid, "cancel", True)
        remote.cancelled = remote.watch = True
        self.bridge.cancel_request(self.session_id, remote.number)
        if remote.seq:
            self.bridge.spawn(self.bridge.withdraw_cancelled(remote.seq))  # else once stored (_forward)
        if remote.attempt == 0:  # no worker's event came back: it never ran, as far as the peer saw
            self._fail(remote, pb.ERROR_CODE_UNSPECIFIED, f"request {rid} cancelled by the peer", "cancelled")
            return
        wait = self.core.limits.kill_grace + _CONFIRM_SLACK
        remote.overdue = asyncio.get_running_loop().call_later(wait, self._cancel_overdue, remote, wait)

    def _cancel_overdue(self, remote: _Remote, waited: float) -> None:
        """The worker running a cancelled request did not end it (it died, or NATS lost the cancel)."""
        self._fail(remote, pb.ERROR_CODE_UNSPECIFIED, f"request {remote.rid} cancelled by the peer", "cancelled",
                   {"confirmed": "false", "waited_seconds": f"{waited:g}"})

    def _input(self, rid: str, what: str) -> InputChannel:
        remote = self._by_rid.get(rid)
        if remote is not None:
            if remote.stream.finished:
                raise not_running(rid, what, True)
            if remote.ctl is None:
                raise ProtocolError(
                    f"request {rid} has no open stdin: {what} needs a ShellExec sent with open_stdin or pty",
                    pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"},
                )
            return remote.ctl
        if self._unforwarded(rid):  # in the same read as its ShellExec: held until it is forwarded
            channel = self._early.get(rid)
            if channel is None:
                channel = self._early[rid] = InputChannel(rid, self.core.limits.max_stdin_buffer)
            return channel
        raise not_running(rid, what, rid in self._ended)

    def write_stdin(self, rid: str, data: bytes, eof: bool) -> None:
        if self._steerable(rid):
            self._steer(rid, pb.Command(stdin=pb.StdinCommand(request_id=rid, data=data, eof=eof)), len(data))
            return
        self._input(rid, "write stdin to").write(data, eof)

    def resize(self, rid: str, rows: int, cols: int) -> None:
        if self._steerable(rid):
            terminal_size(rows, cols, rid)  # a bad size is refused here
            self._steer(rid, pb.Command(resize=pb.ResizeCommand(request_id=rid, rows=rows, cols=cols)))
            return
        self._input(rid, "resize").resize(rows, cols)

    def _steerable(self, rid: str) -> bool:
        """Stdin or Resize for a background process rather than one of this session's requests."""
        return rid not in self._by_rid and not self._unforwarded(rid) and self._background(rid)

    def _unforwarded(self, rid: str) -> bool:
        """Request ``rid`` (not among the forwarded ones) was admitted and is yet to be forwarded.
        Not one that just ended: its task is done, and the session forgets it a step later
        (a Cancel then gets "has ended", not held for a start that never comes)."""
        if not self._host.is_running(rid):
            return False
        task = self._host.task(rid)
        return task is None or not task.done()

    def _adopt_control(self, remote: _Remote, command: pb.Command) -> bool:
        """What control commands came before the request was forwarded; False: it was cancelled."""
        rid = remote.rid
        channel = self._early.pop(rid, None)
        if interactive(command):
            remote.ctl = channel or InputChannel(rid, self.core.limits.max_stdin_buffer)
            remote.watch = True
        if channel is not None:
            for error in channel.adopt(command):
                self._host.protocol_error(error)
        if rid in self._early_cancel:
            self._early_cancel.discard(rid)
            remote.cancelled = True
            self._fail(remote, pb.ERROR_CODE_UNSPECIFIED, f"request {rid} cancelled by the peer", "cancelled")
            return False
        return True

    def _watched(self, remote: _Remote, event: pb.Event) -> bool:
        """An event of a controlled request on its way to the peer; False: not for the peer."""
        kind = event.WhichOneof("event_type")
        if remote.ctl is not None:
            remote.ctl.observe(event, kind)
            if kind == "shell_output" and self._host.sink.version != 1 and only_stdin_written(event):
                return False  # v0 has no stdin_written (PROTOCOL.md, "v0")
        if kind == "error" and event.error.details.get("reason") == "cancelled":
            remote.cancel_seen = True
        elif kind == "log" and event.log.fields.get("reason") == "background":
            # started on a worker, whose announcement of it may come later: looked for until then
            self.bridge.processes.expect(event.log.fields.get("process_id", remote.rid))
        return True

    def _send_input(self, remote: _Remote, attempt: int, payload: bytes, headers: dict[str, str]) -> None:
        self.bridge.request_control(self.session_id, remote.number, attempt, payload, headers)

    async def _forward(self, rid: str, kind: str, command: pb.Command, *, direct: bool = False) -> None:
        """Forward one request: into the command stream, or (``direct``: an Attach) to the worker holding its process."""
        while self.journal is not None and self._numbers >= self._reserved:
            await self._reservation()
        self._numbers += 1
        key = hook_key(command.hook_load.hook_type, command.hook_load.script) if kind == "hook_load" else None
        remote = _Remote(self._numbers, rid, kind, key)
        self._remote[remote.number] = remote
        self._by_rid[rid] = remote
        host = self._host
        if kind == "shell_exec" and command.shell_exec.background:
            remote.watch = True  # its start notice tells the process directory (_watched)
        if (self._early or self._early_cancel or kind == "shell_exec") and not self._adopt_control(remote, command):
            self._remote.pop(remote.number, None)
            self._request_ended(remote)
            return
        meta = CommandMeta(
            session=self.session_id,
            number=remote.number,
            reply=self.bridge.event_subject(self.session_id),
            capabilities=host.granted,
            hooks=tuple(self.hook_keys),
            traceparent=host.span.traceparent,  # None unless tracing was granted
        )
        if direct:  # an Attach: to the worker holding its process
            await self._follow(remote, self._attach(remote, meta, command))
        elif not self.bridge.accepting:  # held until the sessions of the process before are taken over
            await self._follow(remote, self._held(remote, meta, command), timed=False)
        else:
            self._hand_on(remote, meta, command)
            await self._follow(remote, timed=False)

    def _hand_on(self, remote: _Remote, meta: CommandMeta, command: pb.Command) -> None:
        """The command joins its session's batch at once; the request then waits for one future,
        its end: the storing is reported by a callback (_stored), not awaited (no coroutine, future
        and wake-up per request for it: issue 19, CPU per relayed call)."""
        payload = events.encode_envelope(0, 0, _COMMAND_FIELD, command.SerializeToString(), framed=False)
        try:
            # An interactive ShellExec travels alone: its stdin and resizes go to the worker
            # session of that one delivery (smith_fast.nats.control), not to a shared batch.
            self.bridge.submit_told(meta, payload, functools.partial(self._stored, remote), alone=remote.ctl is not None)
        except Exception as exc:
            self._refused(remote, exc)

    async def _held(self, remote: _Remote, meta: CommandMeta, command: pb.Command) -> bool:
        await self.bridge.accepted()
        if not remote.done.done():  # not cancelled (or the session ended) meanwhile
            self._hand_on(remote, meta, command)
        return True

    async def _attach(self, remote: _Remote, meta: CommandMeta, command: pb.Command) -> bool:
        await self._direct(remote, meta, command)
        return False  # it waited for its end itself

    def _stored(self, remote: _Remote, seq: int, exc: BaseException | None) -> None:
        """The command of a forwarded request is in the command stream (or could not be put there)."""
        if exc is not None:
            self._refused(remote, exc)
            return
        remote.seq = seq
        if remote.cancelled:  # cancelled while it was being stored: no worker may be handed it
            self.bridge.spawn(self.bridge.withdraw_cancelled(seq))
        if remote.over or remote.done.done():
            return  # it ended meanwhile (refused, cancelled, its session closed): nothing to follow
        self.bridge.track(seq, self, remote)
        remote.timers = self._queue_timers(remote)

    def _refused(self, remote: _Remote, exc: BaseException) -> None:
        """The command could not be stored: the request ends here, with why."""
        if isinstance(exc, PayloadTooLarge):
            self._fail(
                remote,
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                f"this {remote.kind} command does not fit in a NATS message: {exc} (the nats-server's max_payload; "
                "raise it there, or send less); nothing was run",
                "too_large_for_nats",
                {"size": str(exc.size), "limit": str(exc.limit)},
            )
        elif isinstance(exc, PublishError):
            full = exc.code in _STREAM_FULL
            self._fail(
                remote,
                pb.ERROR_CODE_RESOURCE_EXHAUSTED if full else pb.ERROR_CODE_INTERNAL_ERROR,
                f"the command could not be queued for a worker: {exc}",
                "queue_full" if full else "nats_unavailable",
            )
        elif isinstance(exc, asyncio.CancelledError):  # the publisher closed: the gateway is stopping
            self._fail(remote, pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", "cancelled")
        else:  # a bug of ours: report it, keep the session
            log.error("forwarding failed", exc_info=exc, extra={"fields": {"peer": self._host.peer, "request_id": remote.rid}})
            self._fail(remote, pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", "internal")
        if not remote.done.done():  # (a closing session sends nothing, but its request is over)
            remote.done.set_result(None)

    async def _follow(self, remote: _Remote, start: Coroutine[Any, Any, bool] | None = None, *, timed: bool = True) -> None:
        """Pass a request's events on until its terminal state: once ``start`` handed it on, or at
        once (a request a restored session follows, handed on by the process before; or one whose
        storing its callback reports, which starts the queue timers then: ``timed`` False)."""
        host = self._host
        try:
            if start is not None and not await start:
                return
            if timed:
                remote.timers = self._queue_timers(remote)
            await remote.done
        except asyncio.CancelledError:
            if remote.done.cancelled():  # cancelling this wait cancelled the future: the events set a new one
                remote.done = asyncio.get_running_loop().create_future()
                if remote.stream.finished:
                    remote.done.set_result(None)
            if not host.closing and not remote.stream.finished:
                # Shutdown (somebody listens): the workers were told to stop this session's
                # commands; their final events are on the way, unless the command never started.
                if remote.seq:
                    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                        await asyncio.wait_for(asyncio.shield(remote.done), self.core.limits.kill_grace + 5)
                self._fail(remote, pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", "cancelled")
            raise
        except Exception as exc:  # a bug of ours: report it, keep the session
            log.exception("forwarding failed", extra={"fields": {"peer": host.peer, "request_id": remote.rid}})
            self._fail(remote, pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", "internal")
        finally:
            remote.over = True
            for timer in remote.timers:
                timer.cancel()
            if start is not None:
                start.close()  # not awaited when cancelled before it ran
            self.bridge.untrack(remote.seq, remote)
            self._remote.pop(remote.number, None)
            self._request_ended(remote)
            if remote.key is not None and remote.stream.state == pb.SERVICE_STATE_READY:
                self.hook_keys.append(remote.key)  # later commands carry it

    async def _direct(self, remote: _Remote, meta: CommandMeta, command: pb.Command) -> None:
        """An Attach, handed to the worker holding its process; its events come back as any
        request's. Ended here with ``worker_gone`` if that worker goes before it ends."""
        directory = self.bridge.processes
        try:
            worker = await directory.attach(meta, command)
        except ProtocolError as exc:
            self._fail(remote, exc.code, str(exc), exc.details.get("reason", ""), dict(exc.details))
            return
        pid = command.attach.process_id

        def gone() -> None:
            self._fail(remote, pb.ERROR_CODE_UNSPECIFIED,
                       f"worker {worker} running the attach of background process {pid} is gone: the process ended with it",
                       "worker_gone", {"process_id": pid, "worker": worker})

        handle = directory.watch(worker, gone)
        try:
            await asyncio.shield(remote.done)
        finally:
            directory.unwatch(worker, handle)

    def _request_ended(self, remote: _Remote) -> None:
        if self._by_rid.get(remote.rid) is remote:
            del self._by_rid[remote.rid]
        if remote.overdue is not None:
            remote.overdue.cancel()
        self._ended[remote.rid] = remote.cancelled
        if len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def _queue_timers(self, remote: _Remote) -> list[asyncio.TimerHandle]:
        """Tell the frontend when its command waits for a worker (``--queue-notice``), and give
        up on it at ``--queue-timeout`` (issue 19: wait by default, but say so). Timers, not a
        task per command: most commands are taken long before either fires."""
        config = self.bridge.config
        loop = asyncio.get_running_loop()
        notice, timeout = config.queue_notice, config.queue_timeout
        timers = []
        if notice > 0 and (timeout == 0 or notice < timeout):
            timers.append(loop.call_later(notice, self._due, self._notice, remote))
        if timeout > 0:
            timers.append(loop.call_later(timeout, self._due, self._withdraw, remote))
        return timers

    def _due(self, act: Callable[[_Remote], Coroutine[Any, Any, None]], remote: _Remote) -> None:
        if self._queued(remote):
            self.bridge.spawn(act(remote))

    def _queued(self, remote: _Remote) -> bool:
        """Still waiting for a worker: no event of it came back, nothing ended it."""
        return remote.attempt == 0 and not remote.stream.finished and not self._host.closing

    async def _notice(self, remote: _Remote) -> None:
        depth = await self.bridge.poll_queue()
        if not self._queued(remote):
            return
        workers = self.bridge.workers_alive()
        notice = self.bridge.config.queue_notice
        who = f"{workers} worker(s) alive, all busy" if workers else "no worker is alive"
        self._host.sink.log(
            pb.LOG_LEVEL_WARN,
            f"request {remote.rid} is queued: no worker took it in {notice:g}s ({who}; {depth} command(s) waiting)",
            remote.rid,
            {"reason": "queued", "queue_depth": str(depth), "workers": str(workers), "waited_seconds": f"{notice:g}"},
        )

    async def _withdraw(self, remote: _Remote) -> None:
        await self.bridge.withdraw(remote.seq)
        if self._queued(remote):  # no worker's event came in meanwhile
            self._fail(
                remote, pb.ERROR_CODE_EXECUTION_TIMEOUT,
                f"request {remote.rid} was withdrawn: no worker took it within --queue-timeout "
                f"{self.bridge.config.queue_timeout:g}s ({self.bridge.workers_alive()} worker(s) alive)",
                "queue_timeout",
            )

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
        self._take(remote, attempt, index, _carried(env))

    def deliver_shared(self, first: int, count: int, attempt: int, index: int, env: pb.Envelope) -> None:
        """One event message of the session a worker ran requests ``first`` .. ``first+count-1``
        in (a batch): each request's events to its own stream."""
        if self._host.closing:
            return
        shared = self._shared.get(first)
        if shared is None:
            numbers = {r.rid: n for n in range(first, first + count) if (r := self._remote.get(n)) is not None}
            if not numbers:
                return
            shared = self._shared[first] = SharedStream(numbers)
        for number, at, events in shared.push(attempt, index, _carried(env)):
            if number is None:  # the worker session's own: the gateway says SHUTTING itself
                for event in events:
                    if not (event.WhichOneof("event_type") == "state_change" and event.state_change.state == pb.SERVICE_STATE_SHUTTING):
                        self._host.sink.event(event)
                continue
            remote = self._remote.get(number)
            if remote is not None:
                self._take(remote, attempt, at, events)
        if all((r := self._remote.get(n)) is None or r.stream.finished for n in shared.numbers.values()):
            del self._shared[first]

    def _take(self, remote: _Remote, attempt: int, index: int, carried: Sequence[pb.Event]) -> None:
        stream = remote.stream
        if attempt > remote.attempt:
            if remote.attempt or attempt > 1:
                self.bridge.counters.redelivered += 1
            remote.attempt = attempt
            if remote.ctl is not None:  # its worker listens now: what the peer typed goes there
                remote.ctl.bind(attempt, functools.partial(self._send_input, remote))
        sink = self._host.sink
        metrics = self.core.metrics
        for event in stream.push(attempt, index, carried):
            if remote.watch and not self._watched(remote, event):
                continue
            if event.WhichOneof("event_type") == "error":
                metrics.error(event.error.error_code)
            sink.event(event)
        if stream.finished:
            if remote.cancelled and not remote.cancel_seen and not remote.done.done():
                # It ended on its worker before the cancel got there: as serve says of a late cancel.
                self._host.protocol_error(not_running(remote.rid, "cancel", True))
            if not remote.done.done():
                self.bridge.counters.acked += 1
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
            if self.journal is not None:
                self.journal.end()

    # ---- taken over by the next gateway process (smith_fast.nats.journal) --------------------------

    def snapshot(self) -> dict[str, Any]:
        """What the next process needs to follow this session's requests on (JSON-able)."""
        open_requests = []
        for remote in self._remote.values():
            if remote.stream.finished:
                continue
            ctl = remote.ctl
            open_requests.append({
                "n": remote.number, "rid": remote.rid, "kind": remote.kind, "key": remote.key, "seq": remote.seq,
                "at": remote.stream.position(), "cancelled": remote.cancelled, "cancel_seen": remote.cancel_seen,
                "watch": remote.watch,
                "ctl": None if ctl is None else [int(ctl.pty), ctl.sent, ctl.taken, ctl.refused, int(ctl.closed), ctl.attempt],
            })
        return {
            "numbers": self._numbers,
            "reserved": self._numbers + _NUMBERS_AHEAD,
            "hooks": self.hook_keys,
            "open": open_requests,
            "shared": [[first, shared.position()] for first, shared in self._shared.items()],
        }

    def journaled(self, state: dict[str, Any] | None) -> None:
        """A journal message of this session is stored (``state``: its snapshot), or could not be
        (None: nothing is durable for this session, nothing to wait for)."""
        self._reserved = float("inf") if state is None else max(self._reserved, float(state.get("reserved", 0)))
        if self._reserving is not None and not self._reserving.done() and self._numbers < self._reserved:
            self._reserving.set_result(None)

    async def _reservation(self) -> None:
        """Wait until the journal holds a reservation of request numbers beyond those used."""
        if self._reserving is None or self._reserving.done():
            self._reserving = asyncio.get_running_loop().create_future()
            assert self.journal is not None
            self.journal.flush(force=True)
        await asyncio.shield(self._reserving)

    def adopt(self, snapshot: dict[str, Any]) -> None:
        """Follow on the requests of a :meth:`snapshot` the process before this one took."""
        # beyond every number the process before may have used: it used only what it had reserved
        self._numbers = int(snapshot.get("reserved", snapshot.get("numbers", 0)))
        self.hook_keys = [str(k) for k in snapshot.get("hooks", [])]
        for first, position in snapshot.get("shared", []):
            self._shared[int(first)] = SharedStream.restored(position)
        limit = self.core.limits.max_stdin_buffer
        for entry in snapshot.get("open", []):
            remote = _Remote(int(entry["n"]), str(entry["rid"]), str(entry["kind"]), entry.get("key"))
            remote.stream = RequestStream.restored(remote.rid, entry["at"])
            remote.seq = int(entry.get("seq", 0))
            remote.attempt = remote.stream.attempt
            remote.cancelled, remote.cancel_seen = bool(entry.get("cancelled")), bool(entry.get("cancel_seen"))
            remote.watch = bool(entry.get("watch"))
            if entry.get("ctl") is not None:
                pty, sent, taken, refused, closed, attempt = (int(v) for v in entry["ctl"])
                ctl = remote.ctl = InputChannel(remote.rid, limit)
                ctl.known, ctl.pty, ctl.sent, ctl.taken, ctl.refused, ctl.closed = True, bool(pty), sent, taken, refused, bool(closed)
                if attempt:
                    ctl.bind(attempt, functools.partial(self._send_input, remote))
            self._remote[remote.number] = remote
            self._by_rid[remote.rid] = remote
            if remote.seq:
                self.bridge.track(remote.seq, self, remote)
            self._host.adopt_request(remote.rid, self._follow(remote))
            if not remote.seq:  # the process before stopped before the command was stored: it may never run
                self._fail(remote, pb.ERROR_CODE_UNSPECIFIED,
                           f"request {remote.rid} was lost: the gateway stopped before it was queued for a worker; send it again",
                           "gateway_restarted")


def _carried(env: pb.Envelope) -> Sequence[pb.Event]:
    """The events an event message's envelope carries (one, or a BatchEvent's)."""
    kind = env.WhichOneof("payload")
    if kind == "batch_event":
        return env.batch_event.events
    if kind == "event":
        return (env.event,)
    return ()


class Bridge:
    """A gateway's NATS side: publishes commands, routes events to sessions, tells workers.

    Args:
        core: the gateway's core; ``nats`` is added to its capabilities while connected.
        config: NATS names and limits.
        gateway_id: names this gateway's event subjects and consumer (default: a fresh id).
        durable: the id is fixed (``--gateway-id``): the resumable sessions are journaled and
            handed over to the next process with that id (smith_fast.nats.journal), which takes
            them over at its start; the event consumer outlives the process.
    """

    def __init__(self, core: GatewayCore, config: NatsConfig, gateway_id: str | None = None, *, durable: bool = False) -> None:
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
        self.batcher: CommandBatcher | None = None
        # a command message's stream sequence -> its requests (several when it carried a batch)
        self._by_seq: dict[int, list[tuple[NatsRunner, _Remote]]] = {}
        self._last: Msg | None = None
        self._ack_scheduled = False
        self._background: set[asyncio.Task[Any]] = set()
        self.events_received = 0
        self.counters = NatsCounters()
        self.ready = False  # connected once and set up (streams, consumer, subscriptions)
        self.setup_error: str | None = None
        self.live = LiveSet(config.presence_interval)
        self.processes = ProcessDirectory(config, self.live)  # the workers' background processes
        self.queue_depth = 0
        self.in_flight = 0
        self._said: str | None = ""  # the last health reason logged ("" = none logged yet)
        self._poller: asyncio.Task[None] | None = None
        self.durable = durable
        self.journal = Journal(config, self.gateway_id, self._spawn) if durable else None
        self.handing_over = False  # stopping, sessions handed over: events are left for the next process
        self._taken_over = asyncio.Event()  # the sessions of the process before are taken over
        if not durable:
            self._taken_over.set()
        self._newest: Msg | None = None  # the last event message taken
        self._unknown: collections.OrderedDict[str, None] = collections.OrderedDict()  # sessions told to end
        if durable:
            core.parked.restoring = True  # until the sessions of the process before are taken over (start)
        core.metrics.add_source(self)

    # ---- health and figures ------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why this gateway cannot serve now, or None (its core's and health's reason)."""
        servers = ", ".join(self.config.servers)
        if self.setup_error is not None:
            return f"NATS at {servers} answered, but the gateway cannot use it: {self.setup_error}"
        if not self.ready:
            return f"NATS is unreachable at {servers}; the gateway keeps retrying (every {self.config.reconnect_wait:g}s)"
        if not self.counters.connected:
            return f"the connection to NATS at {servers} was lost; reconnecting every {self.config.reconnect_wait:g}s"
        if not self.workers_alive():
            return (f"no worker is alive (none announced itself in the last {self.live.expiry:g}s); "
                    "commands wait in the queue until one starts")
        return None

    def workers_alive(self) -> int:
        return len(self.live)

    def figures(self) -> list[Figure]:
        """This gateway's NATS figures (``smith_fast.nats.metrics``)."""
        self.counters.events = self.events_received
        journaled = len(self.journal.sessions) if self.journal is not None else 0
        if self.journal is not None:
            self.counters.journal_messages = self.journal.published
        return gateway_figures(self.counters, self.queue_depth, self.in_flight, self.live.alive(), journaled)

    def _health_may_have_changed(self) -> None:
        reason = self.unavailable()
        if reason == self._said:
            return
        self._said = reason
        if reason is None:
            log.info("serving", extra={"fields": {"gateway": self.gateway_id, "workers": self.workers_alive()}})
        else:
            log.warning("not serving", extra={"fields": {"gateway": self.gateway_id, "reason": reason}})
        self.core.health_changed()

    def _heard(self, msg: Msg) -> None:
        try:
            ann = Announcement.decode(msg.data)
        except ValueError as exc:
            log.info("presence message dropped", extra={"fields": {"error": str(exc)}})
            return
        joined_or_left = self.live.heard(ann)
        self.processes.heard(ann)
        self._limit_batches()
        if joined_or_left:
            joined = not ann.leaving
            log.info("worker joined" if joined else "worker left", extra={"fields": {"worker": ann.worker, "version": ann.version,
                                                                                  "capacity": ann.capacity}})
            self._health_may_have_changed()

    def _limit_batches(self) -> None:
        """Batches follow the live workers' capacities (batching.batch_limit)."""
        if self.batcher is not None:
            self.batcher.max_commands = batch_limit([a.capacity for a in self.live.alive()])

    async def poll_queue(self) -> int:
        """Ask the stream how many commands wait (and how many are handed out); the queue depth."""
        if self.js is None or not self.counters.connected:
            return self.queue_depth
        config = self.config
        try:
            info = await self.js.consumer_info(config.command_stream, config.worker_consumer)
            self.queue_depth = info.num_pending or 0
            self.in_flight = info.num_ack_pending or 0
        except NotFoundError:  # no worker ever ran: everything stored waits
            with contextlib.suppress(Exception):
                stream = await self.js.stream_info(config.command_stream)
                self.queue_depth, self.in_flight = stream.state.messages, 0
        except Exception as exc:
            log.debug("queue figures not read", extra={"fields": {"error": repr(exc)}})
        return self.queue_depth

    async def _poll(self) -> None:
        """Every presence interval: expire silent workers, read the queue, measure the round trip."""
        interval = self.config.presence_interval
        while True:
            gone = self.live.expire()
            self.processes.prune(a.worker for a in self.live.alive())  # their background processes went with them
            self._limit_batches()
            for worker in gone:
                log.warning("worker gone", extra={"fields": {"worker": worker, "silent_seconds": self.live.expiry}})
            self._health_may_have_changed()
            if self.nc is not None and self.counters.connected:
                await self.poll_queue()
                with contextlib.suppress(Exception):
                    self.counters.rtt = await round_trip(self.nc)
            await asyncio.sleep(interval)

    async def withdraw_cancelled(self, seq: int) -> None:
        """Remove the command message ``seq`` from the stream once every request it carries was
        cancelled or has ended: a batch (smith_fast.nats.batching) may carry other requests, which
        must stay redeliverable. (The workers remember a cancel, so one handed the batch later
        drops the cancelled request in any case.)"""
        await asyncio.sleep(0)  # the batch's other requests, stored by the same publish, are tracked by now
        entries = self._by_seq.get(seq, [])
        if all(remote.cancelled or remote.stream.finished for _, remote in entries):
            await self.withdraw(seq)

    async def withdraw(self, seq: int) -> None:
        """Remove a command no worker took from the stream (``--queue-timeout``)."""
        if self.js is not None and seq:
            with contextlib.suppress(Exception):
                await self.js.delete_msg(self.config.command_stream, seq)

    async def run(self) -> None:
        """:meth:`start`, retrying NATS for ever; what cannot be fixed by waiting is logged and
        reported by health."""
        self._poller = asyncio.get_running_loop().create_task(self._poll())
        self._health_may_have_changed()  # logs why it cannot serve yet
        try:
            await self.start()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.setup_error = str(exc) or type(exc).__name__
            log.error("cannot use NATS", extra={"fields": {"gateway": self.gateway_id, "error": self.setup_error}})
            self._taken_over.set()  # nothing will be taken over: commands fail at once (setup_error), not wait
        self._health_may_have_changed()

    def event_subject(self, session_id: str) -> str:
        return self.config.event_subject(self.gateway_id, session_id)

    async def start(self) -> None:
        """Connect, create what is missing, start consuming this gateway's events."""
        config = self.config
        self.nc = await connect(config, name=f"smith-fast gateway {self.gateway_id}", on_disconnect=self._disconnected, on_reconnect=self._reconnected)
        self.counters.connected = True
        self.processes.nc = self.nc
        if self.durable:
            await self._claim_id()
        self.js = self.nc.jetstream(timeout=config.publish_timeout)
        await ensure_streams(self.js, config)
        await ensure_gateway_consumer(self.js, config, self.gateway_id)
        self.publisher = Publisher(self.nc, timeout=config.publish_timeout)
        await self.publisher.start()
        self.batcher = CommandBatcher(self.publisher, self._command_subject)
        if self.journal is not None:
            await ensure_journal_stream(self.js, config)
            self.journal.attach(self.publisher, self.js)
            await self._take_over()
        self.feed = PullFeed(
            self.nc, config.event_stream, config.gateway_consumer(self.gateway_id),
            capacity=4096, on_message=self._event, auto_release=True, on_gone=self._recreate_consumer,
        )
        await self.feed.start()
        advisory = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{config.command_stream}.{config.worker_consumer}"
        await self.nc.subscribe(advisory, cb=self._max_deliveries)
        await self.nc.subscribe(config.presence_subject(), cb=self._presence)
        await self.nc.publish(config.presence_query_subject(), b"")  # the workers running already answer now
        self.heartbeat = Heartbeat.started(self.nc, config, self.gateway_id)  # silent for --gateway-lease: its sessions end
        self.ready = True
        self.core.capabilities = self.core.capabilities | ({pb.CAPABILITY_NATS} & self.core.permitted)
        log.info("nats connected", extra={"fields": {"gateway": self.gateway_id, "servers": list(config.servers)}})

    async def _presence(self, msg: Msg) -> None:
        self._heard(msg)

    # ---- taking over from the process before (smith_fast.nats.journal) -----------------------------

    async def _claim_id(self) -> None:
        """A fixed ``--gateway-id`` is this process's alone: ask whether another process answers to
        it (no responders comes back at once), then answer to it from now on.

        Raises:
            GatewayIdInUse: another gateway process runs with this id on this NATS.
        """
        assert self.nc is not None
        subject = identity_subject(self.config, self.gateway_id)
        try:
            answer = await self.nc.request(subject, b"", timeout=1.0)
        except (NoRespondersError, asyncio.TimeoutError, NatsTimeoutError):
            pass
        else:
            raise GatewayIdInUse(
                f"another gateway process ({answer.data.decode(errors='replace')}) runs with --gateway-id {self.gateway_id} "
                "on this NATS; two would split its sessions' events between them: give each gateway its own id"
            )
        me = f"{socket.gethostname()}:{os.getpid()}".encode()

        async def who(msg: Msg) -> None:
            if msg.reply:
                await self.nc.publish(msg.reply, me)  # type: ignore[union-attr]  # set above, never unset

        await self.nc.subscribe(subject, cb=who)

    async def _take_over(self) -> None:
        """The sessions the process before this one (same ``--gateway-id``) left are restored, and
        the events it was handed but had not acknowledged are given to them, before the feed
        brings newer ones."""
        assert self.journal is not None and self.nc is not None
        try:
            for saved in await self.journal.read():
                try:
                    self.core.restore(saved)
                except Exception:  # a bug of ours, or a journal from another version: the others still come back
                    log.exception("session not taken over", extra={"fields": {"session": saved.session_id}})
            # The workers end this id's other sessions (not resumable, or not restorable): said
            # before any command of this process is submitted (submit waits), so none of its own
            # sessions can be among them.
            kept = json.dumps(sorted(self.sessions)).encode()
            with contextlib.suppress(Exception):
                await self.nc.publish(takeover_subject(self.config, self.gateway_id), kept)
                await self.nc.flush(timeout=2)
            await self._replay_unacknowledged()
        finally:
            self.core.parked.restoring = False
            self._taken_over.set()

    async def _replay_unacknowledged(self) -> None:
        """Events delivered to the process before and not acknowledged (it was killed): read from
        the stream directly. The consumer redelivers them only after its ack wait, and this
        process's first acknowledgement (ack-all) would take them as done."""
        assert self.js is not None
        config = self.config
        try:
            info = await self.js.consumer_info(config.event_stream, config.gateway_consumer(self.gateway_id))
        except Exception as exc:
            log.info("no unacknowledged events read", extra={"fields": {"error": repr(exc)}})
            return
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
        delivered = info.delivered.stream_seq if info.delivered is not None else 0
        subject = config.gateway_filter(self.gateway_id)
        seq, replayed = (floor or 0) + 1, 0
        while seq <= (delivered or 0):
            try:
                raw = await self.js.get_msg(config.event_stream, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            except Exception as exc:
                log.warning("unacknowledged events not all read", extra={"fields": {"error": repr(exc), "at": seq}})
                break
            if not raw.seq or raw.seq > (delivered or 0):
                break
            self._route(raw.subject or "", raw.headers or {}, raw.data or b"")
            replayed += 1
            seq = raw.seq + 1
        if replayed:
            log.info("unacknowledged events replayed", extra={"fields": {"events": replayed, "from": (floor or 0) + 1, "to": delivered}})

    async def hand_over(self, sessions: Sequence[Session]) -> None:
        """Stop: ``sessions`` are left running for the next process with this id, everything they
        wrote is journaled, and the events are acknowledged exactly up to what was."""
        self.handing_over = True
        if self.feed is not None:
            self.feed.stop()
        # Commands on their way to the command stream get there first, so that the last snapshot
        # knows them as queued (else the next process would end them as lost).
        deadline = time.monotonic() + self.config.publish_timeout
        await asyncio.sleep(0)  # the batcher sends this iteration's commands
        while self.publisher is not None and self.publisher.backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if self.journal is not None:
            self.journal.snapshot_all()
        for session in sessions:
            session.hand_over()
        last, self._last = self._newest, None
        if self.journal is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.journal.settled(), self.config.publish_timeout * 2)
        if last is not None and last.reply and self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.publish(last.reply, b"+ACK")
                await self.nc.flush(timeout=2)
        log.info("sessions handed over", extra={"fields": {"gateway": self.gateway_id, "sessions": len(sessions)}})

    async def close(self) -> None:
        """Stop consuming, remove this gateway's consumer, close the connection."""
        if self._poller is not None:
            self._poller.cancel()
        if self.feed is not None:
            await self.feed.close()
        self._ack_last()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 2)
        if self.js is not None and not self.durable:  # a fixed id's consumer waits for the next process
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
        self.counters.connected = False
        self.core.capabilities = self.core.capabilities - {pb.CAPABILITY_NATS}
        self._health_may_have_changed()

    def _reconnected(self) -> None:
        self.counters.connected = True
        self.core.capabilities = self.core.capabilities | ({pb.CAPABILITY_NATS} & self.core.permitted)
        if self.feed is not None:
            self.feed.reset()
        if self.nc is not None:
            self._spawn(self.nc.publish(self.config.presence_query_subject(), b""))
        self._health_may_have_changed()

    async def _recreate_consumer(self) -> None:
        assert self.js is not None
        with contextlib.suppress(Exception):
            await ensure_gateway_consumer(self.js, self.config, self.gateway_id)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background; :meth:`close` waits for it briefly."""
        self._spawn(coro)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- commands --------------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """Commands are taken at once (:meth:`submit_told`): not held for the take-over of the
        process before's sessions."""
        return self._taken_over.is_set()

    def _batcher(self) -> CommandBatcher:
        if self.publisher is None or self.batcher is None:  # never reached NATS yet: say so now rather than hold the command
            raise PublishError(
                f"NATS is unreachable at {', '.join(self.config.servers)}; the gateway keeps retrying "
                f"(every {self.config.reconnect_wait:g}s); the command was not queued, send it again later"
                if self.setup_error is None else f"the gateway cannot use NATS: {self.setup_error}"
            )
        return self.batcher

    async def accepted(self) -> None:
        """Return once :attr:`accepting`."""
        if not self._taken_over.is_set():
            await self._taken_over.wait()

    def submit_told(self, meta: CommandMeta, payload: bytes, told: Stored, *, alone: bool = False) -> None:
        """Store one command in the command stream, with the session's other commands of this
        loop iteration as one message (batching.py); ``told(seq, exc)`` once it is stored, or
        refused (the stream is full, NATS stayed away ``submit_timeout`` s). Only while
        :attr:`accepting`.

        Raises:
            PublishError: NATS was never reached (nothing was queued).
        """
        batcher = self._batcher()
        self.counters.dispatched += 1
        batcher.add_told(meta, payload, time.monotonic() + self.config.submit_timeout, told, alone=alone)

    def _command_subject(self, session_id: str) -> str:
        return self.config.command_subject(self.gateway_id, session_id)

    def track(self, seq: int, session: NatsRunner, remote: _Remote) -> None:
        self._by_seq.setdefault(seq, []).append((session, remote))

    def untrack(self, seq: int, remote: _Remote) -> None:
        entries = self._by_seq.get(seq)
        if entries is None:
            return
        entries[:] = [e for e in entries if e[1] is not remote]
        if not entries:
            del self._by_seq[seq]

    async def _max_deliveries(self, msg: Msg) -> None:
        try:
            advisory = json.loads(msg.data)
            seq = int(advisory["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return
        entries = self._by_seq.pop(seq, None)
        if entries is None:
            return
        deliveries = advisory.get("deliveries", self.config.max_deliver)
        for session, remote in entries:  # every request the command message carried
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

    def cancel_request(self, session_id: str, number: int) -> None:
        """Tell every worker that request ``number`` of the session is cancelled (smith_fast.nats.control)."""
        if self.nc is None or self.nc.is_closed:
            return
        headers = {CONTROL: "cancel", REQUEST: str(number)}
        self._spawn(self.nc.publish(self.config.control_subject(session_id), b"", headers=headers))

    def request_control(self, session_id: str, number: int, attempt: int, payload: bytes, headers: dict[str, str]) -> None:
        """A Stdin or Resize to the worker running delivery ``attempt`` of request ``number``.
        Published in the order called: each task's publish queues its message before it yields."""
        if self.nc is None or self.nc.is_closed:
            return
        subject = request_subject(self.config, session_id, number, attempt)
        self._spawn(self.nc.publish(subject, payload, headers=headers))

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
        if self.handing_over:
            return  # not acknowledged: the next process with this id reads it (_replay_unacknowledged)
        self.events_received += 1
        self._route(msg.subject, msg.headers or {}, msg.data)
        self._newest = msg
        # Ack-all: one acknowledgement covers everything delivered before it. Sent a moment later
        # rather than every loop tick: each ack that empties the event stream costs nats-server
        # (file storage) the removal and re-creation of a block file, nearly half its CPU per
        # tool call when acked per tick (issue 19); the ack wait (30 s) is far off.
        self._last = msg
        if not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_later(_ACK_DELAY, self._ack_last)

    def _route(self, subject: str, headers: dict[str, str], data: bytes) -> None:
        """One event message to the session it is for."""
        session_id = subject.rpartition(".")[2]
        session = self.sessions.get(session_id)
        if session is None:
            self._unknown_session(session_id)
            return
        try:
            # one event message, or those of several requests (Smith-Parts, batching.py)
            parts = [(n, attempt, index, pb.Envelope.FromString(part), shared)
                     for n, attempt, index, part, shared in split_events(headers, data, max(len(data), 1))]
        except Exception as exc:  # not from a worker of ours: drop it, keep going
            log.warning("malformed event message dropped", extra={"fields": {"subject": subject, "error": repr(exc)}})
            return
        self.events_received += len(parts) - 1  # event messages, batched or not
        for number, attempt, index, env, shared in parts:
            if shared:
                session.deliver_shared(number, shared, attempt, index, env)
            else:
                session.deliver(number, attempt, index, env)

    def _unknown_session(self, session_id: str) -> None:
        """Events of a session this process does not follow: one that ended, or one of the process
        before that was not handed over (it did not ask for resume, or that process was killed):
        its commands are stopped, once (the workers remember ended sessions)."""
        if session_id in self._unknown or not session_id:
            return
        self._unknown[session_id] = None
        if len(self._unknown) > _ENDED_KEPT:
            self._unknown.popitem(last=False)
        self.control(session_id, "end")
        if self.js is not None:
            self._spawn(self._purge(self.config.command_subject(self.gateway_id, session_id)))

    def _ack_last(self) -> None:
        self._ack_scheduled = False
        last, self._last = self._last, None
        if last is None or not last.reply or self.nc is None or self.nc.is_closed:
            return
        if self.journal is not None and self.journal.busy:
            # acknowledged once what they made is journaled: else a process killed meanwhile
            # would leave events neither in the stream nor in a journal
            self._spawn(self._ack_journaled(last))
        else:
            self._spawn(self.nc.publish(last.reply, b"+ACK"))

    async def _ack_journaled(self, msg: Msg) -> None:
        assert self.journal is not None
        await self.journal.settled()
        if self.nc is not None and not self.nc.is_closed and not self.handing_over:
            await self.nc.publish(msg.reply, b"+ACK")


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
        self.bridge = Bridge(self, nats_config, gateway_id, durable=gateway_id is not None)
        self._journal_index: dict[str, int] = {}  # a restored session's last journal message index

    def _forwarding(self, host: RequestHost) -> NatsRunner:
        return NatsRunner(self, host)

    # ---- resumable sessions outlive the process (smith_fast.nats.journal) ---------------------------

    def made_resumable(self, session: Session) -> None:
        """With a fixed ``--gateway-id``, what a resumable session writes is journaled in NATS
        before its peer gets it, so that the next process with that id can take it over."""
        journal, runner, resumable, sink = self.bridge.journal, session.runner, session.resumable, session.sink
        if journal is None or not isinstance(runner, NatsRunner) or resumable is None or not isinstance(sink, V1Sink):
            return
        retention = resumable.retention
        runner.journal = journal.open(
            session.session_id, functools.partial(self._snapshot, session, runner, sink),
            lambda: retention.first, sink.framed, sink.flush_batch, self._journal_index.pop(session.session_id, 0),
            self.limits.max_session_buffer, runner.journaled,
        )
        token = self.config.token
        runner.journal.conceal(lambda: token)
        runner.journal.conceal(lambda: resumable.token)  # "" until a restored session's peer resumes
        sink.interpose(runner.journal.stage)

    def _snapshot(self, session: Session, runner: NatsRunner, sink: V1Sink) -> dict[str, Any]:
        resumable = session.resumable
        assert resumable is not None
        return {
            "v": 1, "key": resumable.key, "granted": sorted(session.granted), "accepted": sorted(session.accepted),
            "framed": sink.framed, "protocol": session.protocol, "peer": session.peer, "next": sink.last_sequence + 1,
            **runner.snapshot(),
        }

    def restore(self, saved: Saved) -> None:
        """Take over one session the process before left (it handed it over, or was killed)."""
        snap = saved.snapshot
        try:
            framed, key, first = bool(snap["framed"]), str(snap["key"]), int(snap["next"])
            granted = frozenset(int(c) for c in snap["granted"])
            accepted = frozenset(str(a) for a in snap["accepted"])
            self._journal_index[saved.session_id] = int(snap["journal_index"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("journal snapshot unusable", extra={"fields": {"session": saved.session_id, "error": repr(exc)}})
            return
        front = DetachedFront(framed)
        sink = V1Sink(front.write, framed=framed, notify=front.notify, first_sequence=max(1, first))
        front.flush_batch = sink.flush_batch
        session = self.new_session(sink, close=front.close, front=front, peer=str(snap.get("peer", "?")),
                                   protocol=str(snap.get("protocol", "v1")), session_id=saved.session_id)
        runner = session.runner
        assert isinstance(runner, NatsRunner)
        if session.restore(key, granted, accepted, saved.units, DEFAULT_METRICS_INTERVAL_MS):
            runner.adopt(snap)
            self.bridge.counters.taken_over += 1
            log.info("session taken over", extra={"fields": {"session": saved.session_id, "requests": len(snap.get("open", [])),
                                                             "retained": len(saved.units), "window": self.parked.window}})

    async def shutdown(self) -> None:
        """As ``serve`` does, except that with a fixed ``--gateway-id`` the resumable sessions are
        handed over to the next process instead (their requests go on on the workers)."""
        if self.bridge.journal is None or not self.bridge.ready:
            await super().shutdown()
            return
        handed = [s for s in self.sessions if isinstance(s.runner, NatsRunner) and s.runner.journal is not None]
        self.shutting_down = True
        await asyncio.gather(
            *(s.shutdown() for s in list(self.sessions) if s not in handed), self.background.shutdown(self.limits.kill_grace),
            return_exceptions=True,
        )
        await self.bridge.hand_over(handed)
        self.closed.set()

    def unavailable(self) -> str | None:
        return self.bridge.unavailable()

    def service_info(
        self, version: int, granted: list[int], accepted: Sequence[str] = (), interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    ) -> dict[str, str]:
        info = super().service_info(version, granted, accepted, interval_ms)
        info["smith_fast.gateway"] = self.bridge.gateway_id
        # The handshake succeeds without workers or NATS; these say whether anything will run.
        info["smith_fast.workers"] = str(self.bridge.workers_alive())
        info["smith_fast.nats"] = "connected" if self.bridge.ready and self.bridge.counters.connected else "unreachable"
        reason = self.bridge.unavailable()
        if reason is not None:
            info["smith_fast.not_serving_reason"] = reason
        return info

