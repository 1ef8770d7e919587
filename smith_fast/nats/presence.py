"""Which workers are alive: their announcements, and the gateway's live set.

Each worker publishes an :class:`Announcement` (JSON) on the core NATS subject
``<prefix>.presence`` every ``--presence-interval``, at once when a gateway asks on
``<prefix>.presence.query``, and a last one with ``leaving`` when it stops. A gateway keeps the
latest of each worker in a :class:`LiveSet` and takes a worker silent for three intervals as gone.

Why heartbeats on a core subject rather than the JetStream consumer's info (its waiting pull
requests): the consumer info names no worker and carries neither its capacity, its running
requests nor its version; it costs a JetStream API request per look, and a worker that waits in
a long poll looks the same as one that died a moment ago until its pull request expires. A
heartbeat costs one small message per worker and interval, is not stored, and the gateway's view
expires locally without asking the server anything.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

__all__ = ["Announcement", "LiveSet", "EXPIRY_INTERVALS"]

EXPIRY_INTERVALS = 3  # a worker silent for this many presence intervals is taken as gone


@dataclasses.dataclass(frozen=True)
class Announcement:
    """What a worker says about itself.

    Attributes:
        worker: its id (``host:pid``).
        version: its smith-fast version.
        capacity: commands it runs at once (``--concurrency``).
        running: commands it runs now.
        dispatched: commands it was handed since it started (redeliveries included).
        redelivered: of those, handed to it after another delivery (a worker died or stalled).
        acked: commands it finished and acknowledged.
        events: event messages it published.
        rtt: its last measured NATS round trip, in seconds (0 before the first).
        leaving: its last announcement: it stops now.
        background: the ids of its background processes, running or exited
            (smith_fast/nats/processes.py: the gateways route to it what names one).
    """

    worker: str
    version: str
    capacity: int
    running: int = 0
    dispatched: int = 0
    redelivered: int = 0
    acked: int = 0
    events: int = 0
    rtt: float = 0.0
    leaving: bool = False
    background: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Announcement:
        """Parse an announcement.

        Raises:
            ValueError: not an announcement (bad JSON, missing or mistyped fields).
        """
        try:
            raw: Any = json.loads(data)
            if not isinstance(raw, dict):
                raise TypeError("not an object")
            known = {f.name: f.type for f in dataclasses.fields(cls)}
            kept = {k: v for k, v in raw.items() if k in known}
            background = kept.pop("background", [])
            if not isinstance(background, list) or not all(isinstance(p, str) for p in background):
                raise TypeError("background is not a list of process ids")
            ann = cls(**kept, background=tuple(background))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a worker announcement: {exc}") from None
        if not isinstance(ann.worker, str) or not ann.worker or not isinstance(ann.capacity, int) or not isinstance(ann.running, int):
            raise ValueError("not a worker announcement: worker, capacity and running are needed")
        return ann


class LiveSet:
    """The workers heard from recently, by id.

    Args:
        interval: the workers' presence interval; a worker silent for :data:`EXPIRY_INTERVALS`
            of them is dropped.
        clock: seconds, monotonic (a parameter for the tests).
    """

    def __init__(self, interval: float, clock: Any = time.monotonic) -> None:
        self.expiry = interval * EXPIRY_INTERVALS
        self._clock = clock
        self._workers: dict[str, tuple[float, Announcement]] = {}

    def heard(self, ann: Announcement) -> bool:
        """Take an announcement in; True when the set of live workers changed."""
        if ann.leaving:
            return self._workers.pop(ann.worker, None) is not None
        known = ann.worker in self._workers
        self._workers[ann.worker] = (self._clock(), ann)
        return not known

    def expire(self) -> list[str]:
        """Drop the workers silent for too long; their ids."""
        now = self._clock()
        gone = [w for w, (seen, _) in self._workers.items() if now - seen > self.expiry]
        for worker in gone:
            del self._workers[worker]
        return gone

    def alive(self) -> list[Announcement]:
        """The live workers' latest announcements, by id."""
        self.expire()
        return [ann for _, (_, ann) in sorted(self._workers.items())]

    def __len__(self) -> int:
        return len(self.alive())
