"""A session's sandbox built once, with pid 1 in it forking the session's commands: a zygote.

The one-shot form of ``sandbox-exec`` builds a command's walls for every command: a user, mount,
pid, IPC and UTS namespace, the read-only mount view with its private ``/proc``, ``/dev`` and
``/tmp``, then the command (4–5 ms of ``sh -c true``, most of it the kernel making and tearing down
namespaces). ``sandbox-exec --zygote FD`` builds the same walls once; its init (pid 1 of the
session's pid namespace) then forks one command per request on the ``SOCK_SEQPACKET`` socket FD,
and each command does in its own process what the one-shot form's does: a session of its own,
every capability dropped, ``no_new_privs``, Landlock, rlimits, exec (``csrc/sandbox_exec.c``,
"--zygote", holds the wire format). What is the same for every command (signal dispositions, the
capability bounding set and securebits, the Landlock ruleset) the init prepares once and each
command inherits or applies. A command costs a fork and an exec.

* :class:`Zygote`: one such process. :meth:`Zygote.start` sends a command (argv, env, cwd, its
  stdin/stdout/stderr and its cgroup directories, in which it is born with
  ``clone3(CLONE_INTO_CGROUP)``) and returns its host pid once it runs; its end comes back as
  ``on_exit(wait status, rusage, stats)``, stats what the init read of its cell's usage files
  as it reaped it (:meth:`Cell.usage_files <smith_fast.containment.Cell.usage_files>`); :meth:`Zygote.signal` signals its process group through the
  init, which owns the pid (no signal reaches a reused one).
* The ready process: :meth:`Zygote.prepare` has the init fork the next command's process ahead,
  born in the next command's cell and joined to its v1 cells, waiting on a socket whose other end
  the init hands us; the next :meth:`Zygote.start` sends it the command there, with no step through
  the init and no reply to wait for (:meth:`Zygote.take_ready` gives it, its cell with it). The
  fork and the joins are the init's dearest steps: they are paid between commands, not while the
  peer waits. The process joins a v1 cell by its ``tasks`` file (a move of its one thread), which
  the kernel makes without the lock a ``cgroup.procs`` move takes: that one waits for an RCU grace
  period once the host's cgroups have been idle a moment (6-17 ms here, without ``favordynmods``:
  a session's first command, and the second after an agent's think time, waited for it).
  In a burst of commands (one starting within :data:`BUSY_WITHIN` of the last one's end) the
  zygote keeps :data:`BURST_DEPTH` of them, so a command takes one made a command earlier, its
  shell's exec long done, and the one asked for as it starts is made beside it, while the service
  answers (:meth:`Zygote.prepare_after`). With one, the next command's shell was asked for only
  as this one ended (asked for as it started, the fork and exec ran beside a short command on a
  small machine's CPUs, and the init reaped its end only after the fork), and the next command,
  a few hundred microseconds later, waited for that exec: for a CPU, on two.
  A command that comes while the init still forks its process waits for the ``'Q'`` (:meth:`Zygote.ready`).
* :class:`Zygotes`: a session's, one zygote per sandbox configuration, made at its first command,
  all closed with the session (:meth:`Zygotes.close`): the init's end kills whatever is left in
  its pid namespace. The session's commands share the zygote's private ``/tmp``; another session
  has its own.

If the service dies, the zygote's monitor dies with it (``PR_SET_PDEATHSIG``, and the child guard,
to which a zygote is one process group), its init with the monitor, and the kernel ends the
namespace; the guard removes the commands' cells. It is told nothing per command.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import itertools
import os
import resource
import socket
import struct
import subprocess
from collections.abc import Callable, Sequence

from .. import childguard, containment
from ..errors import ZygoteGone

__all__ = ["MAX_REQUEST", "PREPARE_AFTER", "READY_WAIT", "Forked", "Ready", "Warm", "Zygote", "ZygoteGone", "Zygotes"]

_HEAD = struct.Struct("=IIiIQII")  # struct zy_head: op, id, sig, flags, data_size, argc, envc
_REPLY = struct.Struct("=IIii18q5q")  # struct zy_reply: op, id, pid, value, struct rusage (LP64), stats
_FDS2 = socket.CMSG_SPACE(2 * array.array("i").itemsize)  # a 'Q' reply's pidfd and socket
READY_WAIT = 0.05
"""Seconds a command waits at most for its ready process's ``'Q'`` (:meth:`Zygote.ready`); the init
answers within a fork's time, unless it is stuck (then the command is forked as without one)."""
BUSY_WITHIN = 0.05
"""A command that starts this many seconds or more after the zygote's last command ended asks for
the next process at once, as it starts (:meth:`Zygote.prepare_after`). After a pause (an agent's
think time) the machine's idle CPUs sleep, and on a VM whose idle CPUs halt, waking the init for
the command's end cost more than the fork beside the command (a `true` after 0.2 s of idleness:
p50 x1.09-1.12 when it waited); in a burst of commands (or beside other work) the fork delays each
command's end instead."""
BURST_DEPTH = 2
"""Ready processes a zygote keeps once a command came within :data:`BUSY_WITHIN` of the last one's
end (one before). ``true`` one after another on 2 CPUs (``python -m bench.bench_exec_start``):
0.61-0.65x the no-server rate with one, 0.71-0.75x with two, the next asked for as a command
starts (0.73-0.78x with two asked for as a command ends)."""
PREPARE_AFTER = 0.005
"""Seconds a warm shell's command runs before the next command's process is asked for anyway
(:meth:`Zygote.prepare_after`): a command of the same session started meanwhile, or right after a
longer one, then finds it made. Most of an agent's commands (``cat``, ``ls``, ``git status``) end
sooner: theirs is made once they ended, while their final event goes out."""
_PIPE_HOLDS = 4096
"""What a new pipe surely holds: 64 KiB by default, one page once the user's pipes pass
``pipe-user-pages-soft``. A warm shell's script goes in one write: a longer one has its pipe
enlarged first (most commands are far shorter: no ``fcntl`` for them)."""
MAX_REQUEST = 192 * 1024
"""The largest request (argv, env and cwd) sent to a zygote: the init reads 256 KiB at most and an
unprivileged socket buffer holds ~208 KiB; a larger command takes the one-shot path."""

OnExit = Callable[[int, "resource.struct_rusage | None", "tuple[int, ...] | None"], None]


def _rusage(v: Sequence[int]) -> resource.struct_rusage:
    return resource.struct_rusage((v[0] + v[1] / 1e6, v[2] + v[3] / 1e6, *v[4:]))


_PIDFD_GET_INFO = 0xC040FF0B  # _IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info): Linux 6.13
_PIDFD_INFO = struct.Struct("=QQI")  # struct pidfd_info's head: mask, cgroupid, pid
_PIDFD_INFO_SIZE = 64  # PIDFD_INFO_SIZE_VER0
_pidfd_info = True  # False once the kernel said it has no PIDFD_GET_INFO


def _host_pid(pidfd: int) -> int:
    """The pid, in this process's pid namespace, of the process ``pidfd`` refers to (-1: it ended).

    One ``ioctl`` where the kernel has ``PIDFD_GET_INFO``: every command's process is a pidfd from
    the zygote, and the ``/proc/self/fdinfo`` way (open, read, close, a walk of procfs) was the
    costliest of its start's system calls."""
    global _pidfd_info
    if _pidfd_info:
        info = bytearray(_PIDFD_INFO_SIZE)
        info[0] = 1  # PIDFD_INFO_PID
        try:
            fcntl.ioctl(pidfd, _PIDFD_GET_INFO, info)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return -1  # as fdinfo says it
            _pidfd_info = False  # ENOTTY/EINVAL: an older kernel; fdinfo from now on
        else:
            pid: int = _PIDFD_INFO.unpack_from(info)[2]
            return pid
    fd = os.open(f"/proc/self/fdinfo/{pidfd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    at = text.index(b"\nPid:") + 5
    return int(text[at:text.index(b"\n", at)])


def _strings(cwd: str, argv: Sequence[str], env: dict[str, str]) -> bytes:
    """A request's strings (struct zy_head's body): cwd, argv, env, each NUL-terminated.

    Raises:
        ValueError: a NUL byte in one of them.
    """
    parts = [cwd, *argv, *(f"{k}={v}" for k, v in env.items())]
    text = "\0".join(parts)
    if text.count("\0") != len(parts) - 1:
        raise ValueError("embedded null byte")
    return text.encode("utf-8", "surrogateescape") + b"\0"


class Forked:
    """A command a zygote started, as its :class:`~smith_fast.shell_process.ShellProcess` sees it
    in place of a ``Popen``: its host pid, a way to signal its process group, and its end.

    Its end may come before anyone listens (the reply that it ended can follow the one that it
    started in the same read): it is kept, and handed to the listener in a later loop step.
    """

    __slots__ = ("pid", "_zygote", "_rid", "_listener", "_ended", "_loop")

    def __init__(self, zygote: Zygote, rid: int, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = 0
        self._zygote = zygote
        self._rid = rid
        self._loop = loop
        self._listener: OnExit | None = None
        self._ended: tuple[int, resource.struct_rusage | None, tuple[int, ...] | None] | None = None

    def signal(self, sig: int) -> None:
        """``sig`` to its process group, until it is reaped (the init owns the pid)."""
        self._zygote.signal(self._rid, sig)

    def on_exit(self, listener: OnExit) -> None:
        """Call ``listener(wait status, rusage, stats)`` when it has ended (rusage and stats None:
        it died with its zygote; stats: what the init read of its cell's usage files, -1 each unread)."""
        self._listener = listener
        if self._ended is not None:
            self._loop.call_soon(listener, *self._ended)

    def exited(self, status: int, rusage: resource.struct_rusage | None, stats: tuple[int, ...] | None = None) -> None:
        if self._listener is not None:
            self._listener(status, rusage, stats)
        else:
            self._ended = (status, rusage, stats)


class Warm:
    """A warm shell's request (:meth:`Zygote.prepare`): what it runs, and its stdio.

    The shell is started at once and waits for its script on stdin (``script``: our write end);
    a command whose shell and ``cwd`` are these can take it (:meth:`matches`); ``env`` is what it
    started with. ``out`` and ``err`` are our read ends of its stdout and stderr, ``stdin`` (-1:
    none) our write end of its command's stdin; ``theirs`` the fds it gets, its 0, 1, 2 and 3 (its
    command's stdin), sent to the init, then closed here. It starts in ``/``: its script enters
    ``cwd``."""

    __slots__ = ("argv", "env", "cwd", "script", "out", "err", "stdin", "theirs")

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: str, ours: tuple[int, int, int, int],
                 theirs: tuple[int, ...]) -> None:
        self.argv = list(argv)
        self.env = dict(env)  # the caller's dict is the command's: kept as it was when the shell started
        self.cwd = cwd
        self.script, self.out, self.err, self.stdin = ours
        self.theirs = theirs

    def matches(self, shell: str, cwd: str, stdin: bool) -> bool:
        """Whether a command of ``shell`` (its path) and ``cwd`` (and a stdin or not) can run in it
        (its environment, its script sets: :func:`smith_fast.warm_shell.script`)."""
        return self.cwd == cwd and self.argv[0] == shell and (self.stdin >= 0) == stdin

    def close(self) -> None:
        """Our ends closed: a shell still waiting reads an empty script and exits."""
        for fd in (self.script, self.out, self.err, self.stdin, *self.theirs):
            if fd >= 0:
                os.close(fd)
        self.script = self.out = self.err = self.stdin = -1
        self.theirs = ()


class Ready:
    """The next command's process, made ahead (:meth:`Zygote.prepare`): the cell it was born in,
    the command id it will run as, and once the init said it runs (reply ``'Q'``) its host pid and
    our end of its socket, or (``warm``) a shell already running, waiting for its script."""

    __slots__ = ("cell", "rid", "pid", "sock", "warm")

    def __init__(self, cell: containment.Cell, rid: int, warm: Warm | None = None) -> None:
        self.cell = cell
        self.rid = rid
        self.pid = 0
        self.sock: socket.socket | None = None
        self.warm = warm

    def discard(self) -> None:
        """Let it go, and its cell with it (:meth:`drop`, then the cell released)."""
        self.drop()
        self.cell.release()

    def drop(self) -> None:
        """Our end closed: a process still waiting exits at the EOF (the cell stays the caller's)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.warm is not None:
            self.warm.close()


class Zygote:
    """One zygote: ``argv`` (``Sandbox.zygote_argv``) started with the far end of a socket pair.

    Args:
        argv: the sandbox program's argv, ending in ``--zygote FD`` where FD is ``far``.
        far: the socket end the init serves on (passed on, then closed here).
        near: our end.
        loop: the loop that reads the replies.
    """

    __slots__ = ("_loop", "_sock", "_popen", "_ids", "_starting", "_exits", "_gone", "_ready", "_depth", "last", "_deferred",
                 "_defer_timer", "_made", "_ended_at")

    def __init__(self, argv: Sequence[str], far: socket.socket, near: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._sock = near
        self._ids = itertools.count(1)
        self._starting: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, Forked] = {}
        self._gone = False
        self._ready: list[Ready] = []  # the next commands' processes, the oldest first
        self._depth = 1  # how many prepare() keeps: BURST_DEPTH once commands come one after another
        # prepare()'s last arguments: a zygote built again for the session (Zygotes.reset) makes
        # its first ready process with them at once
        self.last: tuple[containment.CommandLimits, Callable[[], Warm | None] | None] | None = None
        self._deferred = 0  # the command whose end (or PREPARE_AFTER) sends the next prepare
        self._defer_timer: asyncio.TimerHandle | None = None
        self._made: asyncio.Future[None] | None = None  # a command waits for the ready process's 'Q' (ready())
        self._ended_at = -BUSY_WITHIN  # loop time of the last command's end
        try:
            # No stdio of ours: a failure shows as the socket's end, and the command then takes the
            # one-shot path, which says why. A session of its own: a terminal's ^C is not for it.
            self._popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, pass_fds=(far.fileno(),), cwd="/",
                                           start_new_session=True)
        finally:
            far.close()
        # If we are SIGKILLed, the guard ends the zygote (and its namespace) and the cells beneath
        # the parents; PR_SET_PDEATHSIG would end the zygote too, but not remove the cells.
        childguard.register(self._popen.pid, containment.cell_parents())
        near.setblocking(False)
        loop.add_reader(near.fileno(), self._readable)

    @property
    def alive(self) -> bool:
        return not self._gone

    def start(self, argv: Sequence[str], env: dict[str, str], cwd: str, stdio: tuple[int, int, int],
              cells: Sequence[int], data_size: int = 0, *, ready: Ready | None = None,
              usage: tuple[int, tuple[int, ...]] = (0, ())) -> tuple[Forked, asyncio.Future[int]]:
        """Send a command: ``argv[0]`` a path; ``stdio`` its fds 0, 1 and 2 and ``cells`` its
        cgroup directories open, v2 first (ours stay open: the caller closes them); ``usage`` the
        cell's :meth:`~smith_fast.containment.Cell.usage_files`, read by the init at its end.
        ``ready``: what :meth:`take_ready` gave (``cells`` are its cell's, its usage files sent with
        it): its process runs the command, at once (forked into the cells as without, if it does
        not take it).

        Returns:
            the command and a future of its host pid (an ``OSError`` when the
            init could not fork it; :class:`ZygoteGone` when the zygote ended first).

        Raises:
            ZygoteGone: it cannot take the command (ended, socket full, request too large).
            ValueError: a NUL byte in an argument, a variable or the cwd.
        """
        if self._gone:
            raise ZygoteGone("the zygote ended")
        body = _strings(cwd, argv, env)
        if len(body) > MAX_REQUEST:
            raise ZygoteGone("the request is too large for the zygote")
        if ready is not None and ready.sock is not None:
            try:
                head = _HEAD.pack(ord("S"), ready.rid, 0, 0, data_size, len(argv), len(env))
                ready.sock.sendmsg([head, body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", stdio))])
            except OSError:  # it is gone (killed), or the request does not fit its socket
                pass
            else:
                forked = self._adopt(ready)
                started: asyncio.Future[int] = self._loop.create_future()
                started.set_result(ready.pid)
                return forked, started
            finally:
                ready.drop()
        rid = next(self._ids)
        try:
            head = _HEAD.pack(ord("S"), rid, 0, usage[0], data_size, len(argv), len(env))
            self._sock.sendmsg([head, body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (*stdio, *usage[1], *cells)))])
        except OSError as exc:  # full (BlockingIOError), too large, or the init is gone
            raise ZygoteGone(f"the zygote did not take the command: {exc}") from None
        started = self._loop.create_future()
        forked = Forked(self, rid, self._loop)
        self._starting[rid] = started
        self._exits[rid] = forked
        return forked, started

    def prepare_after(self, forked: Forked, limits: containment.CommandLimits, shell: Callable[[], Warm | None] | None = None) -> None:
        """:meth:`prepare` for the commands after ``forked`` (the command just started in a ready
        process). At once when the last command ended :data:`BUSY_WITHIN` ago or more (after a
        pause), or when the next one's process is made already (in a burst: this one is made
        beside what comes before it). Else (the first commands of a burst) once ``forked`` ended
        or :data:`PREPARE_AFTER` seconds passed, whichever comes first: the init then reaps a short
        command's end at once, where it would fork first, and the new shell's exec does not take
        the CPU the command and the service need meanwhile; the zygote keeps
        :data:`BURST_DEPTH` from then on."""
        if self._gone or self._loop.time() - self._ended_at >= BUSY_WITHIN:
            self.prepare(limits, shell)  # after a pause: at once (nothing, but its arguments kept, if one is made)
            return
        self._depth = BURST_DEPTH
        if self._ready and self._ready[0].pid:
            self.prepare(limits, shell)
            return
        self.last = (limits, shell)
        if self._defer_timer is not None:
            self._defer_timer.cancel()
        self._deferred = forked._rid
        self._defer_timer = self._loop.call_later(PREPARE_AFTER, self._prepare_deferred)

    def _prepare_deferred(self) -> None:
        self._deferred = 0
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        if self.last is not None:
            self.prepare(*self.last)

    def prepare(self, limits: containment.CommandLimits, shell: Callable[[], Warm | None] | None = None) -> None:
        """Have the init fork the next commands' processes now, as many as the zygote keeps less
        those made or asked for (one, or :data:`BURST_DEPTH` in a burst), each born in
        a cell of its own with ``limits`` (the last command's, the likeliest next ones), which this
        zygote then holds (:meth:`take_ready` gives it, :meth:`close` releases it). Where ``shell``
        gives a :class:`Warm` (called only when a process is to be made; the warm shell is this
        zygote's from then on), the process runs that shell at once. Nothing happens if the zygote
        cannot take the request (the next command is forked as before)."""
        self.last = (limits, shell)
        while not self._gone and len(self._ready) < self._depth and self._make(limits, shell):
            pass

    def _make(self, limits: containment.CommandLimits, shell: Callable[[], Warm | None] | None) -> bool:
        """One ready process asked for (:meth:`prepare`); False if the init cannot take the request."""
        warm = shell() if shell is not None else None
        body = b""
        if warm is not None:
            try:
                body = _strings("/", warm.argv, warm.env)
            except ValueError:
                body = b""
            if not body or len(body) > MAX_REQUEST:  # not for the init: the usual ready process
                warm.close()
                warm, body = None, b""
        cell = containment.new_cell(limits, born_elsewhere=True)
        rid = next(self._ids)
        cells = cell.birth_fds()
        flags, files = cell.usage_files()
        head, fds = _HEAD.pack(ord("R"), rid, 0, flags, 0, 0, 0), files + cells
        if warm is not None:
            extra = len(warm.theirs) - 3  # its fd 3: struct zy_head's flags & ZY_EXTRA
            head = _HEAD.pack(ord("R"), rid, 0, flags | extra, 0, len(warm.argv), len(warm.env))
            fds = (*warm.theirs, *fds)
        try:
            self._sock.sendmsg([head, body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError:
            cell.release()
            if warm is not None:
                warm.close()
            return False
        if warm is not None:  # the init has its copies now
            for fd in warm.theirs:
                os.close(fd)
            warm.theirs = ()
        self._ready.append(Ready(cell, rid, warm))
        return True

    def run(self, ready: Ready, script: bytes) -> Forked:
        """Give a warm shell (``ready.warm``, from :meth:`take_ready`) its script, in one write:
        it runs as that command from now on. Its stdout, stderr and stdin (``ready.warm.out``,
        ``err``, ``stdin``) are the caller's now; the rest of the warm shell's ends are closed.

        Raises:
            OSError: it did not take the whole script (it ended, or its pipe is not empty: someone
                else wrote to it); the caller lets it go.
        """
        warm = ready.warm
        assert warm is not None
        if len(script) > _PIPE_HOLDS:
            with contextlib.suppress(OSError):  # refused: the write below says it did not fit
                fcntl.fcntl(warm.script, fcntl.F_SETPIPE_SZ, len(script))
        if os.write(warm.script, script) != len(script):
            raise BlockingIOError(errno.EAGAIN, "the warm shell's script did not fit its pipe")
        os.close(warm.script)
        warm.script = warm.out = warm.err = warm.stdin = -1
        return self._adopt(ready)

    def _adopt(self, ready: Ready) -> Forked:
        """The ready process, running its command now: a command of ours, its end awaited."""
        forked = Forked(self, ready.rid, self._loop)
        forked.pid = ready.pid
        self._exits[ready.rid] = forked
        return forked

    async def ready(self, limits: containment.CommandLimits) -> Ready | None:
        """:meth:`take_ready`, once the init said the ready process runs, if its ``'Q'`` is on its
        way (for at most :data:`READY_WAIT` seconds). A command sent right after a short one comes
        while the init forks its process (asked for as the short one ended: :meth:`prepare_after`);
        the ``'Q'`` is a moment away, where a process forked for it alone would wait behind that fork."""
        ready = self._ready[0] if self._ready else None
        if ready is not None and not ready.pid and not self._gone:
            if self._made is None or self._made.done():
                self._made = self._loop.create_future()
            await asyncio.wait((self._made,), timeout=READY_WAIT)
        return self.take_ready(limits)

    def _made_known(self) -> None:
        made, self._made = self._made, None
        if made is not None and not made.done():
            made.set_result(None)

    def take_ready(self, limits: containment.CommandLimits) -> Ready | None:
        """The oldest of the next commands' processes, for a command with ``limits`` (set on its
        cell before it was born there); None when there is none yet (its ``'Q'`` is still on its
        way: the command takes a cell of its own, and the process waits for the one after), or
        when their limits differ (then they are let go and their cells released)."""
        while self._ready and self._ready[0].pid:
            ready = self._ready.pop(0)
            if ready.cell.limits == limits:
                return ready
            ready.discard()
        return None

    def signal(self, rid: int, sig: int) -> None:
        """Send ``sig`` to command ``rid``'s process group (nothing once it was reaped)."""
        if self._gone:
            return
        with contextlib.suppress(OSError):
            self._sock.send(_HEAD.pack(ord("K"), rid, sig, 0, 0, 0, 0))

    def _readable(self) -> None:
        while True:
            try:
                data, anc, _flags, _ = self._sock.recvmsg(_REPLY.size, _FDS2)
            except BlockingIOError:
                return
            except OSError:
                data, anc = b"", []
            if len(data) != _REPLY.size:
                self._end()
                return
            v = _REPLY.unpack(data)
            op, rid, status = v[0], v[1], v[3]
            fds = [fd for level, kind, raw in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for fd in array.array("i", raw[: len(raw) - len(raw) % 4])]
            try:
                if op == ord("X"):
                    forked = self._exits.pop(rid, None)
                    if forked is not None:
                        self._ended_at = self._loop.time()
                        forked.exited(status, _rusage(v[4:22]), v[22:])
                        if rid == self._deferred:
                            self._prepare_deferred()
                    else:
                        self._lose_ready(rid)  # it ended before its command came (killed)
                    continue
                if op == ord("Q") or (op == ord("F") and self._ready_of(rid) is not None):
                    self._made_ready(op, rid, fds)
                    continue
                started = self._starting.pop(rid, None)
                if started is None or started.done():
                    continue
                forked = self._exits.get(rid)
                if op == ord("P") and fds and forked is not None:
                    forked.pid = _host_pid(fds[0])
                    started.set_result(forked.pid)
                else:
                    self._exits.pop(rid, None)
                    code = status if op == ord("F") else errno.ESRCH
                    started.set_exception(OSError(code, os.strerror(code)))
            finally:
                for fd in fds:
                    if fd >= 0:
                        os.close(fd)

    def _made_ready(self, op: int, rid: int, fds: list[int]) -> None:
        """The init's answer to :meth:`prepare`: ``'Q'`` with the process's pidfd and socket (taken
        from ``fds``), or ``'F'``: none was made, its cell goes."""
        ready = self._ready_of(rid)
        self._made_known()
        if ready is None:
            return  # one let go meanwhile: its socket is closed with the other fds
        if op == ord("Q") and len(fds) == (1 if ready.warm is not None else 2) and not self._gone:
            ready.pid = _host_pid(fds[0])
            if ready.warm is None:
                ready.sock = socket.socket(fileno=fds[1])
                fds[1] = -1  # the socket's now
                ready.sock.setblocking(False)
        else:
            self._lose_ready(rid)

    def _ready_of(self, rid: int) -> Ready | None:
        """The ready process made (or asked for) as command ``rid``, if one is."""
        return next((ready for ready in self._ready if ready.rid == rid), None)

    def _lose_ready(self, rid: int) -> None:
        """Ready process ``rid`` (if it is one) let go, its cell released; a command waiting for
        it (:meth:`ready`) looks again."""
        ready = self._ready_of(rid)
        if ready is None:
            return
        self._ready.remove(ready)
        self._made_known()
        ready.discard()

    def _end(self) -> None:
        """The init is gone (or we close it): every command it held ended with it."""
        if self._gone:
            return
        self._gone = True
        self._made_known()
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for ready in self._ready:
            ready.drop()
        starting, self._starting = self._starting, {}
        exits, self._exits = self._exits, {}
        for started in starting.values():
            if not started.done():
                started.set_exception(ZygoteGone("the zygote ended"))
        for forked in exits.values():
            forked.exited(9, None)  # killed with its namespace
        childguard.unregister(self._popen.pid)  # before it is reaped: its group id is ours till then
        self._reap()

    def _reap(self) -> None:
        if self._popen.poll() is None:
            # The monitor ends once its init has: a look again shortly, not a wait here.
            self._loop.call_later(0.05, self._reap)
            return
        # The ready process ended with the init's namespace: its cell can go now (not before: a
        # cell with a member left in it is only removed at the next command's, or at exit).
        ready, self._ready = self._ready, []
        for one in ready:
            one.cell.release()

    def close(self) -> None:
        """End the zygote: its init exits, and the kernel kills every process left in its namespace."""
        self._end()


class Zygotes:
    """A session's zygotes, one per sandbox configuration (the argv that builds it), made at its
    first command in that configuration, closed with the session (:meth:`close`)."""

    __slots__ = ("_live", "_primed")

    def __init__(self) -> None:
        self._live: dict[tuple[str, ...], Zygote] = {}
        self._primed: dict[tuple[str, ...], tuple[containment.CommandLimits, Callable[[], Warm | None] | None]] = {}

    def get(self, argv: Callable[[int], list[str]], key: tuple[str, ...], loop: asyncio.AbstractEventLoop) -> Zygote:
        """The zygote of configuration ``key``, started as ``argv(fd)`` when there is none alive."""
        zygote = self._live.get(key)
        if zygote is None or not zygote.alive:
            near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            with contextlib.suppress(OSError):  # a whole request in one message where the limits allow
                near.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_REQUEST)
            try:
                zygote = Zygote(argv(far.fileno()), far, near, loop)
            except BaseException:
                near.close()
                raise
            self._live[key] = zygote
            if (primed := self._primed.pop(key, None)) is not None:  # built again: its next command's process now
                zygote.prepare(*primed)
        return zygote

    def reset(self) -> None:
        """Close every zygote (their view is stale: the session's root was mounted again); one built
        again for the same configuration makes its first ready process as the last one did."""
        live, self._live = self._live, {}
        for key, zygote in live.items():
            if zygote.last is not None:
                self._primed[key] = zygote.last
            zygote.close()

    def close(self) -> None:
        """Close every zygote: the session is over."""
        self.reset()
        self._primed.clear()
