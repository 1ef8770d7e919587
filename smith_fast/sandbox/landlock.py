"""A thin ctypes binding of Linux Landlock: probe the ABI, build a ruleset, restrict this process.

Standard library only (this module runs inside the exec wrapper, started with ``python -I -S``,
which has no site-packages). The three system calls have the same numbers on x86_64 and aarch64
(the generic table): ``landlock_create_ruleset`` 444, ``landlock_add_rule`` 445,
``landlock_restrict_self`` 446. Why not the PyPI ``landlock`` package: it is a pre-release
(1.0.0.dev5), and the wrapper cannot import site-packages without paying their start-up cost.

Rights are taken from the ABI the kernel reports, so a right the kernel does not know is never
asked for (that would fail with ``EINVAL``) and a right it knows is always handled (denied unless
a rule grants it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct

__all__ = [
    "FS_EXECUTE",
    "FS_READ_DIR",
    "FS_READ_FILE",
    "FS_WRITE_FILE",
    "FS_TRUNCATE",
    "FS_IOCTL_DEV",
    "FILE_RIGHTS",
    "LandlockError",
    "abi_version",
    "fs_rights",
    "restrict",
]

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
# 1 << 4 .. 1 << 12: remove dir/file, make char/dir/reg/sock/fifo/block/sym (ABI 1)
FS_REFER = 1 << 13  # ABI 2: link/rename across directories
FS_TRUNCATE = 1 << 14  # ABI 3: truncate(2), open(O_TRUNC)
FS_IOCTL_DEV = 1 << 15  # ABI 5: ioctl on device files
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
"""The rights a rule on a file (not a directory) may carry."""

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38


class LandlockError(OSError):
    """Landlock is missing, disabled, or refused the ruleset."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _numbers() -> tuple[int, int, int]:
    machine = platform.machine()
    try:
        return _SYSCALLS[machine]
    except KeyError:
        raise LandlockError(errno.ENOSYS, f"Landlock system call numbers unknown on {machine}") from None


def abi_version() -> int:
    """The Landlock ABI the running kernel offers; 0 when it has none or it is disabled."""
    try:
        create, _, _ = _numbers()
    except LandlockError:
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(create), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(version) if version > 0 else 0


def fs_rights(abi: int) -> int:
    """Every file-system right ABI ``abi`` knows."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _fail(what: str) -> LandlockError:
    code = ctypes.get_errno()
    return LandlockError(code, f"{what}: {os.strerror(code)}")


def restrict(
    abi: int,
    rules: list[tuple[str, int, bool]],
    *,
    handle_fs: bool = True,
    deny_tcp: bool = False,
    scopes: int = 0,
) -> None:
    """Restrict this process (and everything it later execs or forks) for good.

    Args:
        abi: the kernel's ABI (:func:`abi_version`).
        rules: ``(path, rights, follow)`` grants; a missing path is skipped (``/dev/tty`` without
            a terminal), a directory's grant covers everything beneath it, ``follow`` False grants
            a symlink itself rather than its target. Rights the ABI lacks are dropped.
        handle_fs: deny every file-system right no rule grants.
        deny_tcp: deny TCP bind and connect (ABI 4+; ignored below).
        scopes: IPC scopes (ABI 6+; ignored below).

    Raises:
        LandlockError: the kernel refused (no Landlock, bad rule, ...).
    """
    create, add_rule, restrict_self = _numbers()
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled_fs = fs_rights(abi) if handle_fs else 0
    handled_net = (NET_BIND_TCP | NET_CONNECT_TCP) if deny_tcp and abi >= 4 else 0
    scoped = scopes if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("=QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("=Q", handled_fs)
    if not (handled_fs or handled_net or scoped):
        return
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(ctypes.c_long(create), buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    try:
        for path, rights, follow in rules if handled_fs else ():
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
            except FileNotFoundError:
                continue
            try:
                allowed = rights & handled_fs
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    allowed &= FILE_RIGHTS
                if not allowed:
                    continue
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                if libc.syscall(ctypes.c_long(add_rule), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)) < 0:
                    raise _fail(f"landlock_add_rule({path!r})")
            finally:
                os.close(fd)
        if libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(ctypes.c_long(restrict_self), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
