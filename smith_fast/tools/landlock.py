"""Confine what the calling thread, and every process it starts, may read: Landlock, through ctypes.

:func:`restrict_reads` lets the thread read files and list directories only beneath the given
paths (and execute only what a rule allows), for the rest of its life; writes are not restricted.
Landlock domains belong to a thread (without ``LANDLOCK_RESTRICT_SELF_TSYNC``), and a child
inherits its parent thread's, so a worker thread confined this way can start a process (``rg``,
by ``fs.search``) that cannot read outside the workspace, whatever a racer does to the paths it
walks, while the service's other threads are unaffected.

A thin binding written here: three system calls and two structures; the PyPI ``landlock`` package
wraps the same calls, for the whole process only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from collections.abc import Iterable

__all__ = ["EXECUTE", "READ_DIR", "READ_FILE", "LandlockError", "abi_version", "restrict_reads"]

EXECUTE = 1 << 0
READ_FILE = 1 << 2
READ_DIR = 1 << 3
_HANDLED = EXECUTE | READ_FILE | READ_DIR
_FILE_RIGHTS = EXECUTE | READ_FILE  # what a rule on a non-directory may grant
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Landlock's numbers are the same on every architecture (unified table, Linux >= 5.13).
_SYSCALLS = (444, 445, 446) if sys.platform == "linux" and platform.machine() in (
    "x86_64", "aarch64", "riscv64", "ppc64le", "s390x"
) else None


class LandlockError(OSError):
    """A Landlock call failed other than for want of kernel support."""


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _call(*args: object) -> int:
    result = int(_syscall(*args))
    if result < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, os.strerror(err))
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or it is disabled)."""
    if _SYSCALLS is None:
        return 0
    try:
        return _call(ctypes.c_long(_SYSCALLS[0]), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except LandlockError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
            return 0
        raise


def restrict_reads(rules: Iterable[tuple[str, int]]) -> None:
    """Confine the calling thread's reads and executions to ``rules``, for good.

    Args:
        rules: ``(path, access)`` pairs; ``access`` from :data:`READ_FILE`, :data:`READ_DIR`,
            :data:`EXECUTE` (directory rights are dropped for a path that is not a directory).
            Paths that do not exist are skipped.

    Raises:
        LandlockError: the kernel has no Landlock (``errno`` ``ENOSYS``/``EOPNOTSUPP``), or a
            call failed.
    """
    if _SYSCALLS is None:
        raise LandlockError(errno.ENOSYS, "Landlock is Linux only")
    create, add_rule, restrict_self = _SYSCALLS
    handled = ctypes.c_uint64(_HANDLED)
    ruleset = _call(ctypes.c_long(create), ctypes.byref(handled), ctypes.c_size_t(8), ctypes.c_uint32(0))
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    access &= _FILE_RIGHTS
                rule = _PathBeneath(access & _HANDLED, fd)
                _call(ctypes.c_long(add_rule), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0))
            finally:
                os.close(fd)
        # Required for an unprivileged restrict_self; per thread, like the domain.
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise LandlockError(err, os.strerror(err))
        _call(ctypes.c_long(restrict_self), ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
