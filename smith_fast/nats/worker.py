"""``smith-fast worker``: serve the sessions gateways place here, as ``smith-fast serve`` would.

A gateway places each frontend session on one worker (smith_fast.nats.placement) and opens it
there with the first relay message of the connection (``OPEN``, smith_fast.nats.relay). The worker
answers ``OPENED`` and serves it with a
:class:`~smith_fast.service.connection.Connection` of its own core over a
:class:`~smith_fast.nats.relay_transport.RelayTransport`: the same code as a socket of ``serve``,
so the session's sequencing, limits, hooks, sandbox, audit, resume retention and background
processes are ``serve``'s. Everything of the session stays here for its lifetime.

Around the sessions the worker:

* announces itself (smith_fast.nats.presence) every ``--presence-interval``, when asked, and when
  it stops;
* hears each gateway's heartbeat, and takes the sessions of a gateway silent for
  ``--gateway-lease`` as dropped connections (a resumable one parks and can be resumed through
  any gateway; its resume token starts with this worker's id, which leads gateways here);
* answers other workers about its background processes and asks them about theirs, so its
  sessions see the fleet's as ``serve``'s see the service's (smith_fast.nats.processes);
* on SIGTERM, drains: takes no new session, lets running requests finish for ``--drain-timeout``,
  then ends the sessions (their requests end once each, their gateways say ``worker_stopping``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from .._version import __version__
from .._varint import decode as decode_varint
from ..containment import memory_bound
from ..errors import StartupError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.config import ServiceConfig
from ..service.connection import Connection
from ..service.core import Backend, ServiceCore
from ..service.metrics import Figure
from .config import NatsConfig
from .connect import close, connect, round_trip
from .delivery import InlineDelivery
from .metrics import worker_figures
from .presence import Announcement
from .processes import FleetProcesses
from .relay import OPEN, OPENED, REFUSED, Outbox, Subjects, is_id, pack, unpack
from .relay_transport import RelayTransport

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = ["Worker", "default_worker_id"]

log = get_logger("smith_fast.worker")

_PROTOCOLS = {"v1": "v1", "v0": "v0"}


def default_worker_id() -> str:
    """``<host>-<pid>``, made a subject token (letters, digits, ``-``, ``_``)."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40] or "worker"
    return f"{host}-{os.getpid()}"


def _memory() -> tuple[int, int]:
    """(available, total) bytes: of this process's memory cgroup when it is bounded (v2 or v1),
    else of the machine."""
    bound = memory_bound()
    if bound is not None:
        limit, used = bound
        return max(0, limit - used), limit
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info[key] = int(value.split()[0]) * 1024
        return info.get("MemAvailable", 0), info.get("MemTotal", 0)
    except (OSError, ValueError, IndexError):
        return 0, 0


class Worker(Backend):
    """Serves the sessions gateways place on it, until told to stop.

    Args:
        config: the service configuration (what ``serve`` takes).
        nats_config: NATS servers, credentials, intervals.
        loop_name: reported in ``service_info``.
        worker_id: its id: the token of its subjects, and of its NATS identity's permissions.
        labels: ``--label KEY=VALUE``: what a session may ask its worker to have.
        max_sessions: sessions served at once at most (``--max-sessions``).
        drain_timeout: on stop, seconds running requests may still take.
        connect_options: more ``nats.connect`` arguments (an nkey).

    Attributes:
        core: the service core sessions run on (tools, limits, sandbox, global hooks).
    """

    runs_commands = True

    def __init__(self, config: ServiceConfig, nats_config: NatsConfig, *, loop_name: str = "asyncio", worker_id: str | None = None,
                 labels: Mapping[str, str] | None = None, max_sessions: int = 256, drain_timeout: float = 10.0,
                 connect_options: dict[str, Any] | None = None) -> None:
        self.name = worker_id or default_worker_id()
        if not is_id(self.name):
            raise ValueError(f"--worker-id {self.name!r} may hold only letters, digits, '-' and '_' (64 at most)")
        self.route = self.name  # resume tokens start with it (smith_fast.service.resume)
        self.config = nats_config
        self.subjects = Subjects(nats_config.prefix)
        self.labels = dict(labels or {})
        self.max_sessions = max_sessions
        self.drain_timeout = drain_timeout
        self.core = ServiceCore(config, loop_name=loop_name, backend=self)
        self.core.offer(pb.CAPABILITY_NATS, True)  # its sessions are served through NATS (if --capabilities permits)
        # its sessions see every worker's background processes, as serve's see the service's
        self.processes = self.core.background = FleetProcesses(config.limits, self.name, self.subjects, nats_config.presence_interval)
        self.nc: NATS | None = None
        self.relays: dict[tuple[str, str], RelayTransport] = {}  # (gateway, connection) -> its transport
        self.heard: dict[str, float] = {}  # gateway -> when its last heartbeat came (monotonic)
        self.draining = False
        self.connected = False
        self.opened = 0
        self.rtt = 0.0
        self.instance = secrets.token_hex(8)
        self.started = time.time()
        self.duplicate: str | None = None  # another process announces this worker id (it started first)
        self._connect_options = dict(connect_options or {})
        self._tasks: list[asyncio.Task[None]] = []
        self._delivery: InlineDelivery | None = None
        self._outbox: Outbox | None = None  # the relay's publishes, once connected
        self.core.metrics.add_source(self)

    # ---- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, subscribe, announce: from now on gateways place sessions here."""
        config, subjects = self.config, self.subjects
        options = {"inbox_prefix": f"_INBOX.{self.name}", **self._connect_options}  # its permissions name _INBOX.<worker>.>
        nc = await connect(config, name=f"smith-fast worker {self.name}", on_disconnect=self._disconnected,
                           on_reconnect=self._reconnected, options=options)
        self.nc = nc
        self._outbox = Outbox(nc)
        self.connected = True
        # Before taking any session: is this id already in use? The workers running answer a query
        # at once; one of them with this id means two processes would answer its sessions' OPENs.
        await nc.subscribe(subjects.presence, cb=self._same_id)
        await nc.subscribe(subjects.presence_query, cb=self._queried)
        await nc.publish(subjects.presence_query, b"")
        await asyncio.sleep(min(0.25, config.presence_interval))
        if self.duplicate is not None:
            raise StartupError(f"--worker-id {self.name} is in use by a worker that runs already (instance {self.duplicate}); "
                               "give every worker its own id (and its own key: smith-fast nats-auth --workers ...)")
        self._delivery = InlineDelivery(nc)
        await self._delivery.subscribe(subjects.to_worker_filter(self.name), self._relayed)
        await nc.subscribe(subjects.heartbeat_filter(), cb=self._heartbeat)
        await self.processes.listen(nc, self.announcement, self._delivery.subscribe)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._announce_forever()))
        self._tasks.append(loop.create_task(self._leases()))
        log.info("ready", extra={"fields": {"worker": self.name, "servers": list(config.servers), "labels": self.labels,
                                            "max_sessions": self.max_sessions}})

    async def stop(self) -> None:
        """Drain: no new session; running requests get ``drain_timeout``; then every session ends."""
        if self.draining:
            return
        self.draining = True
        await self._announce()
        core = self.core
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        while any(len(s.requests) for s in core.sessions) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        running = sum(len(s.requests) for s in core.sessions)
        if running:
            log.warning("drain timeout: ending what still runs", extra={"fields": {"requests": running}})
        for relay in self.relays.values():  # the sessions end now (core.shutdown): their frontends hear why
            relay.close_reason = "worker_stopping"

    async def close(self) -> None:
        """After the core shut its sessions down: the relays end, the gateways hear this worker leave."""
        for relay in list(self.relays.values()):
            relay.end("worker_stopping")
        await self._announce(leaving=True)
        self.processes.close()
        await close(self.nc, self._tasks)
        log.info("stopped", extra={"fields": {"worker": self.name, "sessions": self.opened}})

    def _disconnected(self) -> None:
        self.connected = False

    def _reconnected(self) -> None:
        self.connected = True
        if self._delivery is not None:
            self._delivery.reconnected()
        now = time.monotonic()
        for gateway in self.heard:  # their silence while this worker was cut off is not theirs
            self.heard[gateway] = now
        self._announce_soon()

    # ---- sessions ---------------------------------------------------------------------------------

    def _open(self, gateway: str, conn_id: str, data: bytes) -> None:
        """A gateway's OPEN (the first message on a connection's subject): take the session, or say
        why not. What the gateway sent behind it is read by the new connection, or dropped."""
        try:
            seq, kind, body = unpack(data)
            if kind != OPEN or seq != 1:
                return  # a late message of a connection that ended here, or behind a refused OPEN
            size, at = decode_varint(body[:10])  # OPEN: the opening (JSON), then the frontend's first bytes
            request = json.loads(bytes(body[at : at + size]))
            first = body[at + size :]
            protocol = _PROTOCOLS[str(request["protocol"])]
            first_sequence = max(1, int(request.get("first_sequence", 1)))
            peer = str(request.get("peer", "?"))[:200]
            acks = request.get("acks") is True
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return
        nc, outbox = self.nc, self._outbox
        if nc is None or outbox is None or not is_id(gateway) or not is_id(conn_id):
            return
        subject = self.subjects.to_gateway(gateway, self.name, conn_id)
        refusal = "worker_draining" if self.draining else "max_sessions" if len(self.core.sessions) >= self.max_sessions else None
        if refusal is not None:
            outbox.publish(subject, pack(1, REFUSED, refusal.encode()))
            return
        key = (gateway, conn_id)
        transport = RelayTransport(outbox, subject, peer, nc.max_payload, lambda t: self._forget(key, t), first_in=1, first_out=1,
                                   acks=acks)
        # finish_on_eof: an EOF is relayed only for a gateway's stdin that is a file (its requests end first)
        conn = Connection(self.core, protocol=protocol, peer=f"nats:{gateway}/{peer}", first_sequence=first_sequence, finish_on_eof=True)
        transport.set_protocol(conn)
        self.relays[key] = transport
        self.heard.setdefault(gateway, time.monotonic())
        self.opened += 1
        # held until the connection has taken its first bytes: its Ready, which it writes in its
        # next step, goes in the same write (one message less to wake nats-server and the gateway)
        opened = {"worker": self.name, "acks": True} if acks else {"worker": self.name}
        outbox.publish(subject, pack(1, OPENED, json.dumps(opened).encode()), hold=True)
        conn.connection_made(transport)
        if first:
            transport.feed(first)
        outbox.soon()

    def _forget(self, key: tuple[str, str], transport: RelayTransport) -> None:
        if self.relays.get(key) is transport:
            del self.relays[key]

    def _relayed(self, subject: bytes, data: bytes) -> None:
        # <prefix>.s.<worker>.<gateway>.<conn>: only the gateway that opened a connection writes to it
        head, _, conn = subject.rpartition(b".")
        gateway, conn_id = head.rpartition(b".")[2].decode(), conn.decode()
        transport = self.relays.get((gateway, conn_id))
        if transport is not None:
            transport.received(data)
        else:
            self._open(gateway, conn_id, data)

    async def _heartbeat(self, msg: Msg) -> None:
        self.heard[msg.subject.rpartition(".")[2]] = time.monotonic()

    async def _leases(self) -> None:
        """A gateway silent for ``--gateway-lease`` is gone: its connections are dropped here."""
        lease = self.config.gateway_lease
        if lease <= 0:
            return
        while True:
            await asyncio.sleep(max(0.1, lease / 4))
            if not self.connected:
                continue
            now = time.monotonic()
            silent = {g for g, seen in self.heard.items() if now - seen > lease}
            for gateway in silent:
                del self.heard[gateway]
                lost = [t for (g, _), t in self.relays.items() if g == gateway]
                if lost:
                    log.warning("gateway gone", extra={"fields": {"gateway": gateway, "connections": len(lost), "lease": lease}})
                for transport in lost:
                    transport.gateway_gone()

    # ---- presence ---------------------------------------------------------------------------------

    async def _same_id(self, msg: Msg) -> None:
        """Two processes announcing this worker id would both take its sessions (each OPEN answered
        twice): the one started later stops, saying why."""
        try:
            ann = Announcement.decode(msg.data)
        except ValueError:
            return
        if ann.worker != self.name or ann.instance in ("", self.instance) or self.duplicate is not None:
            return
        if (ann.started, ann.instance) < (self.started, self.instance):  # it was there first
            self.duplicate = ann.instance
            if self._tasks:  # serving already (both started at once): stop as on SIGTERM, saying why
                log.error("another worker runs with this --worker-id: stopping", extra={"fields": {
                    "worker": self.name, "other_instance": ann.instance, "remedy": "give every worker its own --worker-id"}})
                os.kill(os.getpid(), signal.SIGTERM)

    def announcement(self, leaving: bool = False) -> Announcement:
        core = self.core
        available, total = _memory()
        return Announcement(
            worker=self.name, version=__version__, capacity=core.limits.max_processes, running=core.running_processes,
            sessions=len(core.sessions), max_sessions=self.max_sessions, mem_available=available, mem_total=total,
            labels=self.labels, templates=tuple(core.workspaces.templates) if core.workspaces is not None else (),
            draining=self.draining, rtt=self.rtt, leaving=leaving, background=tuple(core.background.ids()),
            instance=self.instance, started=self.started,
        )

    async def _announce(self, leaving: bool = False) -> None:
        nc = self.nc
        if nc is None or not nc.is_connected or self.duplicate is not None:  # the other process is that worker
            return
        with contextlib.suppress(Exception):
            await nc.publish(self.subjects.presence, self.announcement(leaving).encode())
            await nc.flush(timeout=2)

    def _announce_soon(self) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self._announce()))

    async def _queried(self, _msg: Msg) -> None:
        await self._announce()

    async def _announce_forever(self) -> None:
        while True:
            await self._announce()
            nc = self.nc
            if nc is not None and nc.is_connected:
                with contextlib.suppress(Exception):
                    self.rtt = await round_trip(nc)
            await asyncio.sleep(self.config.presence_interval)

    # ---- Backend ----------------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        return "draining" if self.draining else None

    def refusing(self) -> tuple[str, str] | None:
        if not self.draining:
            return None
        return ("worker_draining", f"the worker {self.name} is stopping: it starts no new request; "
                "its running ones end within --drain-timeout, then start a new session")

    def service_info(self) -> dict[str, str]:
        info = {"smith_fast.worker": self.name}
        if self.labels:
            info["smith_fast.labels"] = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return info

    def figures(self) -> list[Figure]:
        return worker_figures(self.connected, self.rtt, self.opened, self.draining)
