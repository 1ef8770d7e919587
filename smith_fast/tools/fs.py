"""The file tools ``fs.read``, ``fs.write`` and ``fs.list``.

Every path is opened through :meth:`ToolContext.open <smith_fast.tools.workspace.ToolContext.open>`
or :meth:`~smith_fast.tools.workspace.ToolContext.open_parent`, beneath a directory fd of the root
with the containment enforced by the kernel (see :mod:`smith_fast.tools.workspace`); paths in results are POSIX paths
relative to the root. Blocking file-system work runs in the default executor so one slow disk
does not stall the other calls; the exception is ``fs.read`` of at most :data:`INLINE_READ`
bytes of a regular file, which costs less than the hop to a thread and back.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from os import close as _close, pread as _os_pread
from stat import S_ISREG as _S_ISREG
from typing import Any

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.tools.openat2 import mode_and_size as _mode_and_size
from smith_fast.tools.openat2 import open_beneath
from smith_fast.tools.registry import Tool
from smith_fast.tools.schema import ArgumentError
from smith_fast.tools.workspace import ToolContext, display_name

__all__ = ["FS_READ", "FS_WRITE", "FS_LIST", "readable_beneath"]

_PATH = {"type": "string", "minLength": 1, "description": "Path relative to the workspace root."}
_ENCODING = {
    "enum": ["utf-8", "base64"],
    "default": "utf-8",
    "description": "utf-8 for text, base64 for arbitrary bytes.",
}
DEFAULT_MAX_ENTRIES = 1000
MAX_ENTRIES = 100_000


# --- fs.read ---------------------------------------------------------------------------------

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": _PATH,
        "offset": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "Without limit: the first byte to read (0-based). With limit: the first line to read (1-based).",
        },
        "length": {
            "type": "integer",
            "minimum": 0,
            "description": "Bytes to read at most (default: up to the end, capped by the output limit).",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "description": (
                "Read by lines: at most this many lines from line `offset` (1-based, default 1), as text "
                "(undecodable bytes replaced); the file is read only up to the last line returned."
            ),
        },
        "encoding": _ENCODING,
    },
    "required": ["path"],
    "additionalProperties": False,
}


# Reads of at most this many bytes from a regular file run on the event loop: handing a call to a
# worker thread and back costs far more than such a read (measured: 70-200 µs against ~6 µs for
# open, fstat, pread and close of a small cached file). Larger reads go to a worker thread.
INLINE_READ = 64 * 1024


def _read(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    # A plain function: a small read ends in the step that read the call (the registry answers it
    # at once); a large one goes on in a worker thread (an awaitable the registry awaits).
    offset: int = args.get("offset", 0)
    length: int | None = args.get("length")
    encoding: str = args.get("encoding", "utf-8")
    limit: int | None = args.get("limit")
    cap = ctx.max_output
    n = cap if length is None or length > cap else length
    if limit is not None and (length is not None or encoding != "utf-8"):
        raise ArgumentError("limit reads lines of text: it does not go with length or encoding base64", "$.limit")
    fd, name = _open_for_read(args["path"], ctx)
    if limit is not None:
        return _read_lines_call(fd, name, max(offset, 1), limit, cap)
    # os.close, os.pread and fstat bound once (below): a small read calls each once per request.
    try:
        size = _regular_size(fd, name)
    except BaseException:
        _close(fd)
        raise
    rest = size - offset if size > offset else 0
    if (n if n < rest else rest) <= INLINE_READ:
        try:
            data = _pread(fd, n, offset, size)
        finally:
            _close(fd)
        return _read_result(data, name, size, offset, length, rest, encoding)
    return _read_in_thread(fd, n, name, size, offset, length, rest, encoding)


async def _read_in_thread(
    fd: int, n: int, name: str, size: int, offset: int, length: int | None, rest: int, encoding: str
) -> dict[str, Any]:
    # The thread owns the fd from here and closes it: a cancelled call returns at once, and
    # the fd stays open until the thread's read is done.
    data = await asyncio.to_thread(_pread_and_close, fd, n, offset, size)
    return _read_result(data, name, size, offset, length, rest, encoding)


def _read_result(data: bytes, name: str, size: int, offset: int, length: int | None, rest: int, encoding: str) -> dict[str, Any]:
    wanted = rest if length is None or length > rest else length
    got = len(data)
    truncated = got < wanted
    if encoding == "base64":
        content = base64.b64encode(data).decode("ascii")
        covered = got
    elif offset + got >= size:  # at the end of the file: nothing held back (see _decode_utf8)
        try:
            content, covered = data.decode("utf-8"), got
        except UnicodeDecodeError as exc:
            raise _not_utf8(offset, exc) from None
    else:
        content, covered = _decode_utf8(data, at_eof=False, offset=offset)
    return {
        "path": name,
        "content": content,
        "size": size,
        "offset": offset,
        "length": covered,
        "truncated": truncated,
    }


# O_NONBLOCK so that a FIFO in the workspace cannot hang the caller in open().
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK

# Directories outside the root whose files fs.read reads by absolute path: the service's own
# (the MCP front keeps the whole output of a command it cut there, in --state-dir, which commands
# cannot see and which is never inside the root). Directory -> an O_PATH fd of it.
_EXTRA_READABLE: dict[str, int] = {}


def readable_beneath(directory: str) -> Callable[[], None]:
    """Let ``fs.read`` read the files beneath ``directory`` (absolute, made by the service) by their
    absolute path; the returned function takes that back. Opened beneath the directory's fd as
    the root's files are, without following symlinks: only what the service wrote there."""
    real = os.path.realpath(directory)
    fd = os.open(real, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    _EXTRA_READABLE[real] = fd

    def forget() -> None:
        if _EXTRA_READABLE.get(real) == fd:
            del _EXTRA_READABLE[real]
            os.close(fd)

    return forget


def _open_for_read(path: str, ctx: ToolContext) -> tuple[int, str]:
    if path.startswith("/") and _EXTRA_READABLE:
        for directory, dirfd in _EXTRA_READABLE.items():
            if path.startswith(directory + "/"):
                try:
                    return open_beneath(dirfd, path[len(directory) + 1 :], _READ_FLAGS, follow=False), path
                except FileNotFoundError:
                    raise FileNotFoundError(f"no such file: {path!r} (the service keeps a session's outputs while it lasts)") from None
    return ctx.open(path, _READ_FLAGS)


_LINE_BLOCK = 64 * 1024


def _read_lines_call(fd: int, name: str, first: int, limit: int, cap: int) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    try:
        size = _regular_size(fd, name)
    except BaseException:
        os.close(fd)
        raise
    if size <= INLINE_READ:
        try:
            return _lines_result(name, size, first, *_read_lines(fd, first, limit, cap))
        finally:
            os.close(fd)

    async def in_thread() -> dict[str, Any]:
        def work() -> tuple[bytes, int, int, bool, bool]:
            try:
                return _read_lines(fd, first, limit, cap)
            finally:
                os.close(fd)

        return _lines_result(name, size, first, *(await asyncio.to_thread(work)))

    return in_thread()


def _read_lines(fd: int, first: int, limit: int, cap: int) -> tuple[bytes, int, int, bool, bool]:
    """Lines ``first`` (1-based) on, at most ``limit`` of them and ``cap`` bytes, reading block by
    block from the start (a line's place is only known by counting the newlines before it) and no
    further than the last line returned: memory stays one block plus what is returned, whatever
    the file's size. Returns (the bytes, their byte offset, lines returned, more lines follow,
    cut at ``cap``)."""
    pos, line = 0, 1
    while line < first:  # find where line ``first`` starts
        block = os.pread(fd, _LINE_BLOCK, pos)
        if not block:
            return b"", pos, 0, False, False  # the file has fewer lines
        i = 0
        while line < first:
            j = block.find(b"\n", i)
            if j < 0:
                break
            line, i = line + 1, j + 1
        pos += i if line == first else len(block)
    start = pos
    out = bytearray()
    count = 0
    while count < limit:
        block = os.pread(fd, _LINE_BLOCK, pos)
        if not block:
            return bytes(out), start, count + (1 if out and not out.endswith(b"\n") else 0), False, False
        i = 0
        while count < limit:
            j = block.find(b"\n", i)
            end = len(block) if j < 0 else j + 1
            if len(out) + end - i > cap:
                out += block[i : i + cap - len(out)]
                return bytes(out), start, count, True, True
            out += block[i:end]
            if j < 0:
                break  # the line goes on in the next block
            count, i = count + 1, end
        pos += i if count == limit else len(block)
    more = bool(os.pread(fd, 1, start + len(out)))
    return bytes(out), start, count, more, False


def _lines_result(name: str, size: int, first: int, data: bytes, byte_offset: int, count: int, more: bool, cut: bool) -> dict[str, Any]:
    return {
        "path": name,
        "content": data.decode("utf-8", errors="replace"),
        "size": size,
        "offset": first,
        "lines": count,
        "byte_offset": byte_offset,
        "next_offset": first + count if more else None,
        "truncated": cut,
    }


def _regular_size(fd: int, name: str) -> int:
    """The size of the regular file ``fd`` is open on; refuses all but regular files."""
    mode, size = _mode_and_size(fd)
    if not _S_ISREG(mode):
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"is a directory: {os.path.basename(name)!r}")
        raise OSError(f"not a regular file: {os.path.basename(name)!r}")
    return size


def _pread(fd: int, n: int, offset: int, size: int) -> bytes:
    """Up to ``n`` bytes at ``offset``, allocating for what ``size`` says is there, not for ``n``."""
    # One byte more than the file should hold tells whether it holds more (it grew, or its file
    # system reports no size); then the rest is read as a plain pread(n) would have.
    first = min(n, max(0, size - offset) + 1)
    data = _os_pread(fd, first, offset) if first else b""
    if len(data) == first and first < n:
        data += _os_pread(fd, n - first, offset + first)
    return data


def _pread_and_close(fd: int, n: int, offset: int, size: int) -> bytes:
    try:
        return _pread(fd, n, offset, size)
    finally:
        os.close(fd)


def _decode_utf8(data: bytes, *, at_eof: bool, offset: int) -> tuple[str, int]:
    # A read window may end inside a multi-byte character; the incremental decoder holds those
    # bytes back instead of failing, and ``length`` tells the caller where to continue. At the end
    # of the file nothing is held back, and a plain decode fails at the same byte.
    try:
        if at_eof:
            return data.decode("utf-8"), len(data)
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        text = decoder.decode(data, final=False)
    except UnicodeDecodeError as exc:
        raise _not_utf8(offset, exc) from None
    pending = len(decoder.getstate()[0])
    return text, len(data) - pending


def _not_utf8(offset: int, exc: UnicodeDecodeError) -> ValueError:
    return ValueError(f"the file is not UTF-8 text (byte {offset + exc.start}); read it with encoding base64")


FS_READ = Tool(
    name="fs.read",
    description=(
        "Read a file (or a byte range of it) as UTF-8 text or base64; returns "
        "{path, content, size, offset, length (bytes covered), truncated (cut by the output limit)}. "
        "With limit, reads lines: offset is the first line (1-based) and the result is "
        "{path, content, size, offset, lines, byte_offset, next_offset (null at the end), truncated}."
    ),
    schema=READ_SCHEMA,
    handler=_read,
)


# --- fs.write --------------------------------------------------------------------------------

WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": _PATH,
        "content": {"type": "string", "description": "What to write, encoded as `encoding` says."},
        "encoding": _ENCODING,
        "append": {"type": "boolean", "default": False, "description": "Append instead of replacing."},
        "create_dirs": {
            "type": "boolean",
            "default": False,
            "description": "Create missing parent directories.",
        },
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}


async def _write(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    content: str = args["content"]
    if args.get("encoding", "utf-8") == "base64":
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ArgumentError(f"invalid base64: {exc}", "$.content") from None
    else:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ArgumentError(f"unencodable character at index {exc.start}", "$.content") from None
    path: str = args["path"]
    append = args.get("append", False)
    create_dirs = args.get("create_dirs", False)
    name = await asyncio.to_thread(_write_bytes, ctx, path, data, append, create_dirs)
    return {"path": name, "bytes_written": len(data)}


def _write_bytes(ctx: ToolContext, path: str, data: bytes, append: bool, create_dirs: bool) -> str:
    # Everything happens relative to the parent directory's fd, opened beneath the root: a
    # component swapped for a symlink afterwards changes nothing.
    dirfd, name, shown = ctx.open_parent(path, create_dirs=create_dirs)
    try:
        if append:
            _append(dirfd, name, data, path)
        else:
            _replace(dirfd, name, data)
    finally:
        os.close(dirfd)
    return shown


def _append(dirfd: int, name: str, data: bytes, path: str) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(name, flags, 0o666, dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file: {name!r}")
        if st.st_nlink > 1:
            # Another name of the same file may be outside the root (a hard link to ~/.bashrc):
            # appending would change it. A replacing write is safe (it renames a new file over
            # this name), so only appending is refused.
            raise ProtocolError(
                f"path {path!r} is a file with {st.st_nlink} hard links; appending to it is refused "
                "(write it without append to replace this name only)",
                smith_pb2.ERROR_CODE_PERMISSION_DENIED,
                details={"path": path, "reason": "hard_link"},
            )
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _replace(dirfd: int, name: str, data: bytes) -> None:
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None  # a new file: 0o666 less the umask, as open() would give it
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"is a directory: {name!r}")
    mode = None if st is None else stat.S_IMODE(st.st_mode)
    # Write beside the target and rename over it: readers see the old or the new content, never
    # a half-written file, and a symlink swapped in at the name is replaced, not followed. No
    # fsync: atomic with respect to other processes, not durable across a power cut.
    tmp = f".{name[:100]}.{os.urandom(6).hex()}.tmp"  # (secrets.token_hex: the same, and a module more at start)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=dirfd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except FileNotFoundError:
            pass
        raise


FS_WRITE = Tool(
    name="fs.write",
    description=(
        "Write a file atomically (or append to it), optionally creating parent directories; "
        "returns {path, bytes_written}."
    ),
    schema=WRITE_SCHEMA,
    handler=_write,
)


# --- fs.list ---------------------------------------------------------------------------------

LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {**_PATH, "default": ".", "description": "Directory relative to the workspace root."},
        "recursive": {
            "type": "boolean",
            "default": False,
            "description": "Descend into subdirectories (never into symlinks or .git), breadth first.",
        },
        "max_entries": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_ENTRIES,
            "default": DEFAULT_MAX_ENTRIES,
            "description": "Stop after this many entries.",
        },
    },
    "additionalProperties": False,
}

# Directories a recursive listing shows but does not enter: their contents are noise to an agent
# and can be huge.
_NO_DESCEND = frozenset({".git"})


async def _list(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    fd, name = ctx.open(args.get("path", "."), os.O_RDONLY | os.O_DIRECTORY)
    recursive = args.get("recursive", False)
    limit = args.get("max_entries", DEFAULT_MAX_ENTRIES)
    stop = threading.Event()
    # Who closes ``fd``: this call, until the thread takes it. A cancel that comes while the
    # executor is busy cancels the work item before any thread ran it, and the fd leaked.
    handoff = threading.Lock()
    owner = ["call"]

    def walk() -> tuple[list[dict[str, Any]], bool]:
        with handoff:
            if owner[0] != "call":
                return [], False  # the call was cancelled meanwhile and closed it
            owner[0] = "thread"
        return _walk_entries(fd, name, recursive, limit, stop)

    try:
        entries, truncated = await asyncio.to_thread(walk)
    finally:
        # On cancellation the thread cannot be interrupted, but it checks this between entries
        # (and closes the fds it holds).
        stop.set()
        with handoff:
            if owner[0] == "call":
                owner[0] = "closed"
                os.close(fd)
    return {"entries": entries, "truncated": truncated}


def _walk_entries(
    top: int, top_name: str, recursive: bool, limit: int, stop: threading.Event
) -> tuple[list[dict[str, Any]], bool]:
    """Breadth first from the directory fd ``top`` (closed on return); each subdirectory opened
    beneath its parent's fd without following symlinks, so the walk cannot be led outside."""
    entries: list[dict[str, Any]] = []
    pending: deque[tuple[int, str]] = deque([(top, top_name)])
    try:
        while pending:
            fd, shown = pending.popleft()
            try:
                with os.scandir(fd) as it:
                    children = sorted(it, key=lambda e: e.name)
                for entry in children:
                    if stop.is_set() or len(entries) >= limit:
                        return entries, True
                    kind, size = _kind_and_size(entry)
                    name = display_name(entry.name)
                    path = name if shown == "." else f"{shown}/{name}"
                    entries.append({"name": name, "path": path, "type": kind, "size": size})
                    if recursive and kind == "dir" and entry.name not in _NO_DESCEND:
                        try:
                            sub = open_beneath(fd, entry.name, os.O_RDONLY | os.O_DIRECTORY, follow=False)
                        except OSError:
                            continue  # unreadable, or swapped for a symlink since: left out
                        pending.append((sub, path))
            except OSError:
                if fd == top:
                    raise
                # an unreadable subdirectory is left out, not fatal
            finally:
                os.close(fd)
    finally:
        for fd, _ in pending:
            os.close(fd)
    return entries, False


def _kind_and_size(entry: os.DirEntry[str]) -> tuple[str, int]:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return "other", 0
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "symlink", 0
    if stat.S_ISDIR(mode):
        return "dir", 0
    if stat.S_ISREG(mode):
        return "file", st.st_size
    return "other", 0


FS_LIST = Tool(
    name="fs.list",
    description=(
        "List a directory (optionally recursively); returns "
        "{entries: [{name, path, type: file|dir|symlink|other, size}], truncated}."
    ),
    schema=LIST_SCHEMA,
    handler=_list,
)
