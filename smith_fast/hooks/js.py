"""JavaScript hooks: one embedded QuickJS context per hook (the ``quickjs-ng`` bindings).

The context has only the ECMAScript built-ins plus ``console``: no ``std``/``os`` modules, no
``require``, no ``fetch``, no module loader, no timers, nothing of the process environment (the
bindings add nothing else, and ``tests/test_hooks.py`` checks it). The payload crosses the boundary
as JSON text, parsed and re-serialized inside the engine by a small wrapper per trigger; the answer
``{"action":"allow"}`` is recognised by string comparison before any decoding.

Each hook runs off the event loop, on a thread of its own (HOOKS.md, "Execution model"): the
bindings release the GIL while QuickJS runs, so a hook that computes for its whole time limit
delays only the requests waiting for that hook (its session's, or every session's for a global
hook), never the loop and the other sessions. A context must only ever be used from the thread
that made it (the bindings crash otherwise), so the context is built, called, reset and freed on
that one thread. The thread runs at a lower scheduling priority (nice +10) than the loop, so on a
busy machine the loop gets the CPU first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any

from .model import Decision, Hook, HookFailure, HookLimits, HookLoadError, clip, decode_decision, dumps, loads, log

import importlib.util
from types import ModuleType

_QUICKJS: list[ModuleType] = []  # the quickjs module once imported: importing it starts a thread, so
# not at start-up (a service with --workspaces enters its user namespace single-threaded first)


def _engine() -> Any:
    if not _QUICKJS:
        import quickjs

        _QUICKJS.append(quickjs)
    return _QUICKJS[0]

__all__ = ["JS_FUNCTIONS", "JsHook", "engine_available", "load_js", "load_js_async"]

HOOK_THREAD_NICE = 10  # how much lower than the loop a hook's thread is scheduled

JS_FUNCTIONS: dict[str, str] = {
    "before_tool_call": "beforeToolCall",
    "before_shell_exec": "beforeShellExec",
    "after_tool_result": "afterToolResult",
    "on_shell_output": "onShellOutput",
    "before_hook_load": "beforeHookLoad",
    "before_connect": "beforeConnect",
}
"""The global function a JavaScript hook defines for each trigger."""

_ALLOW_TEXT = '{"action":"allow"}'
_LOGGED = '["\\u0001",'  # how an answer that carries console output starts (see _PRELUDE)
_MAX_LOG = 2000
_MAX_LOG_LINES = 100

# Evaluated before the hook's own script. The wrappers name the hook's functions as identifiers, not
# as globalThis properties, so `const beforeToolCall = (p) => ...` works as well as a declaration.
# JSON.parse/stringify are captured first, so a hook that replaces them does not break the wrappers.
# The bindings refuse calls into Python while a time limit is set, so console output is buffered in
# the context (bounded) and comes back with the answer: JSON ["\u0001", lines, answer] instead of the
# answer alone. The allow fast path is unaffected.
# Every string handed back to Python is made by JSON.stringify, never by `+`: quickjs-ng makes a
# concatenation longer than a few hundred characters a rope string (JS_TAG_STRING_ROPE, -6), which
# the bindings' value conversion (quickjs_to_python handles JS_TAG_STRING only) rejects with
# "TypeError: Unknown quickjs tag: -6", so a long decision with console output was lost.
_PRELUDE = (
    "const __smith_parse = JSON.parse, __smith_stringify = JSON.stringify, __smith_logs = [];\n"
    "function __smith_out(r) {\n"
    "  if (__smith_logs.length === 0) return r;\n"
    '  return __smith_stringify(["\\u0001", __smith_logs.splice(0), r === undefined ? null : r]);\n'
    "}\n"
    'function __smith_drain() { return __smith_stringify(__smith_logs.splice(0)); }\n'
    + "".join(
        f"function __smith_call_{name}(s) {{ return __smith_out(__smith_stringify({name}(__smith_parse(s)))); }}\n"
        for name in JS_FUNCTIONS.values()
    )
    + f"""
function __smith_log(level, a) {{
  if (__smith_logs.length >= {_MAX_LOG_LINES}) return;
  const text = a.map((x) => {{
    if (typeof x === "string") return x;
    try {{ const s = __smith_stringify(x); return s === undefined ? String(x) : s; }} catch (e) {{ return String(x); }}
  }}).join(" ");
  __smith_logs.push([level, text.slice(0, {_MAX_LOG})]);
}}
globalThis.console = {{
  log: (...a) => __smith_log("info", a),
  info: (...a) => __smith_log("info", a),
  warn: (...a) => __smith_log("warning", a),
  error: (...a) => __smith_log("error", a),
  debug: (...a) => __smith_log("debug", a),
}};
"""
)
_DETECT = "[" + ", ".join(f'typeof {name} === "function"' for name in JS_FUNCTIONS.values()) + '].join(",")'


def engine_available() -> bool:
    """Whether the QuickJS bindings import."""
    return bool(_QUICKJS) or importlib.util.find_spec("quickjs") is not None


def _summary(message: str) -> str:
    """``Error: boom`` plus its innermost frames, on one line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return clip(" | ".join(lines[:4]), 1000)


class JsHook(Hook):
    """A JavaScript hook in its own QuickJS context. Make one with :func:`load_js`."""

    kind = "js"

    def __init__(self, source: str, limits: HookLimits, hook_id: str | None = None) -> None:
        if not engine_available():
            raise HookLoadError("JavaScript hooks need the quickjs-ng package, which is not installed")
        if "\0" in source:  # the engine takes a C string: its ValueError would reach the peer as an internal error
            raise HookLoadError(f"the JavaScript hook holds a NUL character (offset {source.index(chr(0))}), which a script may not")
        import hashlib  # here, not at the top: its OpenSSL start (~1 ms) is on every service's start otherwise

        self.source_hash = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
        self.id = hook_id or f"js-{self.source_hash[:12]}"
        self.limits = limits
        self._source = source
        self._allow = Decision("allow", hook_id=self.id)
        self._broken: str | None = None
        self._fns: dict[str, Any] = {}
        self._context: Any = None
        self._drain: Any = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"hook-{self.id}", initializer=_lower_priority)
        try:
            self.triggers = frozenset(self._thread.submit(self._build).result())
        except BaseException:
            self._thread.shutdown(wait=False)
            raise
        if not self.triggers:
            self._thread.shutdown(wait=False)
            raise HookLoadError(
                "the JavaScript hook defines none of the hook functions " + ", ".join(JS_FUNCTIONS.values())
            )

    def _build(self) -> list[str]:
        """A fresh context with the hook's script run in it; returns the triggers it defines."""
        ctx = _engine().Context()
        ctx.set_memory_limit(self.limits.memory_bytes)
        ctx.set_time_limit(self.limits.call_timeout)
        ctx.eval(_PRELUDE)
        try:
            ctx.eval(self._source)
            defined = ctx.eval(_DETECT).split(",")
        except _engine().JSException as exc:
            # StackOverflow is a JSException too; "interrupted" is the time limit, hit at top level.
            raise HookLoadError("the JavaScript hook does not load", str(exc).strip()) from None
        triggers = [t for t, d in zip(JS_FUNCTIONS, defined) if d == "true"]
        self._fns = {t: ctx.get(f"__smith_call_{JS_FUNCTIONS[t]}") for t in triggers}
        self._drain = ctx.get("__smith_drain")
        self._context = ctx
        self._flush_console()
        return triggers

    def _flush_console(self) -> None:
        """Log what the script printed with ``console.*`` during a call that failed (or at load)."""
        try:
            self._emit(loads(self._drain()))
        except Exception:  # a context that just ran out of memory may not manage even this
            pass

    def _emit(self, lines: list[list[str]]) -> None:
        for level, text in lines:
            log.log(_LEVELS.get(level, 20), "hook console", extra={"fields": {"hook_id": self.id, "text": text}})

    def _reset(self) -> None:
        """Rebuild the context after a timeout or memory exhaustion: its state may be half-updated
        or still full. The hook's global variables start over."""
        try:
            self._build()
        except HookLoadError as exc:
            self._broken = f"could not be restarted after a failure: {exc}"
            self._fns = {}
            log.error("hook restart failed", extra={"fields": {"hook_id": self.id, "error": str(exc)}})

    def _call(self, trigger: str, payload: dict[str, Any]) -> Decision:
        fn = self._fns.get(trigger)
        if fn is None:
            if self._broken is not None and trigger in self.triggers:
                raise HookFailure(self.id, trigger, self._broken)
            return self._allow
        try:
            text = dumps(payload)
        except (TypeError, ValueError) as exc:
            raise HookFailure(self.id, trigger, f"its payload is not JSON ({exc})") from None
        try:
            out = fn(text)
        except _engine().StackOverflow as exc:
            self._flush_console()
            self._reset()
            raise HookFailure(self.id, trigger, f"overflowed its stack: {_summary(str(exc))}") from None
        except _engine().JSException as exc:
            self._flush_console()
            message = str(exc)
            if message.startswith("InternalError: interrupted"):
                self._reset()
                reason = f"ran past its time limit of {self.limits.call_timeout:g} s"
            elif message.startswith("InternalError: out of memory"):
                self._reset()
                reason = f"ran out of memory (limit {self.limits.memory_bytes} bytes)"
            else:
                reason = f"threw {_summary(message)}"
            raise HookFailure(self.id, trigger, reason) from None
        except Exception as exc:  # the bindings' conversions: should not happen with JSON text
            raise HookFailure(self.id, trigger, f"engine error: {type(exc).__name__}: {exc}") from None
        if out == _ALLOW_TEXT:
            return self._allow
        if type(out) is str and out.startswith(_LOGGED):
            _, lines, out = loads(out)
            self._emit(lines)
            if out == _ALLOW_TEXT:
                return self._allow
        return decode_decision(out, trigger, self.id)

    async def call(self, trigger: str, payload: dict[str, Any]) -> Decision:
        if trigger not in self.triggers:  # nothing to run: no thread hop
            return self._allow
        try:
            future = self._thread.submit(self._call, trigger, payload)
        except RuntimeError:  # closed
            raise HookFailure(self.id, trigger, "the hook is closed") from None
        return await asyncio.wrap_future(future)

    call.__doc__ = Hook.call.__doc__

    def call_blocking(self, trigger: str, payload: dict[str, Any]) -> Decision:
        """:meth:`call` for a caller that is not on an event loop (it waits for the hook's thread)."""
        return self._thread.submit(self._call, trigger, payload).result()

    def _free(self) -> None:
        self._broken = "the hook is closed"
        self._fns = {}
        self._context = self._drain = None

    async def close(self) -> None:
        try:
            future = self._thread.submit(self._free)  # freed on the thread that made it
        except RuntimeError:
            return  # closed already
        self._thread.shutdown(wait=False)
        await asyncio.wrap_future(future)


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _lower_priority() -> None:
    """Schedule the calling thread (a hook's) below the loop: on Linux, nice applies per thread."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HOOK_THREAD_NICE)
    except (OSError, AttributeError):  # not Linux, or not permitted: same priority as the loop
        pass


def load_js(source: str, limits: HookLimits = HookLimits(), hook_id: str | None = None) -> JsHook:
    """Load a JavaScript hook: run its script in a new context and find its hook functions.

    Args:
        source: the script (not an ES module): it defines any of the global functions in
            :data:`JS_FUNCTIONS`.
        limits: its memory and time limits; the time limit also bounds the script's top level.
        hook_id: the id to give it (default ``js-`` + 12 hex digits of the source's SHA-256).

    Returns:
        The loaded hook.

    Raises:
        HookLoadError: a syntax error, an exception or a limit hit at top level (``diagnostics`` is
            the engine's message with its line:column), no hook function defined, or no engine.
    """
    return JsHook(source, limits, hook_id)


async def load_js_async(source: str, limits: HookLimits = HookLimits(), hook_id: str | None = None) -> JsHook:
    """:func:`load_js` from an event loop: the script's top level runs off the loop too."""
    return await asyncio.to_thread(JsHook, source, limits, hook_id)
