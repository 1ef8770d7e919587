"""The hook policy of one session: global hooks (``serve --hook``) first, then the session's own.

Every gate reports a ``HookResultEvent`` for the request it intercepted, so a frontend always knows
what the policy did; a block stops the request before anything runs (HOOKS.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError
from ..hooks import ChainResult, Hook, HookChain, HookLoadError, hook_action, load_action, load_hook
from ..hooks.model import MIN_HOOK_MEMORY
from ..logs import get_logger
from ..pb import smith_pb2 as pb

if TYPE_CHECKING:
    from .. import tracing
    from ..hooks import HookLimits

__all__ = ["SessionHooks", "blocked"]

log = get_logger("smith_fast.policy")


def blocked(result: ChainResult, what: str, rid: str) -> ProtocolError:
    """The error a blocked request ends with: PERMISSION_DENIED naming the hook and its reason."""
    return ProtocolError(
        f"{what} blocked by hook {result.hook_id}: {result.reason}",
        pb.ERROR_CODE_PERMISSION_DENIED,
        rid,
        {"reason": "hook_blocked", "hook_id": result.hook_id or ""},
    )


class SessionHooks:
    """The hooks that apply to one session, and the gates the session's requests pass through.

    Args:
        global_hooks: the service's hooks (``serve --hook``), run first; read again whenever a
            session hook is loaded.
        failure: ``--hook-failure``: what a failing hook means (``HookChain``).
        limits: the limits hooks load and run under.
        emit: sends an event (each gate's ``HookResultEvent``).
        count: counts one hook decision (``allow``, ``block``, ``transform``).
        spans: request id → its command span, where decisions are recorded.
        peer: names the session in logs.
        decided: told every decision that is reported (request id, trigger, action, hook id,
            reason): the audit trail.
    """

    def __init__(
        self,
        global_hooks: Sequence[Hook],
        *,
        failure: str,
        limits: HookLimits,
        emit: Callable[[pb.Event], None],
        count: Callable[[str], None],
        spans: Mapping[str, tracing.SpanHandle],
        peer: str,
        decided: Callable[[str, str, str, str | None, str | None], None] | None = None,
    ) -> None:
        self._global = global_hooks
        self._failure = failure
        self._limits = limits
        self._emit = emit
        self._count = count
        self._spans = spans
        self._peer = peer
        self._decided = decided
        self.own: list[Hook] = []
        self._use(self._build())

    @property
    def owns_hooks(self) -> bool:
        """Whether closing the session closes hooks (it loaded some)."""
        return bool(self.own)

    def _use(self, chain: HookChain) -> None:
        self._chain = chain
        # Looked at for every tool call (commands._tool_call_now: none of them, the call is answered
        # in the step that read it): one attribute, not two calls per call.
        self.tools_hooked = chain.handles("before_tool_call") or chain.handles("after_tool_result")

    def _build(self) -> HookChain:
        return HookChain([*self._global, *self.own], failure=self._failure)  # type: ignore[arg-type]  # ServiceConfig.hook_failure is a str the CLI restricts to closed/open

    def handles(self, trigger: str) -> bool:
        return self._chain.handles(trigger)

    async def load(self, rid: str, cmd: pb.HookLoadCommand) -> None:
        """Load a session hook; answer ALLOW naming its id and triggers, or raise with diagnostics.

        The hooks already in force (global first) see the load first (``before_hook_load``) and
        may block it; nothing is compiled or run before they allowed it."""
        if self.handles("before_hook_load"):
            result = await self.gate("before_hook_load", rid, {"hook_type": cmd.hook_type, "source": cmd.script})
            if result.action != "allow":
                raise blocked(result, f"loading a {cmd.hook_type} hook", rid)
        try:
            hook = await load_hook(cmd.hook_type, cmd.script, limits=self._admit_hook(rid))
        except HookLoadError as exc:
            raise ProtocolError(
                f"hook did not load: {exc}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "hook_load_failed"}
            ) from None
        if any(h.id == hook.id for h in [*self._global, *self.own]):
            await hook.close()
            raise ProtocolError(f"hook {hook.id} is already loaded", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_hook"})
        self.own.append(hook)
        self._use(self._build())
        self._report(rid, load_action(hook))
        log.info("hook loaded", extra={"fields": {"peer": self._peer, "hook_id": hook.id, "triggers": sorted(hook.triggers)}})

    def _admit_hook(self, rid: str) -> HookLimits:
        """The limits one more session hook loads under, within ``--max-hooks-per-session`` and
        ``--max-session-hook-memory``; RESOURCE_EXHAUSTED naming the limit when it would exceed one."""
        limits = self._limits
        if len(self.own) >= limits.session_hooks:
            raise ProtocolError(
                f"this session has loaded {len(self.own)} hooks, the limit (--max-hooks-per-session {limits.session_hooks}); nothing was loaded",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                rid,
                {"reason": "too_many_hooks", "limit": str(limits.session_hooks)},
            )
        reserved = sum(getattr(h, "limits", limits).memory_bytes for h in self.own)
        left = limits.session_memory_bytes - reserved
        if left < min(MIN_HOOK_MEMORY, limits.memory_bytes):
            raise ProtocolError(
                f"this session's hooks already hold {reserved} of the {limits.session_memory_bytes} bytes of "
                f"--max-session-hook-memory (a hook needs at least {min(MIN_HOOK_MEMORY, limits.memory_bytes)}); nothing was loaded",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                rid,
                {"reason": "hook_memory", "limit": str(limits.session_memory_bytes)},
            )
        return limits if left >= limits.memory_bytes else dataclasses.replace(limits, memory_bytes=left)

    def _report(self, rid: str, action: pb.HookAction) -> None:
        event = pb.Event()
        event.hook_result.request_id = rid
        event.hook_result.action.CopyFrom(action)
        self._emit(event)

    async def gate(self, trigger: str, rid: str, payload: dict[str, Any], allowed_data: bytes | None = None) -> ChainResult:
        """Run the chain for ``trigger`` and report the decision for request ``rid``."""
        result = await self._chain.run(trigger, payload)
        self._count(result.action)
        if self._decided is not None:
            self._decided(rid, trigger, result.action, result.hook_id, result.reason)
        span = self._spans.get(rid)
        if span is not None:
            span.hook_decision(trigger, result.action, result.reason)
        self._report(rid, hook_action(result, allowed_data))
        return result

    async def before_tool_call(self, rid: str, tool: str, args: bytes) -> tuple[str, bytes]:
        """The tool and args to run after the hooks; raises PERMISSION_DENIED on a block."""
        if not self.handles("before_tool_call"):
            return tool, args
        try:
            value = json.loads(args) if args else {}
        except (ValueError, RecursionError):
            return tool, args  # the registry refuses it with a clear message; nothing runs
        result = await self.gate("before_tool_call", rid, {"tool": tool, "args": value}, allowed_data=args)
        if result.action == "block":
            raise blocked(result, f"tool call {tool}", rid)
        if result.action == "transform":
            return result.payload["tool"], json.dumps(result.payload["args"]).encode()
        return tool, args

    async def after_tool_result(self, rid: str, tool: str, success: bool, result: bytes, error: str | None) -> tuple[bool, bytes, str | None]:
        if not self.handles("after_tool_result"):
            return success, result, error
        try:
            value = json.loads(result) if result else None
        except (ValueError, RecursionError):
            value = result.decode("utf-8", "replace")
        res = await self.gate("after_tool_result", rid, {"tool": tool, "success": success, "result": value, "error": error})
        if res.action == "block":
            return False, b"", f"result withheld by hook {res.hook_id}: {res.reason}"
        if res.action == "transform":
            p = res.payload
            return bool(p["success"]), (json.dumps(p["result"]).encode() if p["result"] is not None else b""), p["error"]
        return success, result, error

    async def before_shell_exec(self, rid: str, cmd: pb.ShellExecCommand) -> pb.ShellExecCommand:
        if not self.handles("before_shell_exec"):
            return cmd
        payload = {
            "command": cmd.command,
            "shell": cmd.shell if cmd.HasField("shell") else None,
            "cwd": cmd.cwd if cmd.HasField("cwd") else None,
            "env": dict(cmd.env),
        }
        result = await self.gate("before_shell_exec", rid, payload)
        if result.action == "block":
            raise blocked(result, "shell command", rid)
        if result.action == "transform":
            p = result.payload
            new = pb.ShellExecCommand(request_id=cmd.request_id, command=p["command"], env=p["env"])
            if p.get("shell") is not None:
                new.shell = p["shell"]
            if p.get("cwd") is not None:
                new.cwd = p["cwd"]
            if cmd.HasField("timeout_ms"):
                new.timeout_ms = cmd.timeout_ms
            return new
        return cmd

    async def on_shell_output(self, rid: str, stream: str, text: str) -> str | None:
        """The text to send for one output chunk; None when a hook blocked it."""
        result = await self._chain.run("on_shell_output", {"stream": stream, "text": text})
        self._count(result.action)
        if result.action == "allow":
            return text  # per-chunk ALLOWs are not reported: only what changed the stream is
        if self._decided is not None:
            self._decided(rid, "on_shell_output", result.action, result.hook_id, result.reason)
        self._report(rid, hook_action(result))
        return None if result.action == "block" else str(result.payload["text"])

    async def close(self) -> None:
        """Close the session's hooks."""
        for hook in self.own:
            await hook.close()
        self.own.clear()
