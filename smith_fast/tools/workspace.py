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

How it is enforced: the file tools (``fs.read``, ``fs.write``, ``fs.list``) never open a path
string. :meth:`ToolContext.open` and :meth:`ToolContext.open_parent` open it relative to a directory
fd of the root with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)``
(:mod:`smith_fast.tools.openat2`, with an ``O_NOFOLLOW`` component walk where the kernel lacks it):
the kernel refuses any resolution that leaves the root, in the same system call that opens, so a
process swapping a path component for a symlink between a check and the use cannot get a tool
outside; ``/proc`` magic links are refused too. Only when that open fails does the realpath check
above run, to tell a refusal (``ERROR_CODE_PERMISSION_DENIED``) from a missing file, and to follow an
absolute symlink whose target is inside the root (the kernel refuses absolute symlinks under
``RESOLVE_BENEATH``; the resolved path is opened beneath the root again). ``fs.search`` and
``shell.run``'s ``cwd`` take a path string (:meth:`ToolContext.resolve`), checked the same way and
then used by a child process: ``fs.search`` confines its rg with Landlock
(:mod:`smith_fast.tools.search`); for ``shell.run``'s ``cwd`` the root is a guard, not a boundary
(it runs arbitrary commands anyway).
"""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smith_fast.containment import CommandLimits
from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.records import record
from smith_fast.sandbox import Sandbox
from smith_fast.tools.openat2 import open_beneath

if TYPE_CHECKING:
    from smith_fast.process import Collected

__all__ = ["ToolContext", "DEFAULT_MAX_OUTPUT", "ProcessRequest", "RunProcess"]

DEFAULT_MAX_OUTPUT = 1 << 20


@dataclass(frozen=True, slots=True)
class ProcessRequest:
    """A process a tool asks the service to start (:attr:`ToolContext.run_process`).

    Attributes:
        command: the command line, run by the shell.
        cwd: the working directory as the peer wrote it (relative to the workspace root); the
            service resolves it inside the workspace after the hooks saw it.
        env: variables layered over the service's base environment (the env policy applies).
        timeout_ms: terminate the command after this long (``Collected.timed_out``); None: no limit.
        shell: the shell; None for the service's default.
    """

    command: str
    cwd: str = "."
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_ms: int | None = None
    shell: str | None = None


RunProcess = Callable[[ProcessRequest], Awaitable["Collected"]]
"""Starts a process for a tool and collects its output: the service's choke point
(``smith_fast.service.launch``), which applies the shell hooks, the env policy, the process slots,
the output cap, the sandbox and the audit log. A tool never spawns on its own."""


@record(frozen=True, slots=True)
class ToolContext:
    """Where and within which limits a tool call runs.

    Attributes:
        root: the workspace root; resolved (absolute, symlink-free) on construction.
        max_output: byte cap for ``shell.run`` output, ``fs.read`` content and ``fs.search``
            results.
        allow_env: environment variables ``shell.run`` may set although
            :mod:`smith_fast.refused_env` refuses them (``serve --allow-env``).
        env_policy: ``serve --env-policy`` (for :attr:`run_process`'s absence only).
        run_process: how a tool starts a process (:data:`RunProcess`): the service gives each
            call one bound to its request (:meth:`with_process_runner`); None outside a service
            (a tool then runs it directly under the env policy, with no hooks to apply).
        sandbox: what confines the commands ``shell.run`` starts (``serve --sandbox``); None:
            unconfined.
        command_limits: what a ``shell.run`` command may use (``--max-*-per-command``).

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is not a directory.
        ValueError: ``max_output`` is not positive.
    """

    root: pathlib.Path
    max_output: int = DEFAULT_MAX_OUTPUT
    allow_env: frozenset[str] = frozenset()
    env_policy: str = "denylist"
    run_process: RunProcess | None = field(default=None, compare=False, repr=False)
    sandbox: Sandbox | None = None
    command_limits: CommandLimits | None = None
    _root_str: str = field(init=False, repr=False, compare=False)
    _root_prefix: str = field(init=False, repr=False, compare=False)
    _root_dir: _DirFd = field(init=False, repr=False, compare=False)
    _hidden: tuple[str, ...] = field(init=False, repr=False, compare=False)

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
        # Every file tool opens relative to this fd, beneath it (see the module docstring).
        object.__setattr__(self, "_root_dir", _DirFd(text))
        # --sandbox-deny-read paths inside the root, root-relative: the file tools refuse them
        # as the sandbox hides them from commands.
        denied = self.sandbox.deny_read if self.sandbox is not None else ()
        object.__setattr__(self, "_hidden", tuple(self.relative(p) for p in denied if self._inside(p)))

    def with_process_runner(self, run: RunProcess) -> ToolContext:
        """This context with :attr:`run_process` set (per tool call; the root is not resolved again)."""
        # Slot by slot: copy.copy of a slotted frozen dataclass goes through its pickle state,
        # several times the cost of the fs.read it serves.
        new = object.__new__(ToolContext)
        for name in _CONTEXT_SLOTS:
            _set(new, name, getattr(self, name))
        _set(new, "run_process", run)
        return new

    def with_sandbox(self, sandbox: Sandbox) -> ToolContext:
        """This context with another :attr:`sandbox` of the same denied paths (a session's own home):
        the root's fd is shared, not opened again (a context per session would hold one each, until
        the garbage collector finds the cycle a runner makes with it)."""
        new = object.__new__(ToolContext)
        for name in _CONTEXT_SLOTS:
            _set(new, name, getattr(self, name))
        _set(new, "sandbox", sandbox)
        return new

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
        try:
            real, exists = _realpath(os.path.join(self._root_str, path))
        except OSError:
            # realpath itself failed on a component it may not read (/proc/1/root): whatever is
            # there, it is not something inside the root, and the answer must not say more.
            raise self._denied(path) from None
        if not self._inside(real):
            raise self._denied(path)
        if must_exist and not exists and not os.path.lexists(real):
            raise FileNotFoundError(f"no such file or directory: {path!r}")
        return real

    def open(self, path: str, flags: int, mode: int = 0o666) -> tuple[int, str]:
        """Open ``path`` inside the workspace, the containment enforced by the kernel.

        Args:
            path: a path relative to the root, or an absolute path inside it.
            flags: ``os.open`` flags.
            mode: the mode for ``O_CREAT``.

        Returns:
            The fd (the caller closes it) and the POSIX path of what was opened, relative to the
            root (symlinks resolved, as :meth:`relative` shows it).

        Raises:
            ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` when the path leaves the root, whether
                or not the target exists.
            FileNotFoundError: nothing is there.
            OSError: what ``open`` raises otherwise (``NotADirectoryError``, ``PermissionError`` …).
            ValueError: the path contains a NUL byte.
        """
        if "\x00" in path:
            raise ValueError(f"path contains a NUL byte: {path!r}")
        rel = self._lexical(path)
        failure: OSError | None = None
        if rel is not None:
            try:
                # The common case in one system call: a path without symlinks, whose name is then
                # known without asking the kernel.
                return self._readable(open_beneath(self._root_dir.fd, rel, flags, mode, follow=False), _normal(rel), path)
            except OSError as exc:
                failure = exc
            if failure.errno == errno.ELOOP:  # a symlink on the way: the kernel follows it, beneath
                try:
                    fd = open_beneath(self._root_dir.fd, rel, flags, mode)
                except OSError as exc:
                    failure = exc
                else:
                    return self._readable(fd, self._fd_name(fd, rel), path)
        # Refused or failed: decide as the realpath check always did, so a refusal is a refusal
        # whether or not the target exists, and a missing file inside is FileNotFoundError.
        real = self.resolve_str(path, must_exist=False)
        if failure is not None and failure.errno not in (errno.EXDEV, errno.ELOOP):
            raise _plain_error(failure, path)
        # An absolute path or absolute symlink that the realpath check found inside: open where it
        # leads, beneath the root again (a swap meanwhile is refused, not followed).
        inner = "." if real == self._root_str else real[len(self._root_prefix) :]
        try:
            fd = open_beneath(self._root_dir.fd, inner, flags, mode)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.ELOOP):
                raise self._denied(path) from None
            raise _plain_error(exc, path) from None
        return self._readable(fd, self._fd_name(fd, inner), path)

    def open_parent(self, path: str, *, create_dirs: bool = False) -> tuple[int, str, str]:
        """Open the directory that holds ``path`` (which need not exist) and name its last component.

        A final component that is a symlink is resolved (it must lead inside the root) and its
        target's directory is opened instead, so writing through a symlink inside the root writes
        the file it names.

        Args:
            path: a path relative to the root, or an absolute path inside it.
            create_dirs: create missing directories on the way, each beneath its parent's fd.

        Returns:
            The directory's fd (``O_PATH``; the caller closes it), the entry's name in it, and its
            POSIX path relative to the root.

        Raises:
            ProtocolError: ``ERROR_CODE_PERMISSION_DENIED`` when the path leaves the root.
            FileNotFoundError: a parent directory is missing and not ``create_dirs``.
            IsADirectoryError: the path names the root or ends in ``..``.
            ValueError: the path contains a NUL byte.
        """
        if "\x00" in path:
            raise ValueError(f"path contains a NUL byte: {path!r}")
        rel = self._lexical(path)
        if rel is None:
            real = self.resolve_str(path, must_exist=False)
            rel = "." if real == self._root_str else real[len(self._root_prefix) :]
        for _ in range(2):  # the second round: the target of a final symlink
            parent, _, name = rel.rstrip("/").rpartition("/")
            if name in ("", ".", ".."):
                real = self.resolve_str(path, must_exist=False)  # refused if it leaves the root
                if real == self._root_str:
                    raise IsADirectoryError("cannot write to the workspace root")
                raise IsADirectoryError(f"is a directory: {path!r}")
            dirfd = self._open_dir(parent or ".", path, create_dirs)
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            except BaseException:
                os.close(dirfd)
                raise
            if st is None or not _is_link(st.st_mode):
                entry = _join(self._fd_name(dirfd, parent or "."), name)
                if self.hides(entry):
                    os.close(dirfd)
                    raise self._hidden_error(path)
                return dirfd, name, entry
            os.close(dirfd)
            real = self.resolve_str(path, must_exist=False)
            rel = "." if real == self._root_str else real[len(self._root_prefix) :]
        raise self._denied(path)  # still a symlink after resolving: swapped meanwhile

    def _open_dir(self, rel: str, path: str, create_dirs: bool) -> int:
        flags = os.O_PATH | os.O_DIRECTORY
        try:
            fd, _ = self.open(rel, flags)
            return fd
        except ProtocolError:
            raise self._denied(path) from None
        except (FileNotFoundError, NotADirectoryError):
            if not create_dirs:
                raise FileNotFoundError(
                    f"no such directory: {os.path.basename(rel)!r} (set create_dirs to create it)"
                ) from None
        # Create what is missing one component at a time, each below the fd of the one before, on
        # the realpath-resolved path (no "..", no symlinks): a symlink swapped in meanwhile is
        # refused, not followed.
        try:
            real = self.resolve_str(os.path.join(self._root_str, rel), must_exist=False)
        except ProtocolError:
            raise self._denied(path) from None
        fd = os.dup(self._root_dir.fd)
        try:
            for name in real[len(self._root_str) :].split("/"):
                if not name:
                    continue
                try:
                    nxt = open_beneath(fd, name, flags, follow=False)
                except FileNotFoundError:
                    try:
                        os.mkdir(name, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nxt = open_beneath(fd, name, flags, follow=False)
                os.close(fd)
                fd = nxt
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EXDEV, errno.ELOOP):
                raise self._denied(path) from None
            raise
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _lexical(self, path: str) -> str | None:
        """``path`` relative to the root without touching the file system; ``None`` for an absolute
        path that does not start with the root."""
        if not path.startswith("/"):
            return path
        if path == self._root_str or path + "/" == self._root_prefix:
            return "."
        if path.startswith(self._root_prefix):
            return path[len(self._root_prefix) :] or "."
        return None

    def _fd_name(self, fd: int, fallback: str) -> str:
        """The root-relative name of what ``fd`` is open on (``fallback``, normalised, if unknown)."""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return _normal(fallback)
        if self._inside(real):
            return self.relative(real)
        return _normal(fallback)

    def hides(self, name: str) -> bool:
        """Whether the root-relative ``name`` is (beneath) a ``--sandbox-deny-read`` path."""
        return any(name == h or name.startswith(h + "/") for h in self._hidden) if self._hidden else False

    def _readable(self, fd: int, name: str, path: str) -> tuple[int, str]:
        if self._hidden and self.hides(name):
            os.close(fd)
            raise self._hidden_error(path)
        return fd, name

    def _hidden_error(self, path: str) -> ProtocolError:
        return ProtocolError(
            f"path {path!r} is denied to commands and tools (--sandbox-deny-read)",
            smith_pb2.ERROR_CODE_PERMISSION_DENIED,
            details={"path": path, "reason": "deny_read"},
        )

    def _inside(self, real: str) -> bool:
        return real == self._root_str or real.startswith(self._root_prefix)

    def _denied(self, path: str) -> ProtocolError:
        return ProtocolError(
            f"path {path!r} is outside the workspace root",
            smith_pb2.ERROR_CODE_PERMISSION_DENIED,
            details={"path": path},
        )

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


class _DirFd:
    """An ``O_PATH`` fd of a directory, closed when the last context (or copy of one) using it goes."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def __del__(self) -> None:
        os.close(self.fd)


_CONTEXT_SLOTS: tuple[str, ...] = ToolContext.__slots__  # slots=True made it
_set = object.__setattr__


def _normal(rel: str) -> str:
    """A symlink-free relative path, normalised as :meth:`ToolContext.relative` shows it."""
    if rel and "/" not in rel and rel != "." and rel != "..":
        return display_name(rel)  # one plain name: normpath would return it as is
    return display_name(os.path.normpath(rel)) if rel else "."


def _join(parent: str, name: str) -> str:
    return display_name(name) if parent == "." else f"{parent}/{display_name(name)}"


def _is_link(mode: int) -> bool:
    return (mode & 0o170000) == 0o120000


def _plain_error(exc: OSError, path: str) -> OSError:
    """The open's error, named after the caller's path (not the resolved one)."""
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(f"no such file or directory: {path!r}")
    return OSError(exc.errno, exc.strerror, path)


def display_name(name: str) -> str:
    """``name`` with surrogate-escaped bytes replaced by U+FFFD so it can be UTF-8 encoded."""
    if name.isascii():
        return name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
