"""What a peer's Rust hook may contain: a token-level check before ``rustc`` sees it.

A Rust hook a *session* loads (``HookLoadCommand``) is source from a peer the service does not
trust; compiling it must not read files, and running it must not do what the operator's policy
forbids (the global hooks see the session's commands, but not what a hook's native code does).
So before the compiler runs, the source is split into Rust tokens (comments, strings, raw strings,
byte and C strings, character literals and lifetimes, raw identifiers: what the compiler itself
sees, so that none of them can hide a token from the check, or make one up) and refused when:

* an identifier is one of :data:`FORBIDDEN` (reading files at compile time: ``include!``,
  ``include_str!``, ``include_bytes!``, ``env!``, ``option_env!``; code outside Rust: ``asm!``,
  ``global_asm!``, ``extern`` blocks and crates, ``unsafe``; the operating system at run time:
  ``std::process``, ``std::fs``, ``std::net``, ``std::os``, ``std::env``, ``std::thread``,
  ``Path``, ``File``, ``Command``), or starts with ``__smith`` (the prelude's internals). Banned as
  identifiers anywhere, not only where they are used, because a ``macro_rules!`` macro could be
  handed one as an argument; a macro cannot make an identifier out of pieces.
* a ``#`` does not start an attribute from :data:`ALLOWED_ATTRIBUTES` written out literally
  (``#[link_section]``, ``#[used]``, ``#[no_mangle]``, ``#[export_name]``, ``#[path]``,
  ``#[cfg_attr]``, ``#![...]`` crate attributes and any attribute a macro would assemble from
  ``$`` fragments are refused: they are how code runs before ``main`` or a file is read).
* a module is declared without a body (``mod name;`` reads ``name.rs``).
* an identifier is not ASCII (Rust normalises identifiers to NFC, under which a look-alike such
  as U+212A KELVIN SIGN becomes ``K``).

The operator's own hooks (``serve --hook FILE``) are trusted and not checked.
"""

from __future__ import annotations

from .model import HookLoadError

__all__ = ["ALLOWED_ATTRIBUTES", "FORBIDDEN", "check_rust_source", "rust_tokens"]

FORBIDDEN: dict[str, str] = {
    **dict.fromkeys(("include", "include_str", "include_bytes"), "it reads a file while compiling"),
    **dict.fromkeys(("env", "option_env"), "it reads the environment (env!) or reaches it (std::env)"),
    **dict.fromkeys(("asm", "global_asm", "naked_asm", "llvm_asm"), "inline assembly is not Rust"),
    "extern": "it links or declares foreign code",
    "unsafe": "a session's hook is safe Rust",
    "concat_idents": "it builds identifiers",
    **dict.fromkeys(("process", "Command"), "a hook does not run programs"),
    **dict.fromkeys(("fs", "File", "Path", "PathBuf"), "a hook does not touch files"),
    "net": "a hook does not use the network",
    "os": "a hook does not reach the operating system",
    "thread": "a hook does not start threads (they would run outside its call's time limit)",
}
"""Identifiers a session's Rust hook may not contain, and why."""

ALLOWED_ATTRIBUTES: frozenset[str] = frozenset({
    "allow", "warn", "deny", "forbid", "expect", "derive", "inline", "cold", "must_use", "doc",
    "track_caller", "non_exhaustive", "repr", "deprecated", "cfg", "rustfmt", "clippy", "test",
})  # fmt: skip
"""Attributes a session's Rust hook may use: lints, derives, docs, layout; none affects the build."""

_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT = _IDENT_START | frozenset("0123456789")


class _Reject(Exception):
    def __init__(self, pos: int, message: str) -> None:
        self.pos = pos
        self.message = message


def _string_end(src: str, i: int) -> int:
    """``src[i]`` is the opening quote of a (byte, C) string: the index after its closing one."""
    n = len(src)
    i += 1
    while i < n:
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    raise _Reject(n, "unterminated string literal")


def _raw_string_end(src: str, i: int) -> int | None:
    """``src[i:]`` starts after the ``r`` of ``r#*"``: the index after the raw string, or None if
    it is not one (``r#ident`` is a raw identifier)."""
    n = len(src)
    j = i
    while j < n and src[j] == "#":
        j += 1
    if j >= n or src[j] != '"':
        return None
    close = '"' + "#" * (j - i)
    end = src.find(close, j + 1)
    if end < 0:
        raise _Reject(n, "unterminated raw string literal")
    return end + len(close)


def rust_tokens(src: str) -> list[tuple[str, str, int]]:
    """The tokens of ``src`` that matter to the check: ``(kind, text, offset)`` with kind
    ``ident`` (raw identifiers without their ``r#``), ``punct`` (one character) or ``literal``.

    Raises:
        HookLoadError: an unterminated comment or literal, or a non-ASCII identifier.
    """
    try:
        return _tokens(src)
    except _Reject as exc:
        raise HookLoadError(f"hook.rs:{_where(src, exc.pos)}: {exc.message}") from None


def _tokens(src: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    n = len(src)
    i = 0
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end + 1
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while depth:
                if j >= n:
                    raise _Reject(i, "unterminated block comment")
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            i = j
        elif c == '"':
            end = _string_end(src, i)
            out.append(("literal", src[i:end], i))
            i = end
        elif c in "bcr" and (prefix := _literal_prefix(src, i)) is not None:
            end, kind = prefix
            out.append((kind, src[i + 2 : end] if kind == "ident" else src[i:end], i))
            i = end
        elif c in _IDENT_START:
            j = i + 1
            while j < n and src[j] in _IDENT:
                j += 1
            if j < n and not src[j].isascii() and (src[j].isalnum() or src[j] == "_"):
                raise _Reject(j, "identifiers in a hook must be ASCII")
            out.append(("ident", src[i:j], i))
            i = j
        elif c.isdigit():
            j = i + 1
            while j < n and (src[j] in _IDENT or (src[j] == "." and j + 1 < n and src[j + 1].isdigit())):
                j += 1
            out.append(("literal", src[i:j], i))
            i = j
        elif c == "'":
            i = _quote(src, i, out)
        elif not c.isascii():
            raise _Reject(i, f"{c!r} outside a string or comment (identifiers in a hook must be ASCII)")
        else:
            out.append(("punct", c, i))
            i += 1
    return out


def _literal_prefix(src: str, i: int) -> tuple[int, str] | None:
    """A literal or raw identifier that starts with ``b``, ``c`` or ``r`` at ``i``: (end, kind)."""
    n = len(src)
    j = i
    if src[j] in "bc" and j + 1 < n and src[j + 1] == "r":
        j += 1  # br"..", cr".."
    if src[j] == "r" and j + 1 < n and src[j + 1] in '#"':
        end = _raw_string_end(src, j + 1)
        if end is not None:
            return end, "literal"
        if j == i and j + 2 < n and src[j + 1] == "#" and src[j + 2] in _IDENT_START:
            k = j + 2  # r#ident: the identifier is what the compiler sees
            while k < n and src[k] in _IDENT:
                k += 1
            return k, "ident"
        return None
    if j == i and src[i] in "bc" and i + 1 < n:
        if src[i + 1] == '"':
            return _string_end(src, i + 1), "literal"
        if src[i] == "b" and src[i + 1] == "'":
            return _char_end(src, i + 1), "literal"
    return None


def _char_end(src: str, i: int) -> int:
    """``src[i]`` opens a character literal: the index after it."""
    n = len(src)
    j = i + 1
    if j < n and src[j] == "\\":
        j += 2
        if j <= n and src[j - 1] == "u" and j < n and src[j] == "{":
            close = src.find("}", j)
            if close < 0:
                raise _Reject(i, "unterminated character literal")
            j = close + 1
        elif j <= n and src[j - 1] == "x":
            j += 2
    else:
        j += 1
    if j >= n or src[j] != "'":
        raise _Reject(i, "unterminated character literal")
    return j + 1


def _quote(src: str, i: int, out: list[tuple[str, str, int]]) -> int:
    """A ``'`` at ``i``: a character literal, or a lifetime/label (``'a``, ``'static``)."""
    n = len(src)
    if i + 1 < n and src[i + 1] == "\\":
        end = _char_end(src, i)
        out.append(("literal", src[i:end], i))
        return end
    if i + 2 < n and src[i + 2] == "'":
        out.append(("literal", src[i : i + 3], i))
        return i + 3
    j = i + 1
    if j < n and src[j] in _IDENT_START:
        while j < n and src[j] in _IDENT:
            j += 1
        out.append(("punct", "'", i))  # a lifetime's name is no path the check cares about
        return j
    raise _Reject(i, "stray quote")


def _where(src: str, pos: int) -> str:
    line = src.count("\n", 0, pos) + 1
    col = pos - (src.rfind("\n", 0, pos) + 1) + 1
    return f"{line}:{col}"


def check_rust_source(src: str) -> None:
    """Refuse a session's Rust hook that could read files, run code outside its calls or reach
    the operating system (the module docstring has the rules).

    Raises:
        HookLoadError: naming the token, its ``hook.rs:LINE:COL`` and why.
    """
    tokens = rust_tokens(src)

    def reject(pos: int, message: str) -> HookLoadError:
        return HookLoadError(f"hook.rs:{_where(src, pos)}: {message} (HOOKS.md, \"What a session's Rust hook may contain\")")

    for n, (kind, text, pos) in enumerate(tokens):
        if kind == "ident":
            why = FORBIDDEN.get(text)
            if why is not None:
                raise reject(pos, f"`{text}` is not allowed in a session's Rust hook: {why}")
            if text.startswith("__smith"):
                raise reject(pos, f"`{text}` is the prelude's own")
            if text == "mod" and n + 2 < len(tokens) and tokens[n + 2][1] == ";" and tokens[n + 1][0] == "ident":
                raise reject(pos, "a module without a body (`mod name;`) reads another file: write `mod name { ... }`")
        elif kind == "punct" and text == "#":
            k = n + 1
            if k < len(tokens) and tokens[k][1] == "!":
                raise reject(pos, "crate attributes (`#![...]`) are not allowed in a session's Rust hook")
            if k >= len(tokens) or tokens[k][1] != "[":
                raise reject(pos, "`#` only starts an attribute in a session's Rust hook")
            name = tokens[k + 1] if k + 1 < len(tokens) else ("punct", "", pos)
            if name[0] != "ident" or name[1] not in ALLOWED_ATTRIBUTES:
                raise reject(
                    name[2],
                    f"attribute `{name[1]}` is not allowed in a session's Rust hook (allowed: {', '.join(sorted(ALLOWED_ATTRIBUTES))})",
                )
