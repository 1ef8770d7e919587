"""A watchdog process that kills our children's process groups if we die without doing it ourselves.

:mod:`smith_fast.process` kills every command's process group when the request ends, and at
interpreter exit. Neither runs if the service is ``SIGKILL``\\ ed (or the OOM killer picks it): the
shells would be re-parented to init and run on. The guard closes that gap:

* :func:`start` spawns this file as a small separate process (``python -I -S``, stdlib only, in a
  session of its own so a terminal's Ctrl-C does not reach it) reading a pipe from us; a service
  :func:`arm`\\ s it instead, and the first :func:`register` starts it.
* For each shell (and each Rust hook process), :mod:`smith_fast.process` writes ``+PID`` once it
  is spawned and ``-PID`` once it has exited and its group was killed, *before* reaping it: while a
  pid is registered it is ours and unreaped, so its number (the group id) cannot be reused.
* A command's cgroup directories (:mod:`smith_fast.containment`) follow its ``+PID``: what left
  the group (``setsid``, daemons) is in the cgroup, which the guard kills (``cgroup.kill``, else each
  member) and removes, with the service's ``smith-fast-PID`` parents once empty.
* A session's zygote (:mod:`smith_fast.sandbox.zygote`) registers once, as its monitor's ``+PID``
  with the cells' parents: the commands it forks are not ours to reap and cost the guard nothing;
  at EOF the guard kills the zygote's group (its pid namespace ends with its init) and every cell
  beneath those parents, and removes them.
* ``=PATH`` names a directory to remove (once empty) at end-of-file: the service's cells' parents,
  which it removes itself at a clean exit, but not when SIGKILLed, nor when it may no longer (a
  ``--workspaces`` service made them as root before it entered its user namespace) (:func:`remove_at_end`).
* When the pipe reaches end-of-file, whichever way we died, the guard ``SIGKILL``\\ s the group of
  every pid still registered: at once, so the groups are still ours. Linux does not hand out a
  number that is the group id of a live process, so a group id can only come back once every
  member of our group is gone, and then there is nothing left to kill.

One line per spawn and one per exit is the whole cost. Without a guard (not started, or it died)
everything works as before, minus this protection; a dead guard is logged once.

Linux only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["active", "arm", "register", "remove_at_end", "start", "stop", "unregister"]

_lock = threading.Lock()
_proc: subprocess.Popen[bytes] | None = None
_fd = -1
_armed = False  # arm(): start with the first register()
_leftovers: tuple[str, ...] = ()  # arm()'s remove_at_end, sent once the guard starts
_at_end: set[str] = set()  # what remove_at_end sent


def start() -> bool:
    """Start the guard for this process (idempotent). Returns whether one is running."""
    global _proc, _fd
    with _lock:
        if _proc is not None:
            return _fd >= 0
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            _proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            os.close(write_end)
            return False
        finally:
            os.close(read_end)
        _fd = write_end
        return True


def arm(leftovers: tuple[str, ...] = ()) -> None:
    """Start the guard with the first :func:`register`, not now: a service arms it at start, and
    the guard (a Python process: some 3 ms of the start's way to its first answer, and a core's
    worth of its CPU meanwhile) comes with the first process it has to guard. What registers is
    spawned before it registers, as with a guard started earlier: the window is the same.
    ``leftovers``: for :func:`remove_at_end`, once it runs (at once if it does)."""
    global _armed, _leftovers
    if _fd >= 0:
        remove_at_end(leftovers)
        return
    _armed, _leftovers = True, leftovers


def active() -> bool:
    """Whether a guard is running and listening."""
    return _fd >= 0


def _send(line: bytes) -> None:
    global _fd
    fd = _fd
    if fd < 0:
        return
    try:
        os.write(fd, line)  # under PIPE_BUF: atomic, and the guard drains the pipe at once
    except OSError:  # EPIPE: the guard died; carry on without it
        with _lock:
            if _fd == fd:
                _fd = -1
                os.close(fd)
                if _proc is not None:
                    _proc.poll()  # reap it
        from .logs import get_logger

        get_logger("smith_fast.childguard").warning("the child guard process died; children would outlive a killed service")


def register(pid: int, cgroups: tuple[str, ...] = ()) -> None:
    """A shell was spawned as the leader of process group ``pid``: kill its group, and the
    ``cgroups`` directories it was put in, if we die (paths hold no whitespace: we made them)."""
    global _armed
    if _armed:  # the first process since arm(): the guard starts now (once: a failed start is not retried)
        _armed = False
        if start():
            remove_at_end(_leftovers)
    line = b"+%d" % pid
    for path in cgroups:
        line += b" " + os.fsencode(path)
    _send(line + b"\n")


def remove_at_end(paths: tuple[str, ...]) -> None:
    """Directories for the guard to remove, once empty, when we are gone: after our own clean-up at
    exit, which a SIGKILL skips, and which may lack the rights (a service in ``--workspaces``' user
    namespace no longer writes the cgroup directories that hold its cells' parents). Paths hold no
    whitespace: we made them."""
    for path in paths:
        if path not in _at_end and _fd >= 0:  # each once (start-up and the service's start may both name them)
            _at_end.add(path)
            _send(b"=" + os.fsencode(path) + b"\n")


def unregister(pid: int) -> None:
    """The shell ``pid`` has exited and its group was killed; call before reaping it."""
    _send(b"-%d\n" % pid)


def stop() -> None:
    """Stop the guard, leaving every child alone (they are ours to end)."""
    global _proc, _fd
    with _lock:
        proc, fd = _proc, _fd
        _proc, _fd = None, -1
    if proc is None:
        return
    if fd >= 0:
        try:
            os.write(fd, b"!\n")  # forget everything: this is an orderly stop, not a death
        except OSError:
            pass
        os.close(fd)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _guard() -> None:
    """The guard process: track ``+PID``/``-PID`` lines on stdin, kill what is left at EOF."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only EOF (our parent gone) ends the guard
    tracked: dict[int, list[bytes]] = {}
    leftovers: list[str] = []
    with os.fdopen(0, "rb") as pipe:
        for line in pipe:
            op = line[:1]
            if op == b"+":
                number, *cgroups = line[1:].split()
                tracked[int(number)] = cgroups
            elif op == b"-":
                tracked.pop(int(line[1:]), None)
            elif op == b"=":
                leftovers.append(os.fsdecode(line[1:].strip()))
            elif op == b"!":
                return  # an orderly stop of a service that lives on: what it made is its own
    _sweep(tracked)
    _remove_leftovers(leftovers)


def _sweep(tracked: dict[int, list[bytes]]) -> None:
    """The pipe's end: every group still registered killed, and the cells it was in removed."""
    killed = []
    for pid in tracked:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:  # the whole group is gone already
            continue
        killed.append(pid)
    cells = _cells_first([os.fsdecode(p) for cgroups in tracked.values() for p in cgroups])
    for cell in cells:
        _kill_cgroup(cell)
    _remove_cgroups(cells)
    if killed:  # on the service's stderr, in its log format (smith_fast.logs)
        record = {
            "ts": round(time.time(), 3), "level": "warning", "logger": "smith_fast.childguard",
            "event": "the service died without stopping its commands; their process groups were killed",
            "process_groups": sorted(killed),
        }  # fmt: skip
        with contextlib.suppress(OSError):
            os.write(2, (json.dumps(record) + "\n").encode())


def _cells_first(paths: list[str]) -> list[str]:
    """``paths`` with the directories beneath each put before it: a zygote (sandbox/zygote.py)
    registers the service's cell parents, whose cells come and go with its commands."""
    out: list[str] = []
    for path in paths:
        with contextlib.suppress(OSError):
            out += [entry.path for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
        out.append(path)
    return out


def _kill_cgroup(path: str) -> None:
    try:
        with open(path + "/cgroup.kill", "w") as f:
            f.write("1")
        return
    except OSError:  # a v1 hierarchy, or Linux < 5.14: each member, until none is left
        pass
    for _ in range(50):
        try:
            with open(path + "/cgroup.procs") as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def _remove_leftovers(paths: list[str], timeout: float = 2.0) -> None:
    """The ``=PATH`` directories, with the empty ones beneath (spare cells), once empty: the
    service removed the rest a moment ago, or the sweep did; a cell's last member may still be exiting."""
    deadline = time.monotonic() + timeout
    for path in paths:
        while True:
            for entry in _cells_first([path]):
                _rmdir_quietly(entry)
            if not os.path.isdir(path) or time.monotonic() > deadline:
                break
            time.sleep(0.01)


def _remove_cgroups(cells: list[str], timeout: float = 2.0) -> None:
    """Remove the killed cells (once their members have exited) and any of our parents left empty."""
    parents = {os.path.dirname(c) for c in cells}
    deadline = time.monotonic() + timeout
    while cells and time.monotonic() < deadline:
        left = []
        for cell in cells:
            try:
                os.rmdir(cell)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(cell)
        cells = left
        if cells:
            time.sleep(0.01)
    for parent in parents:
        _rmdir_quietly(parent)  # still holding another cell (ENOTEMPTY): not ours to wait for


def _rmdir_quietly(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


if __name__ == "__main__":
    _guard()
