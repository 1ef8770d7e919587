"""The ``fs.search`` tool: a regular expression over the lines of the workspace's files, run by ripgrep.

The matching runs in a separate ``rg`` process (the PyPI ``ripgrep`` package installs it into the
environment's ``bin``), not in Python's ``re``: Rust's regex engine matches in time linear in the
input, so no pattern can backtrack for seconds (``(a+)+$`` against ``aaaa…!`` took Python 5 s
with each extra ``a`` doubling it, holding the GIL and so stalling every other session). rg is
started through the sandbox program with Landlock alone (:meth:`Sandbox.only_read
<smith_fast.sandbox.Sandbox.only_read>`, the rules of ``csrc/landlock_policy.h``): it may read
only beneath the workspace root, run only itself, and write nowhere. rg walks by path, and a racer
swapping a directory for a symlink to outside led it there 2 times in 400 searches without it.
rg is read by a worker thread; the call's timeout or cancellation kills it.

What is searched (see PROTOCOL.md, ``fs.search``):

- the file or directory ``path`` (resolved inside the workspace like every tool path); in a
  directory, files in path order (rg ``--sort path``), hidden files included, but not ``.git``
  (nor the other VCS directories in :data:`SKIP_DIRS`) nor what ``.gitignore``/``.ignore`` files
  exclude (also outside a git repository); symlinks are never followed, binary files (a NUL byte)
  are skipped;
- the regex dialect is Rust's ``regex`` crate: Python's for everything common (classes, groups,
  ``(?i)``, ``\\b``, ``{m,n}``, named groups ``(?P<n>…)``) but no look-around and no
  back-references, which are refused as invalid;
- bounded three ways: ``max_results`` matches, ``ToolContext.max_output`` bytes of results, and an
  excerpt of at most :data:`MAX_LINE_CHARS` characters per matching line. A line longer than
  :data:`MAX_LINE_BYTES` is never read whole by the service: rg reports where its first match is
  (``--max-columns``) and the excerpt is read from the file around that byte.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fnmatch
import functools
import logging
import os
import re
import shutil
import stat
import subprocess
import threading
from typing import Any

from smith_fast.errors import LandlockError, ProtocolError
from smith_fast.sandbox import Sandbox
from smith_fast.tools.registry import Tool, encode_result
from smith_fast.tools.schema import ArgumentError
from smith_fast.tools.workspace import ToolContext, display_name

__all__ = ["FS_SEARCH", "MAX_LINE_BYTES", "MAX_LINE_CHARS", "SKIP_DIRS", "rg_path"]

DEFAULT_MAX_RESULTS = 100
MAX_RESULTS = 10_000
MAX_LINE_CHARS = 1000
MAX_LINE_BYTES = 4096
"""Matching lines longer than this (in bytes) are cut: the service reads an excerpt around the
match from the file instead of the whole line."""
SKIP_DIRS = frozenset({".git", ".hg", ".svn"})
_SNIFF = 8192
log = logging.getLogger("smith_fast.tools")
_EXCERPT_READ = 4 * MAX_LINE_CHARS  # bytes on each side of a match: enough for MAX_LINE_CHARS characters
_STDERR_KEEP = 4096
# One output record: the path (at most PATH_MAX), numbers, and a line of at most MAX_LINE_BYTES.
_RECORD_LIMIT = MAX_LINE_BYTES + 8192
_RECORD = re.compile(rb"(\d+):(\d+):(\d+):")

SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "minLength": 1,
            "description": "Regular expression (Rust regex syntax: no look-around or back-references).",
        },
        "path": {
            "type": "string",
            "minLength": 1,
            "default": ".",
            "description": "File or directory to search, relative to the workspace root.",
        },
        "glob": {
            "type": "string",
            "minLength": 1,
            "description": (
                "Only files whose name matches this fnmatch pattern (e.g. *.py); a pattern with a "
                "slash is matched against the path relative to `path`."
            ),
        },
        "max_results": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_RESULTS,
            "default": DEFAULT_MAX_RESULTS,
        },
        "ignore_case": {"type": "boolean", "default": False},
    },
    "required": ["pattern"],
    "additionalProperties": False,
}


def rg_path() -> str:
    """The ``rg`` program: the one beside this interpreter (the ``ripgrep`` dependency), else on PATH.

    Raises:
        FileNotFoundError: there is none.
    """
    import sysconfig  # here: the first search's, not every start's (0.5 ms)

    beside = os.path.join(sysconfig.get_path("scripts"), "rg")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("rg")
    if found is None:
        raise FileNotFoundError("fs.search needs ripgrep (rg), which is not installed: pip install ripgrep")
    return os.path.abspath(found)  # the sandbox program runs a path, and grants only that one


def _argv(rg: str, pattern: str, target: str, ignore_case: bool) -> list[str]:
    argv = [
        rg, "--no-config", "--null", "--line-number", "--column", "--byte-offset", "--no-heading",
        "--with-filename", "--color", "never", "--max-columns", str(MAX_LINE_BYTES),
        "--hidden", "--no-require-git", "--sort", "path", "--no-messages",
    ]
    for name in sorted(SKIP_DIRS):
        argv += ["--glob", f"!{name}"]
    if ignore_case:
        argv.append("--ignore-case")
    return [*argv, "--regexp", pattern, "--", target]


async def _search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    pattern: str = args["pattern"]
    top = ctx.resolve_str(args.get("path", "."))
    target = os.path.relpath(top, ctx.root)  # not ctx.relative: rg needs the name's real bytes
    st = os.stat(top)
    if stat.S_ISREG(st.st_mode):
        if await asyncio.to_thread(_is_binary, top):
            return {"matches": [], "truncated": False}
        prefix = target.rsplit("/", 1)[0] + "/" if "/" in target else ""
    elif stat.S_ISDIR(st.st_mode):
        prefix = "" if target == "." else target + "/"
    else:
        raise NotADirectoryError(f"not a file or directory: {target!r}")
    search = _Results(ctx, args.get("glob"), prefix, args.get("max_results", DEFAULT_MAX_RESULTS))
    argv = _argv(rg_path(), pattern, target, bool(args.get("ignore_case")))
    run = _Run(_confined(argv, str(ctx.root), ctx.sandbox or _NO_SANDBOX), str(ctx.root), search)
    loop = asyncio.get_running_loop()
    try:
        code, errors = await loop.run_in_executor(_pool(), run.run)
    finally:
        run.kill()  # a timeout or cancellation: rg goes, and with it the worker's wait
    if code in (126, 127) and errors.startswith(b"smith-fast sandbox:"):
        raise LandlockError(errno.EPERM, f"fs.search: {errors.decode('utf-8', 'replace').strip()}")
    if code == 2 and not search.matches and b"regex" in errors:
        raise ArgumentError(f"invalid regular expression ({_regex_error(pattern, errors)})", "$.pattern")
    return {"matches": search.matches, "truncated": search.truncated}


# The confinement of rg, whatever --sandbox says about commands: the file tools never reach
# outside the workspace. Outside a service (no Sandbox in the context) the default program.
_NO_SANDBOX = Sandbox(mode="off")
_confinable: dict[tuple[str, ...], bool] = {}


def _confined(argv: list[str], root: str, sandbox: Sandbox) -> list[str]:
    """``argv`` under Landlock, reading only beneath ``root``; unchanged (once logged) where
    Landlock cannot be had: a kernel without it, or no sandbox program (a build without a C
    compiler), as the service runs commands then."""
    able = _confinable.get(sandbox.wrapper)
    if able is None:
        able = _confinable[sandbox.wrapper] = sandbox.can_confine_reads()
        if not able:
            log.warning(
                "fs.search runs rg unconfined: no Landlock in this kernel, or no sandbox program",
                extra={"fields": {"root": root}},
            )
    return sandbox.only_read(argv, [root]) if able else argv


_POOL_WORKERS = 4


@functools.cache  # one pool, made on the first search (called from the event loop only)
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that start and read rg (its output is read with blocking calls)."""
    return concurrent.futures.ThreadPoolExecutor(_POOL_WORKERS, thread_name_prefix="fs.search")


class _Run:
    """One rg process, run to completion (or killed) by a worker thread."""

    def __init__(self, argv: list[str], cwd: str, search: _Results) -> None:
        self.argv = argv
        self.cwd = cwd
        self.search = search
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            if self._proc is not None and self._proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()

    def run(self) -> tuple[int, bytes]:
        """Returns rg's exit status and the start of its error output."""
        # Error output goes to a memory file, not a pipe: an invalid pattern's message repeats the
        # pattern, which could fill a pipe that nobody reads before rg exits.
        errors = os.memfd_create("rg-errors", os.MFD_CLOEXEC)
        try:
            with self._lock:
                if self._killed:
                    return -9, b""
                # An empty environment: no RIPGREP_CONFIG_PATH, no global git excludes from HOME.
                self._proc = proc = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                    cwd=self.cwd, env={}, close_fds=True, start_new_session=True,
                )
            assert proc.stdout is not None
            try:
                with proc.stdout:
                    self._read(proc.stdout)
            finally:
                if proc.poll() is None and self.search.stopped:
                    proc.kill()
                code = proc.wait()
            return code, os.pread(errors, _STDERR_KEEP, 0)
        finally:
            os.close(errors)

    def _read(self, out: Any) -> None:
        while True:
            record = out.readline(_RECORD_LIMIT)
            if not record:
                return
            if not record.endswith(b"\n"):  # longer than any record rg writes: skip the rest
                while (more := out.readline(_RECORD_LIMIT)) and not more.endswith(b"\n"):
                    pass
                continue
            if not self.search.add_record(record):
                return


def _regex_error(pattern: str, errors: bytes) -> str:
    # Python's wording where Python also refuses the pattern (what callers of the re-based tool
    # saw); rg's otherwise, e.g. for look-around, which Python supports and rg does not.
    try:
        re.compile(pattern)
    except re.error as exc:
        return str(exc)
    except (RecursionError, OverflowError, ValueError):
        pass
    lines = [line.strip() for line in errors.decode("utf-8", "replace").splitlines()]
    said = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    return "; ".join(said) or " ".join(lines)[:500]


def _is_binary(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return True  # unreadable: nothing to report
    try:
        return b"\0" in os.read(fd, _SNIFF)
    finally:
        os.close(fd)


class _Results:
    """The matches collected from rg's output, within the call's bounds."""

    def __init__(self, ctx: ToolContext, glob: str | None, prefix: str, max_results: int) -> None:
        self.ctx = ctx
        self.glob = glob
        self.prefix = prefix  # `path` as rg prints it, for globs relative to `path`
        self.max_results = max_results
        self.budget = ctx.max_output
        self.matches: list[dict[str, Any]] = []
        self.truncated = False
        self.stopped = False  # enough: rg is killed rather than left to finish

    def add_record(self, record: bytes) -> bool:
        """Take one line of rg's output (``PATH\\0LINE:COLUMN:OFFSET:TEXT\\n``); ``False`` once the
        search must stop."""
        raw_path, sep, rest = record.partition(b"\0")
        found = _RECORD.match(rest) if sep else None
        if found is None:
            return True  # a notice such as "binary file matches", not a match
        rel = os.fsdecode(raw_path).removeprefix("./")
        if self.glob is not None and not self._glob_matches(rel):
            return True
        if self.ctx.hides(os.path.normpath(rel)):  # --sandbox-deny-read: not a match to show
            return True
        number, column, offset = (int(g) for g in found.groups())
        body = rest[found.end() :].rstrip(b"\n")
        if len(body) > MAX_LINE_BYTES or body.startswith(b"[Omitted long line"):
            # rg left the line out (--max-columns): read around its first match instead.
            text = self._excerpt_from_file(rel, offset + column - 1)
        else:
            line = body.decode("utf-8", "replace").rstrip("\r")
            start = len(body[: column - 1].decode("utf-8", "replace"))
            text = _excerpt(line, start)
        return self._add(display_name(rel), number, text)

    def _glob_matches(self, rel: str) -> bool:
        assert self.glob is not None
        if "/" in self.glob:
            return fnmatch.fnmatchcase(rel.removeprefix(self.prefix), self.glob)
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.glob)

    def _excerpt_from_file(self, rel: str, at: int) -> str:
        try:
            fd, _ = self.ctx.open(rel, os.O_RDONLY | os.O_NONBLOCK)  # beneath the root, by the kernel
        except (OSError, ValueError, ProtocolError):
            return ""
        try:
            begin = max(0, at - _EXCERPT_READ)
            before = os.pread(fd, at - begin, begin).rsplit(b"\n", 1)[-1]
            after = os.pread(fd, _EXCERPT_READ, at).split(b"\n", 1)[0]
        except OSError:
            return ""
        finally:
            os.close(fd)
        head = before.decode("utf-8", "replace")
        tail = after.decode("utf-8", "replace").rstrip("\r")
        keep = max(100, MAX_LINE_CHARS - len(tail))
        return (head[-keep:] + tail)[:MAX_LINE_CHARS]

    def _add(self, path: str, line: int, text: str) -> bool:
        if len(self.matches) >= self.max_results:
            self.truncated = self.stopped = True
            return False
        match = {"path": path, "line": line, "text": text}
        # Exactly what the match adds to the encoded result (plus a comma), escapes included.
        cost = len(encode_result(match)) + 1
        if cost > self.budget:
            self.truncated = self.stopped = True
            return False
        self.budget -= cost
        self.matches.append(match)
        return True


def _excerpt(line: str, start: int) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    # Keep the match in view: a little context before it, then as much as fits.
    begin = max(0, min(start - 100, len(line) - MAX_LINE_CHARS))
    return line[begin : begin + MAX_LINE_CHARS]


FS_SEARCH = Tool(
    name="fs.search",
    description=(
        "Search files for a regular expression (Rust regex syntax), line by line, skipping "
        ".gitignored files; returns {matches: [{path, line, text}], truncated}."
    ),
    schema=SEARCH_SCHEMA,
    handler=_search,
)
