"""Start a sandboxed command with no exec wrapper in between: Landlock applied in the child.

:meth:`Sandbox.wrap` puts the exec wrapper (``sandbox-exec``) before the command, so every
sandboxed command paid two ``execve`` calls, and an exec is as dear as the rest of a short
command's start (~300 us here; ``bench/bench_exec_start.py``). :func:`spawn` instead starts the
command itself with the C function of ``csrc/sandbox_spawn.c``, which applies the same Landlock
policy (one source, ``csrc/landlock_policy.h``) between ``clone`` and ``execve`` and has the child
join its cgroups itself before anything of the command runs.

It serves only what it can do identically: the C build (``SMITH_FAST_NO_EXTENSIONS`` unset), a
sandbox on the C wrapper (a Python-wrapper sandbox keeps its wrapper), a confined file system and
``--network on``, since a network namespace needs ``unshare`` in a single-threaded process, which
is the wrapper. :func:`usable` says whether it applies; :mod:`smith_fast.process` falls back to
the wrapper and ``Popen`` otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .._compat import NO_EXTENSIONS
from . import HELPER, Sandbox

__all__ = ["spawn", "usable"]

try:
    from .. import _spawn_c

    _BUILT = not NO_EXTENSIONS
except ImportError:  # a source checkout without a build: the wrapper it is
    _BUILT = False


def usable(sandbox: Sandbox) -> bool:
    """Whether :func:`spawn` confines a command exactly as ``sandbox``'s wrapper would."""
    return (_BUILT and sandbox.confines_files and sandbox.network == "on"
            and sandbox.wrapper == (HELPER,))


def _envp(env: Mapping[str, str]) -> list[bytes]:
    out = []
    for key, value in env.items():
        name = os.fsencode(key)
        if b"=" in name:  # what Popen says for it
            raise ValueError("illegal environment variable name")
        out.append(name + b"=" + os.fsencode(value))
    return out


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    fds: tuple[int, int, int],
    sandbox: Sandbox,
    writable: Sequence[str],
    cgroup_procs: Sequence[str] = (),
) -> tuple[int, int]:
    """Start ``argv`` (``argv[0]`` a path: no ``PATH`` search) confined by ``sandbox``, allowed to
    write ``writable``, with ``fds`` as its stdin, stdout and stderr, in a new session, after it
    joined the cgroups whose ``cgroup.procs`` files are ``cgroup_procs``; only where
    :func:`usable`.

    Returns:
        Its pid (our child: reap it) and the bit mask of ``cgroup_procs`` it joined.

    Raises:
        OSError: it could not be started (``filename``: ``cwd`` or ``argv[0]``); nothing ran.
        ValueError: a NUL byte in ``argv`` or ``env``, an ``=`` in a variable name.
    """
    args = [os.fsencode(a) for a in argv]
    try:
        return _spawn_c.spawn(
            args[0], args, _envp(env), None if cwd is None else os.fsencode(cwd), fds,
            [os.fsencode(p) for p in cgroup_procs], [os.fsencode(p) for p in sandbox.readable()],
            [os.fsencode(p) for p in writable],
        )
    except OSError as exc:
        if isinstance(exc.filename, bytes):  # as Popen's: the str it was given
            exc.filename = os.fsdecode(exc.filename)
        raise
