"""A gateway gone for good leaves no command of its sessions running on the workers.

A gateway ends its sessions on the workers with ``Smith-Control: end``; one that is SIGKILLed, or
whose host dies, sends nothing. So each gateway says it is alive: :class:`Heartbeat` publishes an
empty message on the core NATS subject ``<prefix>.gateway.<gateway id>`` every
``--presence-interval``. Each worker hears every gateway's (``<prefix>.gateway.*``) and keeps, in
:class:`Leases`, when it last heard each one and which of its sessions it serves (a command's
reply subject ``<prefix>.evt.<gateway>.<session>`` names both). A gateway silent for longer than
the worker's ``--gateway-lease`` (120 s) is taken as gone: the worker stops its sessions there as a
``shutdown`` does, their requests' final events published, and answers their later commands
``gateway_gone`` (smith_fast/nats/worker.py).

Only silence counts. A gateway that stops cleanly says nothing either: it may hand its sessions
to its successor (the same ``--gateway-id``), whose heartbeats then carry on; and the lease is
generous because a gateway restarted with its id takes its sessions back. Silence is counted from
the latest of the last heartbeat heard, the first command of the session this worker got (a worker
that started after the gateway died still gives it the whole lease) and the moment this worker's
own NATS connection came back (while it is down the worker hears nobody, so nobody is silent).

Why core NATS and one subject per gateway rather than the gateways' durable event consumers (the
server knows when one has no pull request waiting): that costs every worker a JetStream API
request per gateway per look, and a consumer with no waiting request is also a live gateway
between two pulls. A heartbeat costs one small message per gateway and interval, is not stored,
and the worker's view expires locally. The worker looks once per :attr:`Leases.period` for all
gateways at once (its sweep), not with a timer per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .config import NatsConfig

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

__all__ = ["Heartbeat", "Lapse", "Leases", "heartbeat_subject", "identity_subject", "takeover_subject"]

_MAX_PERIOD = 5.0  # seconds between two looks at most: a gone gateway's sessions end by lease + this


def heartbeat_subject(config: NatsConfig, gateway: str) -> str:
    """Where gateway ``gateway`` says it is alive: ``<prefix>.gateway.<gateway>`` (core NATS);
    ``"*"`` for every gateway's."""
    return f"{config.prefix}.gateway.{gateway}"


def takeover_subject(config: NatsConfig, gateway: str) -> str:
    """Where a gateway process that started with a fixed id says which of the sessions of the
    process before it took over (smith_fast.nats.journal): ``<prefix>.gateway.<gateway>.takeover``,
    the body a JSON list of session ids; ``"*"`` for every gateway's. The workers end that
    gateway's other sessions: nobody follows them any more."""
    return f"{config.prefix}.gateway.{gateway}.takeover"


def identity_subject(config: NatsConfig, gateway: str) -> str:
    """Where a gateway process with a fixed id answers who it is (``host:pid``), so that a second
    process started with the same id finds it at once and refuses to run: two processes sharing
    one id would split its events between them. ``<prefix>.gateway.<gateway>.who``."""
    return f"{config.prefix}.gateway.{gateway}.who"


class Heartbeat:
    """A gateway's heartbeat: an empty message every ``--presence-interval`` while its NATS
    connection is open (none while it reconnects: a burst of stale ones on reconnect says nothing).
    It stops by itself when the connection is closed, so a clean stop needs nothing of it."""

    def __init__(self, nc: NATS, config: NatsConfig, gateway: str) -> None:
        self._nc = nc
        self._subject = heartbeat_subject(config, gateway)
        self._interval = config.presence_interval
        self.task: asyncio.Task[None] | None = None  # held here: the loop keeps only a weak reference

    @classmethod
    def started(cls, nc: NATS, config: NatsConfig, gateway: str) -> Heartbeat:
        """A heartbeat, beating from now on (the first at once)."""
        beat = cls(nc, config, gateway)
        beat.task = asyncio.get_running_loop().create_task(beat._beat())
        return beat

    async def _beat(self) -> None:
        while not self._nc.is_closed:
            if self._nc.is_connected:
                with contextlib.suppress(Exception):  # draining, or lost meanwhile: the next one goes
                    await self._nc.publish(self._subject, b"")
            await asyncio.sleep(self._interval)


@dataclasses.dataclass(frozen=True)
class Lapse:
    """A gateway whose lease ran out, with the sessions of it this worker served.

    Attributes:
        gateway: its id.
        sessions: the session ids, oldest first.
        silence: seconds the worker waited on it (from the latest of its last heartbeat, the
            first command of its oldest session here, the worker's reconnect).
        heard: whether this worker ever heard its heartbeat.
    """

    gateway: str
    sessions: tuple[str, ...]
    silence: float
    heard: bool


class Leases:
    """When a worker last heard each gateway, and which gateway each session it serves belongs to.

    Args:
        config: the NATS names (the subject prefix) and ``gateway_lease``: seconds of silence after
            which a gateway's sessions end (0 = never).
        clock: monotonic seconds (a parameter for the tests).
    """

    def __init__(self, config: NatsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease = config.gateway_lease
        self._events = f"{config.prefix}.evt."
        self._subject = heartbeat_subject(config, "*")
        self._clock = clock
        self._heard: dict[str, float] = {}  # gateway -> its last heartbeat
        self._sessions: dict[str, dict[str, float]] = {}  # gateway -> session -> its first command here
        self._gateway_of: dict[str, str] = {}  # session -> its gateway
        self._floor = clock()  # silence counts from here at the earliest: the start, the last reconnect
        self._deaf = False  # the worker's connection is down: it hears nobody, so nobody is silent

    @property
    def period(self) -> float:
        """How often :meth:`expired` should be asked: a tenth of the lease, at most 5 s."""
        return min(self.lease / 10, _MAX_PERIOD) if self.lease > 0 else _MAX_PERIOD

    async def listen(self, nc: NATS) -> None:
        """Hear every gateway's heartbeat on ``nc``."""
        await nc.subscribe(self._subject, cb=self._beat)

    async def _beat(self, msg: Msg) -> None:
        self.heard(msg.subject.rpartition(".")[2])

    def heard(self, gateway: str) -> None:
        """Gateway ``gateway`` said it is alive."""
        self._heard[gateway] = self._clock()

    def serving(self, reply: str, session: str) -> None:
        """This worker got a command of ``session`` whose events go to ``reply``
        (``<prefix>.evt.<gateway>.<session>``); a reply subject of another form is not tracked."""
        gateway, dot, rest = reply.removeprefix(self._events).partition(".")
        if not reply.startswith(self._events) or not dot or not gateway or rest != session:
            return
        if self._gateway_of.get(session) == gateway:
            return
        self.forget(session)  # served by another gateway before: that one's silence no longer matters
        self._gateway_of[session] = gateway
        self._sessions.setdefault(gateway, {})[session] = self._clock()

    def forget(self, session: str) -> None:
        """``session`` ended here (``end``, idle, its lease): nothing to end any more."""
        gateway = self._gateway_of.pop(session, None)
        if gateway is None:
            return
        sessions = self._sessions[gateway]
        del sessions[session]
        if not sessions:
            del self._sessions[gateway]

    def replaced(self, gateway: str, kept: set[str]) -> Lapse | None:
        """A new process of ``gateway`` took over ``kept``: its other sessions served here are
        nobody's any more (forgotten here: the caller ends them)."""
        self.heard(gateway)
        sessions = [s for s in self._sessions.get(gateway, {}) if s not in kept]
        for session in sessions:
            self.forget(session)
        return Lapse(gateway, tuple(sessions), 0.0, True) if sessions else None

    def disconnected(self) -> None:
        """The worker's NATS connection dropped: it hears nobody until it is back."""
        self._deaf = True

    def reconnected(self) -> None:
        """The worker's NATS connection is back: every gateway's silence starts again now."""
        self._deaf = False
        self._floor = self._clock()

    def expired(self) -> list[Lapse]:
        """The gateways silent for longer than the lease, each with its sessions whose lease ran
        out (forgotten here: the caller ends them). Costs one look per gateway and one per
        session ended."""
        if self.lease <= 0 or self._deaf:
            return []
        now = self._clock()
        out: list[Lapse] = []
        for gateway in [g for g, t in self._heard.items() if now - t > self.lease and g not in self._sessions]:
            del self._heard[gateway]  # gone, and nothing of it here: no need to remember it
        for gateway, sessions in list(self._sessions.items()):
            last = self._heard.get(gateway)
            since = max(last if last is not None else -math.inf, self._floor)
            if now - since <= self.lease:
                continue
            lapsed = []
            for session, first in sessions.items():  # oldest first: the first still within its lease ends the look
                if now - max(since, first) <= self.lease:
                    break
                lapsed.append(session)
            if not lapsed:
                continue
            silence = now - max(since, sessions[lapsed[0]])
            for session in lapsed:
                self.forget(session)
            out.append(Lapse(gateway, tuple(lapsed), silence, last is not None))
        return out

    def __len__(self) -> int:
        """Sessions tracked."""
        return len(self._gateway_of)
