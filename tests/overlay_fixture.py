"""Real overlay layers for the workspace tests: a function run on an overlay the kernel mounts.

:func:`on_overlay` forks; the child enters a user and mount namespace of its own (so this works
for an unprivileged user too: the upper's files are then owned by the caller), mounts an overlay
with the new mount API (``fsopen("overlay")``, ``lowerdir+`` per layer, ``userxattr``), runs the
function on the mount point, unmounts and exits. The parent gets the function's return value
(pickled through a pipe) and can read the upper as a plain directory: a layer as the kernel wrote
it, whiteouts and opaque directories included.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pickle
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["on_overlay"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_MOVE_MOUNT_F_EMPTY_PATH = 4
_AT_FDCWD = -100
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _single_threaded(w: int, always: bool = False) -> None:
    """Make sure this forked child is alone in its process: a user namespace is entered only by a
    single-threaded one, and a library's at-fork hook may have started a thread here (OpenTelemetry's
    batch processors restart their worker in every child while one is alive in the test process).
    Then it forks once more through the C library's ``fork`` with the GIL held (PyDLL), which runs
    no Python at-fork hook (that would start the thread again) but does take the C library's own
    locks (the allocator's, the loader's) first, so that the grandchild gets none of them held by
    the other thread. The raw ``clone`` system call used before did not, and a fresh clone's run
    once timed out waiting for a grandchild here. This process only relays the grandchild's status."""
    if not always and len(os.listdir("/proc/self/task")) == 1:
        return
    raw = ctypes.PyDLL(None, use_errno=True)
    pid = raw.fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork")
    if pid == 0:
        return  # the grandchild: one thread, ours
    os.close(w)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f"{tid}:{f.read().strip()}")
        except OSError:  # gone meanwhile
            continue
    return names


def _enter_alone(w: int) -> None:
    """:func:`_single_threaded`, then the namespaces. A CI run once had ``unshare`` fail with
    EINVAL (a second thread) right after the check had seen one: the unshare is tried again in a
    fresh fork of the C library's (at most twice more), and a last failure names the threads."""
    for attempt in range(3):
        _single_threaded(w, always=attempt > 0)
        try:
            _enter_namespace()
            return
        except OSError as exc:
            if exc.errno != errno.EINVAL or attempt == 2:
                raise OSError(exc.errno, f"{exc.strerror} (threads: {', '.join(_threads())})") from None


def _enter_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    # setgroups must be denied before an unprivileged process may write its gid_map
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    # the new namespace's copies of the host's mounts must not send our mounts back
    _check(_libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_SLAVE), None), "mount MS_SLAVE")


def _mount_overlay(lowers: Sequence[str], upper: str, work: str, target: str) -> None:
    fs = _check(_libc.syscall(_SYS_FSOPEN, b"overlay", 0), "fsopen")
    try:
        for layer in lowers:  # top first
            _check(
                _libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, b"lowerdir+", os.fsencode(layer), 0),
                f"fsconfig lowerdir+ {layer}",
            )
        for key, value in ((b"upperdir", upper), (b"workdir", work)):
            _check(
                _libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, os.fsencode(value), 0), f"fsconfig {key!r}"
            )
        _check(_libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_FLAG, b"userxattr", None, 0), "fsconfig userxattr")
        _check(_libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
        mnt = _check(_libc.syscall(_SYS_FSMOUNT, fs, 0, 0), "fsmount")
        try:
            _check(
                _libc.syscall(_SYS_MOVE_MOUNT, mnt, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
                "move_mount",
            )
        finally:
            os.close(mnt)
    finally:
        os.close(fs)


def _drop_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice, all empty
    _check(_libc.capset(header, data), "capset")


def on_overlay(
    lowers: Sequence[str], upper: str, fn: Callable[[str], Any], *, work: str | None = None, drop_caps: bool = False
) -> Any:
    """Mount ``upper`` over ``lowers`` (top first) in a child's own namespaces, run ``fn(mount point)``
    there, unmount: what ``fn`` returned (picklable). ``upper`` is created if missing; the work
    and mount directories are made next to it (``work`` may name the work dir). ``drop_caps``:
    ``fn`` runs without any capability, as the service does (the namespace's end unmounts)."""
    os.makedirs(upper, exist_ok=True)
    base = os.path.dirname(os.path.abspath(upper))
    name = os.path.basename(upper)
    work = work or os.path.join(base, f".{name}.work")
    target = os.path.join(base, f".{name}.mnt")
    os.makedirs(work, exist_ok=True)
    os.makedirs(target, exist_ok=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe and its status
        code = 1
        try:
            os.close(r)
            _enter_alone(w)
            _mount_overlay(lowers, upper, work, target)
            if drop_caps:
                _drop_capabilities()
                payload = pickle.dumps((True, fn(target)))
            else:
                try:
                    payload = pickle.dumps((True, fn(target)))
                finally:
                    _check(_libc.umount2(os.fsencode(target), 0), "umount")
            code = 0
        except BaseException:
            payload = pickle.dumps((False, traceback.format_exc()))
        try:
            with os.fdopen(w, "wb") as out:
                out.write(payload)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as src:
        data = src.read()
    _, status = os.waitpid(pid, 0)
    ok, value = pickle.loads(data) if data else (False, f"child died: status {status}")
    if not ok or os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(f"the overlay child failed:\n{value}")
    return value
