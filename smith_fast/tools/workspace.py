"""The workspace sandbox: every path a tool touches is resolved against one root directory.

What is allowed:

- Paths are relative to the workspace root (``--root``, default the current directory). An absolute
  path is accepted only when it names something inside the root.
- Symlinks are resolved *before* the containment check (``os.path.realpath``), so ``..``
  components, a symlink to a file outside the root, a symlinked directory that leads outside, and
  a dangling symlink whose target lies outside are all refused. For a path that does not exist yet
  (a file about to be written) the existing part is resolved and the rest is appended, so a new
  file below a symlinked directory is judged by where that directory really is.
- A refused path raises :class:`~smith_fast.errors.ProtocolError` with
  ``ERROR_CODE_PERMISSION_DENIED``, whether or not the target exists, so nothing outside the root
  can be probed for existence.
- Symlinks *inside* the root that point inside the root are followed.

What this does not protect against: a process that swaps a directory for a symlink between the
check and the use. The built-in tools narrow that window (writes rename onto the resolved path,
appends open with ``O_NOFOLLOW``, walks never follow symlinked directories), but the sandbox is a
guard against mistakes of a cooperative agent, not a security boundary against a hostile local
process; ``shell.run`` in particular runs arbitrary commands, and only its working directory is
confined.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.sandbox import Sandbox

__all__ = ["ToolContext", "DEFAULT_MAX_OUTPUT"]

DEFAULT_MAX_OUTPUT = 1 << 20


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Where and within which limits a tool call runs.

    Attributes:
        root: the workspace root; resolved (absolute, symlink-free) on construction.
        max_output: byte cap for ``shell.run`` output, ``fs.read`` content and ``fs.search``
            results.
        allow_env: environment variables ``shell.run`` may set although
            :mod:`smith_fast.refused_env` refuses them (``serve --allow-env``).
        sandbox: what confines the commands ``shell.run`` starts (``serve --sandbox``); None:
            unconfined.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is not a directory.
        ValueError: ``max_output`` is not positive.
    """

    root: pathlib.Path
    max_output: int = DEFAULT_MAX_OUTPUT
    allow_env: frozenset[str] = frozenset()
    sandbox: Sandbox | None = None
    _root_str: str = field(init=False, repr=False, compare=False)
    _root_prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        root = pathlib.Path(self.root).resolve(strict=True)
        if not root.is_dir():
            raise NotADirectoryError(f"workspace root is not a directory: {str(root)!r}")
        if self.max_output <= 0:
            raise ValueError(f"max_output must be positive, not {self.max_output}")
        object.__setattr__(self, "root", root)
        # String forms of the root for the per-call checks: comparing strings is several times
        # cheaper than pathlib's is_relative_to/relpath, and exact for the normalised absolute
        # paths realpath returns.
        text = str(root)
        object.__setattr__(self, "_root_str", text)
        object.__setattr__(self, "_root_prefix", text if text.endswith("/") else text + "/")

    def resolve(self, path: str, *, must_exist: bool = True) -> pathlib.Path:
        """Resolve ``path`` inside the workspace.

        Args:
            path: a path relative to the root, or an absolute path inside it.
            must_exist: raise :class:`FileNotFoundError` when the resolved path does not exist.

        Returns:
            The absolute, symlink-free path.

        Raises:
            ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` when the path leaves the root.
            FileNotFoundError: ``must_exist`` and nothing is there.
            ValueError: the path contains a NUL byte.
        """
        return pathlib.Path(self.resolve_str(path, must_exist=must_exist))

    def resolve_str(self, path: str, *, must_exist: bool = True) -> str:
        """:meth:`resolve`, returning the path as a ``str``.

        The same checks and errors; for hot paths that have no use for a ``pathlib.Path`` (building
        one costs about as much as the containment check).

        Args:
            path: a path relative to the root, or an absolute path inside it.
            must_exist: raise :class:`FileNotFoundError` when the resolved path does not exist.

        Returns:
            The absolute, symlink-free path.

        Raises:
            ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` when the path leaves the root.
            FileNotFoundError: ``must_exist`` and nothing is there.
            ValueError: the path contains a NUL byte.
        """
        if "\x00" in path:
            raise ValueError(f"path contains a NUL byte: {path!r}")
        # os.path.join keeps an absolute ``path`` as is; realpath then resolves every symlink
        # that exists and normalises the rest lexically (a component that does not exist cannot
        # be a symlink, so lexical ``..`` handling is exact there).
        real, exists = _realpath(os.path.join(self._root_str, path))
        if real != self._root_str and not real.startswith(self._root_prefix):
            raise ProtocolError(
                f"path {path!r} is outside the workspace root",
                smith_pb2.ERROR_CODE_PERMISSION_DENIED,
                details={"path": path},
            )
        if must_exist and not exists and not os.path.lexists(real):
            raise FileNotFoundError(f"no such file or directory: {path!r}")
        return real

    def relative(self, path: pathlib.Path | str) -> str:
        """The POSIX path of ``path`` relative to the root (``"."`` for the root itself).

        Names that are not valid UTF-8 (kept by the OS as surrogate escapes) get U+FFFD for each
        bad byte, so the result always encodes as JSON.

        Args:
            path: an absolute path inside the root.

        Returns:
            The relative path.
        """
        text = os.fspath(path)
        if text == self._root_str:
            return "."
        if text.startswith(self._root_prefix):
            rel = text[len(self._root_prefix) :]
            # The plain remainder is the answer only for a normalised path; "a/../b", "a//b",
            # "a/." or a trailing slash take relpath, which normalises.
            framed = f"/{rel}/"
            if rel and "//" not in framed and "/./" not in framed and "/../" not in framed:
                return display_name(rel)
        return display_name(os.path.relpath(path, self.root))


_O_PATH = getattr(os, "O_PATH", 0)  # Linux


def _realpath(path: str) -> tuple[str, bool]:
    """``os.path.realpath(path)``, and whether the path is known to exist.

    For a path that exists, the kernel resolves it in one ``open(O_PATH)`` and names the result
    through ``/proc/self/fd``: three system calls, where realpath makes one ``lstat`` per
    component. It resolves as realpath does (every symlink, ``..`` after the symlink before it).
    Anything else (a missing or dangling path, a loop, no ``/proc``, a file deleted meanwhile) takes
    realpath itself, so its rules for paths that do not exist still apply.
    """
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        except OSError:
            return os.path.realpath(path), False
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = ""
        finally:
            os.close(fd)
        if real.startswith("/") and not real.endswith(" (deleted)"):
            return real, True
    return os.path.realpath(path), False


def display_name(name: str) -> str:
    """``name`` with surrogate-escaped bytes replaced by U+FFFD so it can be UTF-8 encoded."""
    if name.isascii():
        return name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
