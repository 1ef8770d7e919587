"""Which environment variables a request may set for the commands it runs (the env policy).

A request's ``env`` is layered over :func:`smith_fast.process.base_environment`. Most variables
only matter to the program that reads them, and the program is named in the command a policy (a
hook, a reviewer) can see. Some make a program *load or run other code* than the command says,
invisibly: set from ``env`` a command that a hook allowed as ``git status`` or ``openssl version``
could run anything. Those fall into four classes (:data:`CLASSES`), and the policy is about
classes, not single names:

``loader``
    the dynamic loader and the C library loading files or code: every ``LD_*`` and ``DYLD_*``
    variable, ``GCONV_PATH``, ``GLIBC_TUNABLES``, ``LOCPATH``, ``NLSPATH``, ``MALLOC_TRACE``,
    ``HOSTALIASES``, ``RESOLV_HOST_CONF`` (glibc's list of variables it drops for setuid programs).
``config-path``
    where a program reads a configuration file that can name code to load or run:
    ``OPENSSL_CONF`` (an ``engine`` section loads a shared object whose constructor runs under
    ``openssl``, ``python3 -c 'import ssl'``, ``curl``), ``OPENSSL_ENGINES``/``OPENSSL_MODULES``,
    ``GIT_CONFIG``/``GIT_CONFIG_GLOBAL``/``GIT_CONFIG_SYSTEM``, ``HOME`` and ``XDG_CONFIG_HOME``
    (``~/.gitconfig``, ``~/.curlrc``, ``~/.npmrc`` ... from a directory the peer wrote),
    ``PYTHONHOME``, ``CURL_HOME``, ``WGETRC``, ``PIP_CONFIG_FILE``, ``NPM_CONFIG_*``/``npm_config_*``,
    ``CARGO_HOME`` (its ``config.toml`` names a ``rustc-wrapper``), ``RUSTUP_HOME`` (its settings name
    the toolchain that runs), ``GOENV`` (go's env file sets ``GOFLAGS``). The service sets ``HOME``
    and these homes itself, to the session's home (:func:`smith_fast.command_env.home_environment`).
``option-injection``
    settings that *are* code or a command: shell start-up (``BASH_ENV``, ``ENV``, ``ZDOTDIR``,
    ``SHELLOPTS``, ``BASHOPTS``, ``PS4``, ``PROMPT_COMMAND``, exported functions ``BASH_FUNC_*``),
    interpreter options (``NODE_OPTIONS``, ``PERL5OPT``, ``RUBYOPT``, ``JAVA_TOOL_OPTIONS``,
    ``_JAVA_OPTIONS``, ``JDK_JAVA_OPTIONS``, ``PYTHONSTARTUP``, ``PYTHONINSPECT``,
    ``PYTHONWARNINGS`` (a category imports a module)), git's configuration by variables
    (``GIT_CONFIG_COUNT`` with ``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n``: ``core.fsmonitor``
    runs a command on ``git status``; ``GIT_CONFIG_PARAMETERS``) and the commands programs run
    for help (``GIT_SSH``, ``GIT_SSH_COMMAND``, ``GIT_PROXY_COMMAND``, ``GIT_EXTERNAL_DIFF``,
    ``GIT_ASKPASS``, ``SSH_ASKPASS``, ``GIT_PAGER``, ``PAGER``, ``MANPAGER``, ``GIT_EDITOR``,
    ``EDITOR``, ``VISUAL``, ``LESSOPEN``, ``LESSCLOSE``, ``GIT_EXEC_PATH``, ``RUSTC_WRAPPER``, ``GOFLAGS`` (``-toolexec``) ...).
``search-path``
    module search paths: ``PYTHONPATH`` (a ``sitecustomize.py`` there runs in *every*
    ``python3``, whatever it is asked to do), ``PYTHONUSERBASE``, ``NODE_PATH``, ``PERL5LIB``,
    ``PERLLIB``, ``RUBYLIB``, ``CLASSPATH``, ``GEM_PATH``, ``GEM_HOME``, ``LUA_PATH``,
    ``LUA_CPATH``. ``PATH`` is a search path too but stays allowed in ``denylist`` mode: the
    command names the program, and ``./bin/ls`` runs a workspace file as surely as
    ``PATH=./bin ls``; what a workspace program may do is the sandbox's business.

Two modes (``serve --env-policy``):

``denylist`` (the default)
    every name in the four classes is refused unless ``--allow-env NAME`` lets it through.
    A list of names always misses one (there are thousands of programs); it is the default
    because ``env`` is meant for arbitrary application variables.
``allowlist``
    only :data:`SAFE_NAMES` (locale, terminal, colour, time zone) and the ``--allow-env`` names
    may be set; everything else is refused. The choice for a service facing peers that may be
    hostile: what it lets through is what the operator listed.

In either mode, and whatever ``--allow-env`` says, the names of :data:`ALWAYS_REFUSED_PREFIXES`
are refused: ``SMITH_NATS_*`` hold a NATS fleet's credentials (smith_fast.nats.config), and a
request must not hand credentials of its choosing to a smith-fast process its command starts.
Commands never see the service's own (they start from ``base_environment``, not its environment).

Either way a refusal is ``ERROR_CODE_PERMISSION_DENIED`` naming the variables, before anything
runs, checked after the hooks (a transform cannot bring one in). The sandbox (``smith_fast/sandbox``) bounds
what a program can do once it runs; this policy keeps a command from being another one in
disguise, so that what a hook reviewed is what runs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

from .errors import ProtocolError
from .pb import smith_pb2

__all__ = [
    "ALWAYS_REFUSED_PREFIXES",
    "CLASSES",
    "ENV_POLICIES",
    "REFUSED_NAMES",
    "REFUSED_PREFIXES",
    "SAFE_NAMES",
    "SAFE_PREFIXES",
    "check_env",
    "env_class",
    "refused_names",
]

ENV_POLICIES: tuple[str, ...] = ("denylist", "allowlist")
"""The values of ``--env-policy``."""

CLASSES: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "loader": (
        frozenset({"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "MALLOC_TRACE", "HOSTALIASES", "RESOLV_HOST_CONF"}),
        ("LD_", "DYLD_"),
    ),
    "config-path": (
        frozenset({
            "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES", "GIT_CONFIG", "GIT_CONFIG_GLOBAL",
            "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM", "GIT_TEMPLATE_DIR", "HOME", "XDG_CONFIG_HOME",
            "XDG_CONFIG_DIRS", "PYTHONHOME", "CURL_HOME", "WGETRC", "PIP_CONFIG_FILE", "INPUTRC",
            "CARGO_HOME", "RUSTUP_HOME", "GOENV",
        }),
        ("NPM_CONFIG_", "npm_config_"),
    ),
    "option-injection": (
        frozenset({
            "BASH_ENV", "ENV", "ZDOTDIR", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
            "NODE_OPTIONS", "PERL5OPT", "RUBYOPT", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
            "JDK_JAVA_OPTIONS", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONWARNINGS", "PYTHONBREAKPOINT",
            "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS", "GIT_SSH", "GIT_SSH_COMMAND",
            "GIT_PROXY_COMMAND", "GIT_EXTERNAL_DIFF", "GIT_ASKPASS", "SSH_ASKPASS", "SUDO_ASKPASS",
            "GIT_PAGER", "PAGER", "MANPAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "EDITOR", "VISUAL",
            "LESSOPEN", "LESSCLOSE", "GIT_EXEC_PATH", "RSYNC_RSH", "CVS_RSH", "BROWSER", "MAKEFLAGS",
            "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_RUSTC_WRAPPER", "GOFLAGS",
        }),
        ("BASH_FUNC_", "GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"),
    ),
    "search-path": (
        frozenset({
            "PYTHONPATH", "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "NODE_PATH", "PERL5LIB", "PERLLIB",
            "RUBYLIB", "CLASSPATH", "GEM_PATH", "GEM_HOME", "LUA_PATH", "LUA_CPATH", "TCLLIBPATH",
            "GUILE_LOAD_PATH",
        }),
        (),
    ),
}  # fmt: skip
"""The classes of variables that make a program load or run code, by exact name and by prefix."""

REFUSED_NAMES: frozenset[str] = frozenset().union(*(names for names, _ in CLASSES.values()))
"""Every name refused by exact name in ``denylist`` mode."""

REFUSED_PREFIXES: tuple[str, ...] = tuple(p for _, prefixes in CLASSES.values() for p in prefixes)
"""A variable whose name starts with one of these is refused in ``denylist`` mode."""

SAFE_NAMES: frozenset[str] = frozenset({
    "LANG", "LANGUAGE", "TZ", "TERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "CLICOLOR",
    "CLICOLOR_FORCE", "CI",
})  # fmt: skip
"""What ``allowlist`` mode lets through without ``--allow-env``: presentation, not code."""

SAFE_PREFIXES: tuple[str, ...] = ("LC_",)

ALWAYS_REFUSED_PREFIXES: tuple[str, ...] = ("SMITH_NATS_",)
"""Refused in both modes, even when ``--allow-env`` names them: the NATS fleet's credentials."""

# A name the kernel and libc read as something else (``A=B`` sets ``A``; NUL ends it) is refused
# in either mode: what the policy checked must be the name the program sees.
_WELL_FORMED = re.compile(r"[^=\0]+")
_NAMED = 16  # refused names said back in one error


def env_class(name: str) -> str | None:
    """The class of :data:`CLASSES` ``name`` belongs to, or None."""
    for cls, (names, prefixes) in CLASSES.items():
        if name in names or name.startswith(prefixes):
            return cls
    return None


def refused_names(names: Iterable[str], allow: Collection[str] = (), *, policy: str = "denylist") -> list[str]:
    """The names among ``names`` a request may not set, in the order given.

    Args:
        names: environment variable names (the keys of a request's ``env``).
        allow: names permitted anyway (``serve --allow-env``).
        policy: ``denylist`` (refuse the classes) or ``allowlist`` (refuse all but the safe and
            the allowed names).

    Returns:
        The refused names; empty when all are fine.
    """
    allowlist = policy == "allowlist"
    out = []
    for name in names:
        if not _WELL_FORMED.fullmatch(name) or name.startswith(ALWAYS_REFUSED_PREFIXES):
            out.append(name)
        elif name in allow:
            continue
        elif allowlist:
            if name not in SAFE_NAMES and not name.startswith(SAFE_PREFIXES):
                out.append(name)
        elif name in REFUSED_NAMES or name.startswith(REFUSED_PREFIXES):
            out.append(name)
    return out


def check_env(
    env: Mapping[str, str],
    allow: Collection[str] = (),
    *,
    policy: str = "denylist",
    what: str = "env",
    request_id: str | None = None,
) -> None:
    """Refuse ``env`` if it sets a variable :func:`refused_names` refuses.

    Args:
        env: the variables a request sets.
        allow: names permitted anyway (``serve --allow-env``).
        policy: ``serve --env-policy``.
        what: how the message names ``env`` (``env``, ``shell.run env`` ...).
        request_id: the request, for the error.

    Raises:
        ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` naming the variables,
            ``details["reason"] == "env_refused"``, ``details["variables"]`` a comma list and
            ``details["env_policy"]`` the mode.
    """
    if not env:
        return
    refused = refused_names(env, allow, policy=policy)
    if refused:
        first = refused[0]
        cls = env_class(first)
        why = (
            "it holds the NATS fleet's credentials, which no request may set"
            if first.startswith(ALWAYS_REFUSED_PREFIXES)
            else f"it is in the {cls} class: it makes programs load or run code unseen in the command"
            if cls is not None
            else "only the safe names and the --allow-env ones may be set (--env-policy allowlist)"
            if policy == "allowlist"
            else "it is not a well-formed name"
        )
        # At most _NAMED names, each cut to 64 characters: an env of 50,000 refused names is one
        # short error, not an echo of the request.
        names = [n[:64] for n in refused[:_NAMED]]
        listed = ", ".join(names) + (f" and {len(refused) - _NAMED} more" if len(refused) > _NAMED else "")
        # A name no environment can hold (=, NUL, empty) or the fleet's credentials: no flag lets it through.
        final = first.startswith(ALWAYS_REFUSED_PREFIXES) or not _WELL_FORMED.fullmatch(first)
        remedy = "" if final else f" (the service can allow it with --allow-env {names[0]})"
        raise ProtocolError(
            f"{what} sets {listed}, which a request may not set: {why}{remedy}",
            smith_pb2.ERROR_CODE_PERMISSION_DENIED,
            request_id,
            {"reason": "env_refused", "variables": ",".join(names), "env_policy": policy},
        )
