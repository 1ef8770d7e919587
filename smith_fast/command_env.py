"""The environment every command a peer asks for starts from (:func:`base_environment`)."""

from __future__ import annotations

import functools
import os
import pwd

__all__ = ["DEFAULT_PATH", "DEFAULT_SHELL", "base_environment"]

DEFAULT_SHELL = "/bin/sh"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@functools.lru_cache(maxsize=4)
def _account(uid: int) -> tuple[str, str | None]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # a uid with no passwd entry, common in containers
        return str(uid), None
    return entry.pw_name, entry.pw_dir or None


def base_environment() -> dict[str, str]:
    """The environment every command starts from, before the request's ``env`` is layered on top.

    It is deliberately *not* the service's own environment, which may hold credentials. It holds
    exactly these nine variables:

    * ``PATH``: the service's ``PATH`` if set and non-empty, else :data:`DEFAULT_PATH`.
    * ``HOME``: the service's ``HOME`` if set and non-empty, else the home directory of the
      service's user from the password database, else ``/``.
    * ``USER`` and ``LOGNAME``: the name of the user the service runs as (password database),
      or the numeric uid when it has no entry.
    * ``SHELL``: ``/bin/sh`` (:meth:`~smith_fast.shell_process.ShellProcess.start` replaces it with the shell it runs).
    * ``LANG`` and ``LC_ALL``: ``C.UTF-8``.
    * ``TERM``: ``dumb`` (output goes to a pipe, not a terminal).
    * ``SMITH_FAST``: ``1``, so a command can tell it runs under smith-fast.

    Returns:
        A new dict the caller may modify.
    """
    user, home = _account(os.getuid())
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": os.environ.get("HOME") or home or "/",
        "USER": user,
        "LOGNAME": user,
        "SHELL": DEFAULT_SHELL,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "SMITH_FAST": "1",
    }
