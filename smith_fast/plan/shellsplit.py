"""Cut a shell goal into steps at its top-level ``&&``, ``;`` and newlines, the way ``sh`` reads them.

The result is a list of ``(command, joiner)`` pairs, ``joiner`` saying how the command hangs on the
one before it: ``""`` for the first, ``"&&"`` (run only if the previous one succeeded) or ``";"``
(run after the previous one, whatever its result; a newline counts as ``;``).

The scanner knows enough of the POSIX shell grammar to cut only where ``sh`` would end a command:

* never inside quotes (``'...'``, ``"..."``, ``\\`` escapes, backslash-newline continuations),
  command substitutions (``$(...)``, backticks), ``${...}``, ``(...)`` subshells, ``$((...))``,
  ``[[ ... ]]``, here-documents, or compound commands (``if ... fi``, ``for``/``while``/``until`` ...
  ``done``, ``case ... esac``, ``{ ...; }``);
* ``# comments`` are dropped; blank lines are ignored;
* ``a && b || c`` stays one step: ``||`` binds the whole and-or list, so cutting it would change
  what runs when ``a`` fails. A list with a here-document also stays one step (the body follows the
  whole line). ``|`` pipelines and ``&`` background jobs stay inside their step;
* a line may continue after ``&&``, ``||`` or ``|``, as in ``sh``.

Syntax errors (an unterminated quote, an unclosed ``if``, ``&&`` with nothing after it ...) raise
:class:`~smith_fast.plan.model.PlanError` with reason ``invalid_goal`` and the offset.
"""

from __future__ import annotations

import re

from .model import PlanError

__all__ = ["split_shell_goal"]

_WORD_END = frozenset(" \t\n;&|()<>")
_BLANK = " \t"
# A run of characters that can make a word without quoting or expansion. A word is "bare" (and
# may be a reserved word) when such a run is the whole word.
_PLAIN = re.compile(r"[^\s;&|()<>'\"\\`$]+")
_OPENERS = {"if": "fi", "case": "esac", "for": "done", "while": "done", "until": "done", "select": "done", "{": "}", "[[": "]]"}
_CLOSERS = frozenset({"fi", "esac", "done", "}"})
_MIDDLES = frozenset({"then", "do", "elif", "else"})
# After these reserved words the next word is again in command position.
_KEEP_COMMAND = frozenset({"if", "then", "elif", "else", "while", "until", "do", "{", "!"})
# ``$(``/``${`` (and the quotes inside them) are skipped recursively: deeper nesting is refused as
# an invalid goal, well before Python's recursion limit (a goal of ``$(`` repeated was a RecursionError).
MAX_NESTING = 32


def _error(message: str) -> PlanError:
    return PlanError(f"goal: {message}", "invalid_goal")


class _Scanner:
    __slots__ = ("text", "n", "i", "stack", "out", "pieces", "parts", "chunk", "command_pos",
                 "word_start", "has_or", "heredocs", "has_heredoc", "and_offset", "nesting")

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.i = 0
        self.stack: list[tuple[str, str, int]] = []  # (closer, opener, offset)
        self.out: list[tuple[str, str]] = []
        self.pieces: list[str] = []  # the &&-separated commands of the current and-or list
        self.parts: list[str] = []  # text spans of the current command (comments cut out)
        self.chunk = 0  # start of the current span
        self.command_pos = True
        self.word_start = True
        self.has_or = False
        self.heredocs: list[tuple[str, bool, int]] = []  # pending (delimiter, strip_tabs, offset)
        self.has_heredoc = False
        self.and_offset = 0  # offset of the last top-level '&&'
        self.nesting = 0  # $( and ${ being skipped, one inside the other

    # ---- pieces and lists ----------------------------------------------------------------------

    def _take(self, end: int) -> str:
        self.parts.append(self.text[self.chunk : end])
        command = "".join(self.parts).strip()
        self.parts = []
        return command

    def _end_piece(self, end: int) -> None:
        command = self._take(end)
        if not command:
            raise _error(f"'&&' at offset {end} has no command before it")
        self.pieces.append(command)
        self.and_offset = end

    def _end_list(self, end: int, op: str, op_offset: int) -> None:
        command = self._take(end)
        if not command:
            if self.pieces:
                raise _error(f"'&&' at offset {self.and_offset} has no command after it")
            if op == ";":
                raise _error(f"';' at offset {op_offset} has no command before it")
            return
        self.pieces.append(command)
        if self.has_or or self.has_heredoc:
            self.pieces = [" && ".join(self.pieces)]
        for k, piece in enumerate(self.pieces):
            self.out.append((piece, "&&" if k else ";" if self.out else ""))
        self.pieces = []
        self.has_or = self.has_heredoc = False

    # ---- scanning ----------------------------------------------------------------------------

    def _skip_blanks_and_newlines(self) -> None:
        """After ``&&``, ``||`` or ``|`` the command may continue on the next line (comments allowed)."""
        text, n = self.text, self.n
        while self.i < n:
            c = text[self.i]
            if c in " \t\n":
                self.i += 1
            elif c == "#":
                self.parts.append(text[self.chunk : self.i])
                while self.i < n and text[self.i] != "\n":
                    self.i += 1
                self.chunk = self.i
            elif c == "\\" and text.startswith("\\\n", self.i):
                self.i += 2
            else:
                break

    def _skip_single(self, start: int) -> int:
        end = self.text.find("'", start + 1)
        if end < 0:
            raise _error(f"unterminated single quote starting at offset {start}")
        return end + 1

    def _skip_double(self, start: int) -> int:
        text, n = self.text, self.n
        i = start + 1
        while i < n:
            c = text[i]
            if c == '"':
                return i + 1
            if c == "\\":
                i += 2
            elif c == "$" and i + 1 < n and text[i + 1] in "({":
                i = self._skip_group(i + 2, ")" if text[i + 1] == "(" else "}", i)
            elif c == "`":
                i = self._skip_backtick(i)
            else:
                i += 1
        raise _error(f"unterminated double quote starting at offset {start}")

    def _skip_backtick(self, start: int) -> int:
        text, n = self.text, self.n
        i = start + 1
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
            elif c == "`":
                return i + 1
            else:
                i += 1
        raise _error(f"unterminated backquote starting at offset {start}")

    def _skip_group(self, i: int, closer: str, start: int) -> int:
        """Skip to just past the ``closer`` that matches an opener at ``start``; ``i`` is just past the opener."""
        if self.nesting >= MAX_NESTING:
            raise _error(f"'$(' or '${{' at offset {start} is nested more than {MAX_NESTING} deep")
        self.nesting += 1  # not given back on an error: the scan ends there
        text, n = self.text, self.n
        depth = 0
        parameter = closer == "}"  # inside ${...}, '#' is an operator, not a comment
        word_start = True
        while i < n:
            c = text[i]
            if c == closer and depth == 0:
                self.nesting -= 1
                return i + 1
            if c == "'":
                i = self._skip_single(i)
            elif c == '"':
                i = self._skip_double(i)
            elif c == "\\":
                i += 2
            elif c == "`":
                i = self._skip_backtick(i)
            elif c == "$" and i + 1 < n and text[i + 1] in "({":
                i = self._skip_group(i + 2, ")" if text[i + 1] == "(" else "}", i)
            elif c == "#" and word_start and not parameter:
                while i < n and text[i] != "\n":
                    i += 1
            else:
                if c == "(" and closer == ")":
                    depth += 1
                elif c == ")" and closer == ")":
                    depth -= 1
                i += 1
                word_start = c in _WORD_END
                continue
            word_start = False
        what = {")": "'('", "}": "'${'"}[closer]
        if text.startswith("$(", start):
            what = "'$('"
        raise _error(f"{what} at offset {start} is never closed")

    def _heredoc_operator(self, start: int) -> int:
        """Read ``<<[-]WORD`` at ``start``; remember the delimiter; return the index after it."""
        text, n = self.text, self.n
        i = start + 2
        strip_tabs = i < n and text[i] == "-"
        i += strip_tabs
        while i < n and text[i] in _BLANK:
            i += 1
        delimiter: list[str] = []
        while i < n and text[i] not in _WORD_END:
            c = text[i]
            if c in "'\"":
                end = text.find(c, i + 1)
                if end < 0:
                    raise _error(f"unterminated {'single' if c == chr(39) else 'double'} quote starting at offset {i}")
                delimiter.append(text[i + 1 : end])
                i = end + 1
            elif c == "\\" and i + 1 < n:
                delimiter.append(text[i + 1])
                i += 2
            else:
                delimiter.append(c)
                i += 1
        if not delimiter:
            raise _error(f"here-document at offset {start} has no delimiter word")
        self.heredocs.append(("".join(delimiter), strip_tabs, start))
        self.has_heredoc = True
        return i

    def _heredoc_bodies(self, newline: int) -> int:
        """Skip the bodies of the pending here-documents, which start after ``newline``; return the
        index of the newline ending the last delimiter line (or the end of the text)."""
        text, n = self.text, self.n
        i = newline
        for delimiter, strip_tabs, offset in self.heredocs:
            while True:
                if i >= n:
                    raise _error(f"here-document at offset {offset} is never closed by a line {delimiter!r}")
                start = i + 1
                end = text.find("\n", start)
                if end < 0:
                    end = n
                line = text[start:end]
                i = end
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.heredocs = []
        return i

    def _reserved(self, word: str, offset: int) -> bool:
        """Handle a bare word in command position; return whether the next word is in command position."""
        stack = self.stack
        if word in _OPENERS:
            stack.append((_OPENERS[word], word, offset))
            return word in _KEEP_COMMAND
        if word in _CLOSERS:
            if stack and stack[-1][0] == word:
                stack.pop()
                return False
            if stack:
                closer, opener, at = stack[-1]
                raise _error(f"{word!r} at offset {offset} cannot close {opener!r} at offset {at} (expected {closer!r})")
            raise _error(f"{word!r} at offset {offset} closes nothing")
        if word in _MIDDLES and not stack:
            raise _error(f"{word!r} at offset {offset} is outside any compound command")
        return word in _KEEP_COMMAND

    def run(self) -> list[tuple[str, str]]:
        text, n = self.text, self.n
        while self.i < n:
            i = self.i
            c = text[i]
            if self.word_start and c == "#":
                self.parts.append(text[self.chunk : i])
                end = text.find("\n", i)
                self.i = self.chunk = n if end < 0 else end
                continue
            if c in _BLANK:
                self.i += 1
                self.word_start = True
                continue
            if c == "\n":
                if self.heredocs:
                    end = self._heredoc_bodies(i)
                    if self.stack:
                        self.i = end
                        self.command_pos = self.word_start = True
                        continue
                    self._end_list(end, "\n", i)
                    self.i = self.chunk = end + 1
                elif self.stack:
                    self.i += 1
                else:
                    self._end_list(i, "\n", i)
                    self.i = self.chunk = i + 1
                self.command_pos = self.word_start = True
                continue
            if c == ";":
                if text.startswith(";;", i):
                    if not self.stack or self.stack[-1][0] != "esac":
                        raise _error(f"';;' at offset {i} is only valid inside case ... esac")
                    self.i += 2
                elif self.stack or self.heredocs:  # a here-document's body belongs to this line
                    self.i += 1
                else:
                    self._end_list(i, ";", i)
                    self.i = self.chunk = i + 1
                self.command_pos = self.word_start = True
                continue
            if c == "&":
                if text.startswith("&&", i):
                    self.i += 2
                    if not self.stack:
                        self._end_piece(i)
                        self.chunk = self.i
                        self._skip_blanks_and_newlines()
                        self.chunk = self.i
                        if self.i >= n:
                            raise _error(f"'&&' at offset {i} has no command after it")
                    else:
                        self._skip_blanks_and_newlines()
                else:
                    self.i += 1
                self.command_pos = self.word_start = True
                continue
            if c == "|":
                op = "||" if text.startswith("||", i) else "|"
                if op == "||" and not self.stack:
                    self.has_or = True
                self.i += len(op)
                self._skip_blanks_and_newlines()
                if self.i >= n:
                    raise _error(f"'{op}' at offset {i} has no command after it")
                self.command_pos = self.word_start = True
                continue
            if c == "(":
                subshell = self.command_pos
                self.i = self._skip_group(i + 1, ")", i)
                # A '(' that is not in command position is the '()' of a function definition,
                # whose body ('{ ...; }') follows in command position.
                self.command_pos = not subshell
                self.word_start = True
                continue
            if c == ")":
                if self.stack and self.stack[-1][0] == "esac":  # the end of a case pattern
                    self.i += 1
                    self.command_pos = self.word_start = True
                    continue
                raise _error(f"')' at offset {i} has no matching '('")
            if c == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
                self.i = self._heredoc_operator(i)
                self.command_pos = False
                self.word_start = True
                continue
            if c in "<>":
                self.i += 3 if text.startswith("<<<", i) else 1  # a here-string is not a here-document
                self.word_start = True
                continue
            if c == "'":
                self.i = self._skip_single(i)
            elif c == '"':
                self.i = self._skip_double(i)
            elif c == "`":
                self.i = self._skip_backtick(i)
            elif c == "\\":
                self.i += 2
                if text.startswith("\\\n", i):
                    # sh deletes a backslash-newline before it reads anything else; so do we, so a
                    # step never ends in a stray backslash.
                    self.parts.append(text[self.chunk : i])
                    self.chunk = i + 2
                    continue
            elif c == "$" and i + 1 < n and text[i + 1] in "({":
                self.i = self._skip_group(i + 2, ")" if text[i + 1] == "(" else "}", i)
            else:
                match = _PLAIN.match(text, i)
                end = match.end() if match else i + 1
                word = text[i:end]
                bare = self.word_start and (end >= n or text[end] in _WORD_END)
                self.i = end
                if bare and word == "]]" and self.stack and self.stack[-1][0] == "]]":
                    self.stack.pop()
                    self.command_pos = False
                elif bare and self.command_pos:
                    self.command_pos = self._reserved(word, i)
                else:
                    self.command_pos = self.command_pos and bare and "=" in word  # VAR=x cmd
                self.word_start = False
                continue
            self.command_pos = False
            self.word_start = False
        if self.heredocs:
            _, _, offset = self.heredocs[0]
            raise _error(f"here-document at offset {offset} has no body")
        if self.stack:
            closer, opener, offset = self.stack[-1]
            raise _error(f"{opener!r} at offset {offset} is never closed by {closer!r}")
        self._end_list(n, "\n", n)
        return self.out


def split_shell_goal(text: str) -> list[tuple[str, str]]:
    """Cut a shell goal into its top-level commands.

    Args:
        text: the goal, written as shell commands.

    Returns:
        ``(command, joiner)`` pairs in order; ``joiner`` is ``""`` for the first command, ``"&&"``
        when the command runs only if the previous one succeeded, ``";"`` when it runs after the
        previous one whatever its result. Empty when the goal holds no command (blank or comments).

    Raises:
        PlanError: ``invalid_goal``: the goal is not valid shell syntax, with the offset of the problem.
    """
    return _Scanner(text).run()
