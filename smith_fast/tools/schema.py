"""Tool arguments: decoding the JSON bytes of a call and validating them against a JSON Schema.

Validators are compiled once, when a tool is registered (:func:`compile_validator`); a call only
runs the compiled validator. Every problem is reported as an :class:`ArgumentError` whose message
names the JSON path of the offending value (``$`` for the whole object, ``$.path``,
``$.env.HOME``, ``$.items[2]``), which the registry turns into a failed ``ToolResultEvent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from smith_fast.errors import SmithFastError

__all__ = ["ArgumentError", "Validator", "compile_validator", "decode_args", "validate"]

# An argument error quotes the offending value; a multi-megabyte string must not be echoed back.
_MAX_REASON = 300


class ArgumentError(SmithFastError, ValueError):
    """The arguments of a tool call are not valid for that tool.

    Raised by argument decoding and validation, and by handlers for problems a schema cannot
    express (an invalid regex, invalid base64). The message reads ``args: <reason> at <path>``,
    or just ``args: <reason>`` when the bytes are not JSON at all (the reason then gives the byte,
    or the line and column).

    Attributes:
        reason: what is wrong.
        path: the JSON path of the offending value (``$`` is the whole arguments value), or
            ``None`` when the arguments are not JSON at all.
    """

    def __init__(self, reason: str, path: str | None = "$") -> None:
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        super().__init__(f"args: {reason}" if path is None else f"args: {reason} at {path}")
        self.reason = reason
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.reason, self.path))


class Validator(Protocol):
    """The part of a ``jsonschema`` validator the registry uses."""

    def iter_errors(self, instance: Any) -> Any: ...


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
    cls = jsonschema.validators.validator_for(plain, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(plain)
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"invalid JSON Schema at {exc.json_path}: {exc.message}") from None
    return cls(plain)


def decode_args(args: bytes) -> Any:
    """Parse the arguments of a call: UTF-8 JSON, with ``b""`` standing for ``{}``.

    An empty ``bytes`` is what protobuf delivers for arguments never set, so a tool without
    arguments can be called without any.

    Args:
        args: the raw ``ToolCallCommand.args``.

    Returns:
        The JSON value.

    Raises:
        ArgumentError: invalid UTF-8, invalid JSON, or the non-standard constants ``NaN`` and
            ``Infinity``.
    """
    if not args:
        return {}
    try:
        text = bytes(args).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"invalid UTF-8 at byte {exc.start}", None) from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} (char {exc.pos})", None
        ) from None


def _reject_constant(name: str) -> Any:
    raise ArgumentError(f"invalid JSON: {name} is not a JSON value", None)


def validate(validator: Validator, value: Any) -> None:
    """Validate ``value``, reporting the most relevant error with its JSON path.

    Args:
        validator: from :func:`compile_validator`.
        value: decoded arguments.

    Raises:
        ArgumentError: the value does not match the schema.
    """
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        raise ArgumentError(error.message, error.json_path)
