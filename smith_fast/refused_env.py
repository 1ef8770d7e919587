"""Which environment variables a request may set for the commands it runs.

A request's ``env`` is layered over :func:`smith_fast.process.base_environment`. Most variables
only matter to the program that reads them, and the program is named in the command a policy (a
hook, a reviewer) can see. Some change how *every* program loads or starts, whatever the command
says: they load a shared library into it, run a script before it, or feed an interpreter options
that execute code. Set from ``env`` they are invisible in the command text, so a command that a
hook allowed as ``ls`` could run anything. Those are refused (``ERROR_CODE_PERMISSION_DENIED``,
naming the variable) unless the service lets one through with ``serve --allow-env NAME``.

Refused (names are case-sensitive, as the programs reading them are):

* the dynamic loader: every ``LD_*`` variable (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``,
  ``LD_DEBUG_OUTPUT`` ...) and every ``DYLD_*`` variable (macOS);
* the C library loading files or code: ``GCONV_PATH``, ``GLIBC_TUNABLES``, ``LOCPATH``,
  ``NLSPATH``, ``MALLOC_TRACE``, ``HOSTALIASES``, ``RESOLV_HOST_CONF`` (from glibc's list of
  variables it drops for setuid programs);
* shell start-up: ``BASH_ENV`` and ``ENV`` (a file sourced before the command), ``SHELLOPTS``,
  ``BASHOPTS``, ``PS4`` (runs command substitutions under ``xtrace``), and exported functions
  (``BASH_FUNC_*``), which replace any command of that name;
* interpreter options that carry code: ``NODE_OPTIONS`` (``--require``), ``PERL5OPT`` (``-M``),
  ``RUBYOPT`` (``-r``), ``JAVA_TOOL_OPTIONS``, ``_JAVA_OPTIONS``, ``JDK_JAVA_OPTIONS``
  (``-javaagent``), ``PYTHONSTARTUP``, ``PYTHONINSPECT``.

Allowed, deliberately: ``PATH`` and module search paths (``PYTHONPATH``, ``NODE_PATH``,
``PERL5LIB``, ``CLASSPATH`` ...), which development commands set all the time and which only
redirect a lookup to files already on disk; the tool workspace and the command text remain what a
policy reviews. A deployment that wants them refused too uses a ``before_shell_exec`` hook.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from .errors import ProtocolError
from .pb import smith_pb2

__all__ = ["REFUSED_NAMES", "REFUSED_PREFIXES", "check_env", "refused_names"]

REFUSED_PREFIXES: tuple[str, ...] = ("LD_", "DYLD_", "BASH_FUNC_")
"""A variable whose name starts with one of these is refused."""

REFUSED_NAMES: frozenset[str] = frozenset(
    {
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
        "NLSPATH",
        "MALLOC_TRACE",
        "HOSTALIASES",
        "RESOLV_HOST_CONF",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "NODE_OPTIONS",
        "PERL5OPT",
        "RUBYOPT",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
    }
)
"""Variables refused by exact name."""


def refused_names(names: Iterable[str], allow: Collection[str] = ()) -> list[str]:
    """The names among ``names`` a request may not set, in the order given.

    Args:
        names: environment variable names (the keys of a request's ``env``).
        allow: names permitted anyway (``serve --allow-env``).

    Returns:
        The refused names; empty when all are fine.
    """
    out = []
    for name in names:
        if (name in REFUSED_NAMES or name.startswith(REFUSED_PREFIXES)) and name not in allow:
            out.append(name)
    return out


def check_env(env: Mapping[str, str], allow: Collection[str] = (), *, what: str = "env", request_id: str | None = None) -> None:
    """Refuse ``env`` if it sets a variable :func:`refused_names` refuses.

    Args:
        env: the variables a request sets.
        allow: names permitted anyway (``serve --allow-env``).
        what: how the message names ``env`` (``env``, ``shell.run env`` ...).
        request_id: the request, for the error.

    Raises:
        ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` naming the variables,
            ``details["reason"] == "env_refused"`` and ``details["variables"]`` a comma list.
    """
    if not env:
        return
    refused = refused_names(env, allow)
    if refused:
        raise ProtocolError(
            f"{what} sets {', '.join(refused)}, which a request may not set: it changes how every program "
            f"loads or starts, unseen in the command (the service can allow it with --allow-env {refused[0]})",
            smith_pb2.ERROR_CODE_PERMISSION_DENIED,
            request_id,
            {"reason": "env_refused", "variables": ",".join(refused)},
        )
