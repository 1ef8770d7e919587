"""Compiling Rust hooks: the system ``rustc``, the prelude, and the cache of compiled binaries.

The hook's source is compiled together with ``prelude.rs`` (``Json``, ``Action``, ``hooks!`` and
``main``) by ``rustc --edition 2021 -O``. The binary is cached under
``<cache>/<sha256 of prelude + flags + rustc version + source>/hook``; a compile happens in a fresh
temporary directory beside it, which is renamed into place, so concurrent compiles of one hook (in
this process or another) never see a half-written binary: the first rename wins, the others throw
their copy away. Within this process a per-hash lock also stops the duplicate compiles.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import importlib.resources
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from ..sandbox import Sandbox
from .model import HookLoadError, clip, log

__all__ = [
    "MAX_DIAGNOSTICS",
    "PRELUDE",
    "RUSTC_FLAGS",
    "cache_key",
    "compile_hook",
    "default_cache_dir",
    "rustc_path",
    "rustc_version",
]

PRELUDE: str = importlib.resources.files(__package__).joinpath("prelude.rs").read_text(encoding="utf-8")
"""The Rust prelude every hook is compiled with (``smith_fast/hooks/prelude.rs``)."""

RUSTC_FLAGS: tuple[str, ...] = (
    "--edition", "2021", "-O", "--crate-type", "bin", "--crate-name", "smith_hook", "--color", "never",
    "-C", "debuginfo=0", "-C", "strip=symbols",
)  # fmt: skip

MAX_DIAGNOSTICS = 16 * 1024
"""Compiler output beyond this many characters is cut from a HookLoadError."""
def rustc_path() -> str | None:
    """The ``rustc`` to use: ``$SMITH_FAST_RUSTC``, else ``rustc`` on ``PATH``, else ``~/.cargo/bin/rustc``."""
    explicit = os.environ.get("SMITH_FAST_RUSTC")
    if explicit:
        return explicit
    found = shutil.which("rustc")
    if found:
        return found
    cargo = Path.home() / ".cargo" / "bin" / "rustc"
    return str(cargo) if os.access(cargo, os.X_OK) else None


_asked: subprocess.Popen[str] | None = None  # `rustc --version` started early, not yet read


def _ask_rustc() -> subprocess.Popen[str] | None:
    rustc = rustc_path()
    if rustc is None:
        return None
    try:
        return subprocess.Popen([rustc, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError:
        return None


def start_rustc_version() -> None:
    """Start ``rustc --version`` now, for :func:`rustc_version` to read later: rustc takes some
    15 ms to answer, which ``serve`` spends importing the service instead of waiting for it (its
    capabilities say whether Rust hooks load)."""
    global _asked
    if _asked is None and rustc_version.cache_info().currsize == 0:
        _asked = _ask_rustc()


@functools.cache
def rustc_version() -> str | None:
    """``rustc --version`` if it runs, else None (computed once per process)."""
    global _asked
    proc, _asked = _asked or _ask_rustc(), None
    if proc is None:
        return None
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.SubprocessError:
        proc.kill()
        proc.wait()
        return None
    return out.strip() if proc.returncode == 0 and out.strip() else None


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/smith-fast/hooks``, by default ``~/.cache/smith-fast/hooks``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "smith-fast" / "hooks"


def cache_key(source: str) -> str:
    """The cache entry name of ``source``: any change to the prelude, the flags or the compiler
    makes a new one."""
    h = hashlib.sha256()
    for part in (PRELUDE, " ".join(RUSTC_FLAGS), rustc_version() or "", source):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


_compile_locks: dict[str, threading.Lock] = {}
_compile_locks_guard = threading.Lock()


def _compile_blocking(source: str, cache_dir: Path, timeout: float, sandbox: Sandbox | None = None) -> tuple[Path, bool]:
    key = cache_key(source)
    final = cache_dir / key
    exe = final / "hook"
    with _compile_locks_guard:
        lock = _compile_locks.setdefault(key, threading.Lock())
    with lock:
        if os.access(exe, os.X_OK):
            return exe, True
        rustc = rustc_path()
        if rustc is None or rustc_version() is None:
            raise HookLoadError("Rust hooks need rustc, which does not run here")
        cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        work: Path | None  # None once renamed into place: the finally below removes it otherwise
        work = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=cache_dir))
        try:
            (work / "main.rs").write_text(PRELUDE, encoding="utf-8")
            (work / "hook.rs").write_text(source, encoding="utf-8", errors="surrogatepass")
            argv = [rustc, *RUSTC_FLAGS, "main.rs", "-o", "hook"]
            env = None
            if sandbox is not None and sandbox.active:
                # The compiler (and the linker it runs) may write only its build directory, which
                # is also where its temporary files go.
                argv = sandbox.wrap([shutil.which(rustc) or rustc, *argv[1:]], writable=[str(work)])
                env = sandbox.wrap_environ({**os.environ, "TMPDIR": str(work)})
            proc = subprocess.Popen(
                argv,
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # rustc runs the linker: a timeout kills both
            )
            try:
                output, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.communicate()
                raise HookLoadError(f"rustc did not finish within {timeout:g} s") from None
            text = output.decode("utf-8", "replace")
            if proc.returncode != 0:
                raise HookLoadError("the Rust hook does not compile", clip(text.strip(), MAX_DIAGNOSTICS))
            try:
                os.rename(work, final)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Another process compiled the same hook first: use its binary.
            else:
                work = None
            log.info("rust hook compiled", extra={"fields": {"key": key[:16], "warnings": clip(text.strip(), 2000)}})
            return exe, False
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)


async def compile_hook(
    source: str, *, cache_dir: Path | None = None, timeout: float = 120.0, sandbox: Sandbox | None = None
) -> tuple[Path, bool]:
    """Compile ``source`` with the prelude, or find it in the cache.

    Args:
        source: the hook's Rust source.
        cache_dir: where compiled hooks live (default :func:`default_cache_dir`).
        timeout: seconds ``rustc`` may take.
        sandbox: confines ``rustc`` to writing its build directory; None: unconfined.

    Returns:
        The binary's path, and whether it came from the cache (True) or was compiled now (False).

    Raises:
        HookLoadError: it does not compile (``diagnostics`` holds rustc's output), rustc took too
            long, or there is no working rustc.
    """
    return await asyncio.to_thread(_compile_blocking, source, cache_dir or default_cache_dir(), timeout, sandbox)
