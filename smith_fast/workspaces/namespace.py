"""The workspaces' namespace: :func:`enter`, called once by ``serve --workspaces`` at start-up.

The service moves into a user and mount namespace of its own (its uid and gid mapped onto
themselves, but for root's uid: :data:`ROOT_INSIDE`; files keep their owners), where it may mount overlays without being root on the host.
It forks the *mount hosts* (:mod:`.mount_host`), the only processes that keep the namespace's
capabilities (one for what a request waits for, one at a low priority for the rest: the warm pool,
unmounting, removing), and then drops every capability itself, for good (securebits locked, bounding
set empty): neither the service nor anything it starts can mount, unmount or remount anything; it
asks a host, which only mounts beneath ``top``. ``/`` is made a slave mount first, so nothing
mounted in the namespace propagates to the host. When the service ends, even by SIGKILL, the hosts
end (``PR_SET_PDEATHSIG``), and the namespace with its mounts and tmpfs memory goes with them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pathlib
import socket
from collections.abc import Sequence

from ..errors import MountError, StartupError, WorkspacesUnavailable
from .mount_host import MountHost, start_child

__all__ = ["enter", "current", "drop_capabilities", "capabilities", "ROOT_INSIDE"]

ROOT_INSIDE = 65533
"""The uid host root has in the namespace, when the service runs as root (every other uid keeps its
number). Not 0: since Linux 5.12 a process may map its namespace's uid 0 into a new user namespace
only with CAP_SETFCAP (a namespaced file capability of that uid would hold on the host), and the
sandbox program, started by the service that holds no capability, maps its caller's uid into each
command's namespace. Files keep their owners: host root's files show as this uid, and are its."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_REC, _MS_SLAVE = 0x4000, 0x80000
_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, each with its lock; NO_CAP_AMBIENT_RAISE and its lock.
_SECUREBITS = 0x2F | 0xC0
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _errno_text(what: str) -> str:
    code = ctypes.get_errno()
    return f"{what}: {os.strerror(code)}"


def capabilities() -> tuple[int, int]:
    """This thread's ``(effective, permitted)`` capability sets, as bit masks."""
    head = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(head), data) != 0:
        raise OSError(ctypes.get_errno(), _errno_text("capget"))
    return (data[0].effective | data[1].effective << 32, data[0].permitted | data[1].permitted << 32)


def drop_capabilities() -> None:
    """Drop every capability of this (single-threaded) process for good, as the sandbox program's
    ``drop_capabilities`` does: securebits first (uid 0 gets nothing back at exec, ambient
    capabilities cannot be raised), then the bounding set, the ambient set and the rest."""
    if _libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), _errno_text("PR_SET_SECUREBITS"))
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), _errno_text("PR_CAPBSET_DROP"))
    if _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
        raise OSError(ctypes.get_errno(), _errno_text("PR_CAP_AMBIENT_CLEAR_ALL"))
    head = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(head), data) != 0:
        raise OSError(ctypes.get_errno(), _errno_text("capset"))


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _userns_off() -> str:
    """Why unprivileged user namespaces look off here, or ""."""
    for path, name in (("/proc/sys/user/max_user_namespaces", "user.max_user_namespaces"),
                       ("/proc/sys/kernel/unprivileged_userns_clone", "kernel.unprivileged_userns_clone")):
        try:
            if int(pathlib.Path(path).read_text()) <= 0:
                return f"{name} is 0"
        except (OSError, ValueError):
            continue
    return ""


def _unshare() -> None:
    uid, gid = os.geteuid(), os.getegid()
    inside = ROOT_INSIDE if uid == 0 else uid
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        why = _userns_off() or f"unshare(CLONE_NEWUSER|CLONE_NEWNS): {os.strerror(code)}"
        raise WorkspacesUnavailable(
            f"--workspaces needs unprivileged user namespaces with mount namespaces ({why}): set the sysctls "
            "user.max_user_namespaces > 0 and kernel.unprivileged_userns_clone = 1 where it exists, and check that "
            "AppArmor (kernel.apparmor_restrict_unprivileged_userns) or a container's seccomp profile does not block them"
        )
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{inside} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as exc:
        raise WorkspacesUnavailable(f"--workspaces cannot map its ids in its user namespace: {exc}") from None
    if _libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        raise WorkspacesUnavailable(_errno_text("--workspaces cannot make / a slave mount in its namespace"))


def _probe(host: MountHost) -> None:
    """A tmpfs and a small overlay (written, then replaced by a longer chain, then read-only) under
    ``top/.probe``: a kernel without what the workspaces need fails the start, not a session."""
    probe = os.path.join(host.top, ".probe")
    os.makedirs(probe, mode=0o700, exist_ok=True)
    try:
        host.call("tmpfs", path=probe, size_bytes=1 << 20, inodes=64)
    except MountError as exc:
        raise WorkspacesUnavailable(f"--workspaces cannot mount a tmpfs in its namespace: {exc.strerror}") from None
    try:
        for name in ("lower", "upper", "work", "root", "upper2", "work2", "view"):
            os.mkdir(os.path.join(probe, name))
        lower, root = os.path.join(probe, "lower"), os.path.join(probe, "root")
        with open(os.path.join(lower, "a"), "w") as f:
            f.write("a")
        up, work = os.path.join(probe, "upper"), os.path.join(probe, "work")
        host.call("overlay", target=root, lowers=[lower], upper=up, work=work)
        with open(os.path.join(root, "b"), "w") as f:
            f.write("b")
        host.call("replace", target=root, lowers=[up, lower], upper=os.path.join(probe, "upper2"), work=os.path.join(probe, "work2"))
        host.call("overlay", target=os.path.join(probe, "view"), lowers=[up, lower], upper=None, work=None)
        seen = sorted(os.listdir(root)), sorted(os.listdir(os.path.join(probe, "view")))
        if seen != (["a", "b"], ["a", "b"]):
            raise WorkspacesUnavailable(f"--workspaces: the probe's overlay shows {seen}, not a and b")
        host.call("umount", path=os.path.join(probe, "view"))
        host.call("umount", path=root)
    except MountError as exc:
        raise WorkspacesUnavailable(f"--workspaces cannot mount an overlay in its namespace: {exc.strerror}") from None
    finally:
        try:
            for path in (os.path.join(probe, "view"), os.path.join(probe, "root")):
                if os.path.ismount(path):
                    host.call("umount", path=path)
            host.call("umount", path=probe)
            os.rmdir(probe)
        except (MountError, OSError):
            pass


def _fork_host(top: str, roots: tuple[str, ...], parent: int, *, idle: bool) -> tuple[socket.socket, int]:
    """A mount host (a child keeping the namespace's capabilities): the service's end of its
    socket and its pid. ``idle``: the one that does what no request waits for (see
    :class:`~.mount_host.MountHost`), at a low priority."""
    service, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        service.close()
        start_child(child_end, top, roots, parent, idle=idle)  # never returns
        os._exit(1)
    child_end.close()
    service.set_inheritable(False)
    return service, pid


_CURRENT: MountHost | None = None
"""The mount host of this process, once it entered its namespace (a fact of the process: at most one)."""


def current() -> MountHost | None:
    """The mount host :func:`enter` started in this process, None before (or without) it."""
    return _CURRENT


def enter(top: pathlib.Path, lower_roots: Sequence[pathlib.Path] = ()) -> MountHost:
    """Move this process into the workspaces' namespace and start its mount host.

    Call it once, while the process is single-threaded (a user namespace cannot be entered by a
    threaded process). ``top``: the directory the host mounts beneath (made when missing).
    ``lower_roots``: directories outside ``top`` an overlay may also take lower layers from (the
    templates, used in place), fixed now: the service cannot widen them later.

    Raises:
        StartupError: the process already has threads.
        WorkspacesUnavailable: the kernel lacks what the workspaces need; the message says what.
    """
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        raise StartupError(f"the workspaces' namespace must be entered while the process is single-threaded (it has {len(tasks)} threads)")
    top.mkdir(parents=True, exist_ok=True)
    resolved = os.path.realpath(top)
    roots = tuple(os.path.realpath(p) for p in lower_roots)
    _unshare()
    parent = os.getpid()
    service, pid = _fork_host(resolved, roots, parent, idle=False)
    background, background_pid = _fork_host(resolved, roots, parent, idle=True)
    try:
        drop_capabilities()
    except OSError as exc:
        service.close()
        background.close()
        raise WorkspacesUnavailable(f"--workspaces cannot drop the service's capabilities in its namespace: {exc}") from None
    host = MountHost(service, resolved, pid, idle=MountHost(background, resolved, background_pid))
    try:
        _probe(host)
        host.idle.call("ping")  # the background host answers too
    except BaseException:
        host.close()
        raise
    global _CURRENT
    _CURRENT = host
    return host
