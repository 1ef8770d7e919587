"""The two JSON backends (stdlib ``json`` and ``orjson``), made to accept and write the same bytes.

orjson is the reference: it follows RFC 8259 as ``serde_json`` does. The stdlib backend is adjusted
to it on the rare inputs where they differ (``NaN``/``Infinity``, lone surrogate escapes, integers
beyond 64 bits, infinite numbers, floats below 1e-4), each detected by a cheap scan first so that
ordinary lines take the C fast paths only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from ..errors import EncodeError, ProtocolError
from ..pb import smith_pb2 as pb

try:
    import orjson
except ImportError:  # optional dependency: the stdlib backend is always there
    orjson = None  # type: ignore[assignment]  # None marks it missing; every use checks for it

__all__ = ["MAX_NESTING", "STDLIB", "Backend", "backend", "invalid_json", "invalid_utf8", "json_value",
           "nesting_exceeds", "stack_too_deep", "too_deep"]

MAX_NESTING = 127  # serde_json's recursion limit: a Rust peer rejects deeper lines
_UNSPECIFIED = pb.ERROR_CODE_UNSPECIFIED
_U64 = 0xFFFFFFFFFFFFFFFF
_I64_MIN = -0x8000000000000000

_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_STRING_BYTES = re.compile(_STRING.encode(), re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP = {0x5B: 1, 0x7B: 1, 0x5D: -1, 0x7D: -1}
# Numbers the stdlib parser reads differently from orjson: 19+ digits (maybe beyond 64 bits) or
# a 3-digit exponent (maybe infinite).
_WIDE_NUMBER = re.compile(r"[0-9]{19}|[eE]\+?[0-9]{3}")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STRING_TEXT = re.compile(_STRING, re.DOTALL)
# Python prints 1e-05 .. 9e-09 with a zero-padded exponent where orjson prints 0.00001 .. 9e-9.
_PADDED_EXPONENT = re.compile(_STRING + r"|(-?)([0-9])(?:\.([0-9]+))?e-0([0-9])")


def nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays/objects deeper than ``limit`` levels."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING_BYTES.sub(b"", raw).translate(None, _NOT_BRACKET)
    # Every bracket may sit inside strings ('"[[[...]"'): then there is no depth to take a max of.
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > limit


def invalid_utf8(exc: UnicodeDecodeError) -> ProtocolError:
    return ProtocolError(
        f"invalid UTF-8 at byte {exc.start}: {exc.reason}", _UNSPECIFIED, details={"reason": "invalid_utf8"}
    )


def invalid_json(message: str, pos: int | None = None) -> ProtocolError:
    where = "" if pos is None else f" at character {pos}"
    return ProtocolError(f"invalid JSON{where}: {message}", _UNSPECIFIED, details={"reason": "invalid_json"})


def too_deep() -> ProtocolError:
    return invalid_json(f"arrays/objects nested deeper than {MAX_NESTING} levels (the serde_json limit)")


def stack_too_deep() -> ProtocolError:
    # RecursionError only comes from a caller with little stack left: MAX_NESTING is far below
    return invalid_json("arrays/objects nested too deeply to parse with the stack left")


def _has_lone_surrogate(text: str) -> bool:
    """Whether a string literal of the valid JSON ``text`` escapes a lone surrogate.

    Scans the literals, not the parsed value: a duplicate key drops the earlier value from the
    dict, yet orjson has already refused the line for it.
    """
    for m in _STRING_TEXT.finditer(text):
        literal = m[0]
        if _SURROGATE_ESCAPE.search(literal):
            try:
                json.loads(literal).encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:20]} is out of the range of a double")
    return value


def _parse_int(text: str) -> int | float:
    if len(text) <= 20:
        value = int(text)
        if _I64_MIN <= value <= _U64:
            return value
    return _parse_float(text)  # orjson (and serde_json) read wider integers as doubles


def _orjson_float(m: re.Match[str]) -> str:
    sign, lead, frac, exp = m.groups()
    if lead is None:
        return m[0]  # a string: left alone
    if exp == "5":
        return f"{sign}0.0000{lead}{frac or ''}"
    return f"{sign}{lead}{'.' + frac if frac else ''}e-{exp}"


def _not_serializable(obj: Any) -> Any:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _compact_encoder() -> Callable[[Any], str]:
    """``JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode``, minus its per-call setup.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs more than encoding a
    small event; building it once makes the stdlib backend about three times faster. Falls back to
    the public API where the C accelerator (or its signature) differs.
    """
    options: dict[str, Any] = {"ensure_ascii": False, "separators": (",", ":"), "allow_nan": False, "check_circular": False}
    slow = json.JSONEncoder(**options).encode
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]  # private, not in typeshed

        fast = c_make_encoder(None, _not_serializable, encode_basestring, None, ":", ",", False, False, False)
        probe = {"a": [1, 2.5, None, True, "\u00e9\n"], "b": {}}
        if "".join(fast(probe, 0)) == slow(probe):
            return lambda obj: "".join(fast(obj, 0))
    except (ImportError, TypeError):
        pass
    return slow


class _StdlibBackend:
    name = "json"

    def __init__(self) -> None:
        self._decode = json.JSONDecoder(parse_constant=_reject_constant).decode
        self._decode_wide = json.JSONDecoder(
            parse_int=_parse_int, parse_float=_parse_float, parse_constant=_reject_constant
        ).decode
        self._encode = _compact_encoder()

    def loads(self, raw: bytes) -> Any:
        try:
            text = str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise invalid_utf8(exc) from None
        try:
            value = (self._decode_wide if _WIDE_NUMBER.search(text) else self._decode)(text)
        except json.JSONDecodeError as exc:
            raise invalid_json(exc.msg, exc.pos) from None
        except ValueError as exc:  # from the number/constant hooks
            raise invalid_json(str(exc)) from None
        except RecursionError:
            raise stack_too_deep() from None
        if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(text):
            raise invalid_json("a string holds a lone surrogate escape")
        return value

    def _text(self, value: Any) -> bytes:
        text = self._encode(value)
        if "e-0" in text:
            text = _PADDED_EXPONENT.sub(_orjson_float, text)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = f"U+{ord(exc.object[exc.start]):04X}"
            raise EncodeError(f"a string holds the lone surrogate {char}, which is not valid UTF-8") from None

    def dumps_value(self, value: Any) -> bytes:
        return self._text(value)

    def dumps_line(self, obj: Any) -> bytes:
        return self._text(obj) + b"\n"


class _OrjsonBackend:
    name = "orjson"

    def __init__(self) -> None:
        self._loads = orjson.loads
        self._dumps = orjson.dumps
        self._newline = orjson.OPT_APPEND_NEWLINE

    def loads(self, raw: bytes) -> Any:
        try:
            return self._loads(raw)
        except orjson.JSONDecodeError as exc:
            try:
                str(raw, "utf-8")  # report invalid UTF-8 as such, at its byte, like the stdlib path
            except UnicodeDecodeError as bad:
                raise invalid_utf8(bad) from None
            raise invalid_json(exc.msg, exc.pos) from None

    def dumps_value(self, value: Any) -> bytes:
        try:
            return self._dumps(value)
        except TypeError:
            return STDLIB.dumps_value(value)  # the stdlib bytes, or its error: the same either way

    def dumps_line(self, obj: Any) -> bytes:
        try:
            return self._dumps(obj, option=self._newline)
        except TypeError:
            return STDLIB.dumps_line(obj)  # e.g. its EncodeError for a lone surrogate


STDLIB = _StdlibBackend()
Backend = _StdlibBackend | _OrjsonBackend


def json_value(be: Backend, raw: bytes, embedded: int) -> Any:
    """The v0 JSON value for v1 JSON ``bytes`` sitting ``embedded`` levels deep in a line."""
    if not raw:
        return None
    try:
        if nesting_exceeds(raw, MAX_NESTING - embedded):
            raise too_deep()
        return be.loads(raw)
    except ProtocolError:
        return str(raw, "utf-8", "replace")


def backend(name: str) -> Backend:
    """The backend called ``name``: ``"json"``, ``"orjson"`` or ``"auto"`` (orjson when importable)."""
    if name == "auto":
        name = "json" if orjson is None else "orjson"
    if name == "json":
        return STDLIB
    if name == "orjson":
        if orjson is None:
            raise ImportError("the orjson backend was asked for, but orjson is not installed")
        return _OrjsonBackend()
    raise ValueError(f"backend must be 'json', 'orjson' or 'auto', got {name!r}")
