"""The NATS side of ``smith-fast gateway``: commands out, the workers' events in, one connection.

A :class:`Bridge` publishes the commands of every session (batched per session and loop
iteration, :mod:`smith_fast.nats.batching`) into the command stream, consumes this gateway's
events and routes each to the session it is for (its :class:`Routed` runner), tells the workers
about sessions and requests (pause, resume, cancel, end), follows the live workers
(:mod:`smith_fast.nats.presence`) and their background processes (:mod:`smith_fast.nats.processes`),
says why the gateway cannot serve, and with a fixed ``--gateway-id`` journals resumable sessions
and takes over those of the process before (:mod:`smith_fast.nats.journal`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError

from ..errors import GatewayIdInUse, PublishError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.metrics import Figure
from .batching import CommandBatcher, Stored, batch_limit, split_events
from .config import NatsConfig, is_token
from .control import request_subject
from . import jetstream
from .jetstream import (
    Publisher,
    PullFeed,
    connect,
    ensure_gateway_consumer,
    ensure_journal_stream,
    ensure_streams,
    round_trip,
)
from .journal import Journal, Saved
from .leases import Heartbeat, identity_subject, takeover_subject
from .metrics import NatsCounters, gateway_figures
from .presence import Announcement, LiveSet
from .processes import ProcessDirectory
from .remote import Remote
from .wire import CONTROL, REQUEST, CommandMeta

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext

    from ..service.core import ServiceCore
    from ..service.session import Session

__all__ = ["Bridge", "Routed"]

log = get_logger("smith_fast.gateway")

_UNKNOWN_KEPT = 1024  # sessions told to end because events came for them, so each is told once
_ACK_DELAY = 0.05  # seconds an acknowledgement of the event consumer waits for the next ones (Bridge._event)


class Routed(Protocol):
    """What the bridge routes a session's events to: its runner
    (:class:`~smith_fast.nats.forwarding.NatsRunner`)."""

    @property
    def session_id(self) -> str: ...

    def deliver(self, number: int, attempt: int, index: int, env: pb.Envelope) -> None:
        """One event message of request ``number`` of the session."""

    def deliver_shared(self, first: int, count: int, attempt: int, index: int, env: pb.Envelope) -> None:
        """One event message of the worker session that ran requests ``first`` .. ``first+count-1``."""

    def fail_request(self, remote: Remote, code: int, message: str, reason: str) -> None:
        """End a request the workers gave up on."""


class Bridge:
    """A gateway's NATS side: publishes commands, routes events to sessions, tells workers.

    Args:
        core: the gateway's service core; it offers ``nats`` while the bridge is connected.
        config: NATS names and limits.
        gateway_id: names this gateway's event subjects and consumer (default: a fresh id).
        durable: the id is fixed (``--gateway-id``): the resumable sessions are journaled and
            handed over to the next process with that id (smith_fast.nats.journal), which takes
            them over at its start; the event consumer outlives the process.
        restore: makes a session of the process before this one live again here, from what its
            journal saved (called at the start of a durable bridge, once per saved session).
    """

    def __init__(self, core: ServiceCore, config: NatsConfig, gateway_id: str | None = None, *, durable: bool = False,
                 restore: Callable[[Saved], None] = lambda saved: None) -> None:
        self.core = core
        self.config = config
        self.gateway_id = gateway_id or uuid.uuid4().hex
        if not is_token(self.gateway_id):
            raise ValueError(f"gateway id {self.gateway_id!r} may hold only letters, digits, '-' and '_'")
        self.sessions: dict[str, Routed] = {}  # each session's runner, by session id (it adds itself)
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.publisher: Publisher | None = None
        self.feed: PullFeed | None = None
        self.batcher: CommandBatcher | None = None
        # a command message's stream sequence -> its requests (several when it carried a batch)
        self._by_seq: dict[int, list[tuple[Routed, Remote]]] = {}
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
        self._restore = restore
        self.journal = Journal(config, self.gateway_id, self._spawn) if durable else None
        self.handing_over = False  # stopping, sessions handed over: events are left for the next process
        self._taken_over = asyncio.Event()  # the sessions of the process before are taken over
        if not durable:
            self._taken_over.set()
        self._newest: Msg | None = None  # the last event message taken
        self._unknown: collections.OrderedDict[str, None] = collections.OrderedDict()  # sessions told to end
        if durable:
            core.hold_resumes(True)  # until the sessions of the process before are taken over (start)
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
        self.core.offer(pb.CAPABILITY_NATS, True)
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
                    self._restore(saved)
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
            self.core.hold_resumes(False)
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
        await jetstream.close(self.nc, self.publisher)

    def _disconnected(self) -> None:
        self.counters.connected = False
        self.core.offer(pb.CAPABILITY_NATS, False)
        self._health_may_have_changed()

    def _reconnected(self) -> None:
        self.counters.connected = True
        self.core.offer(pb.CAPABILITY_NATS, True)
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

    def track(self, seq: int, session: Routed, remote: Remote) -> None:
        self._by_seq.setdefault(seq, []).append((session, remote))

    def untrack(self, seq: int, remote: Remote) -> None:
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

    def end_session(self, session: Routed) -> None:
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
        # tool call when acked per tick (measured on the relayed-call benchmark); the ack wait
        # (30 s) is far off.
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
        if len(self._unknown) > _UNKNOWN_KEPT:
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
