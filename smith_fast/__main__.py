"""``python -m smith_fast``, and the ``smith-fast`` command (pyproject's entry point).

A start of ``serve --mcp`` imports some 400 modules and builds a parser, a config and a core: a
few hundred thousand objects, none of them garbage, through which the cyclic collector ran some 70
times before the first answer (~10 ms of ~150). So the collector is off from here to the end of
the start, where :func:`smith_fast.cli.main` freezes what the start made (never garbage: kept out
of every later collection too) and turns it back on.

Before anything else, each of the standard fds 0, 1 and 2 that is closed gets ``/dev/null``
(:func:`standard_fds`), as daemons do: a libuv loop must not hold those numbers; and a file mode
creation mask that lets others write gets that masked (:func:`mask_world_write`).
"""

import gc
import os
import sys


def standard_fds() -> None:
    """Open ``/dev/null`` on each of fds 0, 1 and 2 that is closed (and give Python its stream).

    A supervisor or a script's ``smith-fast serve >&- 2>&-`` may start us with one closed. The
    first descriptors made then take those numbers (the loop's epoll and io_uring instances, a
    pipe of libuv's) and are taken for stdin, stdout and stderr: log lines were written to one,
    and libuv, which never closes fds 0-2, aborted (``uv__close: Assertion `fd > STDERR_FILENO'``):
    a service at SIGTERM, ``smith-fast exec CMD >&-`` at its end."""
    for fd, mode, name in ((0, "r", "stdin"), (1, "w", "stdout"), (2, "w", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself, the lower ones being open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:  # what Python leaves for a stream whose fd was closed at its start
                setattr(sys, name, open(fd, mode, closefd=False, errors="backslashreplace"))


def mask_world_write() -> None:
    """Add "others may not write" to the file mode creation mask where the process that started
    this one left it out (``umask 000``): every directory made on the way to the service's own
    (``~/.cache/smith-fast``, where compiled Rust hooks wait to be run; the recordings' parents; the
    homes') and every file its commands and ``fs.write`` make was writable by every local account,
    which could then put its own program where a hook's is looked for. Group write, which a
    shared-group setup's ``umask 002`` asks for, stays as it is."""
    os.umask(os.umask(0o022) | 0o002)


def main() -> int:
    standard_fds()
    mask_world_write()
    gc.disable()  # before the imports below: cli.main turns it back on once started
    from .cli import main as run

    return run()


if __name__ == "__main__":
    raise SystemExit(main())
