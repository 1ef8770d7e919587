"""The service's open-file limit: raised at start-up to what its limits need, given back to commands.

A service holds a socket per connection and, per session that ran a command, its zygote's socket
and its ready shells' pipes (13 descriptors with the sandbox on), and per running command its
pipes, pidfd and cell (8 more). The usual soft ``RLIMIT_NOFILE`` of 1024 (systemd's default, and
so most shells') then runs out at about 75 busy sessions, far below ``--max-connections``' 1024:
commands fail with "Too many open files", and new connections are closed by the event loop without
a word (libuv's answer to ``EMFILE``). As the Go runtime does for every program and systemd advises
for services, the service raises its soft limit at start-up, within the hard one, as far as its
limits need (:func:`needed`); a hard limit below that is said once, with what to do.

Commands get back the soft limit the service was started with: a large one is the service's need,
not theirs, and some programs pay for it (``select()`` cannot take a descriptor past 1023; some
close every descriptor up to the limit at start). The sandbox program sets it before the exec
(``--open-files``, :func:`for_commands`); an unsandboxed command gets it from :func:`give_back`
just after its spawn, as the rlimit fallbacks of :mod:`smith_fast.containment` are set.
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass

__all__ = ["PER_PROCESS", "PER_SESSION", "SPARE", "Raised", "for_commands", "give_back", "needed", "raise_for"]

PER_SESSION = 16  # a connection's socket, its session's zygote socket and ready shells (13 measured), slack
PER_PROCESS = 8  # a running or background command: its pipes, pidfd, cell (8 measured)
SPARE = 256  # listeners, logs, the loop's own, hooks, recordings, NATS, the egress proxy's upstreams

_started_with = (0, 0)  # the (soft, hard) limits before raise_for raised the soft one; soft 0: not raised


@dataclass(frozen=True, slots=True)
class Raised:
    """What :func:`raise_for` did.

    Attributes:
        before: the soft limit the process was started with.
        after: the soft limit now.
        hard: the hard limit (``resource.RLIM_INFINITY`` for none).
        needed: what the limits need (:func:`needed`).
    """

    before: int
    after: int
    hard: int
    needed: int

    @property
    def short(self) -> bool:
        """The hard limit is below what the limits need."""
        return self.after < self.needed

    def sessions(self, processes: int) -> int:
        """About how many sessions that ran commands the soft limit holds beside ``processes``
        commands running."""
        return max(0, (self.after - SPARE - processes * PER_PROCESS) // PER_SESSION)


def needed(connections: int, processes: int) -> int:
    """Descriptors a service with ``connections`` sessions, each of which ran a command, and
    ``processes`` commands running or kept in the background needs at most (about)."""
    return connections * PER_SESSION + processes * PER_PROCESS + SPARE


def raise_for(connections: int, processes: int) -> Raised:
    """Raise this process's soft ``RLIMIT_NOFILE`` to :func:`needed` (never above the hard limit,
    never lower than it is); commands then get the one it had first (:func:`for_commands`)."""
    global _started_with
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = _started_with[0] or soft  # a second service in one process (the tests) raises it further
    want = needed(connections, processes)
    ceiling = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft == resource.RLIM_INFINITY or ceiling <= soft:
        return Raised(before, soft, hard, want)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    except (OSError, ValueError):  # a seccomp filter or a hard limit lowered meanwhile: keep what it is
        return Raised(before, soft, hard, want)
    _started_with = (before, hard)
    return Raised(before, ceiling, hard, want)


def for_commands() -> int:
    """The soft limit a command gets (the one the service was started with), or 0 when the service
    did not raise its own: a command then inherits it as it is."""
    return _started_with[0]


def give_back(pid: int) -> None:
    """Set the soft limit of ``pid`` (a command just spawned outside the sandbox program, with the
    service's limits) back to the one the service was started with. It runs meanwhile: what it
    opens before this is kept."""
    if not _started_with[0]:
        return
    with contextlib.suppress(OSError, ValueError):  # ESRCH: it exited already
        resource.prlimit(pid, resource.RLIMIT_NOFILE, _started_with)
