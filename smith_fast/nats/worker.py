"""``smith-fast worker``: run the commands of gateway sessions, taken from a JetStream work queue.

Any number of workers, on any machines, share one durable pull consumer of the command stream,
so each command is handed to one worker at a time. A worker runs it with the same machinery as
``smith-fast serve`` (a :class:`~smith_fast.service.core.ServiceCore` and a
:class:`~smith_fast.service.session.Session`, hooks, limits, process groups), and publishes every
event the session emits to the gateway session's event subject as v1 ``Envelope`` bytes.

Delivery (PROTOCOL.md, "Scale-out over NATS"):

* while a command runs, the worker reports progress every third of the ack wait, so a live
  worker keeps it however long it runs;
* each event is published with the id ``<session>.<n>.<attempt>.<index>`` and republished until
  the event stream acknowledged it;
* the command is acknowledged only after its request has ended *and* every one of its events was
  stored: a worker killed before that leaves the command unacknowledged, and JetStream hands it to
  another worker after the ack wait (as the next ``attempt``).

Each command runs in a session of its own (so every event is known to belong to its command);
what a gateway session keeps across commands lives in :class:`SessionState`: its hooks (loaded
once per worker from the hooks bucket, shared by its commands, closed when the session ends),
whether its frontend is reading (pause/resume), and whether it is shutting down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError
from nats.aio.msg import Msg

from .. import tracing
from .._version import __version__
from ..errors import ProtocolError
from ..hooks import HookLoadError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.core import ServiceCore
from ..service.metrics import Figure
from ..service.runner import LocalRunner, RequestHost
from ..service.session import Session
from ..service.sinks import V1Sink
from .batching import EventOutbox, split_commands
from .config import NatsConfig
from .control import ControlHold, WorkerControls, interactive
from .hooks_bucket import HooksBucket
from . import jetstream
from .jetstream import Publisher, PullFeed, connect, ensure_streams, ensure_worker_consumer, round_trip
from .leases import Lapse, Leases, takeover_subject
from .metrics import NatsCounters, worker_figures
from .presence import Announcement
from .processes import ProcessDesk
from .publication import Publication
from .wire import CONTROL, REQUEST, CommandMeta, parse_command_headers
from .worker_sessions import SessionState, Shelf

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext

__all__ = ["Worker"]

log = get_logger("smith_fast.worker")

_ENDED_TTL = 600.0  # seconds a session that ended is remembered, so its queued commands are dropped
_ENDED_MAX = 100_000
_IDLE_TTL = 1800.0  # seconds before an idle session's hooks are closed (reloaded if it comes back)
_ACK_DELAY = 0.05  # seconds command acks wait to leave together (Worker._ack)
_HOUSEKEEPING = 30.0  # seconds between two looks for ended and idle sessions to forget

# What a command of a session that ended here gets, by why it ended ("": nothing, it is dropped:
# its gateway ended the session and purged its commands). A session whose gateway went silent
# answers, so that the gateway, should it come back after all, sees each request end once.
_ENDED_ANSWERS: dict[str, tuple[str, str]] = {
    "shutdown": ("request cancelled: the session is shutting down", "cancelled"),
    "gateway_gone": ("request not run: this session's gateway was silent for longer than the workers' --gateway-lease, "
                     "and its session was ended", "gateway_gone"),
}


_Started = tuple[Session, "SessionState", list[tuple[CommandMeta, ControlHold]]]
"""A message's commands started in their session: it, their gateway session's state, and the
control holds of each command (smith_fast.nats.control)."""


class Worker:
    """Takes commands from the command stream and runs them until told to stop.

    Args:
        core: the service core commands run on (tools, limits, global hooks).
        config: NATS names and limits.
        concurrency: commands run at once, at most.
        drain_timeout: on stop, seconds to let running commands finish; the rest are killed and
            handed back to the stream (redelivered at once to another worker).
    """

    def __init__(self, core: ServiceCore, config: NatsConfig, *, concurrency: int = 64, drain_timeout: float = 10.0) -> None:
        self.core = core
        self.config = config
        self.concurrency = concurrency
        self.drain_timeout = drain_timeout
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.hooks = HooksBucket(config)  # the sources of the session hooks loaded by any worker
        self.publisher: Publisher | None = None
        self.outbox: EventOutbox | None = None
        self.feed: PullFeed | None = None
        self.states: dict[str, SessionState] = {}
        # session -> (when it ended here, why: "", or a key of _ENDED_ANSWERS)
        self.ended: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self.running: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.completed = 0
        self._backlogged = False
        self._handed_back: set[Session] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._announcer: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._acks: list[Msg] = []  # acknowledgements waiting to leave together
        self.counters = NatsCounters()
        self.controls = WorkerControls(config)  # cancel, stdin, resize from the gateways
        self.leases = Leases(config)  # the gateways' heartbeats: a silent one's sessions end here
        self.processes = ProcessDesk(core, config, self.name, self._attach)  # its background processes, for the gateways
        self._announced: tuple[str, ...] = ()  # the background ids the last announcement listed
        core.metrics.add_source(self)

    def figures(self) -> list[Figure]:
        """This worker's NATS figures (``smith_fast.nats.metrics``)."""
        return worker_figures(self.counters, len(self.running), self.concurrency)

    # ---- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create what is missing (streams, consumer, hooks bucket) and start taking commands."""
        config = self.config
        self.nc = await connect(config, name=f"smith-fast worker {self.name}", on_disconnect=self._disconnected, on_reconnect=self._reconnected)
        self.counters.connected = True
        self.js = self.nc.jetstream(timeout=config.publish_timeout)
        await ensure_streams(self.js, config)
        await ensure_worker_consumer(self.js, config)
        await self.hooks.open(self.js)
        self.publisher = Publisher(self.nc, timeout=config.publish_timeout, on_high=self._backlog_high, on_low=self._backlog_low)
        await self.publisher.start()
        self.outbox = EventOutbox(self.publisher)
        await self.nc.subscribe(config.control_subject("*"), cb=self._control)
        await self.leases.listen(self.nc)
        await self.nc.subscribe(takeover_subject(config, "*"), cb=self._taken_over)
        self.feed = PullFeed(
            self.nc, config.command_stream, config.worker_consumer,
            capacity=self.concurrency, on_message=self._dispatch, on_gone=self._recreate_consumer,
        )
        await self.feed.start()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        await self.nc.subscribe(config.presence_query_subject(), cb=self._queried)
        await self.processes.listen(self.nc)
        self._announcer = asyncio.get_running_loop().create_task(self._announce_forever())
        log.info("ready", extra={"fields": {"worker": self.name, "servers": list(config.servers), "concurrency": self.concurrency,
                                            "stream": config.command_stream, "consumer": config.worker_consumer}})

    async def stop(self) -> None:
        """Stop taking commands, let running ones finish (up to ``drain_timeout``), hand the rest back."""
        self.stopping = True
        if self.feed is not None:
            self.feed.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._announcer is not None:
            self._announcer.cancel()
        # Its background processes end with it (as serve's on shutdown): first, so that attaches
        # following them get their exit and end before the gateways hear this worker leave.
        await self.core.background.shutdown(self.core.limits.kill_grace)
        await self._announce(leaving=True)  # gateways stop counting on this worker now
        if self.running:
            _, pending = await asyncio.wait(list(self.running), timeout=self.drain_timeout)
            if pending:
                log.warning("handing unfinished commands back", extra={"fields": {"commands": len(pending)}})
                for state in self.states.values():
                    for session in list(state.running):
                        self._handed_back.add(session)
                        session.connection_lost()
                await asyncio.wait(pending, timeout=5)
        for state in list(self.states.values()):
            await state.close()
        acks, self._acks = self._acks, []
        await self._ack_all(acks)  # what finished is not run again elsewhere
        if self.feed is not None:
            await self.feed.close()
        await jetstream.close(self.nc, self.publisher)
        log.info("stopped", extra={"fields": {"worker": self.name, "completed": self.completed}})

    def _disconnected(self) -> None:
        self.counters.connected = False
        self.leases.disconnected()

    def _reconnected(self) -> None:
        self.counters.connected = True
        self.leases.reconnected()
        if self.feed is not None and not self.stopping:
            self.feed.reset()
        self._spawn_announce()

    # ---- presence (smith_fast.nats.presence) -----------------------------------------------------------

    def announcement(self, leaving: bool = False) -> Announcement:
        c = self.counters
        return Announcement(
            worker=self.name, version=__version__, capacity=self.concurrency, running=len(self.running),
            dispatched=c.dispatched, redelivered=c.redelivered, acked=c.acked, events=c.events, rtt=c.rtt, leaving=leaving,
            background=self.processes.ids(),
        )

    async def _announce(self, leaving: bool = False) -> None:
        if self.nc is None or self.nc.is_closed or not self.nc.is_connected:
            return
        with contextlib.suppress(Exception):
            ann = self.announcement(leaving)
            self._announced = ann.background
            await self.nc.publish(self.config.presence_subject(), ann.encode())
            if leaving:
                await self.nc.flush(timeout=1)

    def _spawn_announce(self) -> None:
        if not self.stopping:
            self._spawn_background(self._announce())

    async def _queried(self, _msg: Msg) -> None:
        self._spawn_announce()

    async def _announce_forever(self) -> None:
        while True:
            await self._announce()
            await asyncio.sleep(self.config.presence_interval)
            if self.nc is not None and self.nc.is_connected:
                with contextlib.suppress(Exception):
                    self.counters.rtt = await round_trip(self.nc)

    async def _recreate_consumer(self) -> None:
        assert self.js is not None
        with contextlib.suppress(Exception):
            await ensure_worker_consumer(self.js, self.config)

    # ---- sessions ------------------------------------------------------------------------------------

    def _state(self, session_id: str) -> SessionState:
        state = self.states.get(session_id)
        if state is None:
            state = self.states[session_id] = SessionState(self.hooks, self.core.hook_limits, session_id)
        state.last_used = time.monotonic()
        return state

    def _ended(self, session_id: str) -> tuple[float, str] | None:
        return self.ended.get(session_id)

    def _mark_ended(self, session_id: str, why: str = "") -> None:
        self.ended[session_id] = (time.monotonic(), why)
        self.ended.move_to_end(session_id)
        while len(self.ended) > _ENDED_MAX:
            self.ended.popitem(last=False)

    async def _control(self, msg: Msg) -> None:
        session_id = msg.subject.rpartition(".")[2]
        action = (msg.headers or {}).get(CONTROL, "")
        if action == "cancel":
            self._cancel(session_id, (msg.headers or {}).get(REQUEST, ""))
            return
        if action in ("pause", "resume"):
            # Kept even before a command of the session ran here: it starts paused.
            kept = self._state(session_id)
            kept.paused = action == "pause"
            for session in kept.running:
                if kept.paused:
                    session.pause()
                elif not self._backlogged:
                    session.resume()
            return
        if action == "end":
            await self._end(session_id)
        elif action == "shutdown":
            self._mark_ended(session_id, "shutdown")
            state = self.states.get(session_id)
            for session in list(state.running) if state is not None else ():
                asyncio.get_running_loop().create_task(session.shutdown())

    async def _end(self, session_id: str) -> None:
        """Its gateway ended the session: kill its commands silently, drop its later ones, close its hooks."""
        self._mark_ended(session_id)
        self.leases.forget(session_id)
        state = self.states.pop(session_id, None)
        if state is None:
            return
        for session in list(state.running):
            session.connection_lost()
        await state.close()

    async def _taken_over(self, msg: Msg) -> None:
        """A gateway restarted with its id and took over some of its sessions: the others end here
        as a gone gateway's do (smith_fast.nats.journal)."""
        gateway = msg.subject.split(".")[-2]
        try:
            kept = {str(s) for s in json.loads(msg.data or b"[]")}
        except (ValueError, TypeError):
            return
        lapse = self.leases.replaced(gateway, kept)
        if lapse is not None:
            self._end_lapsed([lapse], "gateway restarted: ending the sessions it did not take over")

    def _end_lapsed(self, lapses: list[Lapse], why: str = "gateway gone: ending its sessions") -> None:
        """End the sessions of gateways silent for longer than --gateway-lease (smith_fast/nats/leases.py).

        As a shutdown rather than silently as an ``end``: their commands are stopped (SIGTERM, then
        SIGKILL after --kill-grace) and each request's final events are published, so that should
        its gateway come back after all (restarted with its id), every request ends there once;
        their later commands get ``gateway_gone``."""
        for lapse in lapses:
            log.warning(why, extra={"fields": {
                "gateway": lapse.gateway, "sessions": list(lapse.sessions), "silent_seconds": round(lapse.silence, 3),
                "heard": lapse.heard, "gateway_lease": self.leases.lease}})
            for session_id in lapse.sessions:
                self._mark_ended(session_id, "gateway_gone")
                state = self.states.get(session_id)
                if state is not None:
                    self._spawn_background(self._wind_up(session_id, state))

    async def _wind_up(self, session_id: str, state: SessionState) -> None:
        """Stop a lapsed session's commands, reporting their ends; then close its hooks."""
        await asyncio.gather(*(session.shutdown() for session in list(state.running)), return_exceptions=True)
        if self.states.get(session_id) is state:
            del self.states[session_id]
            await state.close()

    def _cancel(self, session_id: str, number: str) -> None:
        if number.isdigit():
            self.controls.cancel(session_id, int(number))

    def _backlog_high(self) -> None:
        # Events are produced faster than the stream stores them: stop reading the pipes, as a
        # socket front does for a peer that stopped reading.
        self._backlogged = True
        for state in self.states.values():
            for session in state.running:
                session.pause()

    def _backlog_low(self) -> None:
        self._backlogged = False
        for state in self.states.values():
            if not state.paused:
                for session in state.running:
                    session.resume()

    async def _sweep(self) -> None:
        """The worker's one timer: the gateways' leases every ``leases.period``, and what ended
        or went idle every ``_HOUSEKEEPING`` seconds."""
        housekept = time.monotonic()
        while True:
            await asyncio.sleep(min(self.leases.period, _HOUSEKEEPING))
            self._end_lapsed(self.leases.expired())
            now = time.monotonic()
            if now - housekept < _HOUSEKEEPING:
                continue
            housekept = now
            while self.ended and now - next(iter(self.ended.values()))[0] > _ENDED_TTL:
                self.ended.popitem(last=False)
            for session_id, state in list(self.states.items()):
                if not state.running and not state.loading and now - state.last_used > _IDLE_TTL:
                    self.states.pop(session_id, None)
                    self.leases.forget(session_id)
                    await state.close()

    # ---- commands ------------------------------------------------------------------------------------

    def _dispatch(self, msg: Msg) -> None:
        coro = self._give_back(msg) if self.stopping else self._execute(msg)
        task = asyncio.get_running_loop().create_task(coro)
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _give_back(self, msg: Msg) -> None:
        """Arrived after stop() (asked for before): back to the stream, for another worker now."""
        assert self.feed is not None
        try:
            with contextlib.suppress(Exception):
                await msg.nak()
        finally:
            self.feed.release()

    async def _execute(self, msg: Msg) -> None:
        assert self.publisher is not None and self.feed is not None
        held = 1
        try:
            try:
                meta = parse_command_headers(msg.headers)
                commands = []
                for data in split_commands(msg.headers or {}, msg.data, max(len(msg.data), 1)):
                    env = pb.Envelope.FromString(data)
                    if env.WhichOneof("payload") != "command":
                        raise DecodeError(f"payload is {env.WhichOneof('payload')!r}, not a command")
                    commands.append(env.command)
            except (ProtocolError, DecodeError, ValueError) as exc:
                log.error("not a command message; dropped", extra={"fields": {"subject": msg.subject, "error": str(exc)}})
                with contextlib.suppress(Exception):
                    await msg.term()
                return
            if len(commands) > 1:  # --concurrency counts commands: a batch holds room for each
                self.feed.hold(len(commands) - 1)
                held = len(commands)
            await self._run(msg, meta, commands)
        finally:
            self.feed.release(held)

    async def _run(self, msg: Msg, meta: CommandMeta, commands: list[pb.Command]) -> None:
        """Run a command message's commands (one, or a batch: numbers ``meta.number`` on, at once);
        acknowledge it when all ended and all their events were stored."""
        assert self.publisher is not None and self.outbox is not None
        attempt = msg.metadata.num_delivered
        self.counters.dispatched += len(commands)
        if attempt > 1:
            self.counters.redelivered += len(commands)
        # A batch runs in one session, as serve runs a connection's pipelined requests (a session
        # per command cost the worker a fifth of its time); a HookLoad changes what the session's
        # later commands see, so a batch holding one runs a session per command.
        # (and one larger than a session may run, --max-requests: sent before the gateway heard of
        # this worker, sized for bigger ones, it runs a session per command rather than refuse any)
        shared = (1 < len(commands) <= self.core.limits.max_requests
                  and not any(c.HasField("hook_load") for c in commands))
        publications = [Publication(self.outbox, self.publisher, meta, attempt, len(commands))] if shared else [
            Publication(self.outbox, self.publisher, _numbered(meta, meta.number + i) if i else meta, attempt)
            for i in range(len(commands))
        ]
        keepalive = _Progress(msg, self.config.ack_wait / 3, self._spawn_background)
        try:
            # All started first (each session runs its requests in tasks of its own), then waited
            # for in turn: no extra task per command of a batch.
            if shared:
                started = [await self._begin(meta, commands, publications[0], attempt)]
            else:
                started = [await self._begin(p.meta, [c], p, attempt) for c, p in zip(commands, publications)]
            handed_back = False
            for begun, publication in zip(started, publications):
                if begun is not None and await self._conclude(*begun, publication.meta, attempt):
                    handed_back = True
            self._background_moved()
            stored = [f for p in publications for f in p.stored]
            if stored:
                await asyncio.gather(*stored, return_exceptions=True)
            if handed_back:
                with contextlib.suppress(Exception):
                    await msg.nak()
                return
            await self._ack(msg)
            self.completed += len(commands)
            self.counters.acked += len(commands)
        finally:
            keepalive.cancel()
            self.counters.events += sum(p.published for p in publications)

    async def _begin(self, meta: CommandMeta, commands: list[pb.Command], publication: Publication, attempt: int) -> _Started | None:
        """Start commands of a message in one session of their own, emitting to ``publication``;
        None when they ended at once (their session is gone or shutting down, its hooks are
        unavailable here)."""
        sink = publication.sink
        rids = [getattr(getattr(c, k), "request_id", "") if (k := c.WhichOneof("command_type")) else "" for c in commands]
        if self._refused(meta.session, sink, rids):
            return None
        self.leases.serving(meta.reply, meta.session)
        return await self._session_start(meta, commands, sink, rids, attempt)

    def _refused(self, session_id: str, sink: V1Sink, rids: list[str]) -> bool:
        """Whether the session ended here (its requests then end before they started, reported
        when it is shutting down or its gateway is gone)."""
        ended = self._ended(session_id)
        if ended is None:
            return False
        answer = _ENDED_ANSWERS.get(ended[1])
        if answer is not None:
            message, reason = answer
            for rid in rids:
                sink.error(pb.ERROR_CODE_UNSPECIFIED, message, rid, {"reason": reason})
                sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        return True

    async def _session_start(
        self, meta: CommandMeta, commands: list[pb.Command], sink: V1Sink, rids: list[str], attempt: int,
    ) -> _Started | None:
        """The commands' own session, running them, and their gateway session's state (None: the
        session's hooks cannot be had here)."""
        state = self._state(meta.session)
        try:
            hooks = await state.hooks_for(meta.hooks)
        except HookLoadError as exc:
            log.warning("session hook unavailable", extra={"fields": {"session": meta.session, "error": str(exc)}})
            for rid in rids:
                sink.error(pb.ERROR_CODE_UNSPECIFIED, f"this session's hooks could not be loaded on worker {self.name}: {exc}", rid,
                           {"reason": "hook_load_failed"})
                sink.state_change(pb.SERVICE_STATE_ERROR, rid)
            return None
        if self._refused(meta.session, sink, rids):  # it ended while its hooks were fetched
            if self.states.get(meta.session) is not state:
                await state.close()  # what it loaded meanwhile: nobody else will close it
            return None
        core, shelf = self.core, Shelf(state)

        def runner(host: RequestHost) -> LocalRunner:
            return LocalRunner(core, host, hooks=hooks, shelf=shelf)

        # The gateway answered the handshake; this session starts where that one stands.
        session = Session(
            core, sink,
            close=_nothing,
            runner=runner,
            peer=f"nats:{meta.session}/{meta.number}",
            protocol="nats",
            granted=meta.capabilities & core.permitted,  # and this worker's --capabilities
            span=tracing.remote_span(meta.traceparent) if pb.CAPABILITY_TRACING in meta.capabilities else tracing.NOOP,
        )
        state.running.add(session)
        if state.paused or self._backlogged:
            session.pause()
        assert self.nc is not None
        helds: list[tuple[CommandMeta, ControlHold]] = []
        try:
            for i, (command, rid) in enumerate(zip(commands, rids)):
                # A cancel, stdin or resize finds each command of a batch by its own number.
                own = _numbered(meta, meta.number + i) if i else meta
                held = self.controls.hold(own, rid, session)
                helds.append((own, held))
                if interactive(command):  # (the others have nothing to listen for)
                    await self.controls.listen(self.nc, own, attempt, command, held)
                if self.controls.start(own, held):
                    session.handle(command)
                else:  # cancelled before it ran: its gateway ended it, nothing of it is published
                    log.info("cancelled command dropped", extra={"fields": {"session": meta.session, "request": own.number}})
        except BaseException:
            for own, held in helds:
                await self.controls.release(own, held)
            state.running.discard(session)
            raise
        return session, state, helds

    async def _conclude(
        self, session: Session, state: SessionState, helds: list[tuple[CommandMeta, ControlHold]], meta: CommandMeta, attempt: int,
    ) -> bool:
        """Wait for a started command's session to end; True when this worker's stop cut it short."""
        try:
            await session.finish()
        finally:
            for own, held in helds:
                await self.controls.release(own, held)
            state.running.discard(session)
            state.last_used = time.monotonic()
        if attempt > 1:
            log.info("redelivered command done", extra={"fields": {"session": meta.session, "request": meta.number, "attempt": attempt}})
        return session in self._handed_back

    # ---- background processes (smith_fast.nats.processes) -------------------------------------------

    def _background_moved(self) -> None:
        """A command may have started a background process: the gateways hear of it now, not at
        the next presence interval (they route its attach and control here by it)."""
        if self.processes.ids() != self._announced:
            self._spawn_announce()

    def _attach(self, meta: CommandMeta, command: pb.Command) -> None:
        """An Attach a gateway handed to this worker directly (its process is here): run it as a
        command of the gateway session, its events through the event stream like any command's."""
        task = asyncio.get_running_loop().create_task(self._run_direct(meta, command))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run_direct(self, meta: CommandMeta, command: pb.Command) -> None:
        assert self.publisher is not None and self.outbox is not None
        publication = Publication(self.outbox, self.publisher, meta, 1)
        try:
            begun = await self._begin(meta, [command], publication, 1)
            if begun is not None:
                await self._conclude(*begun, meta, 1)
            if publication.stored:
                await asyncio.gather(*publication.stored, return_exceptions=True)
        finally:
            self.counters.events += publication.published

    def _spawn_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _ack(self, msg: Msg) -> None:
        """Acknowledge, a moment later and without waiting for the server's confirmation (issue
        19: a round trip per command message; and each ack that empties the command stream costs
        nats-server, on file storage, the removal and re-creation of a block file, so acks leave
        together every ``_ACK_DELAY``). The acks travel on the connection, buffered across a
        reconnect; one lost anyway (or not sent: the worker was killed meanwhile) only means the
        command is redelivered after the ack wait, its run repeated and its events dropped by
        the gateway (the request already ended there)."""
        self._acks.append(msg)
        if len(self._acks) == 1:
            asyncio.get_running_loop().call_later(_ACK_DELAY, self._send_acks)

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, []
        self._spawn_background(self._ack_all(acks))

    async def _ack_all(self, acks: list[Msg]) -> None:
        for msg in acks:
            try:
                await msg.ack()
            except Exception as exc:
                log.warning("ack not sent", extra={"fields": {"subject": msg.subject, "error": repr(exc)}})


def _nothing() -> None:
    pass


def _numbered(meta: CommandMeta, number: int) -> CommandMeta:
    """``meta`` of another command of its batch (dataclasses.replace costs twice as much)."""
    return CommandMeta(meta.session, number, meta.reply, meta.capabilities, meta.hooks, meta.traceparent)


class _Progress:
    """Tells the command stream every ``period`` seconds that a command message is still being
    worked on, so a live worker keeps it however long it runs: a timer per message rather than a
    task (most messages end long before the first tick)."""

    __slots__ = ("_msg", "_period", "_spawn", "_loop", "_handle")

    def __init__(self, msg: Msg, period: float, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self._msg = msg
        self._period = period
        self._spawn = spawn
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(period, self._tick)

    def _tick(self) -> None:
        self._spawn(self._say())
        self._handle = self._loop.call_later(self._period, self._tick)

    async def _say(self) -> None:
        with contextlib.suppress(Exception):
            await self._msg.in_progress()

    def cancel(self) -> None:
        self._handle.cancel()
