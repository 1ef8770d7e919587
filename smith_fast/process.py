"""Run shell commands as child processes whose output streams through the running event loop.

This is what ``ShellExec`` and the ``shell.run`` tool run on. The same code runs on uvloop and on
stdlib asyncio because it uses only ``loop.add_reader`` and plain system calls:

* **Spawn**: ``subprocess.Popen`` (vfork + exec) with ``start_new_session=True``, so the shell
  (or, for a sandboxed command, the sandbox program ``sandbox-exec`` that runs it: a monitor that
  ends as the command ends) leads a process group of its own and one ``killpg`` reaches everything
  it started; ``close_fds=True``; stdin is ``/dev/null``; stdout and stderr are two fresh
  ``O_CLOEXEC`` pipes.
* **stdin and terminals** (``start(stdin=True)``, ``start(pty=(rows, cols))``): stdin becomes a pipe,
  or all three standard streams one pseudo-terminal (``os.openpty``; a ``/bin/sh`` wrapper reopens
  it by name after ``setsid``, which makes it the controlling terminal, then execs the shell, or
  the sandbox program makes it so with ``TIOCSCTTY``; so Ctrl-C written as ``\x03`` interrupts its foreground
  job and ``resize`` reaches it as SIGWINCH). :meth:`ShellProcess.write_stdin` writes without
  blocking; what the child has not read yet waits in a buffer of at most ``stdin_limit`` bytes, and
  a write that would exceed it is refused whole (returns False), so a child that does not read
  cannot make the service hold more.
* **Read**: the pipes are enlarged to :data:`PIPE_SIZE` (``F_SETPIPE_SZ``; refused silently, e.g.
  past ``/proc/sys/fs/pipe-max-size``), made non-blocking and read with ``loop.add_reader`` +
  one read per wakeup, into a buffer of ``read_size`` bytes kept for the thread and shared by its
  processes (then copied out at the size read: a fresh 1 MiB allocation per read, or per
  process, costs more than the read). No transport,
  protocol or stream buffer sits between the pipe and ``on_output``: every wakeup costs one
  system call and one callback
  (``bench/bench_process.py`` measures this against a blocking ``os.read`` loop).
* **Exit**: ``os.pidfd_open`` + ``loop.add_reader``: no SIGCHLD handler, no child-watcher thread, no
  ``waitpid(-1)`` that could steal another library's children. Where pidfd is unavailable
  (Linux < 5.3, some seccomp sandboxes) a 50 ms ``waitpid(WNOHANG)`` poll replaces it.
* **No orphans**: when the shell exits, the rest of its group (``sleep 100 &``) is SIGKILLed *before*
  the shell is reaped: the unreaped zombie still pins the group id, so the signal cannot reach an
  unrelated process that reused the number. Afterwards the group is never signalled again. Then the
  pipes drain to EOF. A writer that escaped the group (``setsid cmd &``) would hold a pipe open
  forever, so :data:`ESCAPED_WRITER_GRACE` seconds after the exit whatever is buffered is read and the
  pipes are closed.
* **No escapes**: each command also runs in a cgroup of its own (:mod:`smith_fast.containment`,
  where a cgroup hierarchy is writable), killed whole with the group, so ``setsid``, double forks
  and daemons die with the request too; the cell also yields :attr:`ShellProcess.usage` (CPU,
  memory, I/O, from the cgroup and the ``wait4`` rusage) and enforces the command's limits.
* **Backpressure**: :meth:`ShellProcess.pause_reading` removes the pipe readers; the kernel pipe
  fills and the child blocks in ``write``, so the service holds at most what it already delivered.
* **Cancellation**: a cancelled :meth:`ShellProcess.wait`, :meth:`ShellProcess.terminate` or
  :func:`run_collect` kills the group and closes the pipes at once; the pidfd reader stays until the
  shell is reaped. For a graceful timeout use ``wait(timeout=...)`` then ``terminate()``, never
  ``asyncio.wait_for(proc.wait(), ...)``. :func:`kill_all` runs at interpreter exit.
* **Even if we are killed**: with :func:`smith_fast.childguard.start` (the service calls it), a
  watchdog process kills the groups still running when we die without running ``kill_all``
  (``SIGKILL``, the OOM killer).

Linux only.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import fcntl
import functools
import os
import pwd
import shutil
import resource
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from . import childguard, containment
from .errors import ProtocolError
from .pb import smith_pb2
from .sandbox import Sandbox

__all__ = [
    "DEFAULT_PATH",
    "DEFAULT_READ_SIZE",
    "DEFAULT_SHELL",
    "ESCAPED_WRITER_GRACE",
    "PIPE_SIZE",
    "STDERR",
    "STDIN_LIMIT",
    "STDOUT",
    "TERMINATE_GRACE",
    "Collected",
    "ShellProcess",
    "base_environment",
    "kill_all",
    "run_collect",
    "CappedOutput",
]

STDOUT = 1
"""The ``fd`` argument of ``on_output`` for standard output."""
STDERR = 2
"""The ``fd`` argument of ``on_output`` for standard error."""
DEFAULT_SHELL = "/bin/sh"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PIPE_SIZE = 1 << 20
"""Requested kernel buffer of each output pipe: more data per wakeup, fewer wakeups."""
DEFAULT_READ_SIZE = 1 << 20
TERMINATE_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL in :meth:`ShellProcess.terminate` and :func:`run_collect`."""
ESCAPED_WRITER_GRACE = 0.5
"""Seconds after the shell exits before pipes still held open by a process outside its group are closed."""

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_HAVE_PIDFD = hasattr(os, "pidfd_open")
_POLL_INTERVAL = 0.05
_DRAIN_MAX_READS = 64
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})
STDIN_LIMIT = 1 << 20
"""Default bound of the bytes written to a child's stdin that it has not read yet."""
_EOT = b"\x04"  # what end of input is on a terminal (VEOF, in canonical mode)


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


# The pty's first opener after setsid (start_new_session) gets it as its controlling terminal, so a
# small /bin/sh reopens it by name before it execs the command's shell. Not preexec_fn + TIOCSCTTY:
# that runs Python between fork and exec, which is unsafe in a process with threads (gRPC's).
_PTY_WRAPPER = 'exec 0<>"$1" 1>&0 2>&0 && exec "$2" -c "$3"'

# pid -> process whose shell is not reaped yet; kill_all() signals these groups.
_LIVE: dict[int, ShellProcess] = {}


@functools.lru_cache(maxsize=4)
def _account(uid: int) -> tuple[str, str | None]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # a uid with no passwd entry, common in containers
        return str(uid), None
    return entry.pw_name, entry.pw_dir or None


def base_environment() -> dict[str, str]:
    """The environment every command starts from, before the request's ``env`` is layered on top.

    It is deliberately *not* the service's own environment, which may hold credentials. It holds
    exactly these nine variables:

    * ``PATH``: the service's ``PATH`` if set and non-empty, else :data:`DEFAULT_PATH`.
    * ``HOME``: the service's ``HOME`` if set and non-empty, else the home directory of the
      service's user from the password database, else ``/``.
    * ``USER`` and ``LOGNAME``: the name of the user the service runs as (password database),
      or the numeric uid when it has no entry.
    * ``SHELL``: ``/bin/sh`` (:meth:`ShellProcess.start` replaces it with the shell it runs).
    * ``LANG`` and ``LC_ALL``: ``C.UTF-8``.
    * ``TERM``: ``dumb`` (output goes to a pipe, not a terminal).
    * ``SMITH_FAST``: ``1``, so a command can tell it runs under smith-fast.

    Returns:
        A new dict the caller may modify.
    """
    user, home = _account(os.getuid())
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": os.environ.get("HOME") or home or "/",
        "USER": user,
        "LOGNAME": user,
        "SHELL": DEFAULT_SHELL,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "SMITH_FAST": "1",
    }


def _spawn_error(exc: BaseException, shell: str, cwd: str | None) -> ProtocolError:
    """Turn what ``Popen`` raised into the error a client sees."""
    code = smith_pb2.ERROR_CODE_UNSPECIFIED
    details = {"reason": "spawn_failed"}
    if isinstance(exc, OSError):
        if exc.errno is not None:
            details["errno"] = errno.errorcode.get(exc.errno, str(exc.errno))
        reason = exc.strerror or str(exc)
        if exc.errno in _RESOURCE_ERRNOS:
            code = smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED
            message = f"cannot start shell {shell!r}: {reason}"
        elif cwd is not None and exc.filename == cwd:
            if isinstance(exc, FileNotFoundError):
                message = f"working directory {cwd!r} does not exist"
            elif isinstance(exc, NotADirectoryError):
                message = f"working directory {cwd!r} is not a directory"
            else:
                message = f"cannot enter working directory {cwd!r}: {reason}"
        elif isinstance(exc, FileNotFoundError):
            message = f"shell {shell!r} not found"
        elif isinstance(exc, PermissionError):
            message = f"shell {shell!r} is not executable: {reason}"
        else:
            message = f"cannot run shell {shell!r}: {reason}"
    else:  # ValueError/TypeError: a NUL byte in the command or env, an '=' in a variable name
        message = f"cannot start shell {shell!r}: {exc}"
    return ProtocolError(message, code, details=details)


_buffers = threading.local()


def _thread_buffer(size: int) -> memoryview:
    """``size`` bytes of this thread's read buffer (grown when a process reads more at once)."""
    buffer: memoryview | None = getattr(_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _buffers.buffer = memoryview(bytearray(size))
    return buffer[:size]


def _tidy(leftovers: list[Callable[[], None]]) -> None:
    for remove in leftovers:
        remove()
    # and the next command's directories, made now rather than while it starts
    containment.prepare_spare()


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


def _close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


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
        "_read_size",
        "_pipes",
        "_paused",
        "_buffer",
        "_pidfd",
        "_poll_handle",
        "_escape_timer",
        "_exited",
        "_done",
        "_error",
        "_stdin",
        "_stdin_buffer",
        "_stdin_limit",
        "_stdin_eof",
        "_pty",
        "_stdin_taken",
        "_on_stdin",
        "_cell",
        "_usage_fd",
        "_held",
        "_leftovers",
        "usage",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        popen: subprocess.Popen[bytes] | int,
        pipes: dict[int, int],
        on_output: Callable[[int, bytes], None],
        read_size: int,
    ) -> None:
        self.pid: int = popen if isinstance(popen, int) else popen.pid
        self.returncode: int | None = None
        self._loop = loop
        # Kept until the shell is reaped: a Popen collected earlier would waitpid() it itself.
        self._popen: subprocess.Popen[bytes] | None = None if isinstance(popen, int) else popen
        self._on_output = on_output
        self._read_size = read_size
        self._pipes = pipes  # STDOUT/STDERR -> read end, until EOF or close()
        self._paused = False
        self._buffer: memoryview | None = None  # read_size bytes, allocated on the first read
        self._pidfd = -1
        self._poll_handle: asyncio.TimerHandle | None = None
        self._escape_timer: asyncio.TimerHandle | None = None
        self._exited: asyncio.Future[int] = loop.create_future()  # shell reaped
        self._done: asyncio.Future[int] = loop.create_future()  # reaped and both pipes closed
        self._error: Exception | None = None
        self._stdin = -1  # our end of the child's stdin (a pipe, or a dup of the pty master)
        self._stdin_buffer = bytearray()  # written but not yet taken by the kernel
        self._stdin_limit = STDIN_LIMIT
        self._stdin_eof = False  # close stdin once the buffer is written
        self._pty = -1  # the pty master, for resize
        self._stdin_taken = 0  # bytes of stdin the kernel took
        self._on_stdin: Callable[[int], None] | None = None
        self._cell: containment.Cell | None = None
        self._usage_fd = -1  # where the sandbox program writes its command's rusage (sandboxed only)
        self._held = False  # hold_cleanup(): the reap leaves the removals to release_soon()
        self._leftovers: list[Callable[[], None]] = []  # what the reap left to remove
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
        cwd = cwd or None
        environ = base_environment()
        environ["SHELL"] = shell
        if env:
            environ.update(env)
        argv = [shell, "-c", command]
        if sandbox is not None and sandbox.active:
            # The wrapper execs without a PATH search, and its own failure would only be an exit
            # status: find the shell here, so a missing one is the same clear error as unsandboxed.
            found = shutil.which(shell, path=environ.get("PATH")) if "/" not in shell else shell
            if found is None or not os.path.exists(found):
                raise _spawn_error(FileNotFoundError(errno.ENOENT, "No such file or directory", shell), shell, cwd)
            if not os.access(found, os.X_OK) or os.path.isdir(found):
                raise _spawn_error(PermissionError(errno.EACCES, "Permission denied", shell), shell, cwd)
            argv = [found, "-c", command]
            if sandbox.tmpdir is not None and not (env and "TMPDIR" in env):
                environ["TMPDIR"] = sandbox.tmpdir
        if pty is not None:
            self = cls._start_pty(loop, shell, command, cwd, environ, on_output, read_size, pty, stdin_limit, sandbox, limits)
            self._on_stdin = on_stdin
            return self
        try:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            raise _spawn_error(exc, shell, cwd) from None
        try:
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            _close_quietly(out_r, out_w)
            raise _spawn_error(exc, shell, cwd) from None
        cell = containment.new_cell(limits)
        try:
            for fd in (out_r, err_r):
                try:
                    fcntl.fcntl(fd, _F_SETPIPE_SZ, pipe_size)
                except OSError:  # EPERM past pipe-max-size or the per-user pipe quota
                    pass
                os.set_blocking(fd, False)
            in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (-1, -1)
        except OSError as exc:
            _close_quietly(out_r, out_w, err_r, err_w)
            raise _spawn_error(exc, shell, cwd) from None
        usage_r = usage_w = -1
        try:
            if sandbox is not None and sandbox.active:
                usage_r, usage_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                argv = sandbox.wrap(argv, sandbox.writable(), usage_fd=usage_w)
            # Synchronous on purpose: Popen vforks and returns once exec succeeded (~1 ms, see
            # bench_process's spawn group); an executor hop would cost more than it saves.
            with cell.joined():  # born in its cgroup: it cannot fork out before it is put there
                child = subprocess.Popen(
                    argv,
                    stdin=in_r if stdin else subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=err_w,
                    cwd=cwd,
                    env=environ,
                    close_fds=True,
                    pass_fds=(usage_w,) if usage_w >= 0 else (),
                    start_new_session=True,
                )
        except (OSError, ValueError, TypeError) as exc:
            _close_quietly(out_r, out_w, err_r, err_w, *((in_r, in_w) if stdin else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
            cell.release()
            raise _spawn_error(exc, shell, cwd) from None
        except BaseException:
            _close_quietly(out_r, out_w, err_r, err_w, *((in_r, in_w) if stdin else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
            cell.release()
            raise
        if usage_w >= 0:
            os.close(usage_w)
        pid = child.pid
        cell.attach(pid)  # its limits, now that the service is out of the cell
        cell.watch(loop)
        # Only the child may hold the write ends, or EOF would never come.
        _close_quietly(out_w, err_w, *((in_r,) if stdin else ()))
        self = cls(loop, child, {STDOUT: out_r, STDERR: err_r}, on_output, read_size)
        self._cell = cell
        self._usage_fd = usage_r
        if stdin:
            os.set_blocking(in_w, False)
            self._stdin, self._stdin_limit, self._on_stdin = in_w, stdin_limit, on_stdin
        self._watch(loop)
        return self

    @classmethod
    def _start_pty(
        cls,
        loop: asyncio.AbstractEventLoop,
        shell: str,
        command: str,
        cwd: str | None,
        environ: dict[str, str],
        on_output: Callable[[int, bytes], None],
        read_size: int,
        size: tuple[int, int],
        stdin_limit: int,
        sandbox: Sandbox | None,
        limits: containment.CommandLimits | None,
    ) -> ShellProcess:
        found = shutil.which(shell, path=environ.get("PATH"))
        if found is None:
            raise _spawn_error(FileNotFoundError(errno.ENOENT, "not found", shell), shell, cwd)
        try:
            master, slave = os.openpty()  # both non-inheritable
        except OSError as exc:
            raise _spawn_error(exc, shell, cwd) from None
        writer = -1
        usage_r = usage_w = -1
        cell = containment.new_cell(limits)
        try:
            _set_winsize(master, *size)
            writer = os.dup(master)  # our stdin end: closed apart from the read end
            os.set_blocking(master, False)
            os.set_blocking(writer, False)
            if sandbox is not None and sandbox.active:
                # The same confinement as a piped command; the sandbox program makes the terminal
                # the command's controlling one (the host's /dev/pts is not in its view).
                usage_r, usage_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                argv = sandbox.wrap([found, "-c", command], sandbox.writable(), tty=True, usage_fd=usage_w)
            else:
                argv = [DEFAULT_SHELL, "-c", _PTY_WRAPPER, "smith-fast-pty", os.ttyname(slave), shell, command]
            with cell.joined():  # born in its cgroup, as a piped command is
                popen = subprocess.Popen(
                    argv,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    cwd=cwd,
                    env=environ,
                    close_fds=True,
                    pass_fds=(usage_w,) if usage_w >= 0 else (),
                    start_new_session=True,
                )
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            _close_quietly(master, slave, *((writer,) if writer >= 0 else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
            cell.release()
            raise _spawn_error(exc, shell, cwd) from None
        except BaseException:
            _close_quietly(master, slave, *((writer,) if writer >= 0 else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
            cell.release()
            raise
        if usage_w >= 0:
            os.close(usage_w)
        cell.attach(popen.pid)
        cell.watch(loop)
        _close_quietly(slave)  # EOF (EIO on the master) once the child's side is closed
        self = cls(loop, popen, {STDOUT: master}, on_output, read_size)
        self._cell = cell
        self._usage_fd = usage_r
        self._stdin, self._stdin_limit, self._pty = writer, stdin_limit, writer
        self._watch(loop)
        return self

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        _LIVE[self.pid] = self
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
        for stream, fd in self._pipes.items():
            loop.add_reader(fd, self._read_ready, stream, fd)

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"returncode={self.returncode}"
        return f"<ShellProcess pid={self.pid} {state}>"

    # -- output ------------------------------------------------------------------------------------

    def _read_ready(self, stream: int, fd: int) -> None:
        # One read per wakeup: the pipe holds at most PIPE_SIZE, so with read_size >= PIPE_SIZE a
        # second read would only return EAGAIN; the loop calls again if anything is left.
        try:
            data = self._read(fd)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._deliver(stream, data)
        else:
            self._close_pipe(stream)
            self._maybe_done()

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

    def _close_pipe(self, stream: int) -> None:
        fd = self._pipes.pop(stream, None)
        if fd is None:
            return
        if not self._loop.is_closed():
            self._loop.remove_reader(fd)
        os.close(fd)
        if not self._pipes:
            self._buffer = None

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
        for fd in self._pipes.values():
            self._loop.remove_reader(fd)

    def resume_reading(self) -> None:
        """Resume reading after :meth:`pause_reading`."""
        if not self._paused:
            return
        self._paused = False
        for stream, fd in self._pipes.items():
            self._loop.add_reader(fd, self._read_ready, stream, fd)

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

    def _signal_group(self, sig: int) -> None:
        # Only while the shell is unreaped: after that its pid (= the group id) may be reused.
        if self.returncode is not None:
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
            if timeout is None:
                code = await asyncio.shield(self._done)
            else:
                if not self._done.done():
                    await asyncio.wait([self._done], timeout=timeout)
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
        _set_winsize(self._pty, rows, cols)

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


@dataclass(frozen=True, slots=True)
class Collected:
    """What :func:`run_collect` gathered.

    Attributes:
        exit_code: the exit status, or ``-N`` if signal ``N`` killed the shell (on timeout usually
            ``-15``, or ``-9`` if it ignored SIGTERM). Always set by :func:`run_collect`.
        stdout: standard output, at most ``max_output`` bytes.
        stderr: standard error, at most ``max_output`` bytes.
        truncated: a stream produced more than ``max_output`` bytes and the rest was discarded.
        timed_out: the command ran past ``timeout`` and was terminated.
        duration_ms: wall time from spawning to the last output, in milliseconds.
        usage: what the command cost (:class:`smith_fast.containment.Usage`), when known.
    """

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration_ms: int
    usage: containment.Usage | None = field(default=None, compare=False)  # varies run to run


class CappedOutput:
    """A command's stdout and stderr kept up to ``max_output`` bytes each; the rest is read (so the
    child never blocks) and dropped, and :attr:`truncated` says so. ``on_output`` is the
    :class:`ShellProcess` callback."""

    __slots__ = ("max_output", "truncated", "_buffers")

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.truncated = False
        self._buffers = {STDOUT: bytearray(), STDERR: bytearray()}

    def on_output(self, stream: int, data: bytes) -> None:
        buf = self._buffers[stream]
        room = self.max_output - len(buf)
        if len(data) <= room:
            buf += data
        else:
            if room > 0:
                buf += data[:room]
            self.truncated = True

    @property
    def stdout(self) -> bytes:
        return bytes(self._buffers[STDOUT])

    @property
    def stderr(self) -> bytes:
        return bytes(self._buffers[STDERR])


async def run_collect(
    command: str,
    *,
    shell: str | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    max_output: int = 1 << 20,
    sandbox: Sandbox | None = None,
    limits: containment.CommandLimits | None = None,
) -> Collected:
    """Run a command to completion and collect its output.

    Output past ``max_output`` bytes per stream is read (so the child never blocks) and discarded.
    On timeout the group gets SIGTERM, then SIGKILL after :data:`TERMINATE_GRACE` seconds.

    Args:
        command: the command line, run as ``[shell, "-c", command]``.
        shell: the shell; ``None`` means :data:`DEFAULT_SHELL`.
        cwd: the working directory; ``None`` means the service's own.
        env: variables layered over :func:`base_environment`.
        timeout: seconds before the command is terminated; ``None`` for no limit.
        max_output: the most bytes kept of each of stdout and stderr.
        sandbox: confine the command (see :meth:`ShellProcess.start`).
        limits: what the command may use (:mod:`smith_fast.containment`).

    Returns:
        The exit code, both outputs and what happened.

    Raises:
        ProtocolError: the command could not be started (see :meth:`ShellProcess.start`).
        asyncio.CancelledError: the caller was cancelled; the group was killed first.
    """
    output = CappedOutput(max_output)
    started = time.monotonic()
    proc = await ShellProcess.start(command, shell=shell, cwd=cwd, env=env, on_output=output.on_output, sandbox=sandbox, limits=limits)
    timed_out = False
    try:
        try:
            code = await proc.wait(None if timeout is None else max(timeout, 0.0))
        except TimeoutError:
            timed_out = proc.returncode is None  # else it exited in time and only output was in flight
            code = await proc.terminate(TERMINATE_GRACE)
    except BaseException:
        proc.close()
        raise
    return Collected(
        exit_code=code,
        stdout=output.stdout,
        stderr=output.stderr,
        truncated=output.truncated,
        timed_out=timed_out,
        duration_ms=int((time.monotonic() - started) * 1000),
        usage=proc.usage,
    )
