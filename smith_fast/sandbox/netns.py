"""A private network namespace for this process, entered through an unprivileged user namespace.

``unshare(CLONE_NEWUSER | CLONE_NEWNET)`` gives the process a network namespace of its own with
one interface, ``lo``, down: nothing can be reached, not even 127.0.0.1 of the host, and nothing
it binds is reachable from outside. For loopback mode ``lo`` is brought up (the new user namespace
holds ``CAP_NET_ADMIN`` over the new network namespace): the process and its children can talk to
each other over 127.0.0.0/8 and ::1, still not to the host's loopback services nor anything else.
The user namespace maps the caller's uid and gid onto themselves, so files keep their owners;
the capabilities it grants are dropped at ``exec`` (the uid is not 0 in it).

Standard library only (runs in the exec wrapper). The calling process must be single-threaded.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

__all__ = ["NetnsError", "enter"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


class NetnsError(OSError):
    """The user or network namespace could not be made (no unprivileged user namespaces, ...)."""


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter(*, loopback: bool) -> None:
    """Move this process into a new user + network namespace; bring ``lo`` up if ``loopback``.

    Raises:
        NetnsError: the kernel refused.
    """
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNET)) != 0:
        code = ctypes.get_errno()
        raise NetnsError(code, f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {os.strerror(code)}")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        if loopback:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                ifreq = struct.pack("16sh22x", b"lo", 0)
                flags = struct.unpack("16sh22x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, ifreq))[1]
                fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))
    except OSError as exc:
        raise NetnsError(exc.errno or 0, f"setting up the network namespace: {exc}") from None
