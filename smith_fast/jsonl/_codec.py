"""``JsonlCodec``: v0 lines to and from v1 ``Command``/``Event`` messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import EncodeError, ProtocolError
from ..pb import smith_pb2 as pb
from ._backends import (
    MAX_NESTING,
    Backend,
    invalid_utf8,
    json_value,
    nesting_exceeds,
    stack_too_deep,
    too_deep,
)
from ._backends import backend as select_backend
from ._fields import (
    CAPABILITIES,
    COMMANDS_BY_NAME,
    COMMANDS_BY_ONEOF,
    ERROR_CODE_NAMES,
    EVENTS_BY_NAME,
    EVENTS_BY_ONEOF,
    LEVEL_NAMES,
    MISSING,
    STATE_NAMES,
    Variant,
    describe,
    invalid,
    no_v0_name,
    read_request_id,
)

__all__ = ["JsonlCodec"]

_M = TypeVar("_M", pb.Command, pb.Event)
_UNSPECIFIED = pb.ERROR_CODE_UNSPECIFIED
_NAMED = 16  # distinct unknown capability names said back in one error (service/negotiation.py NAMED)
_U64 = 0xFFFFFFFFFFFFFFFF
_I32 = 0x7FFFFFFF


def _malformed(message: str, reason: str = "malformed", request_id: str | None = None) -> ProtocolError:
    return ProtocolError(message, _UNSPECIFIED, request_id, {"reason": reason})


class JsonlCodec:
    """Converts v0 JSON lines to and from v1 ``Command``/``Event`` messages (see the module doc).

    Args:
        backend: ``"json"`` (stdlib), ``"orjson"``, or ``"auto"`` (orjson when importable). Both
            give the same results and the same bytes.

    Raises:
        ValueError: an unknown backend name.
        ImportError: ``"orjson"`` was asked for and is not installed.
    """

    __slots__ = ("_be", "_dumps_line")

    def __init__(self, backend: str = "auto") -> None:
        self._be: Backend = select_backend(backend)
        self._dumps_line = self._be.dumps_line

    @property
    def backend(self) -> str:
        """The JSON backend in use: ``"json"`` or ``"orjson"``."""
        return self._be.name

    # -- decoding ------------------------------------------------------------------------------

    def _decode(
        self, line: bytes | bytearray | memoryview, table: dict[str, Variant], what: str, wrapper: Callable[..., _M]
    ) -> _M:
        try:
            return self._decode_line(line, table, what, wrapper)
        except RecursionError:
            raise stack_too_deep() from None

    def _decode_line(
        self, line: bytes | bytearray | memoryview, table: dict[str, Variant], what: str, wrapper: Callable[..., _M]
    ) -> _M:
        if type(line) is not bytes:
            line = bytes(line)
        be = self._be
        if nesting_exceeds(line, MAX_NESTING):
            try:  # invalid UTF-8 is reported first, as a parse would
                str(line, "utf-8")
            except UnicodeDecodeError as exc:
                raise invalid_utf8(exc) from None
            raise too_deep()
        obj = be.loads(line)
        if type(obj) is not dict:
            raise _malformed(f"a v0 line must be a JSON object, got {describe(obj)}")
        name = obj.get("type", MISSING)
        if type(name) is not str:
            problem = 'has no "type"' if name is MISSING else f'has a "type" that is {describe(name)}'
            raise _malformed(f"the {what} object {problem}; expected a variant name string")
        data = obj.get("data", MISSING)
        variant = table.get(name)
        if variant is None:
            known = ", ".join(table)
            raise _malformed(f"unknown {what} type {name!r} (expected one of {known})", f"unknown_{what}",
                             read_request_id(data))
        _, oneof, fields = variant
        if fields is None:  # a unit variant: any data is ignored
            return wrapper(**{oneof: {}})
        if type(data) is not dict:
            raise invalid(f"{name}.data", "an object", data)
        extras: dict[str, Any] = {}
        try:
            kwargs = {f: d(data.get(f, MISSING), path, be, extras) for f, path, d, _ in fields}
        except ProtocolError as exc:
            exc.request_id = read_request_id(data)
            raise
        if extras:
            if "details" in extras:
                kwargs["details"] = extras["details"]
            unknown = extras.get("unknown_capabilities")
            if unknown:
                message = wrapper(**{oneof: kwargs})
                # Named back boundedly: at most _NAMED of the distinct names, each cut to 64 characters.
                names = [n[:64] for n in list(unknown)[:_NAMED]]
                listed = ", ".join(map(repr, names)) + (f" and {len(unknown) - _NAMED} more" if len(unknown) > _NAMED else "")
                error = ProtocolError(
                    f"{name}.capabilities has unknown capabilities {listed} (known: "
                    f"{', '.join(CAPABILITIES)}); the known ones were decoded",
                    pb.ERROR_CODE_INVALID_CAPABILITY,
                    details={"reason": "unknown_capability", "unknown_capabilities": ",".join(names)},
                )
                setattr(error, what, message)
                raise error
        return wrapper(**{oneof: kwargs})

    def decode_command(self, line: bytes | bytearray | memoryview) -> pb.Command:
        """Decode one v0 line (with or without its ``\\n``) into a v1 ``Command``.

        Args:
            line: one line, as :class:`LineDecoder` returns it.

        Returns:
            The command.

        Raises:
            ProtocolError: the line is not a valid v0 command; ``details["reason"]`` names the kind
                and ``request_id`` is set when the line had a readable one. With code
                ``ERROR_CODE_INVALID_CAPABILITY`` only unknown capabilities were wrong, and the
                decoded command is on the exception's ``command`` attribute.
        """
        return self._decode(line, COMMANDS_BY_NAME, "command", pb.Command)

    def decode_event(self, line: bytes | bytearray | memoryview) -> pb.Event:
        """Decode one v0 line (with or without its ``\\n``) into a v1 ``Event`` (the SDK side).

        Args:
            line: one line, as :class:`LineDecoder` returns it.

        Returns:
            The event.

        Raises:
            ProtocolError: as :meth:`decode_command`, with reason ``unknown_event`` for an unknown
                variant and the decoded ``Ready`` on the ``event`` attribute for unknown capabilities.
        """
        return self._decode(line, EVENTS_BY_NAME, "event", pb.Event)

    # -- encoding ------------------------------------------------------------------------------

    def _encode(self, message: Any, oneof: str, table: dict[str, Variant]) -> bytes:
        which = message.WhichOneof(oneof)
        if which is None:
            raise EncodeError(f"{type(message).__name__} has no {oneof} set")
        variant = table.get(which)
        if variant is None:  # V1_ONLY_COMMANDS, V1_ONLY_EVENTS
            raise EncodeError(f"{type(message).__name__}.{which} is protocol v1 only: v0 has no variant for it")
        name, _, fields = variant
        if fields is None:
            return self._dumps_line({"type": name})
        msg = getattr(message, which)
        be = self._be
        data = {f: e(msg, f, be) for f, _, _, e in fields}
        if MISSING in data.values():  # smith-fast additions left unset: absent, as the crate writes it
            data = {f: v for f, v in data.items() if v is not MISSING}
        return self._dumps_line({"type": name, "data": data})

    def encode_event(self, event: pb.Event) -> bytes:
        """Encode a v1 ``Event`` as one v0 line ending in ``\\n``; fields v0 lacks are dropped.

        Args:
            event: the event; ids are not validated.

        Returns:
            The line, compact UTF-8 JSON.

        Raises:
            EncodeError: no event is set, or an enum value has no v0 name (e.g. ``*_UNSPECIFIED``
                states, levels and capabilities), or ``HookResult.action`` is missing, or the event
                is v1 only (``V1_ONLY_EVENTS``).
        """
        return self._encode(event, "event_type", EVENTS_BY_ONEOF)

    def encode_command(self, command: pb.Command) -> bytes:
        """Encode a v1 ``Command`` as one v0 line ending in ``\\n`` (the SDK side).

        Raises:
            EncodeError: no command is set, or a capability has no v0 name, or the command is v1
                only (``V1_ONLY_COMMANDS``).
        """
        return self._encode(command, "command_type", COMMANDS_BY_ONEOF)

    # -- direct encoders for the hot events: same bytes as encode_event, no protobuf objects ----

    def shell_output(
        self, request_id: str, stdout: str | None, stderr: str | None, exit_code: int | None, finished: bool
    ) -> bytes:
        """The v0 ``ShellOutput`` line for these values (``None``: absent).

        Raises:
            EncodeError: ``exit_code`` does not fit in 32 bits, or a string holds a lone surrogate.
        """
        if exit_code is not None and not -_I32 - 1 <= exit_code <= _I32:
            raise EncodeError(
                f"ShellOutputEvent.exit_code {exit_code} does not fit in a signed 32-bit integer"
            )
        data = {"request_id": request_id, "stdout": stdout, "stderr": stderr, "exit_code": exit_code,
                "finished": bool(finished)}  # fmt: skip
        return self._dumps_line({"type": "ShellOutput", "data": data})

    def state_change(self, state: int, request_id: str | None, timestamp: int) -> bytes:
        """The v0 ``StateChange`` line; ``state`` is a ``ServiceState`` value.

        Raises:
            EncodeError: ``state`` has no v0 name, or ``timestamp`` is not an unsigned 64-bit value.
        """
        name = STATE_NAMES.get(state)
        if name is None:
            raise no_v0_name("StateChangeEvent.state", pb.ServiceState, state, "state")
        _check_u64("StateChangeEvent.timestamp", timestamp)
        data = {"request_id": request_id, "state": name, "timestamp": timestamp}
        return self._dumps_line({"type": "StateChange", "data": data})

    def tool_result(self, request_id: str, success: bool, result: bytes, error: str | None) -> bytes:
        """The v0 ``ToolResult`` line; ``result`` is UTF-8 JSON as in v1 (see the module doc).

        Raises:
            EncodeError: a string holds a lone surrogate.
        """
        if type(result) is not bytes:
            result = bytes(result)
        value = json_value(self._be, result, 2)
        data = {"request_id": request_id, "success": bool(success), "result": value, "error": error}
        return self._dumps_line({"type": "ToolResult", "data": data})

    def log(self, level: int, message: str, timestamp: int, request_id: str | None) -> bytes:
        """The v0 ``Log`` line; ``level`` is a ``LogLevel`` value.

        Raises:
            EncodeError: ``level`` has no v0 name, or ``timestamp`` is not an unsigned 64-bit value.
        """
        name = LEVEL_NAMES.get(level)
        if name is None:
            raise no_v0_name("LogEvent.level", pb.LogLevel, level, "log level")
        _check_u64("LogEvent.timestamp", timestamp)
        data = {"level": name, "message": message, "timestamp": timestamp, "request_id": request_id}
        return self._dumps_line({"type": "Log", "data": data})

    def error(self, error_code: int, message: str, request_id: str | None, timestamp: int) -> bytes:
        """The v0 ``Error`` line; ``error_code`` is an ``ErrorCode`` value.

        Raises:
            EncodeError: ``error_code`` is not an ``ErrorCode``, or ``timestamp`` is not an unsigned
                64-bit value.
        """
        code = ERROR_CODE_NAMES.get(error_code)
        if code is None:
            raise no_v0_name("ErrorEvent.error_code", pb.ErrorCode, error_code, "error code")
        _check_u64("ErrorEvent.timestamp", timestamp)
        data = {"request_id": request_id, "error_code": code, "message": message, "timestamp": timestamp}
        return self._dumps_line({"type": "Error", "data": data})


def _check_u64(path: str, value: int) -> None:
    if not 0 <= value <= _U64:
        raise EncodeError(f"{path} {value} does not fit in an unsigned 64-bit integer")
