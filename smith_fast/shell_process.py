"""A running shell command whose output streams through the event loop (:class:`ShellProcess`).

How it is spawned is :mod:`smith_fast.process_spawn`; how it is read, reaped, steered and
stopped is here. :mod:`smith_fast.process` says why it is built this way.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import os
import resource
import signal
import struct
import subprocess
import threading
from collections.abc import Callable, Mapping

from . import childguard, containment
from .command_env import DEFAULT_SHELL, base_environment
from .fd_watch import fd_watch
from .process_spawn import PIPE_SIZE, set_winsize, start
from .sandbox import Sandbox
from .sandbox.zygote import Forked, Zygotes

__all__ = [
    "DEFAULT_READ_SIZE",
    "ESCAPED_WRITER_GRACE",
    "STDIN_LIMIT",
    "TERMINATE_GRACE",
    "ShellProcess",
    "kill_all",
]

DEFAULT_READ_SIZE = 1 << 20
TERMINATE_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL in :meth:`ShellProcess.terminate` and :func:`~smith_fast.collect.run_collect`."""
ESCAPED_WRITER_GRACE = 0.5
"""Seconds after the shell exits before pipes still held open by a process outside its group are closed."""
READ_PACE = 0.001
"""Seconds between reads of a command's output once :data:`PACE_AFTER` small reads (under
:data:`PACE_BELOW`) came each within this long of the last: what comes meanwhile waits in the pipe,
enlarged to 1 MiB then (:data:`ENLARGE_AT`). A command writing fast in small writes was read one 4 KiB write at a time, an
event each, and the service's every wake-up took the CPU from the writer (``seq 200000``: 24 to 317
events, 5 to 23 ms, as the loop happened to wake; paced, 5 to 7 ms). A few quick writes are read
at once, and so is a large read, which means the reader is behind, not ahead (``yes`` fills the
pipe faster than any pace would empty it). The pace ends when the shell is reaped: what the pipes
hold then is the command's last output, read with its end (the MCP shell's prologue and trap write
six times in a ``true``; held to the pace, 4 of 10 waited a pace for their final event)."""
PACE_BELOW = 64 * 1024
"""A read this large is not small (:data:`READ_PACE`)."""
PACE_AFTER = 3
"""Quick small reads in a row before the pace applies (:data:`READ_PACE`)."""
ENLARGE_AT = 32 * 1024
"""A read this large (half a pipe's default size) means output comes faster than it is read: the
pipe is enlarged to ``pipe_size`` (``PIPE_SIZE``) then, as it is when the pace first applies
(what waits for the pace waits in the pipe). A command with little output keeps the default pipe."""
STDIN_LIMIT = 1 << 20
"""Default bound of the bytes written to a child's stdin that it has not read yet."""

_HAVE_PIDFD = hasattr(os, "pidfd_open")
_POLL_INTERVAL = 0.05
_DRAIN_MAX_READS = 64
_EOT = b"\x04"  # what end of input is on a terminal (VEOF, in canonical mode)

# pid -> process whose shell is not reaped yet; kill_all() signals these groups.
_LIVE: dict[int, ShellProcess] = {}


_buffers = threading.local()


def _thread_buffer(size: int) -> memoryview:
    """``size`` bytes of this thread's read buffer (grown when a process reads more at once)."""
    buffer: memoryview | None = getattr(_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _buffers.buffer = memoryview(bytearray(size))
    return buffer[:size]


def _wake(waiter: asyncio.Future[None]) -> None:
    """:meth:`ShellProcess.wait`'s timeout: its waiter resolved (it then finds the process not done)."""
    if not waiter.done():
        waiter.set_result(None)


def _tidy(leftovers: list[Callable[[], None]]) -> None:
    for remove in leftovers:
        remove()
    # and the next command's directories, made now rather than while it starts
    containment.prepare_spare()


_FIONREAD = 0x541B
_INT = struct.Struct("i")


def _waiting(fd: int) -> int:
    """Bytes waiting in pipe ``fd`` (0 at its end; a terminal's pty counts too)."""
    try:
        waiting: int = _INT.unpack(fcntl.ioctl(fd, _FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0
    return waiting


_RUSAGE = struct.Struct("=18q")  # struct rusage on LP64 Linux: two timevals, then 14 longs


def _with_reported(own: resource.struct_rusage, fd: int) -> resource.struct_rusage:
    """``own`` (the sandbox program's wait4 rusage) plus the command's, which the sandbox program
    wrote to ``fd`` before it ended (its init reaped the command, so wait4 does not see it)."""
    try:
        data = os.read(fd, _RUSAGE.size)
    except OSError:
        return own
    if len(data) != _RUSAGE.size:
        return own  # it ended before its command did (killed): what wait4 says is all there is
    v = _RUSAGE.unpack(data)
    extra = (v[0] + v[1] / 1e6, v[2] + v[3] / 1e6, *v[4:])
    return resource.struct_rusage(tuple(
        max(a, b) if i == 2 else a + b for i, (a, b) in enumerate(zip(own, extra))  # ru_maxrss: the larger
    ))


class ShellProcess:
    """A running shell command whose stdout and stderr are delivered to a callback as they arrive.

    Create one with :meth:`start`. Output arrives through ``on_output(fd, data)`` (``fd`` is
    :data:`STDOUT` or :data:`STDERR`, ``data`` a non-empty ``bytes``) in the order each pipe produced
    it; the two streams are not ordered relative to each other.

    Attributes:
        pid: the shell's process id, which is also its process group id.
        returncode: ``None`` until the shell has been reaped; then its exit status, or ``-N`` if
            signal ``N`` killed it. Output may still be in flight: :meth:`wait` waits for both.
    """

    __slots__ = (
        "pid",
        "returncode",
        "_loop",
        "_popen",
        "_on_output",
        "_on_end",
        "_read_size",
        "_pipes",
        "_paused",
        "_buffer",
        "_pidfd",
        "_poll_handle",
        "_escape_timer",
        "_exited",
        "_done",
        "_waiters",
        "_error",
        "_stdin",
        "_stdin_buffer",
        "_stdin_limit",
        "_stdin_eof",
        "_pty",
        "_stdin_taken",
        "_on_stdin",
        "_cell",
        "_forked",
        "_usage_fd",
        "_held",
        "_leftovers",
        "_last_read",
        "_quick_reads",
        "_pacing",
        "_pipe_size",
        "_enlarged",
        "usage",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        popen: subprocess.Popen[bytes] | int,
        pipes: dict[int, int],
        on_output: Callable[[int, bytes], None],
        read_size: int,
        on_end: Callable[[int], None] | None = None,
    ) -> None:
        self.pid: int = popen if isinstance(popen, int) else popen.pid
        self.returncode: int | None = None
        self._loop = loop
        # Kept until the shell is reaped: a Popen collected earlier would waitpid() it itself.
        self._popen: subprocess.Popen[bytes] | None = None if isinstance(popen, int) else popen
        self._on_output = on_output
        self._on_end = on_end
        self._read_size = read_size
        self._pipes = pipes  # STDOUT/STDERR -> read end, until EOF or close()
        self._paused = False
        self._buffer: memoryview | None = None  # read_size bytes, allocated on the first read
        self._pidfd = -1
        self._poll_handle: asyncio.TimerHandle | None = None
        self._escape_timer: asyncio.TimerHandle | None = None
        self._exited: asyncio.Future[int] = loop.create_future()  # shell reaped
        self._done: asyncio.Future[int] = loop.create_future()  # reaped and both pipes closed
        self._waiters: list[asyncio.Future[None]] = []  # wait()'s own futures, resolved with _done
        self._error: Exception | None = None
        self._stdin = -1  # our end of the child's stdin (a pipe, or a dup of the pty master)
        self._stdin_buffer = bytearray()  # written but not yet taken by the kernel
        self._stdin_limit = STDIN_LIMIT
        self._stdin_eof = False  # close stdin once the buffer is written
        self._pty = -1  # the pty master, for resize
        self._stdin_taken = 0  # bytes of stdin the kernel took
        self._on_stdin: Callable[[int], None] | None = None
        self._cell: containment.Cell | None = None
        self._forked: Forked | None = None  # a zygote's command: signalled and reaped by its zygote
        self._usage_fd = -1  # where the sandbox program writes its command's rusage (sandboxed only)
        self._held = False  # hold_cleanup(): the reap leaves the removals to release_soon()
        self._leftovers: list[Callable[[], None]] = []  # what the reap left to remove
        self._last_read = -1.0  # loop time of the last read of output (READ_PACE)
        self._quick_reads = 0  # small reads in a row, each within READ_PACE of the one before
        self._pacing: asyncio.TimerHandle | None = None  # the pipes are not watched until it fires
        self._pipe_size = 0  # what a pipe that output fills is enlarged to (0: left as it is)
        self._enlarged = 0  # the streams whose pipe was (1 << stream)
        # What the command cost (CPU, memory, I/O, limit hit), set when the shell is reaped.
        self.usage: containment.Usage | None = None

    @classmethod
    async def start(
        cls,
        command: str,
        *,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: Callable[[int, bytes], None],
        read_size: int = DEFAULT_READ_SIZE,
        pipe_size: int = PIPE_SIZE,
        sandbox: Sandbox | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        stdin_limit: int = STDIN_LIMIT,
        on_stdin: Callable[[int], None] | None = None,
        limits: containment.CommandLimits | None = None,
        zygotes: Zygotes | None = None,
        egress_fd: int = -1,
        on_end: Callable[[int], None] | None = None,
    ) -> ShellProcess:
        """Start ``[shell, "-c", command]`` and begin delivering its output to ``on_output``.

        Args:
            command: the command line, passed to the shell as one ``-c`` argument.
            shell: the shell program, looked up on the command's ``PATH`` when it has no slash;
                ``None`` or ``""`` means :data:`DEFAULT_SHELL`.
            cwd: the working directory; ``None`` or ``""`` means the service's own.
            env: variables layered over :func:`base_environment` (with ``SHELL`` set to the shell).
            on_output: called from the event loop as ``on_output(fd, data)`` for each chunk read.
                If it raises, the process group is killed and :meth:`wait` raises that exception.
            read_size: the most bytes one read (and so one callback) delivers.
            pipe_size: the kernel buffer to request for each pipe; the default is used if refused.
            sandbox: confine the command (PROTOCOL.md, "Sandbox"): it runs through the sandbox
                program, with a private ``/tmp`` as ``TMPDIR`` (gone with the command) that it may
                write besides what the sandbox's mode allows.
            stdin: give the child a stdin pipe (:meth:`write_stdin`, :meth:`close_stdin`) instead
                of ``/dev/null``.
            pty: ``(rows, cols)``: run on a new pseudo-terminal of that size instead (stdin,
                stdout and stderr; output arrives as :data:`STDOUT`; :meth:`resize`).
            stdin_limit: the most bytes :meth:`write_stdin` keeps that the child has not read.
            on_stdin: called with the total bytes of stdin the child's pipe (or terminal) has taken,
                each time it took more: the peer's flow control.
            limits: what the command may use (:mod:`smith_fast.containment`); None: no limits.
            zygotes: the session's zygotes (:mod:`smith_fast.sandbox.zygote`): a piped sandboxed
                command is forked inside its session's sandbox, built once, instead of building one
                (:func:`smith_fast.process_spawn.route`); None: the one-shot way.
            egress_fd: with a ``--network allow`` sandbox, the unix socket the sandbox program sends
                the command's egress listener over (:meth:`Sandbox.wrap <smith_fast.sandbox.Sandbox.wrap>`).
            on_end: called as ``on_end(fd)`` when a stream reached its end (EOF, not :meth:`close`
                or :meth:`stop_output`), before the process counts as done: a consumer that holds
                back bytes between reads (a secret's redactor) gives them out there.

        Returns:
            The running process.

        Raises:
            ProtocolError: the shell or working directory does not exist or cannot be used, or the
                command or env holds a NUL byte (``details["reason"] == "spawn_failed"``; code
                ``ERROR_CODE_RESOURCE_EXHAUSTED`` when out of processes, fds or memory, else
                ``ERROR_CODE_UNSPECIFIED``).
            ValueError: ``read_size`` is not positive.
        """
        if read_size < 1:
            raise ValueError(f"read_size must be positive, got {read_size}")
        loop = asyncio.get_running_loop()
        shell = shell or DEFAULT_SHELL
        environ = base_environment()
        environ["SHELL"] = shell
        if env:
            environ.update(env)
        spawned = await start(command, loop=loop, shell=shell, cwd=cwd or None, environ=environ, env=env,
                              sandbox=sandbox, stdin=stdin, pty=pty, limits=limits, zygotes=zygotes, egress_fd=egress_fd)
        self = cls(loop, spawned.popen, spawned.pipes, on_output, read_size, on_end)
        self._pipe_size = pipe_size
        self._cell = spawned.cell
        self._forked = spawned.forked
        self._usage_fd = spawned.usage_fd
        self._stdin, self._stdin_limit, self._pty = spawned.stdin, stdin_limit, spawned.pty
        if spawned.stdin >= 0:
            self._on_stdin = on_stdin
        self._watch(loop)
        return self

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        _LIVE[self.pid] = self
        if self._forked is not None:
            # Its zygote reaps it and says so; if we die, the zygote and its namespace die with us.
            self._forked.on_exit(self._forked_ended)
            self._watch_pipes()
            return
        childguard.register(self.pid, self._cell.dirs if self._cell is not None else ())
        if _HAVE_PIDFD:
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:  # ENOSYS (old kernel) or a seccomp filter
                pass
        if self._pidfd >= 0:
            loop.add_reader(self._pidfd, self._check_exit)
        else:
            self._poll_handle = loop.call_later(_POLL_INTERVAL, self._poll_exit)
        self._watch_pipes()

    def _watch_pipes(self) -> None:
        """Read the pipes as output comes, unless paused (the consumer's flow control) or pacing."""
        if self._paused or self._pacing is not None:
            return
        watch = fd_watch(self._loop)
        for stream, fd in self._pipes.items():
            watch.add(fd, self._read_ready, stream, fd)

    def _unwatch_pipes(self) -> None:
        watch = fd_watch(self._loop)
        for fd in self._pipes.values():
            watch.remove(fd)

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"returncode={self.returncode}"
        return f"<ShellProcess pid={self.pid} {state}>"

    # -- output ------------------------------------------------------------------------------------

    def _read_ready(self, stream: int, fd: int) -> None:
        # One read per wakeup: the pipe holds at most PIPE_SIZE, so with read_size >= PIPE_SIZE a
        # second read would only return EAGAIN; the loop calls again if anything is left.
        now = self._loop.time()
        wait = self._last_read + READ_PACE - now
        if wait > 0 and self._quick_reads >= PACE_AFTER and self.returncode is None and 0 < _waiting(fd) < PACE_BELOW:
            # a burst of small writes: look again once READ_PACE has passed since the last read
            # (its end, or a pipe filling up, is read at once; once the shell is reaped, all of it)
            self._enlarge(stream, fd)
            self._pace(wait)
            return
        try:
            data = self._read(fd)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if len(data) >= PACE_BELOW:
            self._quick_reads = 0
        elif now - self._last_read < READ_PACE:
            self._quick_reads += 1
        else:
            self._quick_reads = 1
        self._last_read = now
        if len(data) >= ENLARGE_AT:
            self._enlarge(stream, fd)
        if data:
            self._deliver(stream, data)
        else:
            self._ended(stream)
            self._close_pipe(stream)
            self._maybe_done()

    def _enlarge(self, stream: int, fd: int) -> None:
        """Output filled this pipe before we read it: from now on it holds ``pipe_size`` (once; a
        refusal, past ``pipe-max-size`` or the user's pipe quota, leaves it as it is)."""
        if self._enlarged & (1 << stream):
            return
        self._enlarged |= 1 << stream
        if self._pipe_size:
            try:
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, self._pipe_size)
            except OSError:  # EPERM, EBUSY; or a terminal, which is no pipe
                pass

    def _read(self, fd: int) -> bytes:
        # Into a buffer kept for the process, then copied out at the size read: os.read would
        # allocate read_size bytes (1 MiB, past malloc's mmap threshold) for every read, and the
        # page faults on that fresh memory cost about 3x the read itself (bench_process.py).
        # The buffer is this thread's, shared by its processes (each read is copied out before
        # the next): a fresh 1 MiB bytearray per command costs a 1 MiB zero fill even for `true`.
        buffer = self._buffer
        if buffer is None:
            buffer = self._buffer = _thread_buffer(self._read_size)
        n = os.readv(fd, (buffer,))
        return bytes(buffer[:n])

    def _deliver(self, stream: int, data: bytes) -> None:
        try:
            self._on_output(stream, data)
        except Exception as exc:  # the consumer's bug: stop the command and tell the waiter
            if self._error is None:
                self._error = exc
            self.close()

    def _ended(self, stream: int) -> None:
        if self._on_end is not None and stream in self._pipes:
            try:
                self._on_end(stream)
            except Exception as exc:  # as _deliver: the consumer's bug stops the command
                if self._error is None:
                    self._error = exc
                self.close()

    def _pace(self, wait: float) -> None:
        if self._pacing is not None:
            return
        self._unwatch_pipes()
        self._pacing = self._loop.call_later(wait, self._paced)

    def _paced(self) -> None:
        self._pacing = None
        self._watch_pipes()

    def _close_pipe(self, stream: int) -> None:
        fd = self._pipes.pop(stream, None)
        if fd is None:
            return
        if not self._loop.is_closed():
            fd_watch(self._loop).remove(fd)
        os.close(fd)
        if not self._pipes:
            self._buffer = None
            if self._pacing is not None:
                self._pacing.cancel()
                self._pacing = None

    def stop_output(self) -> None:
        """Stop reading the command's output for good (``--max-output`` reached): the pipes are
        closed, so a command that writes more gets ``SIGPIPE``/``EPIPE`` as under ``| head -c N``;
        a terminal hangs up (``SIGHUP`` to its foreground job), its input with it. Reading what
        nobody will see would cost the service the CPU of every byte a flood writes."""
        for stream in list(self._pipes):
            self._close_pipe(stream)
        if self._pty >= 0:
            self._close_stdin_now()
        self._maybe_done()

    def _drain_and_close(self) -> None:
        """Deliver whatever the pipes hold right now, then close them (an escaped writer holds them)."""
        for stream, fd in list(self._pipes.items()):
            for _ in range(_DRAIN_MAX_READS):
                if self._pipes.get(stream) != fd:  # on_output closed us
                    break
                try:
                    data = self._read(fd)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                self._deliver(stream, data)
            self._ended(stream)
            self._close_pipe(stream)

    def _escaped_writer_check(self) -> None:
        self._escape_timer = None
        if not self._pipes:
            return
        if self._paused:  # the consumer is slow, which is no reason to drop output: look again later
            self._escape_timer = self._loop.call_later(ESCAPED_WRITER_GRACE, self._escaped_writer_check)
            return
        self._drain_and_close()
        self._maybe_done()

    def pause_reading(self) -> None:
        """Stop reading both pipes (backpressure).

        Once the kernel pipe buffer is full the child blocks in ``write``; nothing is lost. Exit is
        still noticed, but :meth:`wait` does not return until reading is resumed and the output
        delivered.
        """
        if self._paused:
            return
        self._paused = True
        self._unwatch_pipes()

    def resume_reading(self) -> None:
        """Resume reading after :meth:`pause_reading`."""
        if not self._paused:
            return
        self._paused = False
        self._watch_pipes()  # (while pacing, when the pace ends)

    # -- exit --------------------------------------------------------------------------------------

    def _poll_exit(self) -> None:
        self._poll_handle = None
        self._check_exit()
        if self.returncode is None:
            self._poll_handle = self._loop.call_later(_POLL_INTERVAL, self._poll_exit)

    def _check_exit(self) -> None:
        if self.returncode is not None:
            return
        try:
            # WNOWAIT: look without reaping, so the zombie keeps pinning the group id below.
            if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return  # still running (a poll tick)
            self._signal_group(signal.SIGKILL)  # whatever the shell left behind (`cmd &`)
            if self._cell is not None:  # and what left its group (`setsid`, double forks)
                self._cell.kill()
            childguard.unregister(self.pid)  # before the reap, which frees the group id
            _, status, rusage = os.wait4(self.pid, os.WNOHANG)
            if self._usage_fd >= 0:
                rusage = _with_reported(rusage, self._usage_fd)
                os.close(self._usage_fd)
                self._usage_fd = -1
        except ChildProcessError:
            # Reaped behind our back (a waitpid(-1) elsewhere): the status is lost, and the group id
            # may already belong to someone else. asyncio reports 255 in this case too.
            self._finish_cell(None, 255)
            self._reaped(255)
            return
        code = os.waitstatus_to_exitcode(status)
        self._finish_cell(rusage, code)
        self._reaped(code)

    def _forked_ended(self, status: int, rusage: resource.struct_rusage | None, stats: tuple[int, ...] | None) -> None:
        """A zygote's command ended (its zygote killed what it left in its group, and reaped it,
        and read its cell's usage files: ``stats``)."""
        if self.returncode is not None:
            return
        if self._cell is not None:
            if stats is not None:
                self._cell.reported(stats)
            self._cell.kill()  # what left its group (`setsid`, double forks)
        code = os.waitstatus_to_exitcode(status)
        self._finish_cell(rusage, code)
        self._reaped(code)

    def _finish_cell(self, rusage: resource.struct_rusage | None, code: int) -> None:
        if self._cell is not None:
            cell, self._cell = self._cell, None
            self.usage = cell.finish(rusage, code, release=not self._held)
            if self._held:
                self._leftovers.append(cell.release)

    def hold_cleanup(self) -> None:
        """Leave the removal of the cell's directories (the cell is killed and measured at the
        reap all the same) until :meth:`release_soon`: the caller's final event then goes out
        first (the ShellExec path; three cgroup rmdirs cost ~100 us, a tenth of a short command)."""
        self._held = True

    def release_soon(self) -> None:
        """End :meth:`hold_cleanup`: what the reap left is removed in a later loop step (after
        the writes this step scheduled), and from now on at the reap."""
        self._held = False
        if self._leftovers:
            leftovers, self._leftovers = self._leftovers, []
            self._loop.call_soon(_tidy, leftovers)

    def _reaped(self, code: int) -> None:
        self.returncode = code
        if self._usage_fd >= 0:  # not read: reaped behind our back
            os.close(self._usage_fd)
            self._usage_fd = -1
        if self._popen is not None:
            self._popen.returncode = code  # tells Popen.__del__ the child is reaped
            self._popen = None
        _LIVE.pop(self.pid, None)
        if self._pidfd >= 0:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        if self._poll_handle is not None:
            self._poll_handle.cancel()
            self._poll_handle = None
        if not self._exited.done():
            self._exited.set_result(code)
        self._close_stdin_now()
        if self._pacing is not None:  # the writer is gone: its last output goes with its end (READ_PACE)
            self._pacing.cancel()
            self._pacing = None
            self._watch_pipes()
        if self._pipes:
            self._escape_timer = self._loop.call_later(ESCAPED_WRITER_GRACE, self._escaped_writer_check)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.returncode is None or self._pipes or self._done.done():
            return
        if self._escape_timer is not None:
            self._escape_timer.cancel()
            self._escape_timer = None
        self._done.set_result(self.returncode)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _signal_group(self, sig: int) -> None:
        # Only while the shell is unreaped: after that its pid (= the group id) may be reused.
        if self.returncode is not None:
            return
        if self._forked is not None:
            self._forked.signal(sig)
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):  # all gone, or only setuid members left
            pass

    # -- control -----------------------------------------------------------------------------------

    async def _wait_exited(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for the shell to be reaped; True if it was."""
        if not self._exited.done():
            await asyncio.wait([self._exited], timeout=timeout)
        return self._exited.done()

    async def wait(self, timeout: float | None = None) -> int:
        """Wait until the shell has exited and all output has been delivered.

        Cancelling the waiting task kills the process group and discards undelivered output (see
        :meth:`close`); the process is then reaped in the background. So do not wrap this in
        ``asyncio.wait_for`` (whose timeout cancels it): pass ``timeout`` instead, which leaves the
        process running and lets the caller :meth:`terminate` it gracefully.

        Args:
            timeout: seconds to wait at most; ``None`` waits as long as it takes.

        Returns:
            The exit status, or ``-N`` if signal ``N`` killed the shell.

        Raises:
            TimeoutError: ``timeout`` passed first; the process is left as it was.
            Exception: whatever ``on_output`` raised, if it did (the group was killed then).
        """
        try:
            if not self._done.done():
                # A future of wait()'s own, resolved where _done is: the task resumes in the next
                # loop step. Awaiting _done through asyncio.shield or asyncio.wait (which keep a
                # cancelled wait() from cancelling _done) took two: their own callback, then the task.
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._waiters.append(waiter)
                timer = None if timeout is None else self._loop.call_later(timeout, _wake, waiter)
                try:
                    await waiter
                finally:
                    if timer is not None:
                        timer.cancel()
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                if not self._done.done():
                    raise TimeoutError(f"process {self.pid} still running after {timeout} s")
            code = self._done.result()
        except asyncio.CancelledError:
            self.close()
            raise
        if self._error is not None:
            raise self._error
        return code

    async def terminate(self, grace: float = TERMINATE_GRACE) -> int:
        """Stop the command: SIGTERM to the whole group, SIGKILL ``grace`` seconds later if the shell
        is still alive, then :meth:`wait` (the remaining output is delivered first).

        Args:
            grace: seconds the shell gets to exit after SIGTERM.

        Returns:
            The exit status, normally ``-15`` or ``-9``.

        Raises:
            Exception: whatever ``on_output`` raised, if it did.
        """
        try:
            if self.returncode is None:
                self._signal_group(signal.SIGTERM)
                self._signal_group(signal.SIGCONT)  # a stopped process acts on SIGTERM only once resumed
                if not await self._wait_exited(grace):
                    self._signal_group(signal.SIGKILL)
        except asyncio.CancelledError:
            self.close()
            raise
        return await self.wait()

    def kill(self) -> None:
        """SIGKILL the whole process group and everything else the command started (its cgroup)
        now. Output already in the pipes is still delivered."""
        self._signal_group(signal.SIGKILL)
        if self._cell is not None and self.returncode is None:
            self._cell.kill()

    def close(self) -> None:
        """Kill the group, stop delivering output and close the pipes at once.

        For a client that went away. The shell is reaped in the background; :meth:`wait` then returns
        its status.
        """
        self.kill()
        self._close_stdin_now()
        for stream in list(self._pipes):
            self._close_pipe(stream)
        self._maybe_done()

    # -- stdin and terminal ------------------------------------------------------------------------

    @property
    def stdin_open(self) -> bool:
        """Whether :meth:`write_stdin` can still write (opened, not closed, child not reaped)."""
        return self._stdin >= 0 and not self._stdin_eof

    @property
    def stdin_buffered(self) -> int:
        """Bytes written with :meth:`write_stdin` that the child has not taken yet."""
        return len(self._stdin_buffer)

    @property
    def is_pty(self) -> bool:
        return self._pty >= 0

    @property
    def stdin_fd(self) -> int:
        """Our end of the child's stdin (the pipe's write end, or a dup of the pty master); -1 when
        closed. For looking at what it is (``fstat``, ``tcgetpgrp``), not for writing past :meth:`write_stdin`."""
        return self._stdin

    def write_stdin(self, data: bytes) -> bool:
        """Write ``data`` to the child's stdin (or terminal) without blocking.

        What the kernel does not take at once is kept and written as the child reads.

        Returns:
            False, writing nothing, if what is buffered plus ``data`` is more than ``stdin_limit``
            bytes (so one write is at most that); True otherwise.

        Raises:
            ValueError: stdin is not open (not asked for, closed, or the child exited).
        """
        if not self.stdin_open:
            raise ValueError("stdin is not open")
        if len(self._stdin_buffer) + len(data) > self._stdin_limit:
            return False
        if self._stdin_buffer:
            self._stdin_buffer += data
            return True
        written = self._write_some(data)
        if written < 0:
            return True  # the child closed its stdin: like a write to a closed pipe, the bytes are gone
        if written < len(data):
            self._stdin_buffer += data[written:]
            self._loop.add_writer(self._stdin, self._stdin_ready)
        return True

    def close_stdin(self) -> None:
        """End of input: close stdin once what is buffered is written (on a terminal: send ^D)."""
        if not self.stdin_open:
            return
        if self._pty >= 0:
            self.write_stdin(_EOT)
            return
        self._stdin_eof = True
        if not self._stdin_buffer:
            self._close_stdin_now()

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal size (the foreground job gets SIGWINCH).

        Raises:
            ValueError: the process has no terminal.
        """
        if self._pty < 0:
            raise ValueError("the process has no terminal")
        set_winsize(self._pty, rows, cols)

    def _write_some(self, data: bytes | bytearray) -> int:
        """Bytes the kernel took (0 when full); -1 when the reader is gone (stdin closed)."""
        try:
            n = os.write(self._stdin, data)
        except BlockingIOError:
            return 0
        except OSError:  # EPIPE, or EIO on a pty whose other side is closed
            self._close_stdin_now()
            return -1
        if n:
            self._stdin_taken += n
            if self._on_stdin is not None:
                self._on_stdin(self._stdin_taken)
        return n

    def _stdin_ready(self) -> None:
        if self._stdin < 0:
            return
        written = self._write_some(self._stdin_buffer)
        if written < 0:
            return
        del self._stdin_buffer[:written]
        if not self._stdin_buffer:
            self._loop.remove_writer(self._stdin)
            if self._stdin_eof:
                self._close_stdin_now()

    def _close_stdin_now(self) -> None:
        fd = self._stdin
        if fd < 0:
            return
        self._stdin = -1
        self._pty = -1
        self._stdin_eof = True
        self._stdin_buffer.clear()
        if not self._loop.is_closed():
            self._loop.remove_writer(fd)
        os.close(fd)


def kill_all() -> None:
    """SIGKILL the process group of every :class:`ShellProcess` whose shell is not reaped yet.

    Synchronous and safe to call at any time; registered with :mod:`atexit` so that no command
    outlives the service. Reaping is left to each process's event loop (or to init after exit).
    """
    for proc in list(_LIVE.values()):
        proc.kill()


atexit.register(kill_all)
