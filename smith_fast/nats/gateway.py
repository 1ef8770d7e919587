"""``smith-fast gateway``: the listeners of ``smith-fast serve``; each session placed on one worker.

Frontends connect exactly as to ``serve`` (v1 or v0, on Unix, TCP and stdio). The gateway reads a
connection's handshake, checks its token, places the session on one live worker (by labels and
load: smith_fast.nats.placement) and from then on relays its bytes both ways over core NATS
(smith_fast.nats.relay, :class:`~smith_fast.nats.gateway_front.RelayConnection`). The worker runs
the session with the same code as ``serve``; the gateway keeps no per-request state but the ids
still open, so that a worker's death ends each of them once (``worker_gone``).

:class:`Gateway` is the core's :class:`~smith_fast.service.core.Backend` (health, ``service_info``,
the end of the relays at shutdown) and the relays' host: its NATS connection, the workers'
presence, placement, and the one subscription all relayed messages arrive on.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from ..logs import get_logger
from ..service.config import ServiceConfig
from ..service.core import Backend, ServiceCore
from ..service.metrics import Figure
from .config import NatsConfig
from .connect import close, connect, round_trip
from .delivery import InlineDelivery
from .gateway_front import OPEN_TIMEOUT, Offered, RelayConnection
from .metrics import gateway_figures
from .placement import Placement
from .presence import Announcement, LiveSet
from .relay import Outbox, Subjects, is_id

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from ..service.connections import ConnectionGate

__all__ = ["Gateway", "Opened"]

log = get_logger("smith_fast.gateway")



class Opened:
    """A session placed: its worker and the worker's subject of its connection."""

    __slots__ = ("worker", "subject")

    def __init__(self, worker: str, subject: str) -> None:
        self.worker = worker
        self.subject = subject


class Gateway(Backend):
    """A service core whose connections are relayed to the workers their sessions are placed on.

    Args:
        config: the service configuration (listeners' limits, token).
        nats_config: NATS servers, credentials, intervals.
        loop_name: reported in ``service_info``.
        gateway_id: names this gateway's subjects (default: a fresh id); the identity its NATS
            permissions are written for (``smith-fast nats-auth``).
        connect_options: more ``nats.connect`` arguments (an nkey, the inbox prefix).

    Attributes:
        core: what the listeners serve (``serve(..., core=gateway.core, front=gateway.front)``).
    """

    def __init__(self, config: ServiceConfig, nats_config: NatsConfig, *, loop_name: str = "asyncio", gateway_id: str | None = None,
                 connect_options: dict[str, Any] | None = None) -> None:
        self.gateway_id = gateway_id or secrets.token_hex(6)
        if not is_id(self.gateway_id):
            raise ValueError(f"--gateway-id {self.gateway_id!r} may hold only letters, digits, '-' and '_'")
        self.config = nats_config
        self.subjects = Subjects(nats_config.prefix)
        self.core = ServiceCore(config, loop_name=loop_name, backend=self)
        self.nc: NATS | None = None
        self.outbox: Outbox | None = None  # the relay's publishes (gateway_front), once connected
        self.workers = LiveSet(nats_config.presence_interval)
        self.placement = Placement()
        self.relays: dict[str, RelayConnection] = {}  # by connection id
        self.connected = False
        self.rtt = 0.0
        self._changed = asyncio.Event()  # the set of workers changed: a waiting placement looks again
        self._connect_options = dict(connect_options or {})
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = False
        self._delivery: InlineDelivery | None = None
        self.core.metrics.add_source(self)

    def front(self, *, protocol: str = "auto", on_closed: Any = None, peer: str | None = None, trusted: bool = False,
              finish_on_eof: bool = False, gate: ConnectionGate | None = None) -> RelayConnection:
        """A listener's new connection (smith_fast.service.server.StreamFront)."""
        return RelayConnection(self, protocol=protocol, on_closed=on_closed, peer=peer, trusted=trusted, finish_on_eof=finish_on_eof, gate=gate)

    # ---- NATS ------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect to NATS (retrying for ever), subscribe, and keep the workers' view fresh."""
        config = self.config
        options = {"inbox_prefix": f"_INBOX.{self.gateway_id}", **self._connect_options}
        nc = await connect(config, name=f"smith-fast gateway {self.gateway_id}", on_disconnect=self._disconnected,
                           on_reconnect=self._reconnected, options=options)
        self.nc = nc
        self.outbox = Outbox(nc)
        self.connected = True
        await nc.subscribe(self.subjects.presence, cb=self._heard)
        self._delivery = InlineDelivery(nc)
        await self._delivery.subscribe(self.subjects.to_gateway_filter(self.gateway_id), self._relayed)
        await nc.publish(self.subjects.presence_query, b"")  # the workers running already answer now
        self._ready = True
        log.info("nats connected", extra={"fields": {"gateway": self.gateway_id, "servers": list(config.servers)}})
        self.core.health_changed()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._heartbeats()))
        self._tasks.append(loop.create_task(self._expiries()))

    async def close(self) -> None:
        await close(self.nc, self._tasks)
        self.nc = self.outbox = None

    def _disconnected(self) -> None:
        self.connected = False
        self.core.health_changed()

    def _reconnected(self) -> None:
        self.connected = True
        if self._delivery is not None:
            self._delivery.reconnected()
        for relay in list(self.relays.values()):  # an ACK lost with the server waits for nothing
            relay.reconnected()
        self.core.health_changed()

    async def _heard(self, msg: Msg) -> None:
        try:
            ann = Announcement.decode(msg.data)
        except ValueError as exc:
            log.warning("bad announcement", extra={"fields": {"error": str(exc)}})
            return
        known = ann.worker in {a.worker for a in self.workers.alive()}
        changed = self.workers.heard(ann)
        self.placement.heard(ann.worker)
        if ann.leaving and changed:  # (not another process that announced this id for a moment, and stops)
            log.info("worker left", extra={"fields": {"worker": ann.worker}})
            self._worker_gone(ann.worker, "worker_stopping")
            self.core.health_changed()
        elif not known and not ann.leaving:
            log.info("worker joined", extra={"fields": {"worker": ann.worker, "labels": ann.labels, "max_sessions": ann.max_sessions}})
            self.core.health_changed()
        self._changed.set()

    def _relayed(self, subject: bytes, data: bytes) -> None:
        # <prefix>.g.<gateway>.<worker>.<conn>: the worker is checked against the connection's, so
        # that a worker cannot write into a session placed on another one.
        head, _, conn = subject.rpartition(b".")
        relay = self.relays.get(conn.decode())
        if relay is not None and relay.worker == head.rpartition(b".")[2].decode():
            relay.received(data)

    async def _heartbeats(self) -> None:
        """The lease the workers give this gateway's sessions (``--gateway-lease``): a third of it."""
        interval = max(0.2, min(5.0, self.config.gateway_lease / 3)) if self.config.gateway_lease > 0 else 5.0
        subject = self.subjects.heartbeat(self.gateway_id)
        while True:
            nc = self.nc
            if nc is not None and nc.is_connected:
                with contextlib.suppress(Exception):
                    await nc.publish(subject, b"")
                    self.rtt = await round_trip(nc)
            await asyncio.sleep(interval)

    async def _expiries(self) -> None:
        """Workers silent for three presence intervals are gone: their sessions end (``worker_gone``)."""
        interval = self.config.presence_interval / 2
        while True:
            await asyncio.sleep(interval)
            if not self.connected:
                continue  # the gateway hears nobody while it is cut off itself; it is not they who left
            for worker in self.workers.expire():
                log.warning("worker gone", extra={"fields": {"worker": worker}})
                self._worker_gone(worker, "worker_gone")
                self.core.health_changed()

    def _worker_gone(self, worker: str, reason: str) -> None:
        for relay in [r for r in self.relays.values() if r.worker == worker]:
            relay.end_session(reason)

    # ---- placement (the relays' host) ---------------------------------------------------------------

    def offer_now(self, conn: RelayConnection, wanted: Mapping[str, str], route: str | None) -> Offered | None:
        """The first offer of ``conn``'s session, made as its handshake is read (see RelayHost.offer_now)."""
        nc = self.nc
        if nc is None:
            return None
        if route is not None:
            worker = route if route in {a.worker for a in self.workers.alive()} else None
        else:
            worker = self.placement.choose(self.workers.alive(), wanted, ())
        return None if worker is None else (worker, self._offer(nc, worker, conn))

    async def place(self, conn: RelayConnection, wanted: Mapping[str, str], route: str | None, tried: Collection[str] = ()) -> Opened | str:
        """Place ``conn``'s session on a worker and open its relay there (see RelayHost.place)."""
        config = self.config
        loop = asyncio.get_running_loop()
        start = loop.time()
        noticed = False
        refused = set(tried)
        while True:
            nc = self.nc
            if route is not None:
                # A resume goes to the worker its token names, or nowhere (the session lives there only).
                alive = {a.worker for a in self.workers.alive()}
                if nc is None or route not in alive or route in refused:
                    return "resume_unknown"
                worker: str | None = route
            else:
                worker = self.placement.choose(self.workers.alive(), wanted, refused) if nc is not None else None
            if worker is not None and nc is not None:
                opened = await self._answered(conn, worker, self._offer(nc, worker, conn))
                if opened is not None:
                    return opened
                refused.add(worker)
                continue
            waited = loop.time() - start
            if config.queue_timeout and waited >= config.queue_timeout:
                return "no_worker" if nc is not None else "nats_unavailable"
            if not noticed and waited >= config.queue_notice:
                noticed = True
                conn.notice("waiting for a worker to take this session", {"reason": "placing", "waited_ms": str(int(waited * 1000))})
            self._changed.clear()
            timeout = None if not config.queue_timeout else max(0.0, config.queue_timeout - waited)
            if not noticed:
                timeout = max(0.0, config.queue_notice - waited) if timeout is None else min(timeout, max(0.0, config.queue_notice - waited))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
            if route is None:
                refused.clear()  # a refusal may not hold any more (a worker had a slot freed)

    def _offer(self, nc: NATS, worker: str, conn: RelayConnection) -> asyncio.Future[str | None]:
        """Offer ``conn``'s session to ``worker``: its OPEN and the frontend's bytes go at once; the
        worker's answer to come."""
        self.relays[conn.conn_id] = conn
        return conn.offer(worker, self.subjects.to_worker(worker, self.gateway_id, conn.conn_id), nc)

    async def _answered(self, conn: RelayConnection, worker: str, answer: asyncio.Future[str | None]) -> Opened | None:
        """The answer of ``worker`` to an offer: ``OPENED``, or ``REFUSED``/silence (None: another
        worker is tried)."""
        try:
            refusal = await asyncio.wait_for(answer, OPEN_TIMEOUT)
        except asyncio.TimeoutError:
            refusal = "no answer"
        if refusal is None:
            return Opened(worker, conn.subject)
        self.refused(conn, worker, refusal)
        return None

    def refused(self, conn: RelayConnection, worker: str, reason: str) -> None:
        log.info("worker did not take the session", extra={"fields": {"worker": worker, "reason": reason}})
        conn.withdraw()
        self.relays.pop(conn.conn_id, None)

    def forget(self, conn: RelayConnection) -> None:
        if self.relays.get(conn.conn_id) is conn:
            del self.relays[conn.conn_id]

    # ---- Backend ----------------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        servers = ", ".join(self.config.servers)
        if not self._ready:
            return f"NATS is unreachable at {servers}; the gateway keeps retrying (every {self.config.reconnect_wait:g}s)"
        if not self.connected:
            return f"the connection to NATS at {servers} was lost; reconnecting every {self.config.reconnect_wait:g}s"
        if not self.workers.alive():
            return (f"no worker is alive (none announced itself in the last {self.workers.expiry:g}s); "
                    "a new session waits for one (--queue-timeout)")
        return None

    def service_info(self) -> dict[str, str]:
        info = {"smith_fast.gateway": self.gateway_id, "smith_fast.workers": str(len(self.workers.alive())),
                "smith_fast.nats": "connected" if self.connected else "unreachable"}
        reason = self.unavailable()
        if reason is not None:
            info["smith_fast.not_serving_reason"] = reason
        return info

    async def stop(self) -> None:
        """The gateway stops: each relay ends (a resumable session parks on its worker)."""
        for relay in list(self.relays.values()):
            relay.close()

    def figures(self) -> list[Figure]:
        per_worker: dict[str, int] = {}
        for relay in self.relays.values():
            if relay.worker:
                per_worker[relay.worker] = per_worker.get(relay.worker, 0) + 1
        return gateway_figures(self.connected, self.rtt, self.workers.alive(), per_worker)
