"""The MCP ``shell`` tool's state between calls: the working directory and the exported variables.

There is no long-lived shell (one would outlive a timeout, hold a process slot, and serialise the
calls). Each call runs the command, as it is, after a short prologue in the same ``/bin/sh``:

* the prologue writes the environment the command starts with (``export -p``) to stderr between two
  markers, ``cd``\\ s to the directory the previous call left, and sets an ``EXIT`` trap;
* the trap (it runs when the script ends, by ``exit`` inside the command too, and after a syntax
  error) writes ``$PWD`` and ``export -p`` between markers, then exits with the command's status.

``export -p`` and ``printf`` are built into every ``sh`` (dash, bash, busybox): the state costs the
call no process (``env -0`` cost two fork+execs per call, more than a ``true`` itself). Its output is
shell words (dash and busybox: ``export NAME='…'``; bash: ``export``/``declare -x NAME="…"`` or
``$'…'``), read back by :func:`_exports`. A variable whose name is no shell name is not listed by
the shell, so it is not carried (it was not the command's doing either).

The markers hold a random token per MCP session and NUL bytes, which text output does not
produce; :class:`StateSplitter` takes the sections out of the stderr stream before anything else
sees it (progress, the result), so the client sees only the command's own output. The variables
carried to the next call are those the command set or changed (its end against its start), minus
the shell's own (``PWD`` …) and the names the env policy refuses (those would make every later call
be refused); they come back as the ShellExec's ``env``, so the env policy and the hooks see them as
any request's variables. What does not update the state: a command killed (timeout, cancel,
limits), one that ``exec``\\ s another program, sets its own ``EXIT`` trap or sends the shell's
stderr elsewhere (``exec 2>file``): the next call starts where this one started.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ..refused_env import refused_names
from ..split_needles import held_back
from ..warm_shell import quote

__all__ = ["ShellState", "StateSplitter", "wrap"]

# Variables of the shell itself or of one command's run, never carried.
_NOT_CARRIED = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})


def new_marker() -> str:
    return f"\0smith-fast-state-{os.urandom(8).hex()}\0"  # secrets.token_hex(8), without its imports at start


def wrap(command: str, marker: str, cwd: str | None) -> str:
    """The script a stateful ``shell`` call runs: the prologue, then ``command`` verbatim."""
    mark = marker.replace("\0", "\\0")  # printf's format writes the NULs
    lines = [
        f"printf '{mark}' >&2; export -p >&2; printf '{mark}' >&2",
        f"trap '__smith_rc=$?; {{ printf \"{mark}%s\\0\" \"$PWD\"; export -p; printf \"{mark}\"; }} >&2; exit $__smith_rc' EXIT",
    ]
    if cwd is not None:
        q = quote(cwd)
        lines.append(f"cd -- {q} 2>/dev/null || printf 'smith-fast: the directory %s is gone; running in %s\\n' {q} \"$PWD\" >&2")
    return "\n".join(lines) + "\n" + command


class StateSplitter:
    """Takes the marked sections out of a stream of stderr text, chunk by chunk.

    Text that may be the start of a marker is held back until the next chunk tells; :meth:`flush`
    gives it back at the end. The sections (their text) are in :attr:`sections`.
    """

    __slots__ = ("marker", "held", "inside", "sections", "_current")

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.held = ""
        self.inside = False
        self.sections: list[str] = []
        self._current: list[str] = []

    def feed(self, text: str) -> str:
        """The output part of ``text`` (what is not a section)."""
        text = self.held + text
        self.held = ""
        out: list[str] = []
        marker = self.marker
        while True:
            at = text.find(marker)
            if at < 0:
                break
            (self._current if self.inside else out).append(text[:at])
            if self.inside:
                self.sections.append("".join(self._current))
                self._current = []
            self.inside = not self.inside
            text = text[at + len(marker) :]
        keep = held_back(text, (marker,))
        if keep:
            self.held, text = text[-keep:], text[:-keep]
        (self._current if self.inside else out).append(text)
        return "".join(out)

    def flush(self) -> str:
        """What was held back and turned out to be output (the stream ended)."""
        held, self.held = self.held, ""
        return "" if self.inside else held


_ANSI_C = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
           "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
"""bash's ``$'…'`` escapes of one character (the numeric ones are read in :func:`_ansi_c`)."""


def _ansi_c(text: str, i: int) -> tuple[str, int]:
    """The value of bash's ``$'…'`` starting after its opening quote at ``text[i]``, and the index
    after its closing quote. Numeric escapes are bytes (``\\303\\251`` is UTF-8 é), so runs of them
    are decoded together, as the stream is (invalid bytes dropped)."""
    out: list[str] = []
    raw = bytearray()
    n = len(text)
    while i < n and text[i] != "'":
        c = text[i]
        if c != "\\" or i + 1 >= n:
            if raw:
                out.append(raw.decode(errors="ignore"))
                raw.clear()
            out.append(c)
            i += 1
            continue
        e = text[i + 1]
        if e in "01234567":
            j = i + 1
            while j < n and j < i + 4 and text[j] in "01234567":
                j += 1
            raw.append(int(text[i + 1 : j], 8) & 0xFF)
            i = j
            continue
        if e == "x":
            j = i + 2
            while j < n and j < i + 4 and text[j] in "0123456789abcdefABCDEF":
                j += 1
            if j > i + 2:
                raw.append(int(text[i + 2 : j], 16))
                i = j
                continue
        if raw:
            out.append(raw.decode(errors="ignore"))
            raw.clear()
        if e in "uU":
            j, end = i + 2, i + (6 if e == "u" else 10)
            while j < n and j < end and text[j] in "0123456789abcdefABCDEF":
                j += 1
            if j > i + 2:
                out.append(chr(min(int(text[i + 2 : j], 16), 0x10FFFF)))
                i = j
                continue
        if e == "c" and i + 2 < n:
            out.append(chr(ord(text[i + 2]) & 0x1F))
            i += 3
            continue
        out.append(_ANSI_C.get(e, "\\" + e))
        i += 2
    if raw:
        out.append(raw.decode(errors="ignore"))
    return "".join(out), i + 1


def _word(text: str, i: int) -> tuple[str, int]:
    """One shell word of ``export -p``'s output from ``text[i]``: quoted and unquoted pieces up to
    unquoted white space; its value and the index after it."""
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t\n":
            break
        if c == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            out.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    if text[i + 1] != "\n":  # a quoted newline after a backslash is a line joint
                        out.append(text[i + 1])
                    i += 2
                else:
                    out.append(text[i])
                    i += 1
            i += 1
        elif c == "$" and i + 1 < n and text[i + 1] == "'":
            value, i = _ansi_c(text, i + 2)
            out.append(value)
        elif c == "\\" and i + 1 < n:
            out.append(text[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out), i


@functools.lru_cache(maxsize=16)
def _exports(text: str) -> dict[str, str]:
    """The exported variables in ``export -p``'s output (``export`` or ``declare -x`` lines; a
    name exported with no value is left out, as ``env`` leaves it out). Kept for the texts seen
    last: a call's start is most often the last one's end, and its end its start (a command that
    exported nothing): parsed by hand a character at a time, a text was ~10% of a ``true`` through
    the MCP front. The dict is shared: not to be changed."""
    env: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t\n":
            i += 1
            continue
        word, i = _word(text, i)
        if word in ("export", "declare") or word.startswith("-"):
            continue
        name, eq, value = word.partition("=")
        if eq and name:
            env[name] = value
    return env


@dataclass(slots=True)
class ShellState:
    """What the next call of an MCP session's ``shell`` starts with.

    Attributes:
        cwd: the directory (absolute, as the command saw it); None: the root.
        env: the variables carried (set or changed by earlier calls).
    """

    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def after(self, sections: list[str], allow: Collection[str], policy: str) -> tuple[ShellState, list[str]] | None:
        """The state a call that started from this one left, from its two sections (None when
        the trap did not run: the state stays); with the names the env policy keeps from carrying."""
        if len(sections) < 2:
            return None
        start = _exports(sections[0])
        cwd, _, rest = sections[1].partition("\0")
        end = _exports(rest)
        changed = {k: v for k, v in end.items() if k not in _NOT_CARRIED and (k in self.env or start.get(k) != v)}
        refused = refused_names(changed, allow, policy=policy)
        for name in refused:
            del changed[name]
        return ShellState(cwd or None, changed), refused

    def command_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        return {**self.env, **extra}
