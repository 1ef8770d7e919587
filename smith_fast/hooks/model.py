"""What hooks see and say: triggers, payload shapes, decisions, limits, errors, the ``Hook`` base.

Both engines (:mod:`.js`, :mod:`.rust`) hand a payload to the hook as JSON text and read its answer
back as JSON text, so the decoding and the validation of an answer live here, once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import HookFailure, HookLoadError
from ..records import record
from ..sandbox import Sandbox

__all__ = [
    "TRIGGERS",
    "Action",
    "Decision",
    "Hook",
    "HookFailure",
    "HookLimits",
    "HookLoadError",
    "shape_error",
]

log = logging.getLogger("smith_fast.hooks")

TRIGGERS: tuple[str, ...] = ("before_tool_call", "before_shell_exec", "after_tool_result", "on_shell_output", "before_hook_load",
                             "before_connect")
"""The trigger points, in the order a request meets them."""

Action = Literal["allow", "block", "transform"]

MAX_REASON = 4096
"""A block reason or failure message longer than this many characters is cut (it ends up in an event)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One hook's answer to one trigger.

    Attributes:
        action: ``"allow"``, ``"block"`` or ``"transform"``.
        data: for ``transform``, the replacement payload (same shape as the one given); else None.
        reason: for ``block``, why (never empty); for an ``allow`` that a failed hook turned into
            under ``failure="open"``, what went wrong; else None.
        hook_id: the hook that decided.
    """

    action: Action
    data: Any = None
    reason: str | None = None
    hook_id: str | None = None


@record(frozen=True, slots=True)
class HookLimits:
    """Bounds on one hook.

    Attributes:
        call_timeout: seconds one call may run. JavaScript: CPU time of the service process, checked
            by the engine's interrupt handler; Rust: wall-clock time of the round trip to the child.
        memory_bytes: JavaScript: the QuickJS heap limit (the hook's own runtime: everything it
            allocates counts); Rust: the child's ``RLIMIT_DATA``.
        rust_compile_timeout: seconds ``rustc`` may take before the load fails.
        sandbox: confines ``rustc`` (it writes only its build directory) and the Rust hook
            processes (they write only their private working directory); None: unconfined.
        session_hooks: hooks one session may load (``--max-hooks-per-session``).
        session_memory_bytes: the sum of the ``memory_bytes`` of one session's hooks
            (``--max-session-hook-memory``): a hook loaded when less than ``memory_bytes`` is left
            gets what is left, and none loads with less than :data:`MIN_HOOK_MEMORY`.
    """

    call_timeout: float = 0.5
    memory_bytes: int = 32 << 20
    rust_compile_timeout: float = 120.0
    sandbox: Sandbox | None = None
    session_hooks: int = 16
    session_memory_bytes: int = 256 << 20


MIN_HOOK_MEMORY = 4 << 20
"""The least memory a session hook is loaded with (a QuickJS runtime needs about 1 MB to start)."""


def clip(text: str, limit: int = MAX_REASON) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- payload shapes -------------------------------------------------------------------------------
# A TRANSFORM must hand back exactly the keys it was given, with the same types; anything else is
# "malformed" (HOOKS.md, "Trigger points and payloads"). Checked by hand: this runs on every transform.


def _opt_str(v: object) -> bool:
    return v is None or type(v) is str


def _check_tool_call(d: dict[str, Any]) -> str | None:
    if d.keys() != {"tool", "args"}:
        return "keys must be exactly tool, args"
    if type(d["tool"]) is not str:
        return "tool must be a string"
    return None


def _check_shell_exec(d: dict[str, Any]) -> str | None:
    if d.keys() != {"command", "shell", "cwd", "env"}:
        return "keys must be exactly command, shell, cwd, env"
    if type(d["command"]) is not str:
        return "command must be a string"
    if not _opt_str(d["shell"]) or not _opt_str(d["cwd"]):
        return "shell and cwd must be strings or null"
    env = d["env"]
    if type(env) is not dict or not all(type(v) is str for v in env.values()):
        return "env must be an object of strings"
    return None


def _check_tool_result(d: dict[str, Any]) -> str | None:
    if d.keys() != {"tool", "success", "result", "error"}:
        return "keys must be exactly tool, success, result, error"
    if type(d["tool"]) is not str:
        return "tool must be a string"
    if type(d["success"]) is not bool:
        return "success must be a boolean"
    if not _opt_str(d["error"]):
        return "error must be a string or null"
    return None


def _check_shell_output(d: dict[str, Any]) -> str | None:
    if d.keys() != {"stream", "text"}:
        return "keys must be exactly stream, text"
    if d["stream"] not in ("stdout", "stderr"):
        return 'stream must be "stdout" or "stderr"'
    if type(d["text"]) is not str:
        return "text must be a string"
    return None


def _check_hook_load(d: dict[str, Any]) -> str | None:
    # A hook may only allow or block a load: a rewritten source or kind would skip the capability
    # the load was admitted under (HOOKS.md, "Trigger points and payloads").
    return "a hook load can only be allowed or blocked, not transformed"


def _check_connect(d: dict[str, Any]) -> str | None:
    # A connection is allowed or blocked: a rewritten host would be a destination no rule was asked about.
    return "a connection can only be allowed or blocked, not transformed"


_SHAPES: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "before_tool_call": _check_tool_call,
    "before_shell_exec": _check_shell_exec,
    "after_tool_result": _check_tool_result,
    "on_shell_output": _check_shell_output,
    "before_hook_load": _check_hook_load,
    "before_connect": _check_connect,
}


def shape_error(trigger: str, data: object) -> str | None:
    """Check that ``data`` has the payload shape of ``trigger``.

    Args:
        trigger: one of :data:`TRIGGERS`.
        data: a decoded JSON value.

    Returns:
        None if it fits, else what is wrong, in words.

    Raises:
        ValueError: ``trigger`` is not one of :data:`TRIGGERS`.
    """
    check = _SHAPES.get(trigger)
    if check is None:
        raise ValueError(f"unknown hook trigger {trigger!r}; known: {', '.join(TRIGGERS)}")
    if type(data) is not dict:
        return f"data must be an object, not {_json_type(data)}"
    return check(data)


def _json_type(v: object) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(v), "an object"
    )


# --- JSON across the engine boundary --------------------------------------------------------------

_std_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is optional
    _orjson = None  # type: ignore[assignment]  # None marks it missing; every use checks for it


def dumps(value: Any) -> str:
    """Compact JSON text (orjson when installed: ~10x faster than ``json`` on small payloads).

    Raises:
        ValueError: the value is not JSON (NaN, a non-string key the stdlib refuses, ...).
        TypeError: likewise.
    """
    if _orjson is not None:
        try:
            return _orjson.dumps(value).decode()
        except TypeError:
            pass  # lone surrogates, integers beyond 64 bits: the stdlib escapes / writes them
    return _std_encode(value)


loads: Callable[[str | bytes], Any] = _orjson.loads if _orjson is not None else json.loads

_ARTICLE = {"allow": "an allow", "block": "a block", "transform": "a transform"}
_DECISION_KEYS = {"allow": frozenset({"action"}), "block": frozenset({"action", "reason"}), "transform": frozenset({"action", "data"})}


def decode_decision(text: str | bytes | None, trigger: str, hook_id: str) -> Decision:
    """Turn a hook's JSON answer into a :class:`Decision`, validating it completely.

    Raises:
        HookFailure: the answer is not JSON, not one of the three decision forms, has unknown keys,
            a block without a non-empty string reason, or a transform whose data does not have the
            shape of ``trigger``'s payload.
    """
    if text is None:
        raise HookFailure(hook_id, trigger, "returned a malformed decision: undefined (return {action: ...})")
    try:
        obj = loads(text)
    except ValueError as exc:
        raise HookFailure(hook_id, trigger, f"returned a malformed decision: not JSON ({exc})") from None
    if type(obj) is not dict:
        raise HookFailure(hook_id, trigger, f"returned a malformed decision: {_json_type(obj)}, not an object")
    action = obj.get("action")
    keys = _DECISION_KEYS.get(action) if type(action) is str else None
    if keys is None:
        raise HookFailure(
            hook_id, trigger, f'returned a malformed decision: action must be "allow", "block" or "transform", not {clip(dumps(action), 80)}'
        )
    if obj.keys() != keys:
        raise HookFailure(
            hook_id, trigger, f"returned a malformed decision: {_ARTICLE[str(action)]} has exactly the keys {', '.join(sorted(keys))}, got {', '.join(sorted(obj))}"
        )
    if action == "allow":
        return Decision("allow", hook_id=hook_id)
    if action == "block":
        reason = obj["reason"]
        if type(reason) is not str or not reason:
            raise HookFailure(hook_id, trigger, "returned a malformed decision: a block needs a non-empty string reason")
        return Decision("block", reason=clip(reason), hook_id=hook_id)
    data = obj["data"]
    problem = shape_error(trigger, data)
    if problem is not None:
        raise HookFailure(hook_id, trigger, f"returned a malformed transform: {problem}")
    return Decision("transform", data=data, hook_id=hook_id)


class Hook:
    """One loaded hook. Make one with :func:`smith_fast.hooks.load_hook`.

    A hook is called for the triggers it defines; for any other trigger :meth:`call` allows.

    Attributes:
        id: ``js-<12 hex>`` / ``rust-<12 hex>`` from the source hash, unless the loader named it.
        kind: ``"js"`` or ``"rust"``.
        triggers: the trigger points the hook defines (a subset of :data:`TRIGGERS`, never empty).
        source_hash: SHA-256 (hex) of the source text.
    """

    id: str
    kind: Literal["js", "rust"]
    triggers: frozenset[str]
    source_hash: str
    # Set by engines that run synchronously on the calling thread (JS): HookChain calls it directly
    # and saves a coroutine per hook per trigger.
    call_sync: Callable[[str, dict[str, Any]], Decision] | None = None

    async def call(self, trigger: str, payload: dict[str, Any]) -> Decision:
        """Run the hook's function for ``trigger`` on ``payload``.

        Args:
            trigger: one of :data:`TRIGGERS`.
            payload: the trigger's payload (HOOKS.md, "Trigger points and payloads"); it is not modified.

        Returns:
            The hook's :class:`Decision` (``allow`` if the hook does not define ``trigger``).

        Raises:
            HookFailure: the hook threw/panicked, crashed, ran past its time or memory limit, or
                answered something malformed. The hook stays usable.
        """
        raise NotImplementedError

    async def close(self) -> None:
        """Release the hook's engine (its QuickJS context, its child process). Idempotent."""

    def describe(self) -> dict[str, Any]:
        """What a successful load reports: ``{"hook_id", "kind", "triggers", "source_hash"}``."""
        return {
            "hook_id": self.id,
            "kind": self.kind,
            "triggers": [t for t in TRIGGERS if t in self.triggers],
            "source_hash": self.source_hash,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} triggers={sorted(self.triggers)}>"
