"""The mount host: the one process of the workspaces' namespace that keeps its capabilities.

:func:`namespace.enter <smith_fast.workspaces.namespace.enter>` forks it; the service itself has
dropped every capability, so it (and all it starts) cannot mount anything, and asks this process
instead, over a ``SOCK_SEQPACKET`` socket pair: one JSON message per request, one reply,
``{"ok": true}`` or ``{"error": "<text>", "errno": N}``. The operations:

* ``ping()``: nothing (what a round trip costs).
* ``tmpfs(path, size_bytes, inodes)``: a tmpfs (``nosuid,nodev``, mode 0755) at ``path``.
* ``overlay(target, lowers, upper, work)``: an overlay (``userxattr``; ``lowers`` top first) at
  ``target``; read-only when ``upper`` is None (lowers only: a view of a checkpoint; of one layer,
  a read-only bind mount of it, since overlayfs wants two).
* ``replace(target, lowers, upper, work)``: the same overlay built detached, then put in place of
  the one at ``target`` (beneath it, then the old one detached: no moment without a mount there).
* ``umount(path)``: detach what is mounted at ``path``.
* ``rmtree(path)``: remove a tree (an overlay's work dir holds a mode 000 directory only a
  capable process may remove), never across a mount point.
* ``mkdir(path)``: a directory (mode 0755), owned as the service's own would be.
* ``batch(ops)``: several of the above in one round trip, in order; the first failure ends it
  (a new workspace is one: its tmpfs, its directories and its overlay).

Every path must be absolute and normalised and lie beneath ``top`` (lower layers may also be one
of the directories given at start-up, the templates, used in place), with no symbolic link on the
way: the host resolves the parent and refuses a link as the last component. The host ends when
the service ends (``PR_SET_PDEATHSIG``, and the end of the socket), and the namespace, its mounts
and its tmpfs memory with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import errno
import os
import re
import shutil
import signal
import socket
import stat
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from ..errors import MountError

__all__ = ["MountHost", "MountError", "overlay_problem", "serve"]

T = TypeVar("T")

MAX_MESSAGE = 1 << 20
"""The largest request or reply, bytes (a chain of a few hundred layers' paths fits easily)."""
MAX_LAYERS = 500
"""overlayfs's limit on lower layers (``OVL_MAX_STACK``)."""
IDLE_NICE = 19
"""The background host's nice value. Measured against SCHED_IDLE, nice 10 and none, session starts
back to back (``bench/bench_workspaces.py``'s figure 1): SCHED_IDLE starved the warm pool's refills
on a loaded machine (handshakes then mounted their own), nice 10 took the cores from handshakes."""

# The new mount API, by number: the same on every architecture.
_OPEN_TREE, _MOVE_MOUNT, _FSOPEN, _FSCONFIG, _FSMOUNT, _OPENAT2, _MOUNT_SETATTR = 428, 429, 430, 431, 432, 437, 442
_RESOLVE_NO_SYMLINKS = 0x04
_OPEN_TREE_CLONE, _AT_EMPTY_PATH = 1, 0x1000
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_BENEATH = 0x4, 0x200
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class _Refused(Exception):
    """A request the host refuses or the kernel failed: its text and errno go back as the reply."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fail(what: str, log: str = "") -> _Refused:
    code = ctypes.get_errno()
    text = f"{what}: {os.strerror(code)}"
    return _Refused(f"{text} ({log})" if log else text, code)


def _syscall(number: int, *args: Any) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


# ---- the kernel side ------------------------------------------------------------------------------


def _context_log(fs: int) -> str:
    """What the kernel said about the mount being built (the fs context's log, ``e overlay: ...``)."""
    lines = []
    while True:
        try:
            line = os.read(fs, 4096)
        except OSError:
            break  # ENODATA: no more
        if not line:
            break
        lines.append(line.decode("utf-8", "replace").strip())
    return "; ".join(lines)


def overlay_problem(lowers: Sequence[str], upper: str | None, work: str | None) -> str | None:
    """What is wrong with these overlay options, in words, before the kernel says it less clearly
    (it answers EINVAL or ENOENT and logs which option): None when nothing is seen."""
    shape = _shape_problem(lowers, upper, work)
    if shape:
        return shape
    for what, path in [*(("lower layer", p) for p in lowers), ("upper directory", upper), ("work directory", work)]:
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError as exc:
            return f"the {what} {path} cannot be used: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"the {what} {path} is not a directory"
    if upper is not None and work is not None:
        if os.stat(upper).st_dev != os.stat(work).st_dev:
            return f"the upper directory {upper} and the work directory {work} are on different file systems"
        if upper == work or work.startswith(upper + "/") or upper.startswith(work + "/"):
            return f"the upper directory {upper} and the work directory {work} must not contain each other"
        if upper in lowers:
            return f"the upper directory {upper} is also a lower layer"
    return None


def _read_only_bind(path: str) -> int:
    """A detached read-only copy of the mount at ``path`` (an fd for move_mount)."""
    mnt = _syscall(_OPEN_TREE, ctypes.c_int(-100), os.fsencode(path), ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC))
    if mnt < 0:
        raise _fail(f"open_tree {path}")
    attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, 0)
    if _syscall(_MOUNT_SETATTR, mnt, b"", ctypes.c_uint(_AT_EMPTY_PATH), attr, ctypes.c_size_t(ctypes.sizeof(attr))) != 0:
        os.close(mnt)
        raise _fail(f"mount_setattr {path}")
    return mnt


def _shape_problem(lowers: Sequence[str], upper: str | None, work: str | None) -> str | None:
    """What :func:`overlay_problem` says without looking at the disk (the rest is looked at only
    once the kernel failed: a freeze's replace is on a request's path)."""
    if not lowers:
        return "an overlay needs at least one lower layer"
    if len(lowers) > MAX_LAYERS:
        return f"{len(lowers)} lower layers, overlayfs takes at most {MAX_LAYERS}"
    if (upper is None) != (work is None):
        return "an overlay needs both an upper and a work directory, or neither (read-only)"
    return None


def _build_overlay(lowers: Sequence[str], upper: str | None, work: str | None) -> int:
    """A detached overlay mount (an fd for move_mount)."""
    problem = _shape_problem(lowers, upper, work)
    if problem:
        raise _Refused(problem, errno.EINVAL)
    try:
        return _overlay_mount(lowers, upper, work)
    except _Refused as exc:
        problem = overlay_problem(lowers, upper, work)  # in words, where the kernel said EINVAL or ENOENT
        if problem:
            raise _Refused(problem, errno.EINVAL) from None
        raise exc


def _overlay_mount(lowers: Sequence[str], upper: str | None, work: str | None) -> int:
    if upper is None and len(lowers) == 1:
        # overlayfs wants two lower layers without an upper; a view of one layer is that layer.
        return _read_only_bind(lowers[0])
    fs = _syscall(_FSOPEN, b"overlay", ctypes.c_uint(1))  # FSOPEN_CLOEXEC
    if fs < 0:
        if ctypes.get_errno() == errno.ENODEV:
            raise _Refused("this kernel has no overlayfs (CONFIG_OVERLAY_FS; modprobe overlay)", errno.ENODEV)
        raise _fail("fsopen(overlay)")
    try:
        def config(cmd: int, key: bytes | None, value: bytes | None) -> None:
            if _syscall(_FSCONFIG, fs, ctypes.c_uint(cmd), key, value, ctypes.c_int(0)) != 0:
                code = ctypes.get_errno()
                log = _context_log(fs)
                if key == b"lowerdir+" and code == errno.EINVAL and not log.strip():
                    raise _Refused("this kernel's overlayfs has no lowerdir+ (Linux 6.8 or later is needed)", code)
                name = key.decode() if key else "create"
                ctypes.set_errno(code)
                raise _fail(f"overlay {name}{' ' + value.decode('utf-8', 'replace') if value else ''}", log)

        for lower in lowers:
            config(_FSCONFIG_SET_STRING, b"lowerdir+", os.fsencode(lower))
        if upper is not None and work is not None:
            config(_FSCONFIG_SET_STRING, b"upperdir", os.fsencode(upper))
            config(_FSCONFIG_SET_STRING, b"workdir", os.fsencode(work))
        config(_FSCONFIG_SET_FLAG, b"userxattr", None)
        config(_FSCONFIG_CMD_CREATE, None, None)
        attrs = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if upper is None else 0)
        mnt = _syscall(_FSMOUNT, fs, ctypes.c_uint(1), ctypes.c_uint(attrs))  # FSMOUNT_CLOEXEC
        if mnt < 0:
            raise _fail("fsmount(overlay)", _context_log(fs))
        return mnt
    finally:
        os.close(fs)


def _move(mnt: int, target: str, flags: int = 0) -> None:
    if _syscall(_MOVE_MOUNT, mnt, b"", ctypes.c_int(-100), os.fsencode(target), ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | flags)) != 0:
        raise _fail(f"move_mount to {target}")


def _umount(path: str) -> None:
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        raise _fail(f"umount {path}")


def _is_mount_point(path: str) -> bool:
    return os.path.ismount(path)


def _mounts_beneath(path: str) -> list[str]:
    """Mount points at or beneath ``path`` (from mountinfo)."""
    found = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            # mountinfo escapes space, tab, newline and backslash as \ooo (octal)
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split(b" ", 5)[4].decode("utf-8", "replace"))
            if point == path or point.startswith(path + "/"):
                found.append(point)
    return found


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _through_link(path: str) -> bool:
    """Whether a symbolic link lies on the way to ``path`` (absolute, normalised) or is its last
    component: one ``openat2(RESOLVE_NO_SYMLINKS)`` of its parent and one ``lstat`` (realpath took
    an ``lstat`` per component, most of what a replace cost the host). Where ``openat2`` cannot
    answer (a missing parent, an old kernel), realpath as before."""
    parent, name = os.path.split(path)
    how = _OpenHow(os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS)
    fd = _syscall(_OPENAT2, ctypes.c_int(-100), os.fsencode(parent), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        if ctypes.get_errno() == errno.ELOOP:
            return True
        return os.path.realpath(parent) != parent or os.path.islink(path)
    try:
        return bool(name) and stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False  # missing: no link there
    finally:
        os.close(fd)


# ---- requests -------------------------------------------------------------------------------------


class _Host:
    def __init__(self, top: str, lower_roots: Sequence[str]) -> None:
        self.top = top
        self.lower_roots = tuple(lower_roots)

    def path(self, value: object, what: str, *, lower: bool = False) -> str:
        """``value`` when it is a path the host may act on, else a refusal (EPERM)."""
        if not isinstance(value, str) or not value.startswith("/") or "\0" in value or os.path.normpath(value) != value:
            raise _Refused(f"the {what} must be an absolute, normalised path, not {value!r}", errno.EINVAL)
        allowed = value.startswith(self.top + "/") or (lower and any(
            value == root or value.startswith(root + "/") for root in self.lower_roots))
        if not allowed:
            raise _Refused(f"the {what} {value} lies outside {self.top}", errno.EPERM)
        if _through_link(value):
            raise _Refused(f"the {what} {value} goes through a symbolic link", errno.EPERM)
        return value

    def layers(self, request: dict[str, Any]) -> tuple[list[str], str | None, str | None]:
        lowers = request.get("lowers")
        if not isinstance(lowers, list):
            raise _Refused("lowers must be a list of paths", errno.EINVAL)
        upper, work = request.get("upper"), request.get("work")
        return ([self.path(p, "lower layer", lower=True) for p in lowers],
                None if upper is None else self.path(upper, "upper directory"),
                None if work is None else self.path(work, "work directory"))

    def handle(self, request: dict[str, Any]) -> None:
        op = request.get("op")
        if op == "ping":
            return
        if op == "batch":  # several operations in one round trip, in order; the first failure ends it
            ops = request.get("ops")
            if not isinstance(ops, list) or not all(isinstance(o, dict) and o.get("op") != "batch" for o in ops):
                raise _Refused("a batch is a list of operations (no batch in a batch)", errno.EINVAL)
            for one in ops:
                self.handle(one)
            return
        if op == "mkdir":
            path = self.path(request.get("path"), "directory")
            try:
                os.mkdir(path, 0o755)
            except OSError as exc:
                raise _Refused(f"making {path}: {exc.strerror}", exc.errno or errno.EIO) from None
            return
        if op == "tmpfs":
            path = self.path(request.get("path"), "tmpfs mount point")
            size, inodes = request.get("size_bytes"), request.get("inodes")
            if not isinstance(size, int) or not isinstance(inodes, int) or size <= 0 or inodes <= 0:
                raise _Refused("a tmpfs needs a positive size_bytes and inodes", errno.EINVAL)
            options = f"mode=0755,size={size},nr_inodes={inodes}".encode()
            if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
                raise _fail(f"mounting a tmpfs on {path}")
            return
        if op in ("overlay", "replace"):
            target = self.path(request.get("target"), "overlay mount point")
            lowers, upper, work = self.layers(request)
            mnt = _build_overlay(lowers, upper, work)
            try:
                if op == "overlay":
                    _move(mnt, target)
                else:
                    self.replace(mnt, target)
            finally:
                os.close(mnt)
            return
        if op == "umount":
            _umount(self.path(request.get("path"), "mount point"))
            return
        if op == "rmtree":
            self.rmtree(self.path(request.get("path"), "tree"))
            return
        raise _Refused(f"unknown operation {op!r}", errno.EINVAL)

    @staticmethod
    def replace(mnt: int, target: str) -> None:
        # Beneath the old mount, then the old one off the top: the target never shows what is
        # under it (Linux 6.5; every kernel with lowerdir+ has it). Where the kernel refuses a
        # mount beneath (the target is not a mount), detach then move: a window of one system call.
        if not _is_mount_point(target):
            _move(mnt, target)
            return
        try:
            _move(mnt, target, _MOVE_MOUNT_BENEATH)
        except _Refused as exc:
            if exc.code != errno.EINVAL:
                raise
            _umount(target)
            _move(mnt, target)
            return
        _umount(target)

    @staticmethod
    def rmtree(path: str) -> None:
        if not os.path.lexists(path):
            return
        mounted = _mounts_beneath(path)
        if mounted:
            raise _Refused(f"{path} holds a mount point ({mounted[0]}): unmount it first", errno.EBUSY)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)  # by fds, never following a link; the host's capabilities open mode 000 dirs
        else:
            os.unlink(path)


def serve(sock: socket.socket, top: str, lower_roots: Sequence[str]) -> None:
    """The host's loop (the forked child): answer requests until the service's end of the socket
    closes, then end the process. Never returns."""
    code = 0
    try:
        host = _Host(top, lower_roots)
        buffer = bytearray(MAX_MESSAGE)  # one, reused: a recv(MAX_MESSAGE) maps and unmaps 1 MiB each time
        view = memoryview(buffer)
        while True:
            try:
                size = sock.recv_into(buffer)
            except InterruptedError:
                continue
            if not size:
                break  # the service is gone
            try:
                request = orjson.loads(view[:size])
                if not isinstance(request, dict):
                    raise _Refused("a request is a JSON object", errno.EINVAL)
                host.handle(request)
                reply = b'{"ok":true}'
            except _Refused as exc:
                reply = orjson.dumps({"error": str(exc), "errno": exc.code})
            except OSError as exc:
                reply = orjson.dumps({"error": str(exc), "errno": exc.errno or errno.EIO})
            except (ValueError, TypeError) as exc:
                reply = orjson.dumps({"error": f"a malformed request: {exc}", "errno": errno.EINVAL})
            sock.send(reply)
    except BaseException:  # noqa: BLE001 - the host must end here, whatever happened
        code = 1
    os._exit(code)


def start_child(sock: socket.socket, top: str, lower_roots: Sequence[str], parent: int, *, idle: bool = False) -> None:
    """In the forked child: become the mount host (``idle``: the background one, at nice
    :data:`IDLE_NICE`, which an unprivileged process may take). Never returns."""
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the service died before the line above
            os._exit(0)
        if idle:
            os.setpriority(os.PRIO_PROCESS, 0, IDLE_NICE)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        keep = sock.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
        os.chdir("/")
    except BaseException:  # noqa: BLE001
        os._exit(1)
    serve(sock, top, lower_roots)


# ---- the service's side ---------------------------------------------------------------------------


class MountHost:
    """The service's client of the mount host: :meth:`call` (blocking, thread safe) and :meth:`acall`.

    Attributes:
        top: the directory every mount lies beneath (resolved).
        pid: the host's process id.
        idle: the host for what no request waits for (the warm pool's mounts, a volume's unmount,
            removing old layers): a second process at nice :data:`IDLE_NICE`, so that its mounts
            and unmounts (a tmpfs's pages freed, the RCU grace periods) yield the cores to a
            handshake or a command starting beside them, and never queue a request's own mount
            (a freeze, a fork) behind them; itself when there is none.
    """

    def __init__(self, sock: socket.socket, top: str, pid: int, idle: MountHost | None = None) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.idle = idle if idle is not None else self
        # Background calls wait in a thread of their own, not the loop's shared executor: a host at
        # nice 19 may be slow on a busy machine, and must not hold threads a diff or an undo needs.
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._reply = bytearray(MAX_MESSAGE)  # reused under the lock (see serve())
        self.top = top
        self.pid = pid

    def call(self, op: str, **args: Any) -> None:
        """Do ``op`` (see the module's docstring) and wait for it.

        Raises:
            MountError: the host refused it, the kernel failed it, or the host is gone.
        """
        message = orjson.dumps({"op": op, **args})
        with self._lock:
            try:
                self._sock.send(message)
                size = self._sock.recv_into(self._reply)
                reply = bytes(self._reply[:size])
            except OSError as exc:
                raise MountError(exc.errno or errno.EPIPE, f"the workspaces' mount host is unreachable: {exc.strerror or exc}") from None
        if not reply:
            raise MountError(errno.EPIPE, "the workspaces' mount host is gone")
        answer = orjson.loads(reply)
        if answer.get("ok") is not True:
            raise MountError(int(answer.get("errno") or errno.EIO), str(answer.get("error")))

    async def acall(self, op: str, **args: Any) -> None:
        """:meth:`call` in a worker thread."""
        await asyncio.to_thread(self.call, op, **args)

    def later(self, work: Callable[..., object], *args: Any) -> None:
        """Run ``work(*args)`` (calls to this host) in this host's own thread, after what is queued
        there; without a running loop (the service closing), here and now."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            work(*args)
            return
        loop.run_in_executor(self._executor(), work, *args)

    async def in_thread(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` (calls to this host) in this host's own thread, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._executor(), work, *args)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="smith-mount-host")
        return self._thread

    def close(self) -> None:
        """Close the socket: the host ends (and its mounts with the namespace once nothing else holds it)."""
        if self.idle is not self:
            self.idle.close()
        if self._thread is not None:
            self._thread.shutdown(wait=False)
        self._sock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
