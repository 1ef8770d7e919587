"""Where a gateway places a new session: one live worker, by labels and load.

A session stays on the worker it is placed on for its whole life (its files, processes, hooks and
resume retention are there), so the choice is made once, at its handshake, from the workers'
presence announcements (smith_fast.nats.presence):

* **fits**: not draining, the same major version, every ``KEY=VALUE`` the handshake asked for in
  ``client_info["smith_fast.placement"]`` among its ``--label``s, the workspace template it names
  (``smith_fast.template``) among its templates, a session slot free (``--max-sessions``); a resume,
  or a fork of a checkpoint (its id names the worker that holds its layers), goes to that worker;
* **load**: the fuller of its process slots and its session slots, plus half the share of its
  memory in use; a session placed here since the worker's last announcement counts as one more
  (several sessions arriving at once do not all go to the same worker);
* the least loaded that fits; of equally loaded ones, one at random (several gateways placing at
  once, each counting what it placed, do not all pick the same worker).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from .._version import __version__
from ..workspaces import TEMPLATE_KEY
from .presence import Announcement

__all__ = ["PLACEMENT_KEY", "Placement", "parse_labels"]

PLACEMENT_KEY = "smith_fast.placement"
"""The ``HandshakeCommand.client_info`` key naming the labels a session's worker must have."""


def parse_labels(text: str, what: str = "placement") -> dict[str, str]:
    """``KEY=VALUE[,KEY=VALUE...]`` as a dict.

    Raises:
        ValueError: an item is not ``KEY=VALUE`` with a non-empty key.
    """
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _major(version: str) -> str:
    return version.split(".", 1)[0]


class Placement:
    """Chooses workers for one gateway's new sessions.

    Args:
        rng: the random choice between the two least loaded (a parameter for the tests).
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._placed: dict[str, int] = {}  # worker -> sessions placed there since its last announcement

    def heard(self, worker: str) -> None:
        """A new announcement of ``worker``: it counts the sessions placed there since."""
        self._placed.pop(worker, None)

    def fits(self, ann: Announcement, wanted: Mapping[str, str]) -> bool:
        if ann.draining or ann.leaving or _major(ann.version) != _major(__version__):
            return False
        for key, value in wanted.items():
            if not (value in ann.templates if key == TEMPLATE_KEY else ann.labels.get(key) == value):
                return False
        return ann.max_sessions <= 0 or ann.sessions + self._placed.get(ann.worker, 0) < ann.max_sessions

    def load(self, ann: Announcement) -> float:
        placed = self._placed.get(ann.worker, 0)
        processes = ann.running / ann.capacity if ann.capacity > 0 else 0.0
        sessions = (ann.sessions + placed) / ann.max_sessions if ann.max_sessions > 0 else 0.0
        memory = 1.0 - ann.mem_available / ann.mem_total if ann.mem_total > 0 else 0.0
        return max(processes, sessions) + 0.5 * memory

    def choose(self, workers: Iterable[Announcement], wanted: Mapping[str, str], exclude: Iterable[str] = ()) -> str | None:
        """The worker for a new session, or None when none fits; it counts as placed there."""
        skip = set(exclude)
        fitting = [(self.load(a), a.worker) for a in workers if a.worker not in skip and self.fits(a, wanted)]
        if not fitting:
            return None
        least = min(load for load, _ in fitting)
        worker = self._rng.choice([w for load, w in fitting if load <= least + 1e-9])
        self._placed[worker] = self._placed.get(worker, 0) + 1
        return worker
