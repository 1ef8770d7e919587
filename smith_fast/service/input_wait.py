""""Waiting for input": tell the peer once when a command with open stdin or a pty blocks reading it.

A frontend driving an interactive command cannot tell a prompt (``name? ``, a REPL, ``vi``) from a
long computation by silence alone. The kernel can: a process asleep in ``read`` on the pipe the
service writes, or on its terminal, is waiting for the peer. So after ``--input-wait-notice``
seconds without output or input, :class:`InputWatch` looks at the command's processes (the shell
and its descendants; with a pty only the terminal's foreground process group) and, if one sleeps
reading the command's stdin, sends one ``LogEvent`` (``fields.reason = waiting_for_input``) for the
request. It says so again only after the command produced output or took input and blocked anew.

What "reading" is comes from ``/proc/PID/syscall`` (the syscall a sleeping process is in and its
arguments), by the tables below: ``read`` and kin on the stdin fd; ``select``/``poll``/``epoll``
waiting for that fd to be readable (``vi`` and the Python REPL wait in ``pselect6``). Where the
syscall file cannot be read (a process that is not dumpable), ``/proc/PID/wchan`` with the process's
fd 0 is the fallback. What this kernel (6.x, x86_64) shows, checked with real programs: ``cat``,
``read -p``, ``python3 -c 'input()'`` on a pipe sleep in ``read(0, …)`` at ``anon_pipe_read``
(``pipe_read`` on older kernels); on a pty in ``read(0, …)`` at ``wait_woken`` (``n_tty_read``);
``less`` and ``getpass`` read fd 3 (``/dev/tty``); ``vi``, ``python3`` and ``bash -i`` wait in
``pselect6(1, …)`` at ``poll_schedule_timeout``; ``sleep`` is in ``clock_nanosleep`` at
``hrtimer_nanosleep`` and never counts.

Cost: nothing for a command without open stdin or a pty; for one with, a flag set per output read
and a timer every ``--input-wait-notice`` seconds while it is silent and not known to be waiting
(a few small ``/proc`` reads each).
"""

from __future__ import annotations

import asyncio
import os
import platform
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, Protocol

from ..pb import smith_pb2 as pb

if TYPE_CHECKING:
    from .sinks import EventSink

__all__ = ["Blocked", "InputWatch", "Target", "WAITING_FOR_INPUT", "Interactive", "blocked_on_input", "notifier", "target_of"]

_P = ParamSpec("_P")

WAITING_FOR_INPUT = "waiting_for_input"
"""``LogEvent.fields["reason"]`` of the notice."""

_MAX_PROCESSES = 256  # of one command's tree looked at per check: a fork bomb costs a bounded check
_MAX_FDS = 1024  # FD_SETSIZE: select() cannot wait on more; poll() arrays looked at up to this

# How a sleeping syscall names the fds it waits to read: its number -> the way to find them.
_READ, _SELECT, _POLL, _EPOLL = "read", "select", "poll", "epoll"
_SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {
        0: _READ, 17: _READ, 19: _READ, 295: _READ, 327: _READ,  # read pread64 readv preadv preadv2
        23: _SELECT, 270: _SELECT,  # select pselect6
        7: _POLL, 271: _POLL,  # poll ppoll
        232: _EPOLL, 281: _EPOLL, 441: _EPOLL,  # epoll_wait epoll_pwait epoll_pwait2
    },
    "aarch64": {
        63: _READ, 65: _READ, 67: _READ, 69: _READ, 286: _READ,
        72: _SELECT,
        73: _POLL,
        22: _EPOLL, 441: _EPOLL,
    },
}
_CALLS = _SYSCALLS.get(platform.machine(), {})

# The fallback when /proc/PID/syscall cannot be read: where in the kernel a reader of fd 0 sleeps.
_WCHANS: dict[bool, frozenset[str]] = {
    False: frozenset({"pipe_read", "anon_pipe_read", "pipe_wait", "pipe_wait_readable"}),  # a pipe
    True: frozenset({"n_tty_read", "wait_woken"}),  # a terminal
}

_PTY_SLAVE_MAJORS = range(136, 144)  # UNIX98_PTY_SLAVE_MAJOR and the 7 after it
_DEV_TTY = os.makedev(5, 0)  # /dev/tty: the controlling terminal (ours, for a foreground process)
_POLLIN = 0x001 | 0x040  # POLLIN | POLLRDNORM (EPOLLIN has the same value)


@dataclass(frozen=True, slots=True)
class Target:
    """What counts as the command's input: the pipe it reads (``pipe`` its inode) or its terminal
    (``pty``; ``foreground`` its foreground process group, None when unknown)."""

    pty: bool
    pipe: tuple[int, int] | None = None  # (st_dev, st_ino) of the stdin pipe
    foreground: int | None = None


@dataclass(frozen=True, slots=True)
class Blocked:
    """A process asleep waiting to read the command's input."""

    pid: int
    fd: int  # the fd it reads (-1: known from wchan only, fd 0)
    call: str  # read, select, poll, epoll, or wchan


class Interactive(Protocol):
    """What :class:`InputWatch` needs of a running command (:class:`~smith_fast.process.ShellProcess`)."""

    @property
    def pid(self) -> int: ...
    @property
    def is_pty(self) -> bool: ...
    @property
    def stdin_fd(self) -> int: ...
    @property
    def stdin_open(self) -> bool: ...
    @property
    def returncode(self) -> int | None: ...


def target_of(proc: Interactive) -> Target | None:
    """The command's input as it is now; None once its stdin is closed."""
    fd = proc.stdin_fd
    if fd < 0 or not proc.stdin_open:
        return None
    try:
        if proc.is_pty:
            try:
                foreground: int | None = os.tcgetpgrp(fd)  # the master side answers for the slave
            except OSError:
                foreground = None
            return Target(pty=True, foreground=foreground)
        st = os.fstat(fd)
    except OSError:
        return None
    return Target(pty=False, pipe=(st.st_dev, st.st_ino))


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", "replace")
    except OSError:
        return None


def _tree(root: int) -> Iterator[int]:
    """``root`` and its descendants (``/proc/PID/task/TID/children``), at most :data:`_MAX_PROCESSES`."""
    todo, seen = [root], 0
    while todo and seen < _MAX_PROCESSES:
        pid = todo.pop()
        seen += 1
        yield pid
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            children = _read(f"/proc/{pid}/task/{tid}/children")
            if children:
                todo.extend(int(c) for c in children.split())


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) from ``/proc/PID/stat``."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    rest = text.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    try:
        return rest[0], int(rest[2])
    except (IndexError, ValueError):
        return None


def _is_input(pid: int, fd: int, target: Target) -> bool:
    try:
        st = os.stat(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    if target.pty:
        return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev) in _PTY_SLAVE_MAJORS or st.st_rdev == _DEV_TTY)
    return stat.S_ISFIFO(st.st_mode) and (st.st_dev, st.st_ino) == target.pipe


def _memory(pid: int, address: int, size: int) -> bytes | None:
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.pread(fd, size, address)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def _select_fds(pid: int, args: list[int]) -> list[int]:
    nfds, readfds = min(args[0], _MAX_FDS), args[1]
    if not readfds or nfds <= 0:
        return []
    bits = _memory(pid, readfds, (nfds + 63) // 64 * 8)  # the kernel reads whole longs
    if bits is None:
        return []
    return [fd for fd in range(nfds) if bits[fd // 8] >> (fd % 8) & 1]


def _poll_fds(pid: int, args: list[int]) -> list[int]:
    array, nfds = args[0], min(args[1], _MAX_FDS)
    data = _memory(pid, array, nfds * 8) if array and nfds > 0 else None
    if data is None:
        return []
    return [fd for fd, events, _ in struct.iter_unpack("ihh", data) if fd >= 0 and events & _POLLIN]


def _epoll_fds(pid: int, args: list[int]) -> list[int]:
    text = _read(f"/proc/{pid}/fdinfo/{args[0]}") or ""
    fds = []
    for line in text.splitlines():  # "tfd:        0 events:       19 data: …"
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "tfd:" and parts[2] == "events:":
            try:
                if int(parts[3], 16) & _POLLIN:
                    fds.append(int(parts[1]))
            except ValueError:
                pass
    return fds


_FDS: dict[str, Callable[[int, list[int]], list[int]]] = {
    _READ: lambda _pid, args: [args[0]],
    _SELECT: _select_fds,
    _POLL: _poll_fds,
    _EPOLL: _epoll_fds,
}


def _waiting(pid: int, target: Target) -> Blocked | None:
    line = _read(f"/proc/{pid}/syscall") if _CALLS else None
    if line is None:  # not ours to look at (not dumpable), or no table for this CPU: where it sleeps, and its fd 0
        wchan = (_read(f"/proc/{pid}/wchan") or "").partition(".")[0]
        return Blocked(pid, -1, "wchan") if wchan in _WCHANS[target.pty] and _is_input(pid, 0, target) else None
    words = line.split()
    try:
        call = _CALLS.get(int(words[0]))
        args = [int(w, 16) for w in words[1:7]]
    except (IndexError, ValueError):  # "running", or "-1 …" (not in a syscall)
        return None
    if call is None or len(args) < 6:
        return None
    for fd in _FDS[call](pid, args):
        if 0 <= fd < 1 << 20 and _is_input(pid, fd, target):
            return Blocked(pid, fd, call)
    return None


def blocked_on_input(root: int, target: Target) -> Blocked | None:
    """The first process of the command rooted at ``root`` found asleep waiting to read ``target``."""
    for pid in _tree(root):
        state = _stat(pid)
        if state is None or state[0] != "S":
            continue
        if target.pty and target.foreground is not None and state[1] != target.foreground:
            continue  # a background job reading the terminal gets SIGTTIN, it does not wait
        found = _waiting(pid, target)
        if found is not None:
            return found
    return None


class InputWatch:
    """Watches one command with open stdin or a pty and calls ``notify`` once per wait.

    ``heard`` is called on every output read and every stdin write the command took: it only
    sets a flag while the timer runs (the output path stays cheap), and arms the timer again after
    a notice. The timer first fires ``after`` seconds from the start or the last notice; output
    seen since its last firing makes it wait another ``after``, so the notice comes ``after`` to
    ``2 * after`` seconds after the last output.

    Args:
        after: seconds of silence before looking (``--input-wait-notice``; > 0).
        notify: called with the blocked process, the silence so far in milliseconds, and whether
            it reads a terminal.
    """

    __slots__ = ("_after", "_notify", "_proc", "_timer", "_heard", "_since", "_stopped", "_loop")

    def __init__(self, after: float, notify: Callable[[Blocked, int, bool], None]) -> None:
        self._after = after
        self._notify = notify
        self._proc: Interactive | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._heard = False
        self._stopped = False
        self._loop = asyncio.get_running_loop()
        self._since = self._loop.time()

    def watch(self, proc: Interactive) -> None:
        """Start watching ``proc`` (once it is spawned)."""
        self._proc = proc
        self._since = self._loop.time()
        self._arm()

    def heard(self) -> None:
        """The command wrote output or took input."""
        if self._timer is not None or self._stopped:
            self._heard = True
        elif self._proc is not None:
            self._since = self._loop.time()
            self._arm()

    def hearing(self, callback: Callable[_P, None]) -> Callable[_P, None]:
        """``callback`` (the output or stdin callback of the process), telling this watch first."""

        def heard(*args: _P.args, **kwargs: _P.kwargs) -> None:
            self.heard()
            callback(*args, **kwargs)

        return heard

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._heard = False
        self._timer = self._loop.call_later(self._after, self._check)

    def _check(self) -> None:
        self._timer = None
        proc = self._proc
        if self._stopped or proc is None or proc.returncode is not None:
            return
        if self._heard:
            self._since = self._loop.time()
            self._arm()
            return
        target = target_of(proc)
        if target is None:
            return  # stdin closed: it can wait for nothing the peer could send
        found = blocked_on_input(proc.pid, target)
        if found is None:
            self._arm()
            return
        self._notify(found, int((self._loop.time() - self._since) * 1000), target.pty)


def notifier(sink: EventSink, rid: str) -> Callable[[Blocked, int, bool], None]:
    """What :class:`InputWatch` calls for request ``rid``: one ``LogEvent`` (INFO) with the
    structured fields (v1; a v0 peer's Log line has the message only, which says the same)."""

    def notify(found: Blocked, idle_ms: int, tty: bool) -> None:
        what = "terminal" if tty else "stdin"
        fields = {
            "reason": WAITING_FOR_INPUT,
            "idle_ms": str(idle_ms),
            "pid": str(found.pid),
            "fd": str(max(found.fd, 0)),
            "call": found.call,
            "tty": "true" if tty else "false",
        }
        sink.log(pb.LOG_LEVEL_INFO, f"waiting for input: process {found.pid} is reading its {what} ({idle_ms} ms without output)", rid, fields)

    return notify
