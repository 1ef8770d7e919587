"""Hooks: the policy layer that sees each tool call and shell command before it runs, and its
results and output after, and allows, blocks or transforms it (HOOKS.md).

Two engines: JavaScript in an embedded QuickJS context (:mod:`.js`) and Rust compiled by the system
``rustc`` and run as a child process (:mod:`.rust`). :func:`load_hook` loads either;
:class:`HookChain` runs several in order with a failure policy.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .chain import ChainResult, HookChain
from .js import JS_FUNCTIONS, JsHook, engine_available, load_js, load_js_async
from .model import TRIGGERS, Decision, Hook, HookFailure, HookLimits, HookLoadError, shape_error
from .wire import hook_action, load_action

# Not typing.TYPE_CHECKING: the Rust engine's names, imported on first use (below), as mypy sees them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .rust import RustHook, default_cache_dir, load_rust, rustc_version
# The Rust engine (its build, its checks, tempfile, importlib.resources: some 5 ms) is imported by a
# Rust hook's first load or a look for rustc, not by every service's start.
_RUST = frozenset({"RustHook", "default_cache_dir", "load_rust", "rustc_version"})

__all__ = [
    "JS_FUNCTIONS",
    "TRIGGERS",
    "ChainResult",
    "Decision",
    "Hook",
    "HookChain",
    "HookFailure",
    "HookLimits",
    "HookLoadError",
    "JsHook",
    "RustHook",
    "available_kinds",
    "kind_available",
    "default_cache_dir",
    "hook_action",
    "load_action",
    "kind_from_path",
    "load_hook",
    "load_hook_file",
    "shape_error",
]

KINDS = ("js", "rust")
_SUFFIXES = {".js": "js", ".mjs": "js", ".rs": "rust"}


def _rustc_runs() -> bool:
    from .rust_build import rustc_version

    return rustc_version() is not None


# kind -> whether this machine can load hooks of it (each computed once per process)
_AVAILABLE = {"js": engine_available, "rust": _rustc_runs}


def kind_available(kind: str) -> bool:
    """Whether this machine can load hooks of ``kind``: ``"js"`` if the QuickJS bindings import,
    ``"rust"`` if ``rustc --version`` runs (some 15–40 ms the first time: ask only when it matters)."""
    return _AVAILABLE[kind]()


@functools.cache
def available_kinds() -> frozenset[str]:
    """The hook kinds this machine can load (computed once per process).

    Returns:
        ``"js"`` if the QuickJS bindings import; ``"rust"`` if ``rustc --version`` runs.
    """
    return frozenset(kind for kind in KINDS if kind_available(kind))


async def load_hook(
    kind: str,
    source: str,
    *,
    limits: HookLimits = HookLimits(),
    cache_dir: Path | None = None,
    hook_id: str | None = None,
    trusted: bool = False,
) -> Hook:
    """Load one hook.

    Args:
        kind: ``"js"`` or ``"rust"`` (``HookLoadCommand.hook_type``).
        source: the script (``HookLoadCommand.script``).
        limits: per-call time and memory limits, and the Rust compile time limit.
        cache_dir: where compiled Rust hooks are cached (default ``~/.cache/smith-fast/hooks``).
        hook_id: the id to give the hook (default: kind + ``-`` + 12 hex digits of the source's SHA-256).
        trusted: the operator's source: a Rust hook skips the check of what it may contain
            (:func:`smith_fast.hooks.rust_check.check_rust_source`); a peer's never is.

    Returns:
        The loaded hook, ready to call.

    Raises:
        HookLoadError: an unknown kind, a kind this machine cannot run, a syntax or compile error
            (``diagnostics`` carries the engine's or compiler's text), or no hook function defined.
    """
    if kind == "js":
        return await load_js_async(source, limits, hook_id)
    if kind == "rust":
        from .rust import load_rust

        return await load_rust(source, limits, hook_id, cache_dir, trusted=trusted)
    raise HookLoadError(f"unknown hook type {kind!r}: expected 'js' or 'rust'")


def kind_from_path(path: str | Path) -> str:
    """The hook kind of a file, from its suffix: ``.js`` → ``"js"``, ``.rs`` → ``"rust"``.

    Raises:
        HookLoadError: any other suffix.
    """
    kind = _SUFFIXES.get(Path(path).suffix.lower())
    if kind is None:
        raise HookLoadError(f"cannot tell the hook type of {str(path)!r}: name it *.js or *.rs")
    return kind


async def load_hook_file(
    path: str | Path,
    *,
    limits: HookLimits = HookLimits(),
    cache_dir: Path | None = None,
    hook_id: str | None = None,
    trusted: bool = True,
) -> Hook:
    """Load a hook from a file (``smith-fast serve --hook FILE``); its kind comes from the suffix.

    Args:
        path: a ``.js`` or ``.rs`` file (UTF-8).
        limits: as for :func:`load_hook`.
        cache_dir: as for :func:`load_hook`.
        hook_id: as for :func:`load_hook`.
        trusted: as for :func:`load_hook`; a file is the operator's (the default).

    Returns:
        The loaded hook.

    Raises:
        HookLoadError: the suffix is neither, the file cannot be read, or as for :func:`load_hook`
            (the message names the file).
    """
    kind = kind_from_path(path)
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HookLoadError(f"cannot read hook file {str(path)!r}: {exc}") from None
    try:
        return await load_hook(kind, source, limits=limits, cache_dir=cache_dir, hook_id=hook_id, trusted=trusted)
    except HookLoadError as exc:
        raise HookLoadError(f"{path}: {exc.message}", exc.diagnostics) from None


def __getattr__(name: str) -> object:
    if name not in _RUST:
        raise AttributeError(f"module 'smith_fast.hooks' has no attribute {name!r}")
    from . import rust

    value = getattr(rust, name)
    globals()[name] = value  # once: the next look-up is a plain module attribute
    return value
