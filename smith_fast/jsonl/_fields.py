"""The v0 shapes: how each field of each variant is decoded from JSON and encoded from v1.

A field kind is a pair ``(decode, encode)``: ``decode(value, path, backend, extras)`` turns a parsed
JSON value (``MISSING`` when the key is absent) into a v1 constructor argument, raising
``ProtocolError``, and may leave side results in ``extras``; ``encode(message, name, backend)``
turns a v1 field into a JSON value. Variants list their fields in the order the Rust crate declares
them, which is the order serde writes them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import EncodeError, ProtocolError
from ..pb import smith_pb2 as pb
from ._backends import Backend, json_value

__all__ = ["CAPABILITIES", "COMMANDS_BY_NAME", "COMMANDS_BY_ONEOF", "ERROR_CODE_NAMES", "EVENTS_BY_NAME", "V1_ONLY_COMMANDS", "V1_ONLY_EVENTS",
           "EVENTS_BY_ONEOF", "LEVEL_NAMES", "MISSING", "STATE_NAMES", "Variant", "describe", "invalid",
           "no_v0_name", "read_request_id"]

_UNSPECIFIED = pb.ERROR_CODE_UNSPECIFIED
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_I32 = 0x7FFFFFFF

MISSING: Any = object()
_Decode = Callable[[Any, str, Backend, dict[str, Any]], Any]
_Encode = Callable[[Any, str, Backend], Any]
_Kind = tuple[_Decode, _Encode]


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return f"the boolean {'true' if value else 'false'}"
    kind = type(value)
    if kind is str:
        text = repr(value)
        return f"the string {text if len(text) <= 60 else text[:56] + '...' + text[0]}"
    if kind is int or kind is float:
        return f"the number {value!r}"
    return "an array" if kind is list else "an object"


def invalid(path: str, expected: str, value: Any, reason: str = "invalid_field") -> ProtocolError:
    if value is MISSING:
        message, reason = f"missing required field {path}", "invalid_field"
    else:
        message = f"{path} must be {expected}, got {describe(value)}"
    return ProtocolError(message, _UNSPECIFIED, details={"reason": reason})


def _e_plain(msg: Any, name: str, be: Backend) -> Any:
    return getattr(msg, name)


def _e_optional(msg: Any, name: str, be: Backend) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _scalar(check: Callable[[Any], bool], expected: str, optional: bool = False) -> _Kind:
    if optional:
        expected += " or null"

    def decode(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
        if check(value):
            return value
        if optional and (value is None or value is MISSING):
            return None
        raise invalid(path, expected, value)

    return decode, (_e_optional if optional else _e_plain)


def _is_str(v: Any) -> bool:
    return type(v) is str


_STR = _scalar(_is_str, "a string")
_OPT_STR = _scalar(_is_str, "a string", optional=True)
_BOOL = _scalar(lambda v: type(v) is bool, "a boolean")
_U32_KIND = _scalar(lambda v: type(v) is int and 0 <= v <= _U32, "an unsigned 32-bit integer")
_U64_KIND = _scalar(lambda v: type(v) is int and 0 <= v <= _U64, "an unsigned 64-bit integer")
_OPT_U64 = _scalar(lambda v: type(v) is int and 0 <= v <= _U64, "an unsigned 64-bit integer", True)
_OPT_I32 = _scalar(lambda v: type(v) is int and -_I32 - 1 <= v <= _I32, "a signed 32-bit integer", True)

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HYPHENATED_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_SIMPLE_UUID = re.compile(r"[0-9a-fA-F]{32}")


def _uuid(text: str) -> str | None:
    """``text`` in the lowercase hyphenated form if the ``uuid`` crate parses it, else None."""
    if _CANONICAL_UUID.fullmatch(text):
        return text
    n = len(text)
    if n == 32 and _SIMPLE_UUID.fullmatch(text):
        t = text.lower()
        return f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}"
    if n == 38 and text[0] == "{" and text[-1] == "}":
        text = text[1:-1]
    elif n == 45 and text.startswith("urn:uuid:"):
        text = text[9:]
    return text.lower() if _HYPHENATED_UUID.fullmatch(text) else None


def _uuid_kind(optional: bool) -> _Kind:
    expected = "a UUID string or null" if optional else "a UUID string"

    def decode(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
        if type(value) is str:
            canonical = _uuid(value)
            if canonical is not None:
                return canonical
        elif optional and (value is None or value is MISSING):
            return None
        raise invalid(path, expected, value, "invalid_uuid")

    return decode, (_e_optional if optional else _e_plain)


_UUID = _uuid_kind(False)
_OPT_UUID = _uuid_kind(True)


def _d_map(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if type(value) is dict:
        for key, item in value.items():
            if type(item) is not str:
                raise invalid(f"{path}[{key!r}]", "a string", item)
        return value
    if value is None or value is MISSING:
        return {}
    raise invalid(path, "an object with string values", value)


_MAP = (_d_map, lambda msg, name, be: dict(getattr(msg, name)))


def _enum_kind(names: dict[int, str], enum: Any, what: str) -> _Kind:
    values = {v: k for k, v in names.items()}
    expected = "one of " + ", ".join(values)

    def decode(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
        if type(value) is str and value in values:
            return values[value]
        raise invalid(path, expected, value)

    def encode(msg: Any, name: str, be: Backend) -> Any:
        number = getattr(msg, name)
        try:
            return names[number]
        except KeyError:
            raise no_v0_name(f"{type(msg).__name__}.{name}", enum, number, what) from None

    return decode, encode


def no_v0_name(path: str, enum: Any, number: int, what: str) -> EncodeError:
    label = enum.Name(number) if number in enum.values() else str(number)
    return EncodeError(f"{path} is {label}, which has no v0 {what} name")


STATE_NAMES: dict[int, str] = {
    pb.SERVICE_STATE_STARTING: "Starting",
    pb.SERVICE_STATE_READY: "Ready",
    pb.SERVICE_STATE_PROCESSING: "Processing",
    pb.SERVICE_STATE_ERROR: "Error",
    pb.SERVICE_STATE_SHUTTING: "Shutting",
}
LEVEL_NAMES: dict[int, str] = {
    pb.LOG_LEVEL_TRACE: "Trace",
    pb.LOG_LEVEL_DEBUG: "Debug",
    pb.LOG_LEVEL_INFO: "Info",
    pb.LOG_LEVEL_WARN: "Warn",
    pb.LOG_LEVEL_ERROR: "Error",
}
# CAPABILITY_SHELL_EXEC -> shell_exec; ERROR_CODE_EXECUTION_TIMEOUT -> EXECUTION_TIMEOUT
_CAPABILITY_NAMES = {n: pb.Capability.Name(n)[11:].lower() for n in pb.Capability.values() if n}
CAPABILITIES = {name: number for number, name in _CAPABILITY_NAMES.items()}
ERROR_CODE_NAMES = {n: pb.ErrorCode.Name(n)[11:] for n in pb.ErrorCode.values()}
_ERROR_CODES = {name: number for number, name in ERROR_CODE_NAMES.items()}
_STATE = _enum_kind(STATE_NAMES, pb.ServiceState, "state")
_LEVEL = _enum_kind(LEVEL_NAMES, pb.LogLevel, "log level")


def _d_capabilities(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if type(value) is list:
        known = []
        for i, item in enumerate(value):
            if type(item) is not str:
                raise invalid(f"{path}[{i}]", "a capability name", item)
            number = CAPABILITIES.get(item)
            if number is None:  # distinct names, in order (a dict): one name repeated costs one
                extras.setdefault("unknown_capabilities", {})[item] = None
            else:
                known.append(number)
        return known
    if value is None or value is MISSING:
        return []
    raise invalid(path, "an array of capability names", value)


def _e_capabilities(msg: Any, name: str, be: Backend) -> Any:
    out = []
    for number in getattr(msg, name):
        if number not in _CAPABILITY_NAMES:
            raise no_v0_name(f"{type(msg).__name__}.{name}", pb.Capability, number, "capability")
        out.append(_CAPABILITY_NAMES[number])
    return out


def _d_error_code(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if type(value) is not str:
        raise invalid(path, "a string", value)
    number = _ERROR_CODES.get(value)
    if number is None:  # a free string in v0: keep it where encode_event finds it again
        extras["details"] = {"v0_error_code": value}
        return _UNSPECIFIED
    return number


def _e_error_code(msg: Any, name: str, be: Backend) -> Any:
    number = getattr(msg, name)
    if number == _UNSPECIFIED and "v0_error_code" in msg.details:
        return msg.details["v0_error_code"]
    try:
        return ERROR_CODE_NAMES[number]
    except KeyError:
        raise no_v0_name(f"{type(msg).__name__}.{name}", pb.ErrorCode, number, "error code") from None


def _d_json(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if value is MISSING:  # any value present is valid, null included
        raise invalid(path, "a JSON value", value)
    return be.dumps_value(value)


def _json_kind(embedded: int) -> _Kind:
    return _d_json, lambda msg, name, be: json_value(be, getattr(msg, name), embedded)


_HOOK_TYPES = {
    pb.HOOK_ACTION_TYPE_ALLOW: ("Allow", "allowed_data"),
    pb.HOOK_ACTION_TYPE_BLOCK: ("Block", "block_reason"),
    pb.HOOK_ACTION_TYPE_TRANSFORM: ("Transform", "transformed_data"),
}
_HOOK_DATA = {field: number for number, (_, field) in _HOOK_TYPES.items()}


def _d_hook_action(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if type(value) is not dict:
        raise invalid(path, "an object", value)
    kind = value.get("type", MISSING)
    data = value.get("data", MISSING)
    if kind == "Block":
        if type(data) is not dict:
            raise invalid(f"{path}.data", "an object", data)
        reason = _STR[0](data.get("reason", MISSING), f"{path}.data.reason", be, extras)
        return {"type": pb.HOOK_ACTION_TYPE_BLOCK, "block_reason": reason}
    if kind == "Allow" or kind == "Transform":
        number = pb.HOOK_ACTION_TYPE_ALLOW if kind == "Allow" else pb.HOOK_ACTION_TYPE_TRANSFORM
        return {"type": number, _HOOK_TYPES[number][1]: _d_json(data, f"{path}.data", be, extras)}
    raise invalid(f"{path}.type", "one of Allow, Block, Transform", kind)


def _e_hook_action(msg: Any, name: str, be: Backend) -> Any:
    path = f"{type(msg).__name__}.{name}"
    if not msg.HasField(name):
        raise EncodeError(f"{path} is not set; v0 requires it")
    action = getattr(msg, name)
    number = action.type
    if number == pb.HOOK_ACTION_TYPE_UNSPECIFIED:  # infer the type from the data that is set
        number = _HOOK_DATA.get(action.WhichOneof("action_data"), number)
    if number not in _HOOK_TYPES:
        raise no_v0_name(f"{path}.type", pb.HookActionType, number, "hook action")
    tag, field = _HOOK_TYPES[number]
    if number == pb.HOOK_ACTION_TYPE_BLOCK:
        return {"type": tag, "data": {"reason": action.block_reason}}
    return {"type": tag, "data": json_value(be, getattr(action, field), 3)}


def _struct_list(fields: tuple[tuple[str, _Kind], ...], expected: str) -> _Kind:
    def decode(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
        if type(value) is list:
            out = []
            for i, item in enumerate(value):
                if type(item) is not dict:
                    raise invalid(f"{path}[{i}]", expected, item)
                where = f"{path}[{i}]."
                out.append({f: d(item.get(f, MISSING), where + f, be, extras) for f, (d, _) in fields})
            return out
        if value is None or value is MISSING:
            return []
        raise invalid(path, f"an array of {expected}s", value)

    def encode(msg: Any, name: str, be: Backend) -> Any:
        return [{f: e(item, f, be) for f, (_, e) in fields} for item in getattr(msg, name)]

    return decode, encode


def _d_uuid_list(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if type(value) is list:
        return [_UUID[0](item, f"{path}[{i}]", be, extras) for i, item in enumerate(value)]
    if value is None or value is MISSING:
        return []
    raise invalid(path, "an array of UUID strings", value)


_UUID_LIST = (_d_uuid_list, lambda msg, name, be: list(getattr(msg, name)))
_NODES = _struct_list((("id", _UUID), ("label", _STR), ("node_type", _STR), ("metadata", _MAP)), "graph node")
_EDGES = _struct_list(
    (("id", _UUID), ("from", _UUID), ("to", _UUID), ("label", _OPT_STR), ("edge_type", _STR)), "graph edge"
)

def _d_text_bytes(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if type(value) is str:
        return value.encode()
    if value is None or value is MISSING:
        return b""
    raise invalid(path, "a string", value)


# v0 has no bytes: stdin data travels as a JSON string, so v0 stdin is text (UTF-8) only.
_TEXT_BYTES = (_d_text_bytes, lambda msg, name, be: getattr(msg, name).decode("utf-8", "replace"))


def _omitted_unless_set(kind: _Kind) -> _Kind:
    """A smith-fast addition to an existing variant: absent (not null) in JSON when unset, so a
    line that does not use it is byte for byte the crate's (the codec drops ``MISSING``)."""
    decode, encode = kind

    def encode_set(msg: Any, name: str, be: Backend) -> Any:
        field = msg.DESCRIPTOR.fields_by_name[name]
        present = msg.HasField(name) if field.has_presence else bool(getattr(msg, name))
        return encode(msg, name, be) if present else MISSING

    return decode, encode_set


def _d_flag(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if value is None or value is MISSING:
        return False
    if type(value) is bool:
        return value
    raise invalid(path, "a boolean", value)


_PTY_FIELDS = (("rows", _U32_KIND), ("cols", _U32_KIND), ("term", _STR))


def _d_pty(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if value is None or value is MISSING:
        return None
    if type(value) is not dict:
        raise invalid(path, "an object with rows, cols and term", value)
    defaults = {"rows": 0, "cols": 0, "term": ""}
    return {f: d(value.get(f, defaults[f]), f"{path}.{f}", be, extras) for f, (d, _) in _PTY_FIELDS}


def _e_pty(msg: Any, name: str, be: Backend) -> Any:
    pty = getattr(msg, name)
    return {f: getattr(pty, f) for f, _ in _PTY_FIELDS}


def _d_u64_or_zero(value: Any, path: str, be: Backend, extras: dict[str, Any]) -> Any:
    if value is None or value is MISSING:
        return 0
    return _U64_KIND[0](value, path, be, extras)


_U64_OR_ZERO = (_d_u64_or_zero, _e_plain)
_PROCESSES = _struct_list(
    (("id", _UUID), ("command", _STR), ("state", _STR), ("exit_code", _OPT_I32), ("pid", _U32_KIND),
     ("started_ms", _U64_KIND), ("ended_ms", _U64_KIND), ("first_offset", _U64_KIND), ("next_offset", _U64_KIND),
     ("retained", _U64_KIND), ("attached", _U32_KIND), ("stdin_open", _BOOL), ("pty", _BOOL)),
    "background process",
)


# --- variants ----------------------------------------------------------------------------------

# (v0 name, v1 oneof member, fields in serde order as (name, path, decode, encode); None: unit variant)
Variant = tuple[str, str, tuple[tuple[str, str, _Decode, _Encode], ...] | None]


def _variant(name: str, oneof: str, *fields: tuple[str, _Kind]) -> Variant:
    return name, oneof, tuple((f, f"{name}.{f}", d, e) for f, (d, e) in fields)


_CAPABILITY_LIST = (_d_capabilities, _e_capabilities)
_HOOK_ACTION = (_d_hook_action, _e_hook_action)
_COMMANDS: tuple[Variant, ...] = (
    _variant("Handshake", "handshake", ("version", _U32_KIND), ("capabilities", _CAPABILITY_LIST)),
    _variant("Plan", "plan", ("request_id", _UUID), ("goal", _STR), ("context", _MAP)),
    _variant(
        "ToolCall", "tool_call",
        ("request_id", _UUID), ("tool", _STR), ("args", _json_kind(2)), ("timeout_ms", _OPT_U64),
    ),
    _variant("HookLoad", "hook_load", ("request_id", _UUID), ("hook_type", _STR), ("script", _STR)),
    _variant(
        "ShellExec", "shell_exec",
        ("request_id", _UUID), ("command", _STR), ("shell", _OPT_STR), ("cwd", _OPT_STR), ("env", _MAP),
        ("timeout_ms", _OPT_U64),
        # smith-fast additions (PROTOCOL.md, "Process control"); binary_output is v1 only
        ("open_stdin", _omitted_unless_set((_d_flag, _e_plain))), ("pty", _omitted_unless_set((_d_pty, _e_pty))),
        # PROTOCOL.md, "Background processes"
        ("background", _omitted_unless_set((_d_flag, _e_plain))),
    ),
    ("Shutdown", "shutdown", None),
    # smith-fast additions (PROTOCOL.md, "Process control"): control commands on a running request
    _variant("Cancel", "cancel", ("request_id", _UUID)),
    _variant("Stdin", "stdin", ("request_id", _UUID), ("data", _TEXT_BYTES), ("eof", (_d_flag, _e_plain))),
    _variant("Resize", "resize", ("request_id", _UUID), ("rows", _U32_KIND), ("cols", _U32_KIND)),
    # smith-fast additions (PROTOCOL.md, "Background processes"); Attach's binary_output is v1 only
    _variant("ListProcesses", "list_processes", ("request_id", _UUID)),
    _variant("Attach", "attach", ("request_id", _UUID), ("process_id", _UUID), ("from_offset", _U64_OR_ZERO)),
)  # fmt: skip
_EVENTS: tuple[Variant, ...] = (
    _variant(
        "Ready", "ready", ("version", _U32_KIND), ("capabilities", _CAPABILITY_LIST), ("service_id", _UUID)
    ),
    _variant(
        "StateChange", "state_change", ("request_id", _OPT_UUID), ("state", _STATE), ("timestamp", _U64_KIND)
    ),
    _variant(
        "Log", "log",
        ("level", _LEVEL), ("message", _STR), ("timestamp", _U64_KIND), ("request_id", _OPT_UUID),
    ),
    _variant(
        "TokenUsage", "token_usage",
        ("request_id", _UUID), ("tokens_used", _U64_KIND), ("tokens_remaining", _OPT_U64),
    ),
    _variant(
        "ShellOutput", "shell_output",
        ("request_id", _UUID), ("stdout", _OPT_STR), ("stderr", _OPT_STR), ("exit_code", _OPT_I32),
        ("finished", _BOOL),
        ("offset", _omitted_unless_set(_OPT_U64)),  # an attached background process (PROTOCOL.md, "Background processes")
    ),
    _variant(
        "ToolResult", "tool_result",
        ("request_id", _UUID), ("success", _BOOL), ("result", _json_kind(2)), ("error", _OPT_STR),
    ),
    _variant("HookResult", "hook_result", ("request_id", _UUID), ("action", _HOOK_ACTION)),
    _variant(
        "GraphDelta", "graph_delta",
        ("request_id", _OPT_UUID), ("nodes_added", _NODES), ("edges_added", _EDGES),
        ("nodes_removed", _UUID_LIST), ("edges_removed", _UUID_LIST),
    ),
    _variant(
        "Error", "error",
        ("request_id", _OPT_UUID), ("error_code", (_d_error_code, _e_error_code)), ("message", _STR),
        ("timestamp", _U64_KIND),
    ),
    # smith-fast addition (PROTOCOL.md, "Background processes")
    _variant("ProcessList", "process_list", ("request_id", _UUID), ("processes", _PROCESSES)),
)  # fmt: skip
# The members v0 has no variant for (PROTOCOL.md, "Workspaces"): a v0 peer cannot send them (its line
# is an unknown command, as any other), and what answers them is never sent to one.
V1_ONLY_COMMANDS = frozenset({"checkpoint", "restore", "diff", "undo"})
V1_ONLY_EVENTS = frozenset({"workspace"})
COMMANDS_BY_NAME = {v[0]: v for v in _COMMANDS}
COMMANDS_BY_ONEOF = {v[1]: v for v in _COMMANDS}
EVENTS_BY_NAME = {v[0]: v for v in _EVENTS}
EVENTS_BY_ONEOF = {v[1]: v for v in _EVENTS}


def read_request_id(data: Any) -> str | None:
    """The canonical ``request_id`` of a line's ``data``, if it has a valid one: for error reports."""
    value = data.get("request_id") if type(data) is dict else None
    return _uuid(value) if type(value) is str else None
