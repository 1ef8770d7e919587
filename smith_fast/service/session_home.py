"""Each session's home directory: where ``npm install``, ``pip install``, ``git config --global``,
``cargo build`` and ``go build`` keep their caches and configuration (``HOME`` and the variables of
:data:`smith_fast.command_env.HOME_VARIABLES`, set by the service, never by a request).

In ``--sandbox workspace-write`` a command may write its session's home besides the root and its
private ``/tmp``; the service's ``HOME`` stays read-only in its view. A session's home is private to
it: the directory of all homes is covered in a command's view (``sandbox-exec --cover``) with only
its own put back. Two places, one behaviour:

* with ``--workspaces DIR``: ``DIR/s/<id>/home``, in the session's volume (a tmpfs), so its bound
  is the volume's: ``--max-workspace-bytes`` for the workspace and the home together (``ENOSPC``);
  it is emptied when the session ends (:meth:`smith_fast.workspaces.workspace.Workspace.close`).
* without: ``--home-dir DIR``'s ``DIR/<random>`` (:class:`Homes`), a plain directory: there is no
  filesystem of its own to fill, so ``--max-home-bytes`` is checked before each process of the
  session starts, and a home found over it is emptied (caches come back; a LogEvent says so). It is
  removed when the session ends (after a resume window if the session was parked), or when the last
  background process started in it ends, whichever comes later.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pathlib
import shutil
import stat

from ..logs import get_logger

__all__ = ["Homes", "SessionHome", "remove_tree", "tree_bytes"]

log = get_logger("smith_fast.session")


def tree_bytes(path: str) -> int:
    """Bytes the files beneath ``path`` take on disk (blocks, as ``du``; links not followed)."""
    total = 0
    stack = [path]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:  # gone meanwhile, or a directory a command made unreadable (chmod 000)
            continue
    return total


def _writable_again(func: object, path: str, _exc: object) -> None:
    # Go's module cache is read-only directories, and a command may chmod 000 anything: the
    # service owns the files (a command runs as the service's user), so it may make them writable.
    parent = os.path.dirname(path)
    try:
        os.chmod(parent, 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, onerror=_writable_again)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def remove_tree(path: str, *, keep_top: bool = False) -> None:
    """Remove ``path`` and what it holds, read-only directories included; with ``keep_top``
    empty it instead. A path already gone is no error."""
    try:
        os.chmod(path, 0o700)
    except FileNotFoundError:
        return
    if not keep_top:
        shutil.rmtree(path, onerror=_writable_again)
        return
    with os.scandir(path) as it:
        entries = [e.path for e in it]
    for entry in entries:
        if os.path.isdir(entry) and not os.path.islink(entry):
            try:
                os.chmod(entry, 0o700)
            except FileNotFoundError:
                continue
            shutil.rmtree(entry, onerror=_writable_again)
        else:
            try:
                os.unlink(entry)
            except FileNotFoundError:
                pass


MEASURE_EVERY = 1.0
"""Seconds between two measurements of a home (without --workspaces, where no tmpfs bounds it)."""

MEASURE_AFTER = 0.05
"""Seconds after a command's start before its home is measured: the walk runs in a thread, which
takes the GIL and a CPU from the command's start (its spawn, measured: 0.2-0.4 ms later after an
idle moment) if it begins with it."""


class SessionHome:
    """One session's home under ``--home-dir`` (:class:`Homes`): made by :meth:`Homes.open`."""

    __slots__ = ("path", "max_bytes", "_removed", "_ended", "_holds", "_measured", "_measuring", "_used")

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._removed = False
        self._ended = False
        self._holds = 0  # background processes of the session, which outlive it
        self._measured = 0.0  # loop time of the last measurement's start
        self._measuring: asyncio.Future[int] | None = None
        self._used = 0  # what the last measurement found

    async def bound(self) -> int:
        """Before a process of the session starts: empty the home when the last measurement found
        it over ``--max-home-bytes``; returns the bytes it held then, 0 when it was within the bound.
        The home is measured in a thread at most every :data:`MEASURE_EVERY` seconds, never while a
        command waits to start (a cache of many files takes a while to walk), and from
        :data:`MEASURE_AFTER` seconds after the command that asked (not during its start)."""
        if not self.max_bytes or self._removed:
            return 0
        loop = asyncio.get_running_loop()
        measuring = self._measuring
        if measuring is not None and measuring.done():
            self._measuring = None
            self._used = 0 if measuring.cancelled() or measuring.exception() is not None else measuring.result()
        if self._measuring is None and loop.time() - self._measured >= MEASURE_EVERY:
            self._measured = loop.time()
            loop.call_later(MEASURE_AFTER, self._measure, loop)
        used, self._used = self._used, 0
        if used <= self.max_bytes:
            return 0
        await asyncio.to_thread(remove_tree, self.path, keep_top=True)
        return used

    def _measure(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._removed and not self._ended and self._measuring is None:
            self._measuring = loop.run_in_executor(None, tree_bytes, self.path)

    def hold(self) -> None:
        """A background process of the session starts: the home stays until :meth:`release`."""
        self._holds += 1

    def release(self) -> None:
        """That background process ended: the home goes now if its session ended before it."""
        self._holds -= 1
        if self._ended and not self._holds:
            self._remove()

    def remove(self) -> None:
        """The session ended: remove the home once no background process of it runs (they outlive
        it, and one may still be building its view of the home), in a thread (a cache is many files)."""
        self._ended = True
        if not self._holds:
            self._remove()

    def _remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            remove_tree(self.path)
            return
        future = loop.run_in_executor(None, remove_tree, self.path)
        future.add_done_callback(self._removed_or_logged)

    def _removed_or_logged(self, future: asyncio.Future[None]) -> None:
        exc = future.exception() if not future.cancelled() else None
        if exc is not None:
            log.warning("a session's home was not removed", extra={"fields": {"home": self.path, "error": str(exc)}})


class Homes:
    """``--home-dir``: the directory of the homes of sessions without a workspace (made 0700).

    Each service run keeps its sessions' homes in a directory of its own, ``DIR/<run>``, locked
    (``flock``) while it runs: at start-up a run directory nobody holds is what a service that
    died (SIGKILL, a crash) left, and is removed; one held is another service's, and stays. The
    whole of ``DIR`` is covered in a command's view, so no other run's homes are in it either.
    """

    def __init__(self, top: pathlib.Path, max_bytes: int) -> None:
        top.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(top, 0o700)  # other users of the host must not enter another user's sessions' homes
        self.top = str(top.resolve())
        self.max_bytes = max_bytes
        self._sweep()
        self.run = self._fresh(self.top)
        self._lock = os.open(f"{self.run}/{_LOCK}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def _sweep(self) -> None:
        with os.scandir(self.top) as it:
            runs = [entry.path for entry in it if entry.is_dir(follow_symlinks=False)]
        for run in runs:
            try:
                fd = os.open(f"{run}/{_LOCK}", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue  # not a run directory of ours: left alone
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live service's
            finally:
                os.close(fd)  # our lock, if taken, goes with it: the directory goes next
            try:
                remove_tree(run)
            except OSError as exc:
                log.warning("a dead service's homes were not removed", extra={"fields": {"path": run, "error": str(exc)}})

    @staticmethod
    def _fresh(parent: str) -> str:
        while True:
            path = f"{parent}/{os.urandom(8).hex()}"  # secrets.token_hex, without its imports at start
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            return path

    def open(self) -> SessionHome:
        """A new, empty home (0700) for a session starting now."""
        return SessionHome(self._fresh(self.run), self.max_bytes)

    def close(self) -> None:
        """The service stops: every home of this run goes, whatever still held one."""
        try:
            remove_tree(self.run)
        except OSError as exc:
            log.warning("the sessions' homes were not removed", extra={"fields": {"path": self.run, "error": str(exc)}})
        os.close(self._lock)


_LOCK = ".smith-fast-run.lock"
