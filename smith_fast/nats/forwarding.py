"""The gateway's request runner: a session's requests forwarded to the workers over NATS.

:class:`NatsRunner` is the :class:`~smith_fast.service.runner.RequestRunner` of every session of
``smith-fast gateway``: the session admits each request as ``serve`` would, and this runner
publishes its command (through the :class:`~smith_fast.nats.bridge.Bridge`) instead of running it,
then passes the workers' events on, each request's in order and its final events exactly once
(a :class:`~smith_fast.nats.wire.RequestStream` per :class:`~smith_fast.nats.remote.Remote`).
Control commands (cancel, stdin, resize) reach the worker running the request
(:mod:`smith_fast.nats.control`); those of a background process, the worker holding it
(:mod:`smith_fast.nats.processes`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from .. import events
from ..errors import PayloadTooLarge, ProtocolError, PublishError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.request_table import ENDED_KEPT
from ..service.shell_exec import terminal_size
from .batching import SharedStream
from .control import FORWARDED, InputChannel, interactive, not_running, only_stdin_written
from .journal import SessionJournal
from .remote import Remote
from .wire import CommandMeta, RequestStream, hook_key

if TYPE_CHECKING:
    from ..service.commands import CommandSpec
    from ..service.request import Request
    from ..service.sinks import EventSink
    from ..service.core import ServiceCore
    from ..service.runner import RequestHost
    from .bridge import Bridge

__all__ = ["NatsRunner"]

log = get_logger("smith_fast.gateway")

_COMMAND_FIELD = pb.Envelope.DESCRIPTOR.fields_by_name["command"].number
_STREAM_FULL = frozenset({10077, 10078})  # JetStream: maximum messages / bytes exceeded
_CONFIRM_SLACK = 5.0  # seconds past --kill-grace a worker has to confirm a cancel
_NUMBERS_AHEAD = 1 << 16  # request numbers a journaled session reserves ahead of those it used


class NatsRunner:
    """Runs a session's requests on workers (the gateway's request runner).

    Every check a request passes before it starts is the session's own (authentication,
    handshake, capability, sizes, request id, ``--max-requests``): only the running differs.
    Where ``serve`` would run the request, this runner publishes the command and waits for the
    workers' events; it sends no ``PROCESSING``/``READY`` of its own, the workers' pass through.

    Args:
        core: the gateway's service core (its limits and error counters).
        bridge: the gateway's NATS side.
        host: the session.
    """

    def __init__(self, core: ServiceCore, bridge: Bridge, host: RequestHost) -> None:
        self.core = core
        self.bridge = bridge
        self._host = host
        self.session_id = host.session_id
        self.hook_keys: list[str] = []  # hooks loaded by this session, in load order
        self._remote: dict[int, Remote] = {}
        self._by_rid: dict[str, Remote] = {}
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

    def start(self, request: Request, at_once: bool) -> Coroutine[Any, Any, None]:
        """Forward admitted ``request`` (RequestRunner): always a task, the worker answers."""
        assert request.spec is not None
        return self.run(request.spec, request.id, request.command)

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

    # ---- control: cancel, stdin and resize reach the worker running the request (nats/control.py) ------

    @property
    def sink(self) -> EventSink:
        return self._host.sink

    def target(self, rid: str, what: str) -> _Forwarded:
        """What a control command addresses (RequestControl): the request as forwarded to its worker."""
        return _Forwarded(self, rid)

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

    def _cancel_overdue(self, remote: Remote, waited: float) -> None:
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
        request = self._host.requests.get(rid)
        if request is None:
            return False
        return request.task is None or not request.task.done()

    def _adopt_control(self, remote: Remote, command: pb.Command) -> bool:
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

    def _watched(self, remote: Remote, event: pb.Event) -> bool:
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

    def _send_input(self, remote: Remote, attempt: int, payload: bytes, headers: dict[str, str]) -> None:
        self.bridge.request_control(self.session_id, remote.number, attempt, payload, headers)

    async def _forward(self, rid: str, kind: str, command: pb.Command, *, direct: bool = False) -> None:
        """Forward one request: into the command stream, or (``direct``: an Attach) to the worker holding its process."""
        while self.journal is not None and self._numbers >= self._reserved:
            await self._reservation()
        self._numbers += 1
        key = hook_key(command.hook_load.hook_type, command.hook_load.script) if kind == "hook_load" else None
        remote = Remote(self._numbers, rid, kind, key)
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

    def _hand_on(self, remote: Remote, meta: CommandMeta, command: pb.Command) -> None:
        """The command joins its session's batch at once; the request then waits for one future,
        its end: the storing is reported by a callback (_stored), not awaited (no coroutine, future
        and wake-up per request for it: they were a measurable share of the gateway's CPU per relayed call)."""
        payload = events.encode_envelope(0, 0, _COMMAND_FIELD, command.SerializeToString(), framed=False)
        try:
            # An interactive ShellExec travels alone: its stdin and resizes go to the worker
            # session of that one delivery (smith_fast.nats.control), not to a shared batch.
            self.bridge.submit_told(meta, payload, functools.partial(self._stored, remote), alone=remote.ctl is not None)
        except Exception as exc:
            self._refused(remote, exc)

    async def _held(self, remote: Remote, meta: CommandMeta, command: pb.Command) -> bool:
        await self.bridge.accepted()
        if not remote.done.done():  # not cancelled (or the session ended) meanwhile
            self._hand_on(remote, meta, command)
        return True

    async def _attach(self, remote: Remote, meta: CommandMeta, command: pb.Command) -> bool:
        await self._direct(remote, meta, command)
        return False  # it waited for its end itself

    def _stored(self, remote: Remote, seq: int, exc: BaseException | None) -> None:
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

    def _refused(self, remote: Remote, exc: BaseException) -> None:
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

    async def _follow(self, remote: Remote, start: Coroutine[Any, Any, bool] | None = None, *, timed: bool = True) -> None:
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

    async def _direct(self, remote: Remote, meta: CommandMeta, command: pb.Command) -> None:
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

    def _request_ended(self, remote: Remote) -> None:
        if self._by_rid.get(remote.rid) is remote:
            del self._by_rid[remote.rid]
        if remote.overdue is not None:
            remote.overdue.cancel()
        self._ended[remote.rid] = remote.cancelled
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _queue_timers(self, remote: Remote) -> list[asyncio.TimerHandle]:
        """Tell the frontend when its command waits for a worker (``--queue-notice``), and give
        up on it at ``--queue-timeout`` (a command waits for a worker by default, but the peer is told). Timers, not a
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

    def _due(self, act: Callable[[Remote], Coroutine[Any, Any, None]], remote: Remote) -> None:
        if self._queued(remote):
            self.bridge.spawn(act(remote))

    def _queued(self, remote: Remote) -> bool:
        """Still waiting for a worker: no event of it came back, nothing ended it."""
        return remote.attempt == 0 and not remote.stream.finished and not self._host.closing

    async def _notice(self, remote: Remote) -> None:
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

    async def _withdraw(self, remote: Remote) -> None:
        await self.bridge.withdraw(remote.seq)
        if self._queued(remote):  # no worker's event came in meanwhile
            self._fail(
                remote, pb.ERROR_CODE_EXECUTION_TIMEOUT,
                f"request {remote.rid} was withdrawn: no worker took it within --queue-timeout "
                f"{self.bridge.config.queue_timeout:g}s ({self.bridge.workers_alive()} worker(s) alive)",
                "queue_timeout",
            )

    def _fail(self, remote: Remote, code: int, message: str, reason: str, details: dict[str, str] | None = None) -> None:
        """End a request here (the workers could not): its error, then its terminal ERROR."""
        if remote.stream.finished or self._host.closing:
            return
        remote.stream.finished = True
        remote.stream.state = pb.SERVICE_STATE_ERROR
        self._host.reject(ProtocolError(message, code, remote.rid, {"reason": reason, **(details or {})}))
        if not remote.done.done():
            remote.done.set_result(None)

    def fail_request(self, remote: Remote, code: int, message: str, reason: str) -> None:
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

    def _take(self, remote: Remote, attempt: int, index: int, carried: Sequence[pb.Event]) -> None:
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
            remote = Remote(int(entry["n"]), str(entry["rid"]), str(entry["kind"]), entry.get("key"))
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


class _Forwarded:
    """A request of a gateway session as a control command's target: what it does goes to the
    worker running it (NatsRunner's cancel, write_stdin, resize)."""

    __slots__ = ("_runner", "_rid")

    def __init__(self, runner: NatsRunner, rid: str) -> None:
        self._runner = runner
        self._rid = rid

    def cancel(self) -> None:
        self._runner.cancel(self._rid)

    def write_stdin(self, data: bytes, eof: bool) -> None:
        self._runner.write_stdin(self._rid, data, eof)

    def resize(self, rows: int, cols: int) -> None:
        self._runner.resize(self._rid, rows, cols)
