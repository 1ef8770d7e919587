"""Which workers are alive: their announcements, and the gateway's live set.

Each worker publishes an :class:`Announcement` (JSON) on the core NATS subject
``<prefix>.presence`` every ``--presence-interval``, at once when a gateway asks on
``<prefix>.presence.query``, and a last one with ``leaving`` when it stops. A gateway keeps the
latest of each worker in a :class:`LiveSet`, takes a worker silent for three intervals as gone
(its sessions end, ``worker_gone``), and places new sessions by what the announcements say
(smith_fast.nats.placement). A heartbeat costs one small message per worker and interval, is
not stored, and the gateway's view expires locally without asking the server anything.
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
    """What a worker says about itself (what a gateway places sessions by).

    Attributes:
        worker: its id (``--worker-id``; one subject token).
        version: its smith-fast version.
        capacity: processes it runs at once (``--max-processes``).
        running: processes it runs now.
        sessions: sessions it serves now (parked ones included).
        max_sessions: sessions it takes at most (``--max-sessions``).
        mem_available, mem_total: bytes of memory it may still use, and in all (its cgroup's
            ``memory.max``, else the machine's); 0 when unknown.
        labels: ``worker --label KEY=VALUE``: what a handshake's ``smith_fast.placement`` may ask for.
        templates: the names of its workspace templates (``worker --workspaces --template``): a
            handshake's ``smith_fast.template`` is placed on a worker that has it.
        draining: it stops (SIGTERM): it takes no new session.
        rtt: its last measured NATS round trip, in seconds (0 before the first).
        leaving: its last announcement: it stops now.
        background: the ids of its background processes, running or exited (``smith-fast ps``
            through a gateway asks the workers that list some).
        instance: a random id of its process, and ``started`` when it started (Unix seconds): two
            processes announcing one worker id are a mistake (both would take its sessions), which
            the one started later sees and stops for.
    """

    worker: str
    version: str
    capacity: int
    running: int = 0
    sessions: int = 0
    max_sessions: int = 0
    mem_available: int = 0
    mem_total: int = 0
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    templates: tuple[str, ...] = ()
    draining: bool = False
    rtt: float = 0.0
    leaving: bool = False
    background: tuple[str, ...] = ()
    instance: str = ""
    started: float = 0.0

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Announcement:
        """Parse an announcement (fields it does not know are ignored: a newer worker's).

        Raises:
            ValueError: not an announcement (bad JSON, missing or mistyped fields).
        """
        try:
            raw: Any = json.loads(data)
            if not isinstance(raw, dict):
                raise TypeError("not an object")
            known = {f.name for f in dataclasses.fields(cls)}
            kept = {k: v for k, v in raw.items() if k in known}
            background = kept.pop("background", [])
            if not isinstance(background, list) or not all(isinstance(p, str) for p in background):
                raise TypeError("background is not a list of process ids")
            labels = kept.pop("labels", {})
            if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
                raise TypeError("labels is not an object of strings")
            templates = kept.pop("templates", [])
            if not isinstance(templates, list) or not all(isinstance(t, str) for t in templates):
                raise TypeError("templates is not a list of names")
            ann = cls(**kept, labels=labels, background=tuple(background), templates=tuple(templates))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a worker announcement: {exc}") from None
        numbers = (ann.capacity, ann.running, ann.sessions, ann.max_sessions, ann.mem_available, ann.mem_total)
        if not isinstance(ann.worker, str) or not ann.worker or not all(isinstance(n, int) for n in numbers):
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
        """Take an announcement in; True when the set of live workers changed. Of two processes
        announcing one worker id (a mistake the later one stops for), the earlier one counts."""
        seen = self._workers.get(ann.worker)
        if (seen is not None and seen[1].instance and ann.instance and seen[1].instance != ann.instance
                and seen[1].started <= ann.started and self._clock() - seen[0] <= self.expiry):
            return False
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
        """The live workers' latest announcements, by id. A silent one is left out but not dropped:
        :meth:`expire` drops it, and its caller acts on each worker gone (ends its sessions)."""
        now = self._clock()
        return [ann for _, (seen, ann) in sorted(self._workers.items()) if now - seen <= self.expiry]

    def __len__(self) -> int:
        return len(self.alive())
