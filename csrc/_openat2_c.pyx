# cython: language_level=3
"""``openat2(2)`` called directly: the system call of :func:`smith_fast.tools.openat2.open_beneath`;
and ``fstat(2)`` for the mode and size of what it opened (:func:`mode_and_size`).

Through ``ctypes`` the call costs about as much again as the kernel's work for a short path
(argument conversion, the ``errno`` dance): every ``fs.read`` pays it. This is the same call, with
the GIL released as ``ctypes`` releases it; ``smith_fast/tools/openat2.py`` keeps the ``ctypes``
call for a build without extensions.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.errno cimport errno
from libc.string cimport strerror, strlen
from posix.stat cimport fstat, struct_stat

cdef extern from *:
    """
    #include <errno.h>
    #include <stdint.h>
    #include <unistd.h>
    #include <sys/syscall.h>
    #ifndef SYS_openat2
    #define SYS_openat2 437  /* the same number on every architecture that has it */
    #endif
    struct smith_open_how { uint64_t flags; uint64_t mode; uint64_t resolve; };
    static long smith_openat2(int dirfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve) {
        struct smith_open_how how = {flags, mode, resolve};
        long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
        return fd < 0 ? -errno : fd;
    }
    """
    long smith_openat2(int dirfd, const char* path, unsigned long long flags, unsigned long long mode,
                       unsigned long long resolve) nogil

__all__ = ["mode_and_size", "openat2"]


def openat2(int dirfd, bytes path, unsigned long long flags, unsigned long long mode, unsigned long long resolve):
    """``openat2(dirfd, path, {flags, mode, resolve})``: the new fd, or minus the ``errno``.

    Raises:
        ValueError: ``path`` holds a NUL byte.
    """
    cdef const char* p = PyBytes_AS_STRING(path)
    cdef long fd
    if <Py_ssize_t>strlen(p) != PyBytes_GET_SIZE(path):
        raise ValueError("embedded null byte")
    with nogil:
        fd = smith_openat2(dirfd, p, flags, mode, resolve)
    return fd


def mode_and_size(int fd):
    """``(st_mode, st_size)`` of what ``fd`` is open on: ``fstat(2)``, without the ``os.stat_result``
    that ``os.fstat`` builds (its three float times and three nanosecond ones: a tenth of a small
    ``fs.read``'s service CPU, for the two fields a read looks at).

    Raises:
        OSError: what ``fstat`` says (``EBADF``).
    """
    cdef struct_stat st
    cdef int r
    with nogil:
        r = fstat(fd, &st)
    if r != 0:
        code = errno
        raise OSError(code, strerror(code).decode())
    return st.st_mode, st.st_size
