"""A ``shell`` call's output sized for a model, and the whole of it kept in a file.

Claude Code and Codex show the model a result's ``structuredContent``; a command's output can be
far larger than a model should read at once (``seq 100000``). So a result holds at most
``--mcp-max-result-chars`` characters of output: each stream within its share keeps its head and
its tail (cut at line ends), with a marker line saying how many lines and bytes were cut and where
the whole stream is. The whole stream goes to a plain-text file of the MCP session's output
directory, which ``fs.read`` reads by line range (``offset``, ``limit``).

Where the files are: ``--state-dir``/``mcp-output/<random>/``, one directory per MCP session, made
0700, removed when the session ends. Not beneath the root: the service writes nothing into the
user's tree unasked (a ``.smith-fast/`` there would show in ``git status``, be packed, indexed,
committed). ``--state-dir`` is never inside the root and commands cannot see it (the sandbox covers
the service's files), so one session's commands cannot rewrite what it reads; ``fs.read`` is let
read that directory by absolute path (:func:`smith_fast.tools.fs.readable_beneath`). A session keeps
its newest :data:`KEPT_FILES` files; each is at most what ``--max-output`` lets a command write.
"""

from __future__ import annotations

import json

import os
import pathlib
import shutil
from collections import deque
from collections.abc import Callable
from typing import IO

import orjson

from ..logs import get_logger
from ..tools.fs import readable_beneath

__all__ = ["FOOTER_ROOM", "KEPT_FILES", "OutputDir", "StreamKeeper", "shares"]

log = get_logger("smith_fast.mcp")

KEPT_FILES = 64
MARKER_ROOM = 400  # characters a marker line takes at most (the budget counts them)
FOOTER_ROOM = 800  # and the text result's closing lines (exit code, cwd, where the cut streams are)


class OutputDir:
    """An MCP session's directory of whole outputs, made when the first one is kept."""

    def __init__(self, state_dir: pathlib.Path) -> None:
        self._parent = state_dir / "mcp-output"
        self.path: pathlib.Path | None = None
        self._forget: Callable[[], None] | None = None
        self._files: deque[pathlib.Path] = deque()

    def new_file(self, name: str) -> tuple[pathlib.Path, IO[bytes]] | None:
        """A new file for a whole output; None when the directory cannot be made (the result then
        says the output was cut without a file)."""
        try:
            if self.path is None:
                self._parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                path = self._parent / os.urandom(16).hex()  # secrets.token_hex(16), without its imports at start
                path.mkdir(mode=0o700)
                self.path = path
                self._forget = readable_beneath(str(path))
            while len(self._files) >= KEPT_FILES:
                self._files.popleft().unlink(missing_ok=True)
            file = self.path / name
            out = open(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), "wb")
        except OSError as exc:
            log.warning("cannot keep an MCP output", extra={"fields": {"error": str(exc)}})
            return None
        self._files.append(file)
        return file, out

    def remove(self) -> None:
        if self._forget is not None:
            self._forget()
            self._forget = None
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class StreamKeeper:
    """One stream of a call: all of it while it is small, then its head, its tail and a file."""

    __slots__ = ("budget", "chunks", "chars", "bytes", "newlines", "head", "tail", "tail_chars", "file", "out", "ends_nl")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.chunks: list[str] = []  # the whole stream, until it passes the budget
        self.chars = 0
        self.bytes = 0
        self.newlines = 0
        self.ends_nl = True
        self.head = ""
        self.tail: deque[str] = deque()
        self.tail_chars = 0
        self.file: pathlib.Path | None = None
        self.out: IO[bytes] | None = None

    def add(self, text: str, size: int, files: OutputDir, name: str) -> None:
        self.chars += shown(text) if self.out is None else len(text)  # as the model sees it, while it may all fit
        self.bytes += size
        self.newlines += text.count("\n")
        if text:
            self.ends_nl = text.endswith("\n")
        if self.out is not None:
            self._write(text)
        elif self.chars <= self.budget:
            self.chunks.append(text)
            return
        else:  # passed the budget now: keep the head, write everything so far, then go on
            whole = "".join(self.chunks) + text
            self.chunks = []
            self.head = whole[: self.budget]
            opened = files.new_file(name)
            if opened is not None:
                self.file, self.out = opened
                self._write(whole)
            text = whole
        self.tail.append(text)
        self.tail_chars += len(text)
        while self.tail_chars - len(self.tail[0]) >= self.budget:
            self.tail_chars -= len(self.tail.popleft())

    def _write(self, text: str) -> None:
        assert self.out is not None
        try:
            self.out.write(text.encode(errors="replace"))
        except OSError as exc:  # a full disk: the file stops here, the result says how much it has
            log.warning("cannot write an MCP output", extra={"fields": {"error": str(exc)}})
            self.out.close()
            self.out = None

    @property
    def lines(self) -> int:
        return self.newlines + (0 if self.ends_nl else 1)

    def finish(self, share: int, files: OutputDir, name: str) -> tuple[str, dict[str, object] | None]:
        """The text the result shows within ``share`` characters, and what was cut (None: nothing)."""
        if self.out is not None:
            self.out.close()
            self.out = None
        if not self.tail:  # all of it is here, and counted (a string's escapes are its characters': the counts add up)
            whole = "".join(self.chunks)
            if self.chars <= share:
                return whole, None
            opened = files.new_file(name)
            if opened is not None:
                self.file, out = opened
                with out:
                    out.write(whole.encode(errors="replace"))
            head_src, tail_src = whole, whole
        else:
            head_src, tail_src = self.head, "".join(self.tail)
        room = max(0, share - MARKER_ROOM)
        for _ in range(4):  # the budget counts characters as a model sees them: in a JSON string
            head = _head(head_src, room * 2 // 5)
            tail = _tail(tail_src, room - len(head))
            over = shown(head) + shown(tail) - max(0, share - MARKER_ROOM)
            if over <= 0:
                break
            room -= over
        head_lines = head.count("\n")
        tail_lines = tail.count("\n") + (0 if tail.endswith("\n") or not tail else 1)
        cut_lines = max(0, self.lines - head_lines - tail_lines)
        cut_bytes = max(0, self.bytes - len(head.encode()) - len(tail.encode()))
        cut: dict[str, object] = {
            "head_lines": head_lines,
            "tail_lines": tail_lines,
            "cut_lines": cut_lines,
            "cut_bytes": cut_bytes,
            "total_lines": self.lines,
            "total_bytes": self.bytes,
            "file": str(self.file) if self.file is not None else None,
        }
        if self.file is not None:
            where = (
                f"the whole stream ({self.lines} lines) is in {self.file}; read the cut lines with "
                f'fs.read {{"path": "{self.file}", "offset": {head_lines + 1}, "limit": {min(cut_lines, 2000) or 1}}}'
            )
        else:
            where = "the whole stream could not be kept (see the service's log)"
        marker = f"[smith-fast: {cut_lines} lines ({cut_bytes} bytes) cut here; {where}]\n"
        return head + ("" if not head or head.endswith("\n") else "\n") + marker + tail, cut


def shown(text: str) -> int:
    """Characters ``text`` takes as a frontend shows it to its model: a JSON string's content
    (``structuredContent``; a newline is two characters there, ``\n``).

    orjson escapes as ``json.dumps(ensure_ascii=False)`` does (the short escapes, ``\\u00XX`` for
    the other control characters, nothing else) about ten times faster: every chunk of a call's
    output is counted (the stdlib's was a quarter of ``serve --mcp``'s time on ``seq 200000``).
    It refuses a lone surrogate, which the stdlib keeps as one character."""
    try:
        return len(orjson.dumps(text).decode()) - 2
    except orjson.JSONEncodeError:
        return len(json.dumps(text, ensure_ascii=False)) - 2


def _head(text: str, n: int) -> str:
    if len(text) <= n:
        return text
    end = text.rfind("\n", 0, n)
    return text[: end + 1] if end >= n // 2 else text[:n]


def _tail(text: str, n: int) -> str:
    if len(text) <= n or n <= 0:
        return text if n > 0 else ""
    start = text.find("\n", len(text) - n)
    return text[start + 1 :] if 0 <= start < len(text) - n // 2 else text[len(text) - n :]


def shares(budget: int, out_chars: int, err_chars: int) -> tuple[int, int]:
    """How the budget is split between stdout and stderr: each what it has when both fit; else
    stderr at least a quarter (errors are what a model needs), the rest to stdout, and what one
    does not use to the other."""
    if out_chars + err_chars <= budget:
        return out_chars, err_chars
    err = min(err_chars, max(budget // 4, budget - out_chars))
    out = min(out_chars, budget - err)
    return out, min(err_chars, budget - out)
