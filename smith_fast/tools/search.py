"""The ``fs.search`` tool: a Python regular expression over the lines of the workspace's files.

The walk is bounded three ways: ``max_results`` matches, ``ToolContext.max_output`` bytes of
results, and an excerpt of at most :data:`MAX_LINE_CHARS` characters per matching line. It skips
``.git`` (and the other VCS directories in :data:`SKIP_DIRS`), binary files (a NUL byte in the
first 8 KiB), anything that is not a regular file, and symlinks (so it never leaves the root and
never loops). Files are read as UTF-8, undecodable bytes shown as U+FFFD. The blocking walk runs in
a worker thread that stops between files and lines once the call is cancelled.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

from smith_fast.tools.registry import Tool, encode_result
from smith_fast.tools.schema import ArgumentError
from smith_fast.tools.workspace import ToolContext

__all__ = ["FS_SEARCH", "MAX_LINE_CHARS", "SKIP_DIRS"]

DEFAULT_MAX_RESULTS = 100
MAX_RESULTS = 10_000
MAX_LINE_CHARS = 1000
SKIP_DIRS = frozenset({".git", ".hg", ".svn"})
_SNIFF = 8192

SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string", "minLength": 1, "description": "Python regular expression."},
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


async def _search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        regex = re.compile(args["pattern"], re.IGNORECASE if args.get("ignore_case") else 0)
    except re.error as exc:
        raise ArgumentError(f"invalid regular expression ({exc})", "$.pattern") from None
    top = ctx.resolve(args.get("path", "."))
    search = _Search(
        ctx=ctx,
        regex=regex,
        glob=args.get("glob"),
        max_results=args.get("max_results", DEFAULT_MAX_RESULTS),
    )
    try:
        await asyncio.to_thread(search.run, top)
    finally:
        search.stop.set()
    return {"matches": search.matches, "truncated": search.truncated}


class _Search:
    """One search's state; lives in the worker thread until ``run`` returns."""

    def __init__(self, ctx: ToolContext, regex: re.Pattern[str], glob: str | None, max_results: int) -> None:
        self.ctx = ctx
        self.regex = regex
        self.glob = glob
        self.max_results = max_results
        self.budget = ctx.max_output
        self.matches: list[dict[str, Any]] = []
        self.truncated = False
        self.stop = threading.Event()

    def run(self, top: Path) -> None:
        if top.is_file():
            self._file(top, top.name)
            return
        if not top.is_dir():
            raise NotADirectoryError(f"not a file or directory: {self.ctx.relative(top)!r}")
        for dirpath, dirnames, filenames in os.walk(top):
            # os.walk does not follow symlinked directories; prune VCS metadata in place.
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if not self._file(Path(path), os.path.relpath(path, top)):
                    return

    def _file(self, path: Path, rel: str) -> bool:
        """Search one file; ``False`` once the search must stop."""
        if self.stop.is_set():
            self.truncated = True
            return False
        if self.glob is not None:
            subject = rel if "/" in self.glob else path.name
            if not fnmatch.fnmatchcase(subject, self.glob):
                return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return True  # a symlink (O_NOFOLLOW), or unreadable: not ours to report
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return True
            if b"\0" in f.read(_SNIFF):
                return True
            f.seek(0)
            display = self.ctx.relative(path)
            for number, raw in enumerate(f, 1):
                if number & 0x3FF == 0 and self.stop.is_set():
                    self.truncated = True
                    return False
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                found = self.regex.search(line)
                if found is None:
                    continue
                if not self._add(display, number, _excerpt(line, found.start())):
                    return False
        return True

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
        "Search files for a Python regular expression, line by line; returns "
        "{matches: [{path, line, text}], truncated}."
    ),
    schema=SEARCH_SCHEMA,
    handler=_search,
)
