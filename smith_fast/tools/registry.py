"""The tool registry: named tools with JSON Schemas, and the one entry point the service calls.

A :class:`ToolRegistry` holds no per-call state: once its tools are registered, any number of
tasks may :meth:`ToolRegistry.call` it at the same time.
"""

from __future__ import annotations

import asyncio
import json
import re
import inspect
from time import perf_counter  # bound once: twice per call
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.records import record

try:
    import orjson
except ImportError:  # pragma: no cover - optional dependency: json serves alone
    orjson = None  # type: ignore[assignment]  # None marks it missing; every use checks for it
from smith_fast.tools.schema import ArgumentError, Validator, compile_validator, decode_args, validate
from smith_fast.tools.workspace import ToolContext

__all__ = ["Handler", "Tool", "ToolOutcome", "ToolRegistry"]

Handler = Callable[[Any, ToolContext], "Awaitable[Any] | Any"]
"""``handler(args, ctx)``: the result, or an awaitable of it (an ``async def``)."""

# Dotted names in the style of the built-ins (``fs.read``); no spaces or slashes, so a name can
# appear in logs, metrics labels and error messages unquoted.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*")
# A handler's exception text goes back to the peer; cap it like the other outputs.
_MAX_ERROR = 4096


# What ToolOutcome(...) does, without the named tuple's __new__ (a Python lambda it evaluates from a
# string, so never compiled): every successful call makes one.
_outcome = tuple.__new__


@record(frozen=True, slots=True)
class Tool:
    """A callable tool.

    Attributes:
        name: the identifier clients call it by, e.g. ``fs.read``.
        description: one line saying what it does.
        schema: the JSON Schema of the arguments value.
        handler: ``(args, ctx) -> result``, an ``async def`` or a plain function; receives the
            validated arguments and returns a JSON-serializable value, or (a plain function) an
            awaitable of it when it has to wait. A plain function is called where its request is
            admitted, before the request has a task: a call that returns its value ends in that
            step, answered at once. Raising :class:`~smith_fast.tools.schema.ArgumentError` or any
            other exception fails the call with that message; raising
            :class:`~smith_fast.errors.ProtocolError` turns the call into a protocol error.
    """

    name: str
    description: str
    schema: Mapping[str, Any]
    handler: Handler


class ToolOutcome(NamedTuple):
    """What a call produced, ready to become a ``ToolResultEvent``.

    A named tuple (immutable, as a frozen dataclass would be): one is made per call, and a frozen
    dataclass's ``__init__`` (an ``object.__setattr__`` per field) cost about twice a tuple's.

    Attributes:
        success: whether the tool ran and returned a result.
        result: the result as compact UTF-8 JSON; ``b""`` when the call failed.
        error: why the call failed; ``None`` on success.
        duration_ms: wall time of the call, argument decoding included.
    """

    success: bool
    result: bytes
    error: str | None
    duration_ms: int


@record(frozen=True, slots=True)
class _Entry:
    """A registered tool and the validator of its arguments."""

    tool: Tool
    validator: Validator


class ToolRegistry:
    """A set of tools by name."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def register(self, tool: Tool) -> None:
        """Add a tool, compiling its argument validator.

        Args:
            tool: the tool.

        Raises:
            TypeError: ``tool`` is not a :class:`Tool`.
            ValueError: the name is taken or malformed, the description is empty or spans several
                lines, or the schema is not a valid JSON Schema.
        """
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool, not {type(tool).__name__}")
        if not isinstance(tool.name, str) or not _NAME.fullmatch(tool.name):
            raise ValueError(f"invalid tool name {tool.name!r}")
        if tool.name in self._entries:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        description = tool.description
        if not isinstance(description, str) or not description.strip() or "\n" in description:
            raise ValueError(f"tool {tool.name!r}: the description must be one non-empty line")
        if not callable(tool.handler):
            raise TypeError(f"tool {tool.name!r}: the handler is not callable")
        try:
            validator = compile_validator(tool.schema)
        except ValueError as exc:
            raise ValueError(f"tool {tool.name!r}: {exc}") from None
        self._entries[tool.name] = _Entry(tool, validator)

    def get(self, name: str) -> Tool:
        """Look a tool up by name.

        Args:
            name: the tool's name.

        Returns:
            The tool.

        Raises:
            ProtocolError: ``ERROR_CODE_INVALID_TOOL`` when there is no such tool.
        """
        return self._entry(name).tool

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def tools(self) -> list[Tool]:
        """The registered tools, sorted by name."""
        return [self._entries[name].tool for name in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    async def call(
        self, name: str, args: bytes, ctx: ToolContext, *, timeout: float | None = None
    ) -> ToolOutcome:
        """Run a tool.

        Failures of the call itself (bad arguments, an exception in the tool) come back as an
        unsuccessful outcome; failures the protocol has an error code for are raised.

        Args:
            name: the tool's name.
            args: the arguments as UTF-8 JSON (``b""`` means ``{}``).
            ctx: the workspace and limits.
            timeout: seconds before the tool is cancelled; ``None`` for no limit.

        Returns:
            The outcome.

        Raises:
            ProtocolError: ``ERROR_CODE_INVALID_TOOL`` for an unknown tool,
                ``ERROR_CODE_PERMISSION_DENIED`` for a path outside the workspace,
                ``ERROR_CODE_EXECUTION_TIMEOUT`` when ``timeout`` expired (the tool has been
                cancelled and has finished cleaning up by then).
        """
        self._entry(name)  # an unknown tool is a protocol error, not a failed call
        step = self.start(name, args, ctx, timeout=timeout)
        assert step is not None
        if isinstance(step, ToolOutcome):
            return step
        return await step

    def start(
        self, name: str, args: bytes, ctx: ToolContext, *, timeout: float | None = None
    ) -> ToolOutcome | Awaitable[ToolOutcome] | None:
        """Start a call: what :meth:`call` does, as far as it gets without waiting.

        The arguments are decoded and checked and the handler is called; a plain-function
        handler that returns its value ends the call here. Nothing is sent and no task is needed,
        so the service answers such a call in the step that read it.

        Returns:
            The outcome when the call ended here; an awaitable giving it (or raising the
            :class:`~smith_fast.errors.ProtocolError` the handler raised) when it goes on; None
            for an unknown tool (:meth:`call` raises for it).
        """
        begun = perf_counter()
        entry = self._entries.get(name)
        if entry is None:
            return None
        try:
            value = decode_args(args)
            validate(entry.validator, value)
        except ArgumentError as exc:
            return ToolOutcome(False, b"", str(exc), _elapsed_ms(begun))
        try:
            result = entry.tool.handler(value, ctx)
        except ProtocolError as exc:
            return _raise(exc)
        except Exception as exc:  # noqa: BLE001 - a broken tool must fail its call, not the service
            return _failed(exc, begun)
        if type(result) is not dict and inspect.isawaitable(result):  # a dict: the common value, at once
            return _finish(name, result, begun, timeout)
        return _succeeded(result, begun)

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ProtocolError(
                f"unknown tool {name!r}", smith_pb2.ERROR_CODE_INVALID_TOOL, details={"tool": str(name)}
            ) from None


def _succeeded(result: Any, start: float) -> ToolOutcome:
    """The outcome of a handler that returned ``result`` (what :func:`_settle` makes of it)."""
    try:
        encoded = result.encoded if type(result) is _Encoded else encode_result(result)
    except Exception as exc:  # noqa: BLE001 - an unencodable result fails its call
        return _failed(exc, start)
    return _outcome(ToolOutcome, (True, encoded, None, _elapsed_ms(start)))


def _failed(exc: Exception, start: float) -> ToolOutcome:
    """The outcome of a handler that raised ``exc`` (not a protocol error)."""
    message = str(exc) if isinstance(exc, ArgumentError) else _describe(exc)
    return ToolOutcome(False, b"", message, _elapsed_ms(start))


async def _raise(exc: ProtocolError) -> ToolOutcome:
    raise exc


async def _finish(name: str, awaitable: Awaitable[Any], start: float, timeout: float | None) -> ToolOutcome:
    """The rest of a call whose handler returned an awaitable, under ``timeout``."""
    if timeout is None:
        return await _settle(awaitable, start)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await _settle(awaitable, start)
    except TimeoutError:
        if not deadline.expired():
            raise
        elapsed = _elapsed_ms(start)
        raise ProtocolError(
            f"tool {name!r} timed out after {elapsed} ms",
            smith_pb2.ERROR_CODE_EXECUTION_TIMEOUT,
            details={"tool": name, "timeout_ms": str(round(timeout * 1000)), "duration_ms": str(elapsed)},
        ) from None


async def _settle(awaitable: Awaitable[Any], start: float) -> ToolOutcome:
    # CancelledError is a BaseException and passes through: the timeout (or the caller) owns it.
    try:
        result = await awaitable
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken tool must fail its call, not the service
        return _failed(exc, start)
    return _succeeded(result, start)


class _Encoded(dict[str, Any]):
    """A result that brings its JSON encoding along (``tools.list`` caches its encoding).

    It is the plain ``dict`` to anyone calling the handler directly; only :func:`_succeeded`, right
    after the handler returned it, takes ``encoded`` instead of encoding the dict again.
    """

    __slots__ = ("encoded",)

    def __init__(self, value: dict[str, Any], encoded: bytes) -> None:
        super().__init__(value)
        self.encoded = encoded


def encode_result(result: Any) -> bytes:
    """Compact UTF-8 JSON of a tool's result.

    Raises:
        TypeError: the value is not JSON-serializable.
        ValueError: it holds NaN or an infinity, or a circular reference.
        UnicodeEncodeError: it holds a lone surrogate.
    """
    if orjson is not None and type(result) is dict and _flat(result):
        try:
            return orjson.dumps(result)  # the same bytes for these types, several times faster
        except TypeError:
            pass  # a lone surrogate: json raises what the caller expects
    return _ENCODER.encode(result).encode()


# The value types for which orjson writes exactly json's compact, ensure_ascii=False bytes (floats
# are not: NaN becomes null there, and 1e16 is spelt differently).
_FLAT = frozenset({str, int, bool, type(None)})


def _flat(result: dict[Any, Any]) -> bool:
    """A dict of str keys and :data:`_FLAT` values (``fs.read``'s result, and most small results)."""
    flat = _FLAT
    for key, value in result.items():
        if type(key) is not str or type(value) not in flat:
            return False
    return True


# What json.dumps(..., ensure_ascii=False, separators=(",", ":"), allow_nan=False) builds on every
# call; the encoder keeps no state between calls, so one serves all of them.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _describe(exc: BaseException) -> str:
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if len(text) > _MAX_ERROR:
        text = text[: _MAX_ERROR - 3] + "..."
    return text


def _elapsed_ms(start: float) -> int:
    return int((perf_counter() - start) * 1000)
