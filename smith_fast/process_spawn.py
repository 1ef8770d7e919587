"""How a command's shell is started: its pipes or terminal, its sandbox, its cgroup, ``Popen``.

:func:`spawn` starts ``[shell, "-c", command]`` and returns what a
:class:`~smith_fast.shell_process.ShellProcess` then runs on (:class:`Spawned`): the ``Popen``,
our ends of its output pipes (or of its pseudo-terminal) and of its stdin, its
:mod:`~smith_fast.containment` cell, and the pipe on which the sandbox program reports its
command's resource usage. Every fd the child does not need is closed in the parent once it
runs; on failure everything made is closed and the error is the one a client sees
(:func:`spawn_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import shutil
import stat
import struct
import subprocess
import termios
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from . import containment, open_files, warm_shell
from .command_env import DEFAULT_SHELL, home_environment
from .errors import ProtocolError
from .logs import get_logger
from .pb import smith_pb2
from .sandbox import Sandbox
from .sandbox.zygote import Forked, Ready, Warm, Zygote, ZygoteGone, Zygotes

__all__ = ["PIPE_SIZE", "STDERR", "STDOUT", "Spawned", "close_quietly", "route", "set_winsize", "spawn", "spawn_error", "spawn_forked",
           "start"]

STDOUT = 1
"""The ``fd`` argument of ``on_output`` for standard output."""
STDERR = 2
"""The ``fd`` argument of ``on_output`` for standard error."""
PIPE_SIZE = 1 << 20
"""The kernel buffer an output pipe is enlarged to once output fills it (``ShellProcess``): more
data per wakeup, fewer wakeups. A pipe starts at the kernel's default (64 KiB): a command with
little output never pays for the larger ring (an ``fcntl``, and the kernel's allocation and free of
it: ~5% of the service's CPU per ``true`` for its three pipes)."""

_log = get_logger("smith_fast.process")
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})

# The pty's first opener after setsid (start_new_session) gets it as its controlling terminal, so a
# small /bin/sh reopens it by name before it execs the command's shell. Not preexec_fn + TIOCSCTTY:
# that runs Python between fork and exec, which is unsafe in a process with threads (gRPC's).
_PTY_WRAPPER = 'exec 0<>"$1" 1>&0 2>&0 && exec "$2" -c "$3"'


def set_winsize(fd: int, rows: int, cols: int) -> None:
    """Set the size of the terminal ``fd`` is a side of (its foreground job gets SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# What a failed start raises (bad cwd, missing program, NUL in an argument, Popen's own checks).
_SPAWN_ERRORS = (OSError, ValueError, TypeError, subprocess.SubprocessError)


def _popen_in(cell: containment.Cell, argv: list[str], stdin: int, stdout: int, stderr: int, cwd: str | None,
              environ: dict[str, str], usage_w: int, egress_fd: int = -1, cgroup_fd: int = -1) -> subprocess.Popen[bytes]:
    """Start ``argv`` born in ``cell``'s cgroup (it cannot fork out before it is put there), in a
    session of its own. Synchronous on purpose: Popen vforks and returns once exec succeeded
    (~1 ms, see bench_process's spawn group); an executor hop would cost more than it saves.
    ``cgroup_fd`` (the sandbox program's ``--cgroup-fd``, :meth:`~smith_fast.containment.Cell.v2_fd`):
    the program starts its init in the v2 cell itself, and the service does not step in there."""
    with cell.joined(v2_delegated=cgroup_fd >= 0):
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=environ, close_fds=True,
                                pass_fds=tuple(fd for fd in (usage_w, egress_fd, cgroup_fd) if fd >= 0), start_new_session=True)


def _give_up(cell: containment.Cell, *fds: int) -> None:
    """A start that failed: its descriptors closed, its cell given back."""
    close_quietly(*fds)
    cell.release()


@dataclass(slots=True)
class Spawned:
    """A command just started.

    Attributes:
        popen: its shell (or the sandbox program running it), leading a process group of its own;
            the host pid of a command a zygote forked (not our child: see ``forked``).
        pipes: :data:`STDOUT`/:data:`STDERR` → the read end of each output pipe, non-blocking
            (on a terminal: :data:`STDOUT` → the pty master).
        cell: its cgroup (:mod:`smith_fast.containment`), the child attached and watched.
        usage_fd: where the sandbox program writes its command's rusage; -1 unsandboxed.
        stdin: our end of its stdin (a pipe's write end, or a dup of the pty master),
            non-blocking; -1 when its stdin is ``/dev/null``.
        pty: the pty master to resize through (the same fd as ``stdin``); -1 without a terminal.
        forked: how a zygote's command is signalled and how its end arrives; None for our child.
    """

    popen: subprocess.Popen[bytes] | int
    pipes: dict[int, int]
    cell: containment.Cell
    usage_fd: int = -1
    stdin: int = -1
    pty: int = -1
    forked: Forked | None = None


def spawn_error(exc: BaseException, shell: str, cwd: str | None) -> ProtocolError:
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


@functools.lru_cache(maxsize=64)
def _find_shell(shell: str, path: str | None) -> str:
    """The executable ``shell`` names (a path, or a name looked up on ``path``). Found once per
    (shell, PATH): three system calls a command; one removed later fails at its exec instead, with
    the sandbox program's message and status 127. Raises the ``OSError`` that exec would."""
    found = shutil.which(shell, path=path) if "/" not in shell else shell
    if found is None or not os.path.exists(found):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", shell)
    if not os.access(found, os.X_OK) or os.path.isdir(found):
        raise PermissionError(errno.EACCES, "Permission denied", shell)
    return found


def _confined_argv(command: str, shell: str, cwd: str | None, environ: dict[str, str], env: Mapping[str, str] | None,
                   sandbox: Sandbox) -> list[str]:
    """The shell's argv under the sandbox program (a path: it execs without a PATH search), and
    the variables the sandbox gives a command (``TMPDIR``, the session's home) added to ``environ``."""
    # The wrapper's own failure would only be an exit status: find the shell here, so a missing
    # one is the same clear error as unsandboxed.
    try:
        found = _find_shell(shell, environ.get("PATH"))
    except OSError as exc:
        raise spawn_error(exc, shell, cwd) from None
    if sandbox.tmpdir is not None and not (env and "TMPDIR" in env):
        environ["TMPDIR"] = sandbox.tmpdir
    if sandbox.home is not None:
        # The session's home (what --allow-env let the request set instead is kept)
        for name, value in home_environment(sandbox.home).items():
            if not (env and name in env):
                environ[name] = value
    return [found, "-c", command]


def _output_pipes(stdin: bool, shell: str, cwd: str | None) -> tuple[int, int, int, int, int, int]:
    """``(out_r, out_w, err_r, err_w, in_r, in_w)``: our ends non-blocking, at the kernel's
    default size (the reader enlarges one that output fills: ``ShellProcess``); the stdin pair
    -1, -1 without ``stdin``."""
    made: list[int] = []
    try:
        for _ in range(3 if stdin else 2):
            made += os.pipe2(os.O_CLOEXEC)
        for fd in made[0:4:2]:
            os.set_blocking(fd, False)
    except OSError as exc:
        close_quietly(*made)
        raise spawn_error(exc, shell, cwd) from None
    return (*made, -1, -1) if not stdin else tuple(made)  # type: ignore[return-value]  # 4 fds either way; mypy cannot count a starred tuple


_devnull_fd = -1


def _devnull() -> int:
    """One ``/dev/null`` fd of ours, kept: the stdin a zygote's command gets without a pipe."""
    global _devnull_fd
    if _devnull_fd < 0:
        _devnull_fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    return _devnull_fd


# Which way a command starts: the first row whose test holds. A session's zygote (one sandbox
# built for the session, commands forked inside it: smith_fast/sandbox/zygote.py) serves its piped
# commands; the rest start the one-shot way (the sandbox program builds the walls per command):
# unconfined commands (no sandbox program at all), commands on a terminal (the terminal is the
# view's /dev/console), and whatever has no session zygote to use (a background process outlives
# its session, a hook is the service's), and a command with an egress listener of its own
# (--network allow). A workspace session's zygote is built on its root as mounted, and closed
# when the root is mounted again (service/runner.py).
_ROUTES: tuple[tuple[str, Callable[[Sandbox | None, "tuple[int, int] | None", "Zygotes | None", int], bool]], ...] = (
    ("one-shot", lambda sandbox, pty, zygotes, egress_fd: sandbox is None or not sandbox.active),
    ("one-shot", lambda sandbox, pty, zygotes, egress_fd: pty is not None),
    ("one-shot", lambda sandbox, pty, zygotes, egress_fd: zygotes is None),
    ("one-shot", lambda sandbox, pty, zygotes, egress_fd: egress_fd >= 0),
    ("zygote", lambda sandbox, pty, zygotes, egress_fd: True),
)


def route(sandbox: Sandbox | None, pty: tuple[int, int] | None, zygotes: Zygotes | None, egress_fd: int = -1) -> str:
    """``"zygote"`` or ``"one-shot"``: how a command with these needs starts (:data:`_ROUTES`)."""
    return next(name for name, applies in _ROUTES if applies(sandbox, pty, zygotes, egress_fd))


async def start(
    command: str,
    *,
    loop: asyncio.AbstractEventLoop,
    shell: str,
    cwd: str | None,
    environ: dict[str, str],
    env: Mapping[str, str] | None,
    sandbox: Sandbox | None,
    stdin: bool,
    pty: tuple[int, int] | None,
    limits: containment.CommandLimits | None,
    zygotes: Zygotes | None,
    egress_fd: int = -1,
) -> Spawned:
    """Start ``[shell, "-c", command]`` the way :func:`route` says: :func:`spawn` (one-shot) or
    :func:`spawn_forked` (the session's zygote). Arguments and errors: :func:`spawn`'s."""
    if zygotes is not None and sandbox is not None and route(sandbox, pty, zygotes, egress_fd) == "zygote":
        try:
            return await spawn_forked(command, loop=loop, shell=shell, cwd=cwd, environ=environ, env=env,
                                      sandbox=sandbox, stdin=stdin, limits=limits, zygotes=zygotes)
        except ZygoteGone as exc:
            _log.warning("a command starts the one-shot way: its session's zygote did not take it",
                         extra={"fields": {"reason": str(exc)}})
    return spawn(command, loop=loop, shell=shell, cwd=cwd, environ=environ, env=env,
                 sandbox=sandbox, stdin=stdin, pty=pty, limits=limits, egress_fd=egress_fd)


def session_zygote(zygotes: Zygotes, sandbox: Sandbox, loop: asyncio.AbstractEventLoop) -> Zygote:
    """The session's zygote for ``sandbox``, started now if it has none: at its command, or ahead
    of it (a workspace's root was mounted again, service/runner.py)."""
    writable = sandbox.writable()
    return zygotes.get(partial(sandbox.zygote_argv, writable), tuple(sandbox.zygote_argv(writable, 0)), loop)


async def spawn_forked(
    command: str,
    *,
    loop: asyncio.AbstractEventLoop,
    shell: str,
    cwd: str | None,
    environ: dict[str, str],
    env: Mapping[str, str] | None,
    sandbox: Sandbox,
    stdin: bool,
    limits: containment.CommandLimits | None,
    zygotes: Zygotes,
) -> Spawned:
    """:func:`spawn` through the session's zygote for ``sandbox``: no namespaces built, no
    ``Popen``, the command born in its cell (its limits set before).

    Raises:
        ZygoteGone: the zygote could not take it (nothing ran: start it the one-shot way).
        ProtocolError: as :func:`spawn`.
    """
    zygote = session_zygote(zygotes, sandbox, loop)
    argv = _confined_argv(command, shell, cwd, environ, env, sandbox)
    where = cwd or os.getcwd()
    try:
        # Where Popen would have failed to chdir, the same error; the command enters cwd in its view.
        if not stat.S_ISDIR(os.stat(where).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), where)
    except OSError as exc:
        raise spawn_error(exc, shell, cwd) from None
    wanted = limits or containment.CommandLimits()
    ready = await zygote.ready(wanted)
    while ready is not None and ready.warm is not None and not ready.warm.matches(argv[0], where, stdin):
        # a shell made for another directory (or shell, or a stdin or not): let go, and the one
        # behind it looked at (a burst keeps two: the second was made after the last command)
        ready.discard()
        ready = zygote.take_ready(wanted)
    if ready is not None and ready.warm is not None:
        spawned = _run_warm(zygote, ready, command, argv, environ, where, stdin, loop)
        if spawned is not None:
            assert spawned.forked is not None
            zygote.prepare_after(spawned.forked, wanted, partial(_warm, argv[0], environ, where, stdin))
            return spawned
        ready.discard()  # not for this command: it exits at the end of its empty script
        ready = None
    out_r, out_w, err_r, err_w, in_r, in_w = _output_pipes(stdin, shell, cwd)
    cell = ready.cell if ready is not None else containment.new_cell(wanted, born_elsewhere=True)
    ours = (out_r, err_r, *((in_w,) if stdin else ()))
    try:
        try:
            # (a ready process's cell sent its usage files with it)
            forked, started = zygote.start(argv, environ, where, (in_r if stdin else _devnull(), out_w, err_w),
                                           cell.birth_fds(), ready=ready, usage=cell.usage_files() if ready is None else (0, ()))
        finally:
            close_quietly(out_w, err_w, *((in_r,) if stdin else ()))  # in flight now, or not needed
        # The next command's process, asked for now: the init forks it while this command execs
        # (later, the fork would meet this command's end and delay its final event).
        zygote.prepare(wanted, partial(_warm, argv[0], environ, where, stdin))
        pid = await started
    except ZygoteGone:
        _give_up(cell, *ours)
        raise
    except _SPAWN_ERRORS as exc:
        _give_up(cell, *ours)
        raise spawn_error(exc, shell, cwd) from None
    except BaseException:
        _give_up(cell, *ours)
        raise
    cell.attach(pid)
    cell.watch(loop)
    if stdin:
        os.set_blocking(in_w, False)
    return Spawned(pid, {STDOUT: out_r, STDERR: err_r}, cell, -1, in_w if stdin else -1, forked=forked)


def _warm(shell: str, environ: dict[str, str], cwd: str, stdin: bool) -> Warm | None:
    """The next command's shell, to start now (:mod:`~smith_fast.warm_shell`), if commands like
    this one can run in one: the same shell and directory (and a stdin or not), with its pipes and
    this command's environment (the next one's script sets what differs)."""
    if not warm_shell.read_size(shell):
        return None
    made: list[int] = []
    try:
        made += os.pipe2(os.O_CLOEXEC)  # enlarged for a script that needs it (Zygote.run)
        out_r, out_w, err_r, err_w, in_r, in_w = _output_pipes(stdin, shell, cwd)
    except (OSError, ProtocolError):
        close_quietly(*made)
        return None
    os.set_blocking(made[1], False)  # its script goes in one write, or not at all
    if stdin:
        os.set_blocking(in_w, False)
        return Warm([shell, "-s"], environ, cwd, (made[1], out_r, err_r, in_w), (made[0], out_w, err_w, in_r))
    return Warm([shell, "-s"], environ, cwd, (made[1], out_r, err_r, -1), (made[0], out_w, err_w))


def _run_warm(zygote: Zygote, ready: Ready, command: str, argv: list[str], environ: dict[str, str], cwd: str,
              stdin: bool, loop: asyncio.AbstractEventLoop) -> Spawned | None:
    """``command`` run by the warm shell ``ready`` holds, one that :meth:`Warm.matches` it (the
    caller let the others go); None when it cannot (a command or environment
    :func:`~smith_fast.warm_shell.script` refuses, a shell gone)."""
    warm = ready.warm
    assert warm is not None
    text = warm_shell.script(command, argv[0], cwd, environ, stdin, warm.env)
    if text is None:
        return None
    out, err, fd0 = warm.out, warm.err, warm.stdin
    try:
        forked = zygote.run(ready, text)
    except OSError:
        return None
    ready.cell.attach(ready.pid)
    ready.cell.watch(loop)
    return Spawned(ready.pid, {STDOUT: out, STDERR: err}, ready.cell, -1, fd0, forked=forked)


def spawn(
    command: str,
    *,
    loop: asyncio.AbstractEventLoop,
    shell: str,
    cwd: str | None,
    environ: dict[str, str],
    env: Mapping[str, str] | None,
    sandbox: Sandbox | None,
    stdin: bool,
    pty: tuple[int, int] | None,
    limits: containment.CommandLimits | None,
    egress_fd: int = -1,
) -> Spawned:
    """Start ``[shell, "-c", command]`` (through the sandbox program when ``sandbox`` is active).

    Args:
        command: the command line.
        loop: the loop that watches its cgroup.
        shell: the shell program (looked up on ``environ``'s ``PATH`` when it has no slash).
        cwd: its working directory; None: the service's own.
        environ: its whole environment (``TMPDIR``, and the home variables of the sandbox's home, are added for a sandboxed command).
        env: what the request asked for (a ``TMPDIR`` of its own is kept).
        sandbox, stdin, pty, limits, egress_fd: as :meth:`~smith_fast.shell_process.ShellProcess.start`'s.

    Raises:
        ProtocolError: it could not be started (:func:`spawn_error`).
    """
    argv = _confined_argv(command, shell, cwd, environ, env, sandbox) if sandbox is not None and sandbox.active else [shell, "-c", command]
    if pty is not None:
        return _spawn_pty(loop, shell, command, cwd, environ, pty, sandbox, limits, egress_fd)
    try:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
    except OSError as exc:
        raise spawn_error(exc, shell, cwd) from None
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
    except OSError as exc:
        close_quietly(out_r, out_w)
        raise spawn_error(exc, shell, cwd) from None
    cell = containment.new_cell(limits)
    try:
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (-1, -1)
    except OSError as exc:
        close_quietly(out_r, out_w, err_r, err_w)
        raise spawn_error(exc, shell, cwd) from None
    usage_r = usage_w = cgroup_fd = -1
    try:
        if sandbox is not None and sandbox.active:
            usage_r, usage_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            cgroup_fd = cell.v2_fd()
            argv = sandbox.wrap(argv, sandbox.writable(), usage_fd=usage_w, egress_fd=egress_fd, cgroup_fd=cgroup_fd)
            environ = sandbox.wrap_environ(environ)
        child = _popen_in(cell, argv, in_r if stdin else subprocess.DEVNULL, out_w, err_w, cwd, environ, usage_w, egress_fd,
                          cgroup_fd)
    except _SPAWN_ERRORS as exc:
        _give_up(cell, out_r, out_w, err_r, err_w, *((in_r, in_w) if stdin else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
        raise spawn_error(exc, shell, cwd) from None
    except BaseException:
        _give_up(cell, out_r, out_w, err_r, err_w, *((in_r, in_w) if stdin else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
        raise
    if usage_w >= 0:
        os.close(usage_w)
    pid = child.pid
    cell.attach(pid)  # its limits, now that the service is out of the cell
    if sandbox is None or not sandbox.active:
        open_files.give_back(pid)  # (the sandbox program sets it before the exec)
    cell.watch(loop)
    # Only the child may hold the write ends, or EOF would never come.
    close_quietly(out_w, err_w, *((in_r,) if stdin else ()))
    if stdin:
        os.set_blocking(in_w, False)
    return Spawned(child, {STDOUT: out_r, STDERR: err_r}, cell, usage_r, in_w if stdin else -1)


def _spawn_pty(
    loop: asyncio.AbstractEventLoop,
    shell: str,
    command: str,
    cwd: str | None,
    environ: dict[str, str],
    size: tuple[int, int],
    sandbox: Sandbox | None,
    limits: containment.CommandLimits | None,
    egress_fd: int = -1,
) -> Spawned:
    found = shutil.which(shell, path=environ.get("PATH"))
    if found is None:
        raise spawn_error(FileNotFoundError(errno.ENOENT, "not found", shell), shell, cwd)
    try:
        master, slave = os.openpty()  # both non-inheritable
    except OSError as exc:
        raise spawn_error(exc, shell, cwd) from None
    writer = -1
    usage_r = usage_w = cgroup_fd = -1
    cell = containment.new_cell(limits)
    try:
        set_winsize(master, *size)
        writer = os.dup(master)  # our stdin end: closed apart from the read end
        os.set_blocking(master, False)
        os.set_blocking(writer, False)
        if sandbox is not None and sandbox.active:
            # The same confinement as a piped command; the sandbox program makes the terminal
            # the command's controlling one (the host's /dev/pts is not in its view).
            usage_r, usage_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            cgroup_fd = cell.v2_fd()
            argv = sandbox.wrap([found, "-c", command], sandbox.writable(), tty=True, usage_fd=usage_w, egress_fd=egress_fd,
                                cgroup_fd=cgroup_fd)
            environ = sandbox.wrap_environ(environ)
        else:
            argv = [DEFAULT_SHELL, "-c", _PTY_WRAPPER, "smith-fast-pty", os.ttyname(slave), shell, command]
        popen = _popen_in(cell, argv, slave, slave, slave, cwd, environ, usage_w, egress_fd, cgroup_fd)
    except _SPAWN_ERRORS as exc:
        _give_up(cell, master, slave, *((writer,) if writer >= 0 else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
        raise spawn_error(exc, shell, cwd) from None
    except BaseException:
        _give_up(cell, master, slave, *((writer,) if writer >= 0 else ()), *((usage_r, usage_w) if usage_r >= 0 else ()))
        raise
    if usage_w >= 0:
        os.close(usage_w)
    cell.attach(popen.pid)
    if sandbox is None or not sandbox.active:
        open_files.give_back(popen.pid)
    cell.watch(loop)
    close_quietly(slave)  # EOF (EIO on the master) once the child's side is closed
    return Spawned(popen, {STDOUT: master}, cell, usage_r, writer, writer)
