"""The ``fs.search`` tool: a regular expression over the lines of the workspace's files, run by ripgrep.

The matching runs in a separate ``rg`` process (the PyPI ``ripgrep`` package installs it into the
environment's ``bin``), not in Python's ``re``: Rust's regex engine matches in time linear in the
input, so no pattern can backtrack for seconds (``(a+)+$`` against ``aaaa…!`` took Python 5 s
with each extra ``a`` doubling it, holding the GIL and so stalling every other session), and the
service's event loop only reads rg's output. The call's timeout or cancellation kills rg.

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
import contextlib
import fnmatch
import os
import re
import shutil
import stat
import sysconfig
from typing import Any

from smith_fast.errors import ProtocolError
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
    beside = os.path.join(sysconfig.get_path("scripts"), "rg")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("rg")
    if found is None:
        raise FileNotFoundError("fs.search needs ripgrep (rg), which is not installed: pip install ripgrep")
    return found


def _argv(rg: str, pattern: str, target: str, ignore_case: bool) -> list[str]:
    argv = [
        rg, "--no-config", "--null", "--line-number", "--column", "--byte-offset", "--no-heading",
        "--with-filename", "--color", "never", "--max-columns", str(MAX_LINE_BYTES),
        "--hidden", "--no-require-git", "--sort", "path",
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
    # Run from the root with a relative target, so rg's paths are the root-relative paths the
    # results show. An empty environment: no RIPGREP_CONFIG_PATH, no global git excludes from HOME.
    proc = await asyncio.create_subprocess_exec(
        *_argv(rg_path(), pattern, target, bool(args.get("ignore_case"))),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ctx.root),
        env={},
        limit=_RECORD_LIMIT,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr_task = asyncio.ensure_future(_keep_head(proc.stderr))
    at_end = False
    try:
        while True:
            try:
                record = await proc.stdout.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                at_end = True  # rg is done (or about to be): let it exit with its own status
                record = exc.partial
                if record:
                    await search.add_record(record)
                break
            except asyncio.LimitOverrunError:  # a path past PATH_MAX: cannot happen, but never unbounded
                search.truncated = True
                break
            if not await search.add_record(record):
                break
    finally:
        if not at_end and proc.returncode is None:  # stopped early, timed out or cancelled
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        # Shielded: a cancelled call still reaps its rg before it is done.
        code = await asyncio.shield(proc.wait())
        errors = await asyncio.shield(stderr_task)
    if code == 2 and not search.matches and b"regex" in errors:
        raise ArgumentError(f"invalid regular expression ({_regex_error(pattern, errors)})", "$.pattern")
    return {"matches": search.matches, "truncated": search.truncated}


async def _keep_head(stream: asyncio.StreamReader) -> bytes:
    """Read a stream to its end, keeping only its first bytes (rg's messages for unreadable files
    could otherwise grow without bound)."""
    head = b""
    while chunk := await stream.read(65536):
        if len(head) < _STDERR_KEEP:
            head = (head + chunk)[:_STDERR_KEEP]
    return head


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

    async def add_record(self, record: bytes) -> bool:
        """Take one line of rg's output (``PATH\\0LINE:COLUMN:OFFSET:TEXT\\n``); ``False`` once the
        search must stop."""
        raw_path, sep, rest = record.partition(b"\0")
        found = _RECORD.match(rest) if sep else None
        if found is None:
            return True  # a notice such as "binary file matches", not a match
        rel = os.fsdecode(raw_path).removeprefix("./")
        if self.glob is not None and not self._glob_matches(rel):
            return True
        number, column, offset = (int(g) for g in found.groups())
        body = rest[found.end() :].rstrip(b"\n")
        if len(body) > MAX_LINE_BYTES or body.startswith(b"[Omitted long line"):
            # rg left the line out (--max-columns): read around its first match instead.
            text = await asyncio.to_thread(self._excerpt_from_file, rel, offset + column - 1)
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
            self.truncated = True
            return False
        match = {"path": path, "line": line, "text": text}
        # Exactly what the match adds to the encoded result (plus a comma), escapes included.
        cost = len(encode_result(match)) + 1
        if cost > self.budget:
            self.truncated = True
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
