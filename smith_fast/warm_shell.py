"""Warm shells: a session's next command's shell started ahead, waiting for its script.

Most of a short command's time is its shell's ``exec``: the dynamic loader, the shell's start-up
(``sh -c true`` in a ready process: ~300 µs of the ~350 from the request to its exit). So when a
session's command starts through its zygote, the process made ahead for the next one runs the
shell at once, as ``[shell, "-s"]`` (commands on stdin) with the same environment, in ``/``, and
blocks reading its stdin, a pipe. The next command, if it would run that same shell in that same
directory, is written to the pipe as its script, :data:`PREFIX` then the
command verbatim, and runs at once (:func:`script`).

What the command sees is what ``sh -c`` gives it: the same ``$0``, no positional parameters, stdin
``/dev/null``, ``PWD`` and ``OLDPWD``, the error messages' ``sh: 1: …`` and the line numbers (the
prefix is on the first line, and a syntax error there is reported as ``sh -c`` reports it, before
anything ran), the same exit status. It holds only where the shell reads its whole script in one read and
no more until the script is done; so a command takes a warm shell only when:

* the shell is dash (bash and busybox read a non-seekable stdin byte by byte, and word their
  errors differently with ``-s``);
* the script fits in what dash reads at once (:func:`read_size`, found by running it once: 8 KiB
  with glibc), written in one ``write`` to the empty pipe (which a reader sees whole);
* it has no ``exec`` (only ``exec`` could point the shell's stdin somewhere for good: dash would
  read the rest of its "script" from there once the command ended);
* the same directory, by path: the shell starts in ``/`` and its script enters the directory, so
  one removed and made again since is the new one, as under ``sh -c``.

A command whose environment differs from the one the shell started with in a few variables
(``TRACEPARENT`` names each command's span; the MCP shell carries what a command exported) gets
them set by its script (``export``/``unset``), unless one is read by dash as it starts (its
locale, ``IFS``...) or by its loader and C library (``LD_PRELOAD``, ``GLIBC_TUNABLES``,
``MALLOC_*``...: a shell that loaded the last command's library is not for a command without it).
The only difference left: ``$-`` holds ``s``. A command with a stdin of its own (an MCP client
that answers input requests) gets it as the warm shell's fd 3 and runs as a group, ``{ command
}`` with its stdin from fd 3: the shell reads the whole group before it runs (any size, ``exec``
allowed: fd 0 is the shell's own again after the group), which differs from ``sh -c`` only for a
command that does not parse (nothing of it runs, where ``sh -c`` runs the lines before the error;
the error's wording may differ) or that defines an alias for its own later lines. Anything else
(a bash session, a long command with ``exec``) starts the usual way, a fork and an exec, and the
warm shell made for it exits at the end of its empty script.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Mapping

from .refused_env import CLASSES

__all__ = ["MAX_SCRIPT", "PREFIX", "quote", "read_size", "script"]

MAX_SCRIPT = 1 << 20
"""The largest script written to a warm shell (its pipe is made that large; one write or none)."""

PREFIX = b"exec </dev/null; "
"""What a warm shell's script starts with when its command has no stdin: ``/dev/null``, as under ``sh -c``."""


def _enter(cwd: str, environ: Mapping[str, str]) -> bytes:
    """The script's step into its directory: the shell started in ``/`` (nothing it may say as it
    starts, such as a removed directory's ``getcwd() failed``, is about the command), so it enters
    ``cwd`` now (the one at that path now), with ``PWD`` as ``sh -c`` started there has it (the
    physical path) and ``OLDPWD`` as the environment had it."""
    q = quote(cwd)
    old = f"OLDPWD={quote(environ['OLDPWD'])}" if "OLDPWD" in environ else "unset OLDPWD"
    return f"cd -P -- {q} || exit 126; {old}; ".encode("utf-8", "surrogateescape")


def quote(text: str) -> str:
    """``text`` as one word for ``sh``, in single quotes (every byte as it is)."""
    return "'" + text.replace("'", "'\\''") + "'"


_TRIES = (8192, 1024)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What dash reads from its environment as it starts (its locale, its word splitting, its options,
# the variables it sets itself): a shell told of a change later is not one started with it. So
# is what the dynamic loader and the C library read as a program starts (refused_env's "loader"
# class: LD_PRELOAD, GLIBC_TUNABLES ...; malloc's MALLOC_* settings): a shell started with the last
# command's LD_PRELOAD has loaded that library, which a later command asked without must not run
# under, and a command that asks for one gets it in its shell only if the shell starts with it.
_LOADER_NAMES, _LOADER_PREFIXES = CLASSES["loader"]
_AT_START = frozenset({"IFS", "ENV", "OPTIND", "PPID", "LANG", "LANGUAGE", "LINENO", "PS1", "PS2", "PS4"}) | _LOADER_NAMES
_AT_START_PREFIXES = ("LC_", "MALLOC_", *_LOADER_PREFIXES)
_MAX_CHANGES = 16
_EXEC = re.compile(r"(?<![\w./-])exec(?![\w./-])")  # the word, not `find -exec` or a path's bench-exec-start


@functools.lru_cache(maxsize=8)
def read_size(shell: str) -> int:
    """The largest script ``shell`` (a path) reads in its first read of a pipe on stdin: 0 for a
    shell other than dash, or one that does not read that much (none of :data:`_TRIES`)."""
    if os.path.basename(os.path.realpath(shell)) != "dash":
        return 0
    for size in _TRIES:
        # A script of exactly `size` bytes, whose last line prints: only a shell that read all of it
        # before the prefix pointed its stdin to /dev/null gets to that line.
        head, tail = b"exec </dev/null\n#", b"\necho ok\n"
        text = head + b"x" * (size - len(head) - len(tail)) + tail
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            os.write(w, text)
            os.close(w)
            w = -1
            done = subprocess.run([shell, "-s"], stdin=r, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return 0
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        if done.stdout == b"ok\n":
            return size
    return 0


def script(command: str, shell: str, cwd: str, environ: Mapping[str, str], stdin: bool,
           started: Mapping[str, str] | None = None) -> bytes | None:
    """What a warm ``shell``, started with the environment ``started`` (None: ``environ``), runs for
    ``command`` in ``cwd`` with ``environ``; None when the command cannot run in one (see the
    module's list).

    Without a stdin: :data:`PREFIX`, the variables that differ (:func:`_changes`), the step into
    the directory, then the command, all on its first line. With one (the shell's fd 3): the same
    steps, then the command in a group, ``{ command\n} <&3 3<&-``, so the shell parses all of it
    before anything reads the command's stdin, and reads its own (at EOF) again after the group,
    whatever the command did to fd 0."""
    if "\0" in command:
        return None
    changes = _changes(environ if started is None else started, environ)
    if changes is None:
        return None
    text = command.encode("utf-8", "surrogateescape")
    if stdin:
        if not _has_commands(command):
            return None  # an empty group is a syntax error; sh -c of nothing is not
        text = changes + _enter(cwd, environ) + b"{ " + text + b"\n} <&3 3<&-"
        return text if len(text) <= MAX_SCRIPT else None
    if "exec" in command and _EXEC.search(command):
        return None
    text = PREFIX + changes + _enter(cwd, environ) + text
    return text if len(text) <= read_size(shell) else None


def _changes(started: Mapping[str, str], environ: Mapping[str, str]) -> bytes | None:
    """``export NAME=VALUE; `` and ``unset NAME; `` for each variable ``environ`` has other than
    the shell started with (a per-command ``TRACEPARENT``, a variable the MCP shell carries), so
    its commands see the environment ``sh -c`` would have given them; None when one of them is no
    shell name, is read by the shell or its loader as it starts (:data:`_AT_START`, ``LC_*``, the
    loader's variables), or there are more
    than :data:`_MAX_CHANGES`. ``PWD`` and ``OLDPWD`` are :func:`_enter`'s."""
    if started == environ:
        return b""
    steps: list[str] = []
    for name, value in environ.items():
        if started.get(name) != value and name not in ("PWD", "OLDPWD"):
            if not _settable(name) or "\0" in value:  # sh -c's start refuses a NUL byte: so does it then
                return None
            steps.append(f"export {name}={quote(value)}; ")
    for name in started:
        if name not in environ and name not in ("PWD", "OLDPWD"):
            if not _settable(name):
                return None
            steps.append(f"unset {name}; ")
    if len(steps) > _MAX_CHANGES:
        return None
    return "".join(steps).encode("utf-8", "surrogateescape")


def _settable(name: str) -> bool:
    return bool(_NAME.match(name)) and name not in _AT_START and not name.startswith(_AT_START_PREFIXES)


def _has_commands(command: str) -> bool:
    """Whether ``command`` has a line that is neither blank nor a comment."""
    return any(line.strip() and not line.lstrip().startswith("#") for line in command.splitlines())
