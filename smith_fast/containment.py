"""Every command runs in a cgroup of its own: it dies whole with its request, and says what it cost.

A process group is not a container: ``setsid``, a double fork or a daemonizing tool leaves it, and
then ``killpg`` misses it. A cgroup cannot be left (only root can move a process out, and the
commands' descendants are moved in by nobody), so killing the cgroup kills everything the command
started, whatever it did. :mod:`smith_fast.process` asks for a :class:`Cell` per command:

* **Where**: under the service's own cgroup (``/proc/self/cgroup``), in ``smith-fast-PID/cN``
  directories, so a delegated systemd unit works as well as root. The ``smith-fast-PID`` parents
  are made at start-up to see what the host allows, removed at once, and made again with the first
  cell: a service that runs no command leaves nothing behind, SIGKILLed or not (the child guard,
  which removes them after a SIGKILL, starts with the first command). :func:`available` ``keep``
  leaves them made, for a service about to lose the right to make them (``--workspaces``). cgroup v2 is preferred
  (``cgroup.kill`` kills every member at once, ``cpu.stat`` is always there); controllers bound to
  a cgroup v1 hierarchy on a hybrid machine (``memory``, ``pids``) are used there, next to it.
* **Joining**: the shell is born in its cell. Moving it in after ``Popen`` returned loses the race
  to a shell that forks at once (measured: ``sh -c 'setsid cmd &'`` had forked before the pid was
  written), and ``clone3(CLONE_INTO_CGROUP)`` is not reachable from ``subprocess``; so for the
  ``Popen`` call the service's process (v2) and event-loop thread (v1 ``tasks``) step into the cell
  and straight back out (:meth:`Cell.joined`; ~20 us per hierarchy and way). A sandboxed command's
  program is given the v2 cell instead (:meth:`Cell.v2_fd`: it clones its init into it), and the
  service steps into the v1 cells only. The limits are set
  only once the service is out, so it is never what they kill. A thread of the service that forks
  in those microseconds would put its child in the cell; :mod:`smith_fast.process` spawns from the
  event loop, and other spawners in threads hold :func:`spawn_guard`.
* **Born elsewhere**: a command a session's zygote forks (:mod:`smith_fast.sandbox.zygote`) is born
  in its cell by ``clone3(CLONE_INTO_CGROUP)`` from the cell's directories, opened once
  (:meth:`Cell.birth_fds`); its limits are set before, while the cell is empty (for the next command
  ahead of time, :func:`prepare_spare`), and the service never steps in.
* **Used again**: such a cell, found empty when its command ended, is kept for the next such command
  when what that one's :class:`Usage` says stays its own (:meth:`Cell.recycle`: at most a shell and
  its program at once all its life, a memory peak that resets, the other counters subtracted): no
  ``mkdir``, ``rmdir`` or limit write per command.
* **Moves wait, or not** (:func:`slow_moves`): a move of a whole process into a cgroup (a write
  to ``cgroup.procs``) takes the kernel's one ``cgroup_threadgroup_rwsem`` for writing, and unless
  a cgroup hierarchy is mounted with ``favordynmods`` (Linux >= 6.0) the first such move after an
  idle moment waits for an RCU grace period, with ``cgroup_mutex`` held (measured here: 5-8 ms for
  a 1-byte write after 0.3 s idle). A thread that moves itself (``"0"`` to a v1 ``tasks`` file)
  takes neither lock's write side and does not wait (0.3 ms), and neither does a birth into a v2
  cell (``clone3(CLONE_INTO_CGROUP)``). So a zygote's command is born in its v2 cell and joins
  its v1 ones by ``tasks`` (one thread: the process); a command started the one-shot way
  sandboxed is born in its v2 cell by the sandbox program (``--cgroup-fd``, :meth:`Cell.v2_fd`),
  and :meth:`Cell.joined` moves only the service's event-loop thread, in v1. Only an unsandboxed
  command still has the service step into its v2 cell as a whole (v2 has no ``tasks``) and waits
  after an idle moment; a service with ``--sandbox off`` says so at start-up with the remedy.
* **Ending**: :meth:`Cell.kill` (``cgroup.kill``, else SIGKILL to each member until none is left)
  when the shell exits, is killed, or the service stops; :mod:`smith_fast.childguard` is told the
  cell's directories, so a SIGKILLed service's leftovers die too.
* **Accounting** (:class:`Usage`): CPU from ``cpu.stat``, peak memory from ``memory.peak`` (v1:
  ``memory.max_usage_in_bytes``), processes from ``pids.peak``, bytes from ``io.stat``; what the
  cgroups cannot say comes from the shell's ``wait4`` rusage, which covers the descendants it
  waited for. A zygote's command's files are read by its init as it reaps the command
  (:meth:`Cell.usage_files`, :meth:`Cell.reported`): the same reads, out of the service's loop.
* **Limits** (:class:`CommandLimits`): ``memory.max``/``pids.max`` (v1: ``memory.limit_in_bytes``,
  ``pids.max``), hits read back from ``memory.events``/``memory.oom_control`` ``oom_kill`` and
  ``pids.events`` ``max``; CPU time is the v2 ``cpu.stat`` ``usage_usec`` of the whole cell, looked
  at every :data:`CPU_POLL` s (the cell is killed past it). Without the controllers: ``RLIMIT_AS``
  and ``RLIMIT_CPU`` on the shell, set right after the spawn (so per process, and a child the
  shell forked before that escapes them).

Without any writable cgroup hierarchy (an unprivileged container) :func:`new_cell` returns a cell
that only accounts from rusage and applies rlimits; the process group kill of
:mod:`smith_fast.process` is then all there is. Processes meant to outlive a request would get a
cell of their own that a request's end does not kill (the seam: :func:`new_cell` is per owner, not
per request).

Linux only.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import itertools
import os
import resource
import signal
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence

__all__ = [
    "CommandLimits",
    "cgroup_dir",
    "cgroup_mounts",
    "cgroup_paths",
    "cell_parents",
    "memory_bound",
    "moves_favored",
    "Cell",
    "Usage",
    "LIMIT_FLAGS",
    "available",
    "new_cell",
    "release_all",
    "set_enabled",
    "shortfall",
    "slow_moves",
    "spawn_guard",
]

LIMIT_FLAGS = {
    "memory": "--max-memory-per-command",
    "pids": "--max-pids-per-command",
    "cpu": "--max-cpu-per-command",
}
"""The option that sets each limit; a hit names it (:attr:`Usage.limit_hit`)."""

_V1_CONTROLLERS = ("memory", "pids")  # used from a v1 hierarchy when the v2 one lacks them
_KILL_ROUNDS = 50
CPU_POLL = 0.1
"""Seconds between two looks at a CPU-limited command's CPU time: how far past the limit it may get."""


@dataclasses.dataclass(frozen=True, slots=True)
class CommandLimits:
    """What one command (the shell and everything it starts) may use; 0 means no limit.

    Attributes:
        memory: bytes of memory (cgroup ``memory.max``; without the controller ``RLIMIT_AS`` per process).
        pids: processes and threads alive at once (cgroup ``pids.max``).
        cpu: CPU seconds of the whole command (cgroup ``cpu.stat``, looked at every :data:`CPU_POLL`
            seconds; without cgroup v2 ``RLIMIT_CPU`` per process).
    """

    memory: int = 0
    pids: int = 0
    cpu: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """What a command cost. Field names are the wire names (PROTOCOL.md, "Accounting").

    Attributes:
        cpu_user_us, cpu_system_us: CPU time of the whole command, microseconds.
        max_rss_bytes: the largest resident set of any one of its processes it waited for
            (rusage ``ru_maxrss``; as the shell is vforked, at least the service's own resident
            set at the spawn: the kernel keeps the high-water mark of the memory it was born in).
        memory_peak_bytes: the most memory the command held at once (cgroup ``memory.peak``, v1
            ``memory.max_usage_in_bytes``; includes page cache and kernel memory), or
            ``max_rss_bytes`` without a memory cgroup.
        io_read_bytes, io_write_bytes: bytes read from / written to storage (not the page cache).
        pids_peak: the most processes and threads alive at once (``pids.peak``; after a spawn
            through :meth:`Cell.joined` at least 2, the service's thread having been in the cell
            for its instant; 1 for a command born in its cell, or 2 in a cell used again after a
            command that ran two: :meth:`Cell.recycle`); 0 when unknown.
        source: ``cgroup`` when the command had a cgroup, else ``rusage``.
        limit_hit: the option of the limit the command hit (:data:`LIMIT_FLAGS`), else None.
    """

    cpu_user_us: int
    cpu_system_us: int
    max_rss_bytes: int
    memory_peak_bytes: int
    io_read_bytes: int
    io_write_bytes: int
    pids_peak: int
    source: str
    limit_hit: str | None = None

    def fields(self) -> dict[str, str]:
        """As LogEvent ``fields`` (strings; ``limit_hit`` only when set)."""
        out = {name: str(getattr(self, name)) for name in _USAGE_FIELDS}
        if self.limit_hit is not None:
            out["limit_hit"] = self.limit_hit
        return out

    def as_dict(self) -> dict[str, int | str | None]:
        """As a JSON object (the ``shell.run`` result's ``usage``)."""
        return dataclasses.asdict(self)


# Usage.fields()'s keys, in field order: taken once here, dataclasses.fields() rebuilt its tuple at
# every command's end.
_USAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Usage) if f.name != "limit_hit")


# -- the hierarchies ------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Tree:
    """Our directory in one cgroup hierarchy and what it offers."""

    parent: str  # smith-fast-PID, created by us, holds the cells
    home: str  # our own cgroup there, where the service returns after a spawn
    v2: bool
    controllers: frozenset[str]  # what a cell here can use (v2: enabled in parent's subtree_control)
    kill: bool = False  # v2 with cgroup.kill (Linux 5.14)


def _read(path: str, at: int | None = None) -> str:
    """The text of a cgroup file (``path`` relative to the directory fd ``at``, if given)."""
    # os-level: open() would add fstat, ioctl, two lseeks and another fstat to each of the four
    # usage files read between a command's exit and its final event; a short read is the whole of
    # a cgroup file (its text is made at the first read), so no second read for the EOF
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=at)
    try:
        return _pread_text(fd)
    finally:
        os.close(fd)


_ZY_EVENTS, _ZY_CPU, _ZY_MEMORY, _ZY_PIDS = 0x10, 0x20, 0x40, 0x80
"""csrc/sandbox_exec.c's ZY_* flags: the usage files a zygote request carries (:meth:`Cell.usage_files`)."""
_UNREPORTED = (-1, -1, -1, -1, -1)

_RESET = frozenset({"memory.max_usage_in_bytes"})
"""The files a reused cell writes as well as reads (:meth:`Cell.recycle` resets the v1 memory peak
after reading it): held open read-write, one ``pwrite`` per reuse instead of an open, a write and a
close."""


def _pread_text(fd: int) -> str:
    """The text of the cgroup file open on ``fd``, from its start (a read at offset 0 makes it afresh)."""
    chunks = [os.pread(fd, 65536, 0)]
    while len(chunks[-1]) == 65536:
        chunks.append(os.pread(fd, 65536, 65536 * len(chunks)))
    return b"".join(chunks).decode("ascii", "replace")


def _write(path: str, text: str, at: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=at)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _cgroup_mountinfo(path: str = "/proc/self/mountinfo") -> Iterator[tuple[str, str, str, list[str]]]:
    """(mount point, root inside the hierarchy, fs type, super options) of each cgroup mount in ``path``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
                continue
            yield fields[4].replace("\\040", " "), fields[3], rfields[0], rfields[2].split(",")


def cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fs type, v1 controllers) of each cgroup mount."""
    return [(point, root, kind, set(options) if kind == "cgroup" else set()) for point, root, kind, options in _cgroup_mountinfo()]


def cgroup_paths(pid: int | str = "self") -> dict[str, str]:
    """Hierarchy key (``""`` for v2, else a v1 controller) -> the cgroup path of ``pid`` in it."""
    out: dict[str, str] = {}
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def cgroup_dir(point: str, root: str, path: str) -> str:
    """The directory of cgroup ``path`` in a hierarchy mounted at ``point`` from its ``root``."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return point.rstrip("/") + "/" + path.strip("/") if path.strip("/") else point


_ZERO_BASE: tuple[int, ...] = (0, 0, 0, 0, 0, 0, 0, 0)
_MAX_SPARES = 4  # cells kept for the next commands (made ahead, or used again: Cell.recycle)
_REUSE_PIDS_PEAK = 2  # a shell and the program it runs: the most a cell may have held to be used again
_LEFT_CHARGED = 1 << 20  # bytes a cell may still hold charged to be used again
_OOM_MARGIN = 4 << 20  # a cell's peak this far below its memory limit: the limit was never reached
_UNBOUNDED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63


def memory_bound() -> tuple[int, int] | None:
    """``(limit, in use)`` bytes of this process's memory cgroup (v2 ``memory.max``, or v1
    ``memory.limit_in_bytes``), or None when it has no limit or none can be read."""
    try:
        own, mounts = cgroup_paths(), cgroup_mounts()
    except (OSError, ValueError):
        return None
    for point, root, kind, controllers in mounts:
        if kind == "cgroup2" and "" in own:  # (a hybrid layout's v2 tree may not offer memory: then v1's)
            files = cgroup_dir(point, root, own[""]), "memory.max", "memory.current"
        elif kind == "cgroup" and "memory" in controllers and "memory" in own:
            files = cgroup_dir(point, root, own["memory"]), "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        try:
            limit, used = _read(f"{files[0]}/{files[1]}").strip(), int(_read(f"{files[0]}/{files[2]}"))
        except (OSError, ValueError):
            continue
        if limit != "max" and limit.isdigit() and int(limit) < _UNBOUNDED:
            return int(limit), used
    return None


def _make_parent(base: str) -> str | None:
    parent = f"{base.rstrip('/')}/smith-fast-{os.getpid()}"
    try:
        os.mkdir(parent, 0o755)
    except FileExistsError:
        pass
    except OSError:  # EACCES/EROFS (not delegated), ENOENT (no such mount here)
        return None
    return parent


def _enable(parent: str, names: Iterable[str]) -> set[str]:
    """Turn on controllers ``names`` for the cells of a v2 ``parent``; those it took."""
    enabled = set()
    for name in names:
        with contextlib.suppress(OSError):
            _write(parent + "/cgroup.subtree_control", "+" + name)
            enabled.add(name)
    return enabled


def _discover() -> list[_Tree]:
    try:
        mounts, own = cgroup_mounts(), cgroup_paths()
    except (OSError, ValueError):
        return []
    trees: list[_Tree] = []
    have: set[str] = set()
    for point, root, kind, _ in mounts:
        if kind != "cgroup2" or "" not in own or trees:
            continue
        home = cgroup_dir(point, root, own[""])
        parent = _make_parent(home)
        if parent is None:
            continue
        try:
            offered = set(_read(parent + "/cgroup.controllers").split())
        except OSError:
            offered = set()
        enabled = _enable(parent, [name for name in ("memory", "pids", "io", "cpu") if name in offered])
        trees.append(_Tree(parent, home, True, frozenset(enabled), os.path.exists(parent + "/cgroup.kill")))
        have |= enabled
    for name in _V1_CONTROLLERS:
        if name in have or name not in own:
            continue
        for point, root, kind, names in mounts:
            if kind == "cgroup" and name in names:
                home = cgroup_dir(point, root, own[name])
                parent = _make_parent(home)
                if parent is not None:
                    trees.append(_Tree(parent, home, False, frozenset({name})))
                    have.add(name)
                break
    return trees


_lock = threading.Lock()
_trees: list[_Tree] | None = None
_made = False  # the parents exist now (else made again with the first cell: _cell_trees)
_serial = itertools.count(1)
_enabled = True
_spawn_lock = threading.Lock()  # one process in a cell at a time: the steps in and out pair up
_pending: list[str] = []  # cell directories whose members were still exiting at release


def _hierarchies(keep: bool = False) -> list[_Tree]:
    """The hierarchies, discovered at the first call; ``keep`` there leaves the parents made."""
    global _trees, _made
    with _lock:
        if _trees is None:
            _trees = _discover()
            _made = keep
            if not keep:  # what the host allows is known: made again with the first cell
                for tree in _trees:
                    _rmdir(tree.parent)
        return _trees


def _cell_trees() -> list[_Tree]:
    """:func:`_hierarchies`, their parents made (again) for a cell to be made in."""
    global _made
    trees = _hierarchies()
    if not _made:
        with _lock:
            if not _made:
                for tree in trees:
                    if _make_parent(tree.home) is not None and tree.v2:
                        _enable(tree.parent, tree.controllers)
                _made = True
    return trees


def available(*, keep: bool = False) -> dict[str, object]:
    """What containment this process gets: for logs and ``service_info`` (``kill``: how a cell ends).

    ``keep``: the cells' parents, made to see what the host allows, stay made (the first call
    decides): for a service that could not make them later (``--workspaces``, about to enter a user
    namespace where its uid no longer overrides permissions). Otherwise they go at once and come
    back with the first cell."""
    trees = _hierarchies(keep)
    controllers = sorted({c for t in trees for c in t.controllers})
    kill = "cgroup.kill" if any(t.kill for t in trees) else ("cgroup" if trees else "process-group")
    return {"kill": kill, "controllers": controllers, "cgroups": [t.parent for t in trees]}


# The controllers whose absence a service says at start-up, with what the command goes without.
_WANTED = (
    ("pids", "no pids controller: --max-pids-per-command is not enforced (a fork bomb meets the host's limits alone)"),
    ("memory", "no memory controller: --max-memory-per-command is RLIMIT_AS, per process"),
)


def shortfall() -> list[str]:
    """What commands go without here (empty: nothing): the start-up warning of a service whose host
    does not let it bound its commands as configured."""
    trees = _hierarchies()
    return _shortfall({c for t in trees for c in t.controllers} if trees else None)


def _shortfall(controllers: Collection[str] | None) -> list[str]:
    """:func:`shortfall` given the controllers the cells get (None: no writable cgroup at all)."""
    if controllers is None:
        return ["no writable cgroup: only a command's process group is killed at its end (what it detaches, a daemon, "
                "may outlive it), and its limits are RLIMIT_AS and RLIMIT_CPU, per process; --max-pids-per-command is not enforced"]
    return [text for name, text in _WANTED if name not in controllers]


def moves_favored(mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether a cgroup hierarchy is mounted with ``favordynmods``: the lock every cgroup move takes
    (one for all hierarchies) is then kept ready for writers, and no move waits for an RCU grace
    period (forks and exits take the lock's slower, shared path instead)."""
    try:
        return any("favordynmods" in options for _, _, _, options in _cgroup_mountinfo(mountinfo))
    except OSError:
        return False


def slow_moves(mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether an unsandboxed command (:meth:`Cell.joined` without ``v2_delegated``) waits for an
    RCU grace period (5-10 ms) after an idle moment: the service steps into its cgroup v2 cell by a
    move of its whole process, and no hierarchy is mounted with ``favordynmods``. A v1 cell is
    joined by a thread's own move, which never waits; a sandboxed command is born in its v2 cell."""
    trees = _hierarchies() if _enabled else []
    return any(t.v2 for t in trees) and not moves_favored(mountinfo)


def cell_parents() -> tuple[str, ...]:
    """The directories new cells are made in (``smith-fast-PID``, one per hierarchy; none without cgroups)."""
    return tuple(t.parent for t in _hierarchies()) if _enabled else ()


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: members still exiting
        return False
    return True


def _retry_pending() -> None:
    with _lock:
        _pending[:] = [p for p in _pending if not _rmdir(p)]


# -- a command's cell -----------------------------------------------------------------------------


def _parse_kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:  # not contextlib.suppress: four files a command, a line each at least
            out[key] = int(value.split()[0]) if value else 0
        except ValueError:
            pass
    return out


class Cell:
    """The cgroups one command runs in (none: rusage and rlimits only).

    Attributes:
        dirs: the cell's directory in each hierarchy (empty without cgroups).
        limits: what it may use.
    """

    __slots__ = ("dirs", "limits", "_v2", "_memory", "_pids", "_pid", "_killed", "_fallback", "_homes", "_hosting", "_born", "_timer",
                 "_cpu_hit", "_limited", "_io", "_base", "_seen", "_reusable", "_fds", "_emptied", "_at", "_open", "_files",
                 "_reported")

    def __init__(self, limits: CommandLimits, trees: list[_Tree]) -> None:
        self.limits = limits
        self.dirs: tuple[str, ...] = ()
        self._homes: list[tuple[str, str, bool]] = []  # (cell dir, our own cgroup dir, is v2)
        self._hosting = False  # the service could not step back out: never cgroup.kill this one
        self._born: set[str] = set()  # the cell dirs a spawn inside joined() was born in
        self._timer: asyncio.TimerHandle | None = None
        self._cpu_hit = False
        self._limited = False  # the limits were set before the command was born (birth_fds)
        self._v2: str | None = None
        self._io = False
        self._memory: tuple[str, bool] | None = None  # (dir, is v2)
        self._pids: str | None = None
        self._pid = 0
        self._killed = False
        # Counters of the cell's former commands (a cell used again: recycle), subtracted from what
        # the files say: CPU user and system us, io read and written bytes, OOM kills, refused forks;
        # then (not subtracted) the lifetime pids peak and the last memory peak.
        self._base = _ZERO_BASE
        self._seen = _ZERO_BASE  # what the last _usage read, the next command's base
        self._reusable = 0  # 1: its command is born in it elsewhere (birth_fds); 2: and was measured (recycle)
        self._fds: tuple[int, ...] = ()  # its directories, open while it lives (birth_fds)
        self._at: dict[str, int] = {}  # directory -> its open fd: files read by name beneath it (_file)
        self._open: dict[str, int] = {}  # "directory/name" -> the file, open while the directories are (_text)
        self._emptied = False  # kill() found it empty and left it unkilled
        self._files: tuple[int, tuple[int, ...]] | None = None  # usage_files(), made once
        # What a zygote's init read of the usage files at the command's end (reported()), until
        # the next command's: (populated, user us, system us, memory peak, pids peak), -1 unread
        self._reported: tuple[int, ...] = _UNREPORTED
        name = f"c{next(_serial)}"
        dirs = []
        for tree in trees:
            path = f"{tree.parent}/{name}"
            try:
                os.mkdir(path, 0o755)
            except OSError:
                continue
            dirs.append(path)
            self._homes.append((path, tree.home, tree.v2))
            if tree.v2:
                self._v2 = path
                self._io = "io" in tree.controllers  # io.stat is the io controller's
            if "memory" in tree.controllers:
                self._memory = (path, tree.v2)
            if "pids" in tree.controllers:
                self._pids = path
        self.dirs = tuple(dirs)
        self._fallback = limits.memory > 0 and self._memory is None

    @contextlib.contextmanager
    def joined(self, *, v2_delegated: bool = False) -> Iterator[None]:
        """While the body runs, the calling process (v2) and thread (v1) are in the cell, so a
        process it spawns is born there; afterwards they are back home. ``v2_delegated``: the
        process spawned starts its own in the v2 cell (``sandbox-exec --cgroup-fd`` on
        :meth:`v2_fd`), so the caller stays out of it: only the v1 steps, a thread's moves, which
        do not wait for an RCU grace period (a whole process's move into v2 does)."""
        entered: list[tuple[str, str, bool]] = []
        with _spawn_lock:
            try:
                for cell, home, v2 in self._homes:
                    if v2 and v2_delegated:
                        continue
                    try:
                        _write(cell + ("/cgroup.procs" if v2 else "/tasks"), "0")
                    except OSError:
                        continue
                    entered.append((cell, home, v2))
                self._born = {cell for cell, _, _ in entered}
                if v2_delegated and self._v2 is not None:
                    self._born.add(self._v2)
                yield
            finally:
                for cell, home, v2 in entered:
                    try:
                        _write(home + ("/cgroup.procs" if v2 else "/tasks"), "0")
                    except OSError:
                        self._hosting = True
                        from .logs import get_logger

                        get_logger("smith_fast.containment").error(
                            "could not leave a command's cgroup", extra={"fields": {"cgroup": cell, "home": home}})

    def v2_fd(self) -> int:
        """Its cgroup v2 directory, open while the cell lives (-1: it has none): for a program that
        starts the command born in it (``sandbox-exec --cgroup-fd``: ``clone3(CLONE_INTO_CGROUP)``),
        with :meth:`joined` ``v2_delegated``."""
        if self._v2 is None:
            return -1
        key = self._v2 + "/."
        fd = self._open.get(key)
        if fd is None:
            try:
                fd = self._open[key] = os.open(self._v2, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:  # the service steps in itself, as for an unsandboxed command
                return -1
        return fd

    def birth_fds(self) -> tuple[int, ...]:
        """For a command that another process starts in this cell (a zygote's
        ``clone3(CLONE_INTO_CGROUP)``, the v1 directories joined by the child before exec): the
        cell's limits are set now, while it is empty (unless they were, ahead), and its directories
        returned open (v2 first; they stay open while the cell lives, which may be for more than
        one command: :meth:`recycle`); :meth:`attach` then only records the pid. No step of the
        service into the cell and out."""
        if not self._limited:
            self._apply_limits()
            self._limited = True
        if not self._fds and self.dirs:
            fds: list[int] = []
            try:
                for path in self.dirs:
                    fds.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError:
                for fd in fds:
                    os.close(fd)
                raise
            self._fds = tuple(fds)
            self._at = dict(zip(self.dirs, fds))
        self._born = set(self.dirs)
        self._reusable = 1
        self._emptied = False
        return self._fds

    def usage_files(self) -> tuple[int, tuple[int, ...]]:
        """``(flags, fds)``: the usage files a zygote's init reads at the end of the command born
        in this cell (after :meth:`birth_fds`, which opens its directories), and the ``ZY_*`` flags
        of ``csrc/sandbox_exec.c`` that name them (in their order: ``cgroup.events``,
        ``cpu.stat``, the memory peak, ``pids.peak``, those the cell has); held open while the
        cell lives. The init's reads come back with the command's end (:meth:`reported`): the
        service's loop does not read them between a command's exit and its final event."""
        files = self._files
        if files is None:
            flags = 0
            fds: list[int] = []
            try:
                if self._v2 is not None and self._v2 in self._at:
                    at = self._at[self._v2]
                    fds += (self._held(self._v2, "cgroup.events", at), self._held(self._v2, "cpu.stat", at))
                    flags |= _ZY_EVENTS | _ZY_CPU
                if self._memory is not None and self._memory[0] in self._at:
                    path, v2 = self._memory
                    fds.append(self._held(path, "memory.peak" if v2 else "memory.max_usage_in_bytes", self._at[path]))
                    flags |= _ZY_MEMORY
                if self._pids is not None and self._pids in self._at:
                    fds.append(self._held(self._pids, "pids.peak", self._at[self._pids]))
                    flags |= _ZY_PIDS
            except OSError:  # a file it does not have (an older kernel's v2 without memory.peak): read here
                flags, fds = 0, []
            files = self._files = (flags, tuple(fds))
        return files

    def reported(self, stats: Sequence[int]) -> None:
        """What the init read of :meth:`usage_files` as it reaped the command (``-1``: not read):
        :meth:`kill`, :meth:`finish` and :meth:`recycle` take these instead of reading the files."""
        self._reported = tuple(stats)

    def _file(self, directory: str, name: str) -> tuple[str, int | None]:
        """``(path, dir fd)`` of file ``name`` of one of the cell's directories: by name beneath its
        open fd while it has one (no walk down the cgroup tree for each file), else the full path."""
        at = self._at.get(directory)
        return (name, at) if at is not None else (f"{directory}/{name}", None)

    def _text(self, directory: str, name: str) -> str:
        """The text of file ``name`` of one of the cell's directories. While the cell holds its
        directories open, the file stays open too and is read again with a pread at offset 0 (which
        makes a cgroup file's text afresh): one system call a read instead of three, for the usage
        files read between a command's exit and its final event; else as :func:`_read`."""
        at = self._at.get(directory)
        if at is None:
            return _read(f"{directory}/{name}")
        return _pread_text(self._held(directory, name, at))

    def _held(self, directory: str, name: str, at: int) -> int:
        """File ``name`` of one of the cell's directories (open on ``at``), opened once and held
        while the directories are; read-write for the files a reused cell resets (:data:`_RESET`)."""
        key = f"{directory}/{name}"
        fd = self._open.get(key)
        if fd is None:
            flags = os.O_RDWR if name in _RESET else os.O_RDONLY
            fd = self._open[key] = os.open(name, flags | os.O_CLOEXEC, dir_fd=at)
        return fd

    def _kv_of(self, directory: str, name: str) -> dict[str, int]:
        try:
            return _parse_kv(self._text(directory, name))
        except OSError:
            return {}

    def _int_of(self, directory: str, name: str) -> int | None:
        try:
            return int(self._text(directory, name).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _put(self, directory: str, name: str, text: str) -> None:
        path, at = self._file(directory, name)
        if at is not None and name in _RESET:  # read at each command's end: held open (_held)
            os.pwrite(self._held(directory, name, at), text.encode(), 0)
        else:
            _write(path, text, at)

    def _apply_limits(self) -> None:
        lim = self.limits
        if lim.memory > 0 and self._memory is not None:
            path, v2 = self._memory
            with contextlib.suppress(OSError):
                if v2:
                    _write(path + "/memory.max", str(lim.memory))
                    with contextlib.suppress(OSError):
                        _write(path + "/memory.swap.max", "0")
                else:
                    _write(path + "/memory.limit_in_bytes", str(lim.memory))
                    with contextlib.suppress(OSError):
                        _write(path + "/memory.memsw.limit_in_bytes", str(lim.memory))
        if lim.pids > 0 and self._pids is not None:
            with contextlib.suppress(OSError):
                _write(self._pids + "/pids.max", str(lim.pids))

    def attach(self, pid: int) -> None:
        """The shell ``pid`` was spawned (best inside :meth:`joined`): make sure it is in, set the
        cell's limits and its rlimits (what it starts inherits both)."""
        self._pid = pid
        text = str(pid)
        for cell in self.dirs:
            if cell not in self._born:  # a spawn outside joined(), or a hierarchy it could not enter
                with contextlib.suppress(OSError):  # ESRCH: it exited already
                    _write(cell + "/cgroup.procs", text)
        if not self._limited:
            self._apply_limits()
        lim = self.limits
        with contextlib.suppress(OSError, ValueError):
            if lim.cpu > 0 and self._v2 is None:  # per process, and only from here on: a fallback
                soft = max(1, int(lim.cpu + 0.999))
                resource.prlimit(pid, resource.RLIMIT_CPU, (soft, soft + 1))
            if self._fallback:
                resource.prlimit(pid, resource.RLIMIT_AS, (lim.memory, lim.memory))

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Enforce the CPU limit on the whole command: its cgroup's ``cpu.stat`` is read every
        :data:`CPU_POLL` seconds, and the cell killed once past the limit (no-op without one)."""
        if self.limits.cpu > 0 and self._v2 is not None and not self._killed:
            self._timer = loop.call_later(CPU_POLL, self._check_cpu, loop)

    def _check_cpu(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self._killed or self._v2 is None:
            return
        if self._kv_of(self._v2, "cpu.stat").get("usage_usec", 0) >= self.limits.cpu * 1e6:
            self._cpu_hit = True
            self.kill()
        else:
            self._timer = loop.call_later(CPU_POLL, self._check_cpu, loop)

    def kill(self) -> None:
        """SIGKILL every process in the cell, whatever session or group it moved to. Idempotent
        in effect; the first call is what counts (the callers call it at every way a command ends)."""
        self._killed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._v2 is not None and not self._hosting:
            try:
                # A cell that may be used again is looked at first: once killed, a process cloned
                # into it (CLONE_INTO_CGROUP) is killed at birth on this kernel (its kill count is
                # compared with the parent's cgroup's), so an empty one is left unkilled.
                if self._reusable:
                    populated = self._reported[0]  # the init's read at the reap (reported), or the file's
                    if populated < 0:
                        populated = 0 if b"populated 0" in self._text(self._v2, "cgroup.events").encode() else 1
                    if populated == 0:
                        self._emptied = True
                        return
                self._reusable = 0
                self._put(self._v2, "cgroup.kill", "1")
                return
            except OSError:  # ENOENT before Linux 5.14
                pass
        self._reusable = 0
        for path in self.dirs[:1]:
            _kill_members(path)

    def finish(self, rusage: resource.struct_rusage | None, returncode: int | None, *, release: bool = True) -> Usage:
        """After the shell was reaped: what the command cost and which limit it hit; then the
        cell's directories are removed (later, if members are still exiting; without ``release``
        when the caller calls :meth:`release`)."""
        usage = self._usage(rusage, returncode)
        if release:
            self.release()
        return usage

    def _usage(self, ru: resource.struct_rusage | None, returncode: int | None) -> Usage:
        user = int(ru.ru_utime * 1e6) if ru else 0
        system = int(ru.ru_stime * 1e6) if ru else 0
        max_rss = ru.ru_maxrss * 1024 if ru else 0
        read_b = ru.ru_inblock * 512 if ru else 0
        write_b = ru.ru_oublock * 512 if ru else 0
        peak = max_rss
        pids_peak = 0
        hit: str | None = None
        base = self._base
        seen = list(base)
        told = self._reported
        if self._v2 is not None:
            cpu_user, cpu_system = told[1], told[2]  # the init's read (reported), or the file's
            if cpu_user < 0 or cpu_system < 0:
                cpu = self._kv_of(self._v2, "cpu.stat")
                cpu_user, cpu_system = cpu.get("user_usec", -1), cpu.get("system_usec", 0)
            if cpu_user >= 0:  # includes the members that were never waited for
                seen[0], seen[1] = cpu_user, cpu_system
                user, system = max(user, seen[0] - base[0]), max(system, seen[1] - base[1])
            if self._io:
                with contextlib.suppress(OSError):
                    rb = wb = 0
                    for line in self._text(self._v2, "io.stat").splitlines():
                        for item in line.split()[1:]:
                            key, _, value = item.partition("=")
                            if key == "rbytes":
                                rb += int(value)
                            elif key == "wbytes":
                                wb += int(value)
                    seen[2], seen[3] = rb, wb
                    read_b, write_b = max(read_b, rb - base[2]), max(write_b, wb - base[3])
        if self._memory is not None:
            path, v2 = self._memory
            held = told[3] if told[3] >= 0 else self._int_of(path, "memory.peak" if v2 else "memory.max_usage_in_bytes")
            if held is not None:
                peak = seen[7] = held
            # The OOM killer acts in this cell only once its charge reached the limit: a peak well
            # below it needs no look at the events (the limit's own, or a parent's without one)
            if held is None or not 0 < held < self.limits.memory - _OOM_MARGIN:
                seen[4] = self._kv_of(path, "memory.events" if v2 else "memory.oom_control").get("oom_kill", 0)
                if seen[4] > base[4]:
                    hit = LIMIT_FLAGS["memory"]
        if self._pids is not None:
            most = told[4] if told[4] >= 0 else self._int_of(self._pids, "pids.peak")
            pids_peak = most or 0
            seen[6] = most if most is not None else _UNBOUNDED
            # a fork refused at pids.max leaves the peak at the limit: below it, none was
            if hit is None and self.limits.pids > 0 and (most is None or most >= self.limits.pids):
                seen[5] = self._kv_of(self._pids, "pids.events").get("max", 0)
                if seen[5] > base[5]:
                    hit = LIMIT_FLAGS["pids"]
        self._seen = tuple(seen)
        if self._reusable == 1:
            self._reusable = 2
        if hit is None and self._cpu_hit:
            hit = LIMIT_FLAGS["cpu"]
        if hit is None and self.limits.cpu > 0 and self._v2 is None and returncode in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU):
            if user + system >= self.limits.cpu * 1e6 * 0.9:
                hit = LIMIT_FLAGS["cpu"]
        if hit is None and self._fallback and returncode not in (0, None):
            if max_rss >= self.limits.memory * 0.5:  # RLIMIT_AS: allocations failed near the limit
                hit = LIMIT_FLAGS["memory"]
        return Usage(
            cpu_user_us=user, cpu_system_us=system, max_rss_bytes=max_rss, memory_peak_bytes=peak,
            io_read_bytes=read_b, io_write_bytes=write_b, pids_peak=pids_peak,
            source="cgroup" if self.dirs else "rusage", limit_hit=hit,
        )  # fmt: skip

    def recycle(self) -> bool:
        """After :meth:`finish`: make this cell the next command's, if nothing of its command is
        left and what the next one's :class:`Usage` says will be its own: its command was born in
        it elsewhere (a zygote's: the service never stepped in), hit no limit, never held more than
        two processes at once all its life (a shell and what it runs: ``pids.peak`` cannot be reset,
        so the next command's peak reads at least 2 once a command ran two, and exact above), left
        under 1 MiB charged, and the memory peak can be reset (v1; v2's ``memory.peak`` resets only
        for one open file). The counters that cannot be reset are kept as a base
        (:meth:`_usage` subtracts it). True: it is a spare again (three ``mkdir``, three ``rmdir``
        and the limit writes saved); False: :meth:`release` it."""
        if not (self._reusable == 2 and self._v2 is not None and self.dirs and not self._cpu_hit and not self._hosting
                and len(_spares) < _MAX_SPARES):
            return False
        if self._pids is not None and self._seen[6] > _REUSE_PIDS_PEAK:
            return False
        if self._memory is not None and self._memory[1]:
            return False
        try:
            # empty when its command ended (kill() looked), and nothing enters a cell but through us
            if not self._emptied and b"populated 0" not in self._text(self._v2, "cgroup.events").encode():
                return False  # what the kill ended is still exiting
            if self._memory is not None:
                # what it left charged (the page cache of files it wrote) would count as the next one's
                # (what it holds now is at most its peak: a small peak needs no look)
                if self._seen[7] > _LEFT_CHARGED and (self._int_of(self._memory[0], "memory.usage_in_bytes") or 0) > _LEFT_CHARGED:
                    return False
                self._put(self._memory[0], "memory.max_usage_in_bytes", "0")
        except OSError:
            return False
        self._base = self._seen
        self._reported = _UNREPORTED
        self._reusable = 0
        self._killed = False
        self._born = set()
        self._pid = 0
        _spares.append(self)
        return True

    def release(self) -> None:
        """Remove the cell's directories (killing what is left first), or keep it as the next
        command's when it can be (:meth:`recycle`)."""
        if not self.dirs or self.recycle():
            return
        if not self._killed:
            self.kill()
        fds, self._fds, self._at = self._fds, (), {}
        opened, self._open = self._open, {}
        self._files = None
        for fd in (*opened.values(), *fds):
            os.close(fd)
        dirs, self.dirs = self.dirs, ()
        busy = [d for d in dirs if not _rmdir(d)]
        if busy:
            with _lock:
                _pending.extend(busy)


def _kill_members(path: str) -> None:
    """SIGKILL each process listed in ``path/cgroup.procs`` until it lists none (no ``cgroup.kill``)."""
    for _ in range(_KILL_ROUNDS):
        try:
            pids = [int(p) for p in _read(path + "/cgroup.procs").split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        pids = [p for p in pids if p != os.getpid()]  # never the service (a failed step out)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def spawn_guard() -> threading.Lock:
    """Hold this (``with containment.spawn_guard():``) around a spawn made from another thread
    (``rg`` for ``fs.search``, ``rustc`` for a hook), so its child is not born in a command's cell
    while the service is stepping through it (:meth:`Cell.joined`)."""
    return _spawn_lock


def set_enabled(enabled: bool) -> None:
    """Give new cells cgroups (the default, where a hierarchy is writable) or not (rusage and
    rlimits only): the benchmark's "without", and the seam for an explicit opt-out."""
    global _enabled
    _enabled = enabled


def new_cell(limits: CommandLimits | None = None, *, born_elsewhere: bool = False) -> Cell:
    """A new cell for one command, with ``limits`` applied (in the cgroups it has): the spare
    one :func:`prepare_spare` made, if there is one.

    ``born_elsewhere``: the command is born in the cell by another process (a zygote, through
    :meth:`Cell.birth_fds`), not through :meth:`Cell.joined`; then a spare whose limits were set
    ahead (the last such command's) is taken as it is. A spare with limits never goes to a spawn
    through :meth:`Cell.joined`: the service would step into a limited cell."""
    global _last_limits
    if _pending:
        _retry_pending()
    wanted = limits or CommandLimits()
    if born_elsewhere:
        _last_limits = wanted
    # a spare with limits set goes only to a command born elsewhere with the same limits (a limit
    # once written is not taken back)
    if _enabled and _spares and (not _spares[-1]._limited or (born_elsewhere and _spares[-1].limits == wanted)):
        cell = _spares.pop()
        cell.limits = wanted
        cell._fallback = cell.limits.memory > 0 and cell._memory is None
        return cell
    if _enabled and born_elsewhere and _spares and _spares[0].limits == wanted and _spares[0]._limited:
        return _spares.pop(0)
    return Cell(wanted, _cell_trees() if _enabled else [])


_spares: list[Cell] = []
_last_limits: CommandLimits | None = None  # those of the last command born elsewhere


def prepare_spare() -> None:
    """Make the next command's cell now (its directories, empty), while nothing waits for it:
    :func:`new_cell` takes it. When the last command was born elsewhere (a zygote's), its limits
    are set now too, off the next command's path. One at most; :func:`release_all` removes it."""
    if _enabled and not _spares:
        trees = _cell_trees()
        if trees:
            cell = Cell(_last_limits or CommandLimits(), trees)
            if _last_limits is not None:
                cell._apply_limits()
                cell._limited = True
            _spares.append(cell)


def release_all(timeout: float = 1.0) -> None:
    """Remove the cells whose members were still exiting and our parent directories (at exit)."""
    deadline = time.monotonic() + timeout
    with _lock:
        trees = _trees or []
    # The whole tree is tried again until the deadline, not once: a cell whose last member is still
    # exiting refuses rmdir for a moment (v1 memory, seen in CI), and a clean exit tells the child
    # guard not to sweep, so what is left here would stay.
    while True:
        _retry_pending()
        left = False
        for tree in trees:
            with contextlib.suppress(OSError):
                for entry in os.scandir(tree.parent):
                    if entry.is_dir(follow_symlinks=False):
                        _kill_members(entry.path)
                        _rmdir(entry.path)
            left = not _rmdir(tree.parent) or left
        if (not left and not _pending) or time.monotonic() > deadline:
            break
        time.sleep(0.01)


atexit.register(release_all)
