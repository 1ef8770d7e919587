"""Open a path beneath a directory fd, with the containment enforced by the kernel.

:func:`open_beneath` is ``openat2(dirfd, path, {flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
[| RESOLVE_NO_SYMLINKS]})`` (Linux >= 5.6, called through ``ctypes``: Python has no wrapper and
no well-kept package offers one). The kernel resolves the whole path and refuses any step that
would leave ``dirfd`` (``..`` above it, an absolute path or symlink, a ``/proc`` magic link) with
``EXDEV`` or ``ELOOP``, so the check and the use are one system call and no rename or symlink swap
by another process can move the result outside.

Where ``openat2`` is missing (``ENOSYS``: an older kernel, or a seccomp filter), or where
``SMITH_FAST_NO_OPENAT2=1`` is set (tests use it to run the same cases through it), the same rules
are applied by a component walk: each component opened relative to the fd of the directory before
it with ``O_NOFOLLOW``, symlinks read and expanded in user space (an absolute one refused), ``..``
taken from the walk's own stack of directory fds (so it can never climb above ``dirfd``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import sys
from collections import deque
from collections.abc import Callable
from os import O_CLOEXEC as _CLOEXEC, fsencode as _fsencode  # bound once: every fs.read opens a file
from typing import Any

from smith_fast._compat import NO_EXTENSIONS

__all__ = [
    "RESOLVE_BENEATH",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_SYMLINKS",
    "kernel_openat2",
    "mode_and_size",
    "open_beneath",
    "set_openat2",
]

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08

# openat2's number is 437 on every architecture that has it (it came after the syscall tables
# were unified); other systems get the walk.
_SYS_OPENAT2 = (
    {"x86_64": 437, "aarch64": 437, "riscv64": 437, "ppc64le": 437, "s390x": 437}.get(platform.machine())
    if sys.platform == "linux"
    else None
)
_O_TMPFILE = getattr(os, "O_TMPFILE", 0o20200000)
_MAX_LINKS = 40  # the kernel's MAXSYMLINKS
_RETRIES = 8  # EAGAIN: a concurrent rename made the kernel unsure that a ".." stayed beneath

# What os.fsencode does here, without its Python frames (it is not compiled): a UTF-8 file system
# encoding with surrogateescape, as Linux has unless the locale says otherwise.
_FS_UTF8 = sys.getfilesystemencoding() == "utf-8" and sys.getfilesystemencodeerrors() == "surrogateescape"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_OpenHow), ctypes.c_size_t]

_HOW_SIZE = ctypes.sizeof(_OpenHow)
# (flags, mode, resolve) -> a reference to its open_how: a handful of combinations ever occur,
# and building the struct per call cost about as much as the system call
_HOWS: dict[tuple[int, int, int], Any] = {}

_use_openat2 = _SYS_OPENAT2 is not None and os.environ.get("SMITH_FAST_NO_OPENAT2") != "1"


def _ctypes_openat2(dirfd: int, raw: bytes, flags: int, mode: int, resolve: int) -> int:
    """``openat2`` through ``ctypes``: the new fd, or minus the ``errno`` (as the compiled one)."""
    key = (flags, mode, resolve)
    how = _HOWS.get(key)
    if how is None:
        how = _HOWS[key] = ctypes.byref(_OpenHow(*key))
    fd: int = _syscall(_SYS_OPENAT2, dirfd, raw, how, _HOW_SIZE)
    return fd if fd >= 0 else -ctypes.get_errno()


def _os_mode_and_size(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_mode, st.st_size


# The compiled calls (csrc/_openat2_c.pyx) where built: the ctypes one costs about as much again as
# the kernel's work for a short path, and os.fstat builds a whole stat_result for two fields.
_openat2: Callable[[int, bytes, int, int, int], int] = _ctypes_openat2
mode_and_size: Callable[[int], tuple[int, int]] = _os_mode_and_size
"""``(st_mode, st_size)`` of what an fd is open on (``fstat``); ``OSError`` as ``os.fstat``."""
if not NO_EXTENSIONS:
    try:
        from smith_fast import _openat2_c
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        pass
    else:
        _openat2 = _openat2_c.openat2
        mode_and_size = _openat2_c.mode_and_size


def set_openat2(enabled: bool) -> None:
    """Use ``openat2`` (when the kernel has it) or always the component walk; for tests."""
    global _use_openat2
    _use_openat2 = enabled and _SYS_OPENAT2 is not None


def kernel_openat2() -> bool:
    """Whether :func:`open_beneath` currently uses the ``openat2`` system call."""
    return _use_openat2


def open_beneath(dirfd: int, path: str, flags: int, mode: int = 0o666, *, follow: bool = True) -> int:
    """Open ``path`` relative to ``dirfd``, never resolving outside of it.

    Args:
        dirfd: an open directory (``O_PATH`` is enough).
        path: a relative path; ``..`` is allowed as long as it stays beneath ``dirfd``.
        flags: ``os.open`` flags (``O_CLOEXEC`` is added).
        mode: the mode for ``O_CREAT``.
        follow: follow symlinks that stay beneath ``dirfd``; ``False`` refuses every symlink with
            ``ELOOP`` (cheaper to resolve, and tells the caller the path has none).

    Returns:
        The new fd.

    Raises:
        OSError: ``EXDEV`` when the path leaves ``dirfd`` (``..``, an absolute path or symlink),
            ``ELOOP`` for a magic link, for any symlink when not ``follow``, or too many links;
            otherwise what ``open`` raises (``ENOENT``, ``ENOTDIR``, ``EISDIR`` …).
    """
    flags |= _CLOEXEC
    resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | (0 if follow else RESOLVE_NO_SYMLINKS)
    global _use_openat2
    if _use_openat2:
        # The kernel refuses a mode without O_CREAT or O_TMPFILE (which includes O_DIRECTORY's bit).
        creates = flags & os.O_CREAT or flags & _O_TMPFILE == _O_TMPFILE
        raw = path.encode("utf-8", "surrogateescape") if _FS_UTF8 and type(path) is str else _fsencode(path)
        for _ in range(_RETRIES):
            fd: int = _openat2(dirfd, raw, flags, mode if creates else 0, resolve)
            if fd >= 0:
                return fd
            err = -fd
            if err == errno.EINTR or err == errno.EAGAIN:
                continue
            if err == errno.ENOSYS:
                _use_openat2 = False
                break
            raise OSError(err, os.strerror(err), path)
        else:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)
    return _walk(dirfd, path, flags, mode, follow)


def _walk(dirfd: int, path: str, flags: int, mode: int, follow: bool) -> int:
    """:func:`open_beneath` without ``openat2``: one ``O_NOFOLLOW`` open per component."""
    if path.startswith("/"):
        raise OSError(errno.EXDEV, "absolute path", path)
    parts = deque(p for p in path.split("/") if p not in ("", "."))
    stack = [os.dup(dirfd)]  # the directories walked through, dirfd first
    links = 0
    try:
        if not parts:
            return _reopen(stack[-1], flags)
        while parts:
            name = parts.popleft()
            if name == "..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, "path leaves the directory", path)
                os.close(stack.pop())
                if not parts:
                    return _reopen(stack[-1], flags)
                continue
            last = not parts
            try:
                if last:
                    fd = os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=stack[-1])
                    if not flags & os.O_PATH or not stat.S_ISLNK(os.fstat(fd).st_mode):
                        return fd
                    os.close(fd)  # O_PATH | O_NOFOLLOW opened the symlink itself
                    target = os.readlink(name, dir_fd=stack[-1])
                else:
                    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
                    stack.append(fd)
                    continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    target = os.readlink(name, dir_fd=stack[-1])
                except OSError:
                    raise exc from None  # not a symlink: the open's own error stands
            if not follow:
                raise OSError(errno.ELOOP, "a symlink in the path", path)
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if target.startswith("/"):
                raise OSError(errno.EXDEV, "a symlink to an absolute path", path)
            parts.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
            if not parts:  # a link to "." or ""
                return _reopen(stack[-1], flags)
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        for fd in stack:
            os.close(fd)


def _reopen(dirfd: int, flags: int) -> int:
    """``dirfd`` itself opened with ``flags`` (the path named the directory)."""
    return os.open(".", flags & ~os.O_CREAT, dir_fd=dirfd)
