"""The environment every command a peer asks for starts from (:func:`base_environment`)."""

from __future__ import annotations

import functools
import os
import pwd

__all__ = ["DEFAULT_PATH", "DEFAULT_SHELL", "HOME_VARIABLES", "base_environment", "home_environment"]

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


HOME_VARIABLES: dict[str, str] = {
    "HOME": "",
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
    "npm_config_cache": ".npm",
    "PIP_CACHE_DIR": ".cache/pip",
    "CARGO_HOME": ".cargo",
    "GOPATH": "go",
    "GOCACHE": ".cache/go-build",
}
"""The variables a session's home sets, each a path relative to the home. Most tools derive these
from ``HOME`` already; they are set anyway so that a tool with its own default (npm's, cargo's,
go's) writes in the home and nowhere else."""

# Tool managers whose toolchains live in the service user's real home (rustup's ``cargo`` and
# ``rustc`` proxies, pyenv's shims): with ``HOME`` moved they would look for them in the session's
# home and find nothing. They are pointed at the real ones, which stay read-only in a command's view.
_TOOLCHAINS = {"RUSTUP_HOME": ".rustup", "PYENV_ROOT": ".pyenv"}


def home_environment(home: str) -> dict[str, str]:
    """The variables of a command whose session's home is ``home``: :data:`HOME_VARIABLES` under
    it, plus ``RUSTUP_HOME``/``PYENV_ROOT`` when the service's environment sets them or its user's
    real home has them (so that toolchains installed there still run). Worked out once per home
    (every sandboxed command asks: a uid, a passwd entry and a stat per toolchain each time); the
    caller gets its own copy."""
    return dict(_home_environment(home))


@functools.lru_cache(maxsize=256)  # a home per session (--home-dir)
def _home_environment(home: str) -> dict[str, str]:
    out = {name: f"{home}/{sub}" if sub else home for name, sub in HOME_VARIABLES.items()}
    _, real = _account(os.getuid())
    real = os.environ.get("HOME") or real
    for name, sub in _TOOLCHAINS.items():
        given = os.environ.get(name)
        if given:
            out[name] = given
        elif real and os.path.isdir(f"{real}/{sub}"):
            out[name] = f"{real}/{sub}"
    return out
