"""Run shell commands as child processes whose output streams through the running event loop.

The names a caller uses, from the modules that do the work: :mod:`~smith_fast.command_env` (the
environment a command starts from), :mod:`~smith_fast.process_spawn` (pipes or a terminal, the
sandbox, the cgroup, ``Popen``), :mod:`~smith_fast.shell_process` (:class:`ShellProcess`: output,
exit, stdin, control) and :mod:`~smith_fast.collect` (:func:`run_collect`). How they work:

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
* **Read**: the pipes are made non-blocking at the kernel's default size, and enlarged to
  :data:`PIPE_SIZE` once output comes faster than it is read (``F_SETPIPE_SZ``; refused silently,
  e.g. past ``/proc/sys/fs/pipe-max-size``), read one read per wakeup, when the
  loop's one epoll for pipes says so (:mod:`~smith_fast.fd_watch`: a loop reader per pipe cost
  more system calls than the reads of a short command), into a buffer of ``read_size`` bytes kept for the thread and shared by its
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
* **Even if we are killed**: with :func:`smith_fast.childguard.start` (the service arms it: started by its first process), a
  watchdog process kills the groups still running when we die without running ``kill_all``
  (``SIGKILL``, the OOM killer).

Linux only.
"""

from __future__ import annotations

from .collect import CappedOutput, Collected, run_collect
from .command_env import DEFAULT_PATH, DEFAULT_SHELL, base_environment
from .process_spawn import PIPE_SIZE, STDERR, STDOUT
from .shell_process import DEFAULT_READ_SIZE, ESCAPED_WRITER_GRACE, STDIN_LIMIT, TERMINATE_GRACE, ShellProcess, kill_all

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
