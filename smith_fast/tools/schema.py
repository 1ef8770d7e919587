"""Tool arguments: decoding the JSON bytes of a call and validating them against a JSON Schema.

Schemas are checked once, when a tool is registered (:func:`compile_validator`); a call only runs
the compiled validator. Schemas written in the plain subset the built-ins use (objects with
``properties``/``required``/``additionalProperties``, strings, integers, booleans, string enums)
also get a fast check of a few microseconds: a value it accepts is one ``jsonschema`` accepts, and
anything else (including every invalid value) goes to ``jsonschema``, so errors read exactly as
``jsonschema`` words them. A schema of that subset is a valid JSON Schema by construction (each
keyword it allows is checked for what the meta-schema demands), so ``jsonschema`` itself (some
30 ms to import, and the meta-schema check of every built-in, at every start) is imported and its
validator built only when a value fails the fast check. Every problem is reported as an
:class:`ArgumentError` whose message names the JSON path of the offending value (``$`` for the
whole object, ``$.path``, ``$.env.HOME``, ``$.items[2]``), which the registry turns into a failed
``ToolResultEvent``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from smith_fast.errors import ArgumentError

__all__ = ["ArgumentError", "Validator", "compile_validator", "decode_args", "validate"]

class Validator(Protocol):
    """The part of a ``jsonschema`` validator the registry uses."""

    def iter_errors(self, instance: Any) -> Any: ...


class _Compiled:
    """A ``jsonschema`` validator plus, when the schema allows one, the fast acceptance check; with
    one, the validator is built on its first use (a value the fast check did not accept)."""

    __slots__ = ("fast", "_schema", "_validator")

    def __init__(self, schema: Any, validator: Any, fast: Callable[[Any], bool] | None) -> None:
        self._schema = schema
        self._validator = validator
        self.fast = fast

    def iter_errors(self, instance: Any) -> Any:
        if self._validator is None:
            self._validator = _validator_class(self._schema)(self._schema)
        return self._validator.iter_errors(instance)


def _validator_class(schema: Any) -> Any:
    import jsonschema  # here, not at the top: see the module's docstring

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def compile_validator(schema: Mapping[str, Any]) -> Validator:
    """Check ``schema`` and build its validator.

    The draft is taken from the schema's ``$schema`` keyword, defaulting to 2020-12.

    Args:
        schema: a JSON Schema.

    Returns:
        A validator to pass to :func:`validate`.

    Raises:
        ValueError: the schema is not a valid JSON Schema, or is not JSON-serializable.
    """
    # A JSON round trip proves the schema can be listed by tools.list, and gives the validator a
    # private copy that later changes to the caller's mapping cannot reach.
    try:
        plain = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"schema is not JSON-serializable: {exc}") from None
    # "$schema" may name a draft whose keywords mean something else (draft 3's boolean
    # "required"): such schemas always take the jsonschema path.
    fast = None if isinstance(plain, dict) and "$schema" in plain else _fast_check(plain)
    if fast is not None:  # valid by construction: no meta-schema check needed
        return _Compiled(plain, None, fast)
    import jsonschema.exceptions

    cls = _validator_class(plain)
    try:
        cls.check_schema(plain)
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"invalid JSON Schema at {exc.json_path}: {exc.message}") from None
    return _Compiled(plain, cls(plain), None)


# --- the fast path -----------------------------------------------------------------------------
# Each builder returns a predicate that is True only for values jsonschema would accept, or None
# when the (sub)schema uses anything outside the subset below, or a keyword of it with a value the
# 2020-12 meta-schema refuses; then the whole schema goes without a fast path (and is checked
# against the meta-schema). Being stricter than jsonschema is fine (the value goes on to
# jsonschema), never laxer: integers must be ``int`` (not 1.0, not bool), enums are matched for
# strings only.

# annotation keyword -> the types the meta-schema allows its value (None: any JSON value)
_ANNOTATIONS: dict[str, tuple[type, ...] | None] = {
    "description": (str,), "title": (str,), "default": None, "examples": (list,),
    "deprecated": (bool,), "readOnly": (bool,), "writeOnly": (bool,),
}
_ANNOTATION_KEYS = frozenset(_ANNOTATIONS)
_Check = Callable[[Any], bool]


def _fast_check(schema: Any) -> _Check | None:
    if schema is True or schema == {}:
        return _accept
    if not isinstance(schema, dict):
        return None
    for key, kinds in _ANNOTATIONS.items():
        if kinds is not None and key in schema and type(schema[key]) not in kinds:
            return None
    keys = set(schema) - _ANNOTATION_KEYS
    if "enum" in schema:
        return _enum_check(schema["enum"]) if keys == {"enum"} else None
    kind = schema.get("type")
    if kind == "object":
        return _object_check(schema, keys)
    if kind == "string":
        return _string_check(schema, keys)
    if kind == "integer":
        return _integer_check(schema, keys)
    if kind == "boolean" and keys == {"type"}:
        return _is_bool
    return None


def _accept(value: Any) -> bool:
    return True


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _enum_check(members: Any) -> _Check | None:
    if not isinstance(members, list) or not all(type(m) is str for m in members):
        return None
    allowed = frozenset(members)
    return lambda value: type(value) is str and value in allowed


def _string_check(schema: dict[str, Any], keys: set[str]) -> _Check | None:
    if not keys <= {"type", "minLength", "maxLength"}:
        return None
    low = schema.get("minLength", 0)
    high = schema.get("maxLength")
    if type(low) is not int or low < 0 or ("maxLength" in schema and (type(high) is not int or high < 0)):
        return None  # (an explicit null is no length: refused by the meta-schema too)
    if high is None:
        return lambda value: type(value) is str and len(value) >= low
    return lambda value: type(value) is str and low <= len(value) <= high


def _integer_check(schema: dict[str, Any], keys: set[str]) -> _Check | None:
    if not keys <= {"type", "minimum", "maximum"}:
        return None
    low = schema.get("minimum")
    high = schema.get("maximum")
    if any(key in schema and type(schema[key]) not in (int, float) for key in ("minimum", "maximum")):
        return None
    if high is None:
        if low is None:
            return lambda value: type(value) is int
        return lambda value: type(value) is int and value >= low
    if low is None:
        return lambda value: type(value) is int and value <= high
    return lambda value: type(value) is int and low <= value <= high


def _object_check(schema: dict[str, Any], keys: set[str]) -> _Check | None:
    if not keys <= {"type", "properties", "required", "additionalProperties"}:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if not all(type(name) is str for name in required) or len(set(required)) != len(required):
        return None  # the meta-schema wants unique strings
    checks: dict[str, _Check] = {}
    for name, sub in properties.items():
        sub_check = _fast_check(sub)
        if sub_check is None:
            return None
        checks[name] = sub_check
    extra_check: _Check | None
    if extra is False:
        extra_check = None
    else:
        extra_check = _fast_check(extra)
        if extra_check is None:
            return None
    needed = tuple(required)

    def check(value: Any) -> bool:
        if type(value) is not dict:
            return False
        for name in needed:
            if name not in value:
                return False
        for name, item in value.items():
            item_check = checks.get(name, extra_check)
            if item_check is None or not item_check(item):
                return False
        return True

    return check


def decode_args(args: bytes) -> Any:
    """Parse the arguments of a call: UTF-8 JSON, with ``b""`` standing for ``{}``.

    An empty ``bytes`` is what protobuf delivers for arguments never set, so a tool without
    arguments can be called without any.

    Args:
        args: the raw ``ToolCallCommand.args``.

    Returns:
        The JSON value.

    Raises:
        ArgumentError: invalid UTF-8, invalid JSON (nested too deeply to parse included), or the
            non-standard constants ``NaN`` and ``Infinity``.
    """
    if not args:
        return {}
    if orjson is not None and _LONG_NUMBER.search(args) is None:
        # orjson parses a strict subset of what json accepts, to the same values; for anything it
        # refuses (NaN, bad UTF-8 …) json decides, with its messages. An integer of 19 digits or
        # more may not fit 64 bits, which orjson turns into a float: json reads those.
        try:
            return orjson.loads(args)
        except orjson.JSONDecodeError:
            pass
    try:
        text = bytes(args).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"invalid UTF-8 at byte {exc.start}", None) from None
    try:
        # What json.loads(text, parse_constant=...) does, without building a decoder per call.
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} (char {exc.pos})", None
        ) from None
    except RecursionError:  # json's C scanner recurses per nesting level: [[[[... deeper than the stack
        raise ArgumentError("invalid JSON: arrays/objects nested too deeply", None) from None


def _reject_constant(name: str) -> Any:
    raise ArgumentError(f"invalid JSON: {name} is not a JSON value", None)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_LONG_NUMBER = re.compile(rb"[0-9]{19}")

try:  # several times faster for the small arguments of every tool call (optional dependency)
    import orjson
except ImportError:  # pragma: no cover - the v0 and MCP extras install it
    orjson = None  # type: ignore[assignment]  # json serves alone


def validate(validator: Validator, value: Any) -> None:
    """Validate ``value``, reporting the most relevant error with its JSON path.

    Args:
        validator: from :func:`compile_validator`.
        value: decoded arguments.

    Raises:
        ArgumentError: the value does not match the schema.
    """
    fast = getattr(validator, "fast", None)
    if fast is not None and fast(value):
        return
    import jsonschema.exceptions  # only for a value the fast check did not accept (the module's docstring)

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        raise ArgumentError(error.message, error.json_path)
