"""Hooks (HOOKS.md) with a real QuickJS engine and a real rustc, on uvloop and stdlib asyncio.

The Rust hooks are compiled once per run into a module-scoped cache directory (the ``compiled``
fixture); every test then loads them from that cache, which takes milliseconds. The ``run`` fixture
runs each async body on a fresh loop of each kind, fails the test if the loop's exception handler
fired, and checks that no Rust hook process was left running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smith_fast.hooks import (
    JS_FUNCTIONS,
    TRIGGERS,
    Decision,
    Hook,
    HookChain,
    HookFailure,
    HookLimits,
    HookLoadError,
    available_kinds,
    hook_action,
    kind_from_path,
    load_action,
    load_hook,
    load_hook_file,
    shape_error,
)
from smith_fast.hooks import rust as rust_engine
from smith_fast.hooks.rust import RustHook, compile_hook
from smith_fast.pb import smith_pb2 as pb

from .conftest import Runner

pytestmark = pytest.mark.timeout(180)

FAST = HookLimits(call_timeout=0.25)  # for the runaway-loop tests: a quick time limit

# -- the hooks under test --------------------------------------------------------------------------
# JS_ALL and RUST_ALL behave alike on the payloads the trigger tests send; each also has failure
# modes of its own, selected by the tool name.

JS_ALL = r"""
let calls = 0;
function beforeToolCall(p) {
  calls++;
  switch (p.tool) {
    case "fs.write": return { action: "block", reason: `writes are not allowed (${p.args.path})` };
    case "fs.read": p.args.path = "/redacted"; return { action: "transform", data: p };
    case "count": return { action: "block", reason: `call ${calls}` };
    case "echo": return { action: "transform", data: p };
    case "throw": throw new Error("tool throw is cursed");
    case "malformed": return 42;
    case "undefined": return;
    case "unknown_action": return { action: "maybe" };
    case "no_reason": return { action: "block" };
    case "extra_key": return { action: "allow", why: "typo" };
    case "async": return Promise.resolve({ action: "allow" });
    case "wrong_shape": return { action: "transform", data: { tool: "x" } };
    case "loop": for (;;) {}
    case "memory": { const hoard = []; for (;;) hoard.push("x".repeat(1 << 20) + hoard.length); }
    case "stack": { const f = (n) => f(n + 1) + 1; return f(0); }
    case "console": console.log("looked at", p); console.warn("careful"); return { action: "allow" };
    default: return { action: "allow" };
  }
}
function beforeShellExec(p) {
  if (p.command.includes("rm -rf")) return { action: "block", reason: "refusing rm -rf" };
  if (p.command.startsWith("echo")) { p.env.HOOKED = "js"; return { action: "transform", data: p }; }
  return { action: "allow" };
}
const afterToolResult = (p) => {
  if (p.result && typeof p.result.text === "string" && p.result.text.includes("SECRET")) {
    p.result.text = "[redacted]";
    return { action: "transform", data: p };
  }
  if (!p.success) return { action: "block", reason: `tool failed: ${p.error}` };
  return { action: "allow" };
};
function onShellOutput(p) {
  if (p.text.includes("password")) return { action: "block", reason: "output contains a password" };
  if (p.stream === "stderr") return { action: "transform", data: { stream: "stderr", text: p.text.toUpperCase() } };
  return { action: "allow" };
}
function beforeHookLoad(p) {
  return p.source.includes("evil") ? { action: "block", reason: `no evil ${p.hook_type} hooks` } : { action: "allow" };
}
function beforeConnect(p) {
  return p.host.endsWith(".evil") ? { action: "block", reason: `not ${p.host}:${p.port}` } : { action: "allow" };
}
"""

RUST_ALL = r"""
use std::collections::BTreeMap; // a hook may `use` what it likes: the prelude keeps its imports private
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

static CALLS: AtomicU64 = AtomicU64::new(0);

fn before_tool_call(p: &Json) -> Action {
    let n = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    match p["tool"].as_str().unwrap_or("") {
        "fs.write" => Action::block(format!("writes are not allowed ({})", p["args"]["path"].as_str().unwrap_or("?"))),
        "fs.read" => {
            let mut q = p.clone();
            q.get_mut("args").unwrap().set("path", "/redacted");
            Action::transform(q)
        }
        "count" => Action::block(format!("call {}", n)),
        "echo" => Action::transform(p.clone()),
        "introspect" => {
            let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default();
            let mut seen: BTreeMap<&str, String> = BTreeMap::new();
            seen.insert("env", std::env::vars_os().count().to_string());
            seen.insert("cwd", cwd);
            Action::block(format!("{:?}", seen))
        }
        "panic" => panic!("tool {} is cursed", "panic"),
        "abort" => std::process::abort(),
        "loop" => loop {
            std::hint::black_box(n);
        },
        "bigalloc" => {
            let v: Vec<u8> = std::hint::black_box(Vec::with_capacity(1 << 30));
            Action::block(format!("allocated {} bytes", v.capacity()))
        }
        "wrong_shape" => Action::transform(Json::from_pairs(vec![("tool", Json::from("x"))])),
        "garbage" => {
            use std::os::unix::io::FromRawFd;
            let fd: i32 = std::env::args().nth(1).unwrap().parse().unwrap();
            let mut answers = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
            answers.write_all(b"garbage\n").unwrap();
            Action::Allow
        }
        "print" => {
            println!("hello from stdout");
            eprintln!("hello from stderr");
            Action::Allow
        }
        _ => Action::Allow,
    }
}

fn before_shell_exec(p: &Json) -> Action {
    let cmd = p["command"].as_str().unwrap_or("");
    if cmd.contains("rm -rf") {
        return Action::block("refusing rm -rf");
    }
    if cmd.starts_with("echo") {
        let mut q = p.clone();
        q.get_mut("env").unwrap().set("HOOKED", "rust");
        return Action::transform(q);
    }
    Action::Allow
}

fn after_tool_result(p: &Json) -> Action {
    if p["result"]["text"].as_str().map_or(false, |t| t.contains("SECRET")) {
        let mut q = p.clone();
        q.get_mut("result").unwrap().set("text", "[redacted]");
        return Action::transform(q);
    }
    if p["success"].as_bool() == Some(false) {
        return Action::block(format!("tool failed: {}", p["error"].as_str().unwrap_or("")));
    }
    Action::Allow
}

fn on_shell_output(p: &Json) -> Action {
    let text = p["text"].as_str().unwrap_or("");
    if text.contains("password") {
        return Action::block("output contains a password");
    }
    if p["stream"].as_str() == Some("stderr") {
        return Action::transform(Json::from_pairs(vec![
            ("stream", Json::from("stderr")),
            ("text", Json::from(text.to_uppercase())),
        ]));
    }
    Action::Allow
}

fn before_hook_load(p: &Json) -> Action {
    if p["source"].as_str().unwrap_or("").contains("evil") {
        return Action::block(format!("no evil {} hooks", p["hook_type"].as_str().unwrap_or("?")));
    }
    Action::Allow
}

fn before_connect(p: &Json) -> Action {
    let host = p["host"].as_str().unwrap_or("");
    if host.ends_with(".evil") {
        return Action::block(format!("not {}:{}", host, p["port"]));
    }
    Action::Allow
}

hooks! { before_tool_call, before_shell_exec, after_tool_result, on_shell_output, before_hook_load, before_connect }
"""

# Append a marker to args.path, so the order of a chain shows in the result.
JS_APPEND = 'function beforeToolCall(p) { p.args.path += "/js"; return { action: "transform", data: p }; }'
RUST_APPEND = r"""
fn before_tool_call(p: &Json) -> Action {
    let mut q = p.clone();
    let path = format!("{}/rs", q["args"]["path"].as_str().unwrap_or(""));
    q.get_mut("args").unwrap().set("path", path);
    Action::transform(q)
}
hooks! { before_tool_call }
"""
RUST_BAD_TYPE = "fn before_tool_call(_p: &Json) -> Action {\n    42\n}\nhooks! { before_tool_call }\n"
RUST_UNKNOWN_TRIGGER = "fn before_everything(_p: &Json) -> Action { Action::Allow }\nhooks! { before_everything }\n"

SOURCES = {"js": JS_ALL, "rust": RUST_ALL}
KINDS = ["js", "rust"]


@dataclass
class Compiled:
    cache: Path
    first_load_hits: dict[str, bool]  # what cache_hit said when each source was loaded first
    concurrent_hits: list[bool]  # two loads of RUST_APPEND at once, into an empty cache
    entries_after_concurrent: list[str]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    """Compile the Rust hooks once for the whole module (a few seconds each)."""
    cache = tmp_path_factory.mktemp("hook-cache")

    async def build() -> Compiled:
        hits = {}
        hook = await load_hook("rust", RUST_ALL, cache_dir=cache, trusted=True)
        hits["all"] = hook.cache_hit  # type: ignore[attr-defined]
        await hook.close()
        pair = await asyncio.gather(
            load_hook("rust", RUST_APPEND, cache_dir=cache), load_hook("rust", RUST_APPEND, cache_dir=cache)
        )
        concurrent = sorted(h.cache_hit for h in pair)  # type: ignore[attr-defined]
        entries = sorted(os.listdir(cache))
        for h in pair:
            await h.close()
        return Compiled(cache, hits, concurrent, entries)

    return asyncio.run(build())


@pytest.fixture
def after_loop() -> Callable[[], None]:
    """Once a test's loop is closed (the ``run`` fixture, tests/conftest.py): no rust hook left running."""

    def check() -> None:
        assert not list(rust_engine._LIVE), f"rust hooks left running: {list(rust_engine._LIVE)}"

    return check


@asynccontextmanager
async def loaded(kind: str, source: str, compiled: Compiled, limits: HookLimits = HookLimits(), **kw: Any) -> AsyncIterator[Hook]:
    # the test hooks probe their own sandbox (std::env, unsafe ...): loaded as the operator's
    kw.setdefault("trusted", True)
    hook = await load_hook(kind, source, limits=limits, cache_dir=compiled.cache, **kw)
    try:
        yield hook
    finally:
        await hook.close()


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"tool": name, "args": args}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


# -- triggers: every one, in both languages, allow / block / transform -----------------------------

TRIGGER_CASES = [
    # (trigger, payload, expected action, expected data or reason)
    ("before_tool_call", tool("fs.list", path="."), "allow", None),
    ("before_tool_call", tool("fs.write", path="/etc/passwd"), "block", "writes are not allowed (/etc/passwd)"),
    ("before_tool_call", tool("fs.read", path="secret.txt"), "transform", tool("fs.read", path="/redacted")),
    (
        "before_shell_exec",
        {"command": "ls", "shell": None, "cwd": None, "env": {}},
        "allow",
        None,
    ),
    (
        "before_shell_exec",
        {"command": "rm -rf /", "shell": "/bin/sh", "cwd": "/", "env": {}},
        "block",
        "refusing rm -rf",
    ),
    (
        "before_shell_exec",
        {"command": "echo hi", "shell": "/bin/bash", "cwd": "/tmp", "env": {"A": "1"}},
        "transform",
        {"command": "echo hi", "shell": "/bin/bash", "cwd": "/tmp", "env": {"A": "1", "HOOKED": "{kind}"}},
    ),
    (
        "after_tool_result",
        {"tool": "fs.read", "success": True, "result": {"text": "hello"}, "error": None},
        "allow",
        None,
    ),
    (
        "after_tool_result",
        {"tool": "fs.read", "success": False, "result": None, "error": "no such file"},
        "block",
        "tool failed: no such file",
    ),
    (
        "after_tool_result",
        {"tool": "fs.read", "success": True, "result": {"text": "the SECRET is 42", "size": 16}, "error": None},
        "transform",
        {"tool": "fs.read", "success": True, "result": {"text": "[redacted]", "size": 16}, "error": None},
    ),
    ("on_shell_output", {"stream": "stdout", "text": "hello\n"}, "allow", None),
    ("on_shell_output", {"stream": "stdout", "text": "password: hunter2\n"}, "block", "output contains a password"),
    ("on_shell_output", {"stream": "stderr", "text": "warning: é\n"}, "transform", {"stream": "stderr", "text": "WARNING: É\n"}),
    ("before_hook_load", {"hook_type": "js", "source": "function beforeToolCall() {}"}, "allow", None),
    ("before_hook_load", {"hook_type": "rust", "source": "// evil"}, "block", "no evil rust hooks"),
    ("before_connect", {"host": "pypi.org", "port": 443, "session": "s", "request": "r"}, "allow", None),
    ("before_connect", {"host": "exfil.evil", "port": 80, "session": "s", "request": "r"}, "block", "not exfil.evil:80"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("trigger", "payload", "action", "expected"), TRIGGER_CASES, ids=[f"{c[0]}-{c[2]}" for c in TRIGGER_CASES])
def test_trigger(run: Runner[Any], compiled: Compiled, kind: str, trigger: str, payload: dict[str, Any], action: str, expected: Any) -> None:
    original = json.loads(json.dumps(payload))

    async def body() -> Decision:
        async with loaded(kind, SOURCES[kind], compiled) as hook:
            assert hook.triggers == frozenset(TRIGGERS)
            return await hook.call(trigger, payload)

    decision = run(body())
    assert decision.action == action
    assert decision.hook_id is not None and decision.hook_id.startswith(f"{kind}-")
    if action == "block":
        assert decision.reason == expected and decision.data is None
    elif action == "transform":
        assert decision.data == json.loads(json.dumps(expected).replace("{kind}", kind))
        assert decision.reason is None
    else:
        assert decision.data is None and decision.reason is None
    assert payload == original, "the caller's payload must not be modified"


@pytest.mark.parametrize("kind", KINDS)
def test_undefined_trigger_allows(run: Runner[Any], compiled: Compiled, kind: str) -> None:
    source = JS_APPEND if kind == "js" else RUST_APPEND

    async def body() -> tuple[frozenset[str], Decision]:
        async with loaded(kind, source, compiled) as hook:
            return hook.triggers, await hook.call("on_shell_output", {"stream": "stdout", "text": "x"})

    triggers, decision = run(body())
    assert triggers == {"before_tool_call"}
    assert decision.action == "allow"


@pytest.mark.parametrize("kind", KINDS)
def test_load_reports_id_and_triggers(run: Runner[Any], compiled: Compiled, kind: str) -> None:
    source = JS_APPEND if kind == "js" else RUST_APPEND

    async def body() -> tuple[Hook, pb.HookAction]:
        async with loaded(kind, source, compiled) as hook:
            return hook, load_action(hook)

    hook, action = run(body())
    assert action.type == pb.HOOK_ACTION_TYPE_ALLOW
    data = json.loads(action.allowed_data)
    assert data == {"hook_id": hook.id, "kind": kind, "triggers": ["before_tool_call"], "source_hash": hook.source_hash}
    assert hook.id == f"{kind}-{hook.source_hash[:12]}"
    assert len(hook.source_hash) == 64


def test_hook_id_can_be_given(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> str:
        async with loaded("js", JS_APPEND, compiled, hook_id="policy-1") as hook:
            decision = await hook.call("before_tool_call", tool("x", path="a"))
            assert decision.hook_id == "policy-1"
            return hook.id

    assert run(body()) == "policy-1"


@pytest.mark.parametrize("kind", KINDS)
def test_json_round_trip_through_the_engine(run: Runner[Any], compiled: Compiled, kind: str) -> None:
    args = {
        "unicode": "é ☃ 😀 \u2028",
        "escapes": 'quote " backslash \\ newline \n tab \t nul \u0000 bell \u0007',
        "ints": [0, -1, 2**53, -(2**62), 9007199254740993],
        "floats": [1.5, -0.25, 1e-7, 6.02e23, 1e300],
        "nested": {"a": [[], {}, [None, True, False]], "": "empty key"},
    }
    if kind == "js":  # JS numbers are doubles: integers beyond 2**53 round
        args["ints"] = [0, -1, 2**53, -(2**52)]

    async def body() -> Decision:
        async with loaded(kind, SOURCES[kind], compiled) as hook:
            return await hook.call("before_tool_call", tool("echo", **args))

    decision = run(body())
    assert decision.action == "transform"
    assert decision.data == tool("echo", **args)


@pytest.mark.parametrize("kind", KINDS)
def test_large_payload_crosses_in_pieces(run: Runner[Any], compiled: Compiled, kind: str) -> None:
    """3 MiB each way: more than a pipe holds, so the request is written and the answer read in pieces."""
    payload = tool("echo", text="é" * (3 << 19), n=1)

    async def body() -> Decision:
        async with loaded(kind, SOURCES[kind], compiled, limits=HookLimits(call_timeout=30)) as hook:
            decision = await hook.call("before_tool_call", payload)
            assert (await hook.call("before_tool_call", tool("fs.write", path="z"))).action == "block"
            return decision

    decision = run(body())
    assert decision.action == "transform" and decision.data == payload


# -- malformed answers and wrong shapes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("malformed", "returned a malformed decision: a number, not an object"),
        ("undefined", "returned a malformed decision: undefined"),
        ("unknown_action", 'action must be "allow", "block" or "transform", not "maybe"'),
        ("no_reason", "a block has exactly the keys action, reason, got action"),
        ("extra_key", "an allow has exactly the keys action, got action, why"),
        ("async", 'action must be "allow", "block" or "transform", not null'),  # a Promise: {}
        ("wrong_shape", "returned a malformed transform: keys must be exactly tool, args"),
    ],
)
def test_js_malformed_answers_fail(run: Runner[Any], compiled: Compiled, mode: str, fragment: str) -> None:
    async def body() -> HookFailure:
        async with loaded("js", JS_ALL, compiled) as hook:
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool(mode))
            # The hook stays usable.
            assert (await hook.call("before_tool_call", tool("fs.list"))).action == "allow"
            return info.value

    failure = run(body())
    assert fragment in failure.reason
    assert failure.trigger == "before_tool_call"
    assert failure.hook_id.startswith("js-")


WRONG_SHAPES: dict[str, list[tuple[Any, str]]] = {
    "before_tool_call": [
        ({"tool": "x"}, "keys must be exactly tool, args"),
        ({"tool": 1, "args": {}}, "tool must be a string"),
        ({"tool": "x", "args": {}, "more": 1}, "keys must be exactly tool, args"),
        ([1, 2], "data must be an object, not an array"),
    ],
    "before_shell_exec": [
        ({"command": "ls", "shell": None, "cwd": None}, "keys must be exactly command, shell, cwd, env"),
        ({"command": ["ls"], "shell": None, "cwd": None, "env": {}}, "command must be a string"),
        ({"command": "ls", "shell": 1, "cwd": None, "env": {}}, "shell and cwd must be strings or null"),
        ({"command": "ls", "shell": None, "cwd": None, "env": {"A": 1}}, "env must be an object of strings"),
    ],
    "after_tool_result": [
        ({"tool": "x", "success": 1, "result": None, "error": None}, "success must be a boolean"),
        ({"tool": "x", "success": True, "result": None, "error": 5}, "error must be a string or null"),
        ({"tool": "x", "success": True, "result": None}, "keys must be exactly tool, success, result, error"),
    ],
    "before_hook_load": [
        ({"hook_type": "js", "source": ""}, "a hook load can only be allowed or blocked, not transformed"),
    ],
    "before_connect": [
        ({"host": "pypi.org", "port": 443, "session": "s", "request": "r"}, "a connection can only be allowed or blocked, not transformed"),
    ],
    "on_shell_output": [
        ({"stream": "stdin", "text": "x"}, 'stream must be "stdout" or "stderr"'),
        ({"stream": "stdout", "text": None}, "text must be a string"),
        ("text", "data must be an object, not a string"),
    ],
}


@pytest.mark.parametrize(
    ("trigger", "data", "problem"),
    [(t, d, p) for t, cases in WRONG_SHAPES.items() for d, p in cases],
)
def test_shape_error(trigger: str, data: Any, problem: str) -> None:
    assert shape_error(trigger, data) == problem


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_transform_of_the_wrong_shape_fails_in_js(run: Runner[Any], compiled: Compiled, trigger: str) -> None:
    """A transform that hands back anything but the payload's shape is a failure, for every trigger."""
    data, problem = WRONG_SHAPES[trigger][0]
    source = f"function {JS_FUNCTIONS[trigger]}(p) {{ return {{ action: 'transform', data: {json.dumps(data)} }}; }}"
    payloads = {c[0]: c[1] for c in TRIGGER_CASES}

    async def body() -> HookFailure:
        async with loaded("js", source, compiled) as hook:
            with pytest.raises(HookFailure) as info:
                await hook.call(trigger, payloads[trigger])
            return info.value

    assert run(body()).reason == f"returned a malformed transform: {problem}"


def test_shape_error_rejects_unknown_trigger() -> None:
    with pytest.raises(ValueError, match="unknown hook trigger 'before_lunch'"):
        shape_error("before_lunch", {})


# -- failures: JavaScript --------------------------------------------------------------------------


def test_js_throw_names_the_error_and_line(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> HookFailure:
        async with loaded("js", JS_ALL, compiled) as hook:
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool("throw"))
            return info.value

    reason = run(body()).reason
    line = next(n for n, text in enumerate(JS_ALL.splitlines(), 1) if "tool throw is cursed" in text)
    assert reason.startswith("threw Error: tool throw is cursed")
    assert f"at beforeToolCall (<input>:{line}:" in reason  # the line in the hook's own source


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("loop", "ran past its time limit of 0.25 s"),
        ("memory", f"ran out of memory (limit {FAST.memory_bytes} bytes)"),
        ("stack", "overflowed its stack"),
    ],
)
def test_js_runaway_is_stopped_and_the_context_rebuilt(run: Runner[Any], compiled: Compiled, mode: str, fragment: str) -> None:
    async def body() -> tuple[str, Decision, Decision]:
        async with loaded("js", JS_ALL, compiled, limits=FAST) as hook:
            first = await hook.call("before_tool_call", tool("count"))
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool(mode))
            after = await hook.call("before_tool_call", tool("count"))
            return info.value.reason, first, after

    reason, first, after = run(body())
    assert fragment in reason
    assert first.reason == "call 1"
    # A fresh context: the hook works, and its global state started over.
    assert after.action == "block" and after.reason == "call 1"


def test_js_throw_keeps_the_context(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> Decision:
        async with loaded("js", JS_ALL, compiled) as hook:
            await hook.call("before_tool_call", tool("count"))
            with pytest.raises(HookFailure):
                await hook.call("before_tool_call", tool("throw"))
            return await hook.call("before_tool_call", tool("count"))

    assert run(body()).reason == "call 3"


def test_js_console_goes_to_the_log(run: Runner[Any], compiled: Compiled, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> Decision:
        async with loaded("js", JS_ALL, compiled) as hook:
            return await hook.call("before_tool_call", tool("console", n=1))

    with caplog.at_level(logging.INFO, logger="smith_fast.hooks"):
        decision = run(body())
    assert decision.action == "allow"
    lines = [(r.levelname, r.fields["text"]) for r in caplog.records if r.getMessage() == "hook console"]  # type: ignore[attr-defined]
    assert lines == [("INFO", 'looked at {"tool":"console","args":{"n":1}}'), ("WARNING", "careful")]


# -- loading: JavaScript ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        ("function beforeToolCall(p) {\n  return {action: 'allow'\n}", ["SyntaxError", "<input>:3:"]),
        ('import * as os from "os";\nfunction beforeToolCall(p) {}', ["SyntaxError"]),
        ("throw new Error('no config');", ["Error: no config", "<input>:1:"]),
        ("for (;;) {}", ["InternalError: interrupted"]),
    ],
    ids=["syntax", "static-import", "top-level-throw", "top-level-loop"],
)
def test_js_load_errors_carry_the_engine_diagnostics(source: str, fragments: list[str]) -> None:
    async def body() -> None:
        await load_hook("js", source, limits=FAST)

    with pytest.raises(HookLoadError) as info:
        asyncio.run(body())
    assert info.value.message == "the JavaScript hook does not load"
    for fragment in fragments:
        assert fragment in info.value.diagnostics
        assert fragment in str(info.value)


def test_js_hook_must_define_a_function() -> None:
    with pytest.raises(HookLoadError, match="defines none of the hook functions beforeToolCall, beforeShellExec"):
        asyncio.run(load_hook("js", "var beforeToolCall = 42; function helper() {}"))


def test_unknown_kind() -> None:
    with pytest.raises(HookLoadError, match="unknown hook type 'lua'"):
        asyncio.run(load_hook("lua", "return true"))


# -- the JavaScript sandbox ------------------------------------------------------------------------

JS_PROBE = r"""
let imported = "never settled";
import("os").then(() => { imported = "loaded"; }, (e) => { imported = "refused"; });
function beforeToolCall(p) {
  const names = ["std", "os", "require", "fetch", "process", "XMLHttpRequest", "WebSocket", "Deno", "Bun",
                 "scriptArgs", "print", "setTimeout", "setInterval", "importScripts", "module", "exports",
                 "__dirname", "environ", "getenv"];
  const probe = {};
  for (const n of names) probe[n] = typeof globalThis[n];
  let dynamic;
  try { dynamic = typeof import("std"); } catch (e) { dynamic = "threw " + e; }
  return { action: "block", reason: JSON.stringify({
    probe, dynamic, imported, globals: Object.getOwnPropertyNames(globalThis),
  }) };
}
"""


def test_js_has_no_file_system_network_or_environment(run: Runner[Any], compiled: Compiled, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMITH_FAST_TEST_SECRET", "s3cr3t-value")

    async def body() -> Decision:
        async with loaded("js", JS_PROBE, compiled) as hook:
            return await hook.call("before_tool_call", tool("x"))

    decision = run(body())
    report = json.loads(decision.reason or "")
    assert set(report["probe"].values()) == {"undefined"}, report["probe"]
    # import() hands back a promise, but no module loader exists and promise jobs never run here:
    # nothing is ever loaded.
    assert report["dynamic"] == "object"
    assert report["imported"] == "never settled"
    assert "s3cr3t-value" not in (decision.reason or "")
    globals_ = set(report["globals"])
    assert globals_.isdisjoint({"std", "os", "require", "fetch", "process", "XMLHttpRequest", "print"})
    assert "console" in globals_ and "JSON" in globals_


# -- failures and isolation: Rust ------------------------------------------------------------------


def test_rust_panic_fails_the_call_and_keeps_the_process(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> tuple[str, Decision, int]:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            assert isinstance(hook, RustHook)
            await hook.call("before_tool_call", tool("count"))
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool("panic"))
            after = await hook.call("before_tool_call", tool("count"))
            return info.value.reason, after, hook.restarts

    reason, after, restarts = run(body())
    assert reason.startswith("panicked: tool panic is cursed at hook.rs:")
    assert after.reason == "call 3"  # the same process, its state intact
    assert restarts == 0


@pytest.mark.parametrize(
    ("mode", "fragment", "limits"),
    [
        ("abort", "crashed: its process died (killed by SIGABRT)", HookLimits()),
        ("bigalloc", "crashed: its process died (killed by SIGABRT)", HookLimits()),
        ("loop", "ran past its time limit of 0.25 s", FAST),
    ],
)
def test_rust_crash_or_runaway_restarts_the_process(
    run: Runner[Any], compiled: Compiled, mode: str, fragment: str, limits: HookLimits
) -> None:
    async def body() -> tuple[str, int, int, Decision, int]:
        async with loaded("rust", RUST_ALL, compiled, limits=limits) as hook:
            assert isinstance(hook, RustHook) and hook._child is not None
            pid = hook._child.proc.pid
            await hook.call("before_tool_call", tool("count"))
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool(mode))
            after = await hook.call("before_tool_call", tool("count"))
            assert hook._child is not None
            return info.value.reason, pid, hook._child.proc.pid, after, hook.restarts

    reason, old_pid, new_pid, after, restarts = run(body())
    assert fragment in reason
    assert not alive(old_pid)
    assert new_pid != old_pid and restarts == 1
    assert after.reason == "call 1"  # a new process


def test_rust_restart_survives_a_deleted_cache(run: Runner[Any], compiled: Compiled, tmp_path: Path) -> None:
    import shutil

    key = rust_engine.cache_key(RUST_ALL)
    shutil.copytree(compiled.cache / key, tmp_path / key)

    async def body() -> tuple[Decision, int]:
        async with loaded("rust", RUST_ALL, Compiled(tmp_path, {}, [], []), limits=HookLimits()) as hook:
            assert isinstance(hook, RustHook) and hook.cache_hit
            shutil.rmtree(tmp_path / key)
            with pytest.raises(HookFailure, match="SIGABRT"):
                await hook.call("before_tool_call", tool("abort"))
            return await hook.call("before_tool_call", tool("count")), hook.restarts

    after, restarts = run(body())
    assert after.reason == "call 1" and restarts == 1


def test_rust_garbage_on_the_answer_pipe_is_malformed(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> tuple[str, Decision, int]:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            assert isinstance(hook, RustHook)
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool("garbage"))
            after = await hook.call("before_tool_call", tool("fs.write", path="p"))
            return info.value.reason, after, hook.restarts

    reason, after, restarts = run(body())
    assert reason.startswith("returned a malformed decision: not JSON")
    # Its real answer came after the garbage, out of turn: the next call had a new process.
    assert after.action == "block" and after.reason == "writes are not allowed (p)"
    assert restarts == 1


def test_rust_wrong_shape_fails(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> str:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            with pytest.raises(HookFailure) as info:
                await hook.call("before_tool_call", tool("wrong_shape"))
            return info.value.reason

    assert run(body()) == "returned a malformed transform: keys must be exactly tool, args"


def test_rust_output_is_logged_not_taken_for_answers(run: Runner[Any], compiled: Compiled, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> Decision:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            decision = await hook.call("before_tool_call", tool("print"))
            for _ in range(100):  # the log pipe is read by the loop, independently of answers
                if sum(r.getMessage() == "hook output" for r in caplog.records) == 2:
                    break
                await asyncio.sleep(0.01)
            return decision

    with caplog.at_level(logging.INFO, logger="smith_fast.hooks"):
        decision = run(body())
    assert decision.action == "allow"
    texts = sorted(r.fields["text"] for r in caplog.records if r.getMessage() == "hook output")  # type: ignore[attr-defined]
    assert texts == ["hello from stderr", "hello from stdout"]


def test_rust_process_is_isolated(run: Runner[Any], compiled: Compiled, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMITH_FAST_TEST_SECRET", "s3cr3t-value")

    async def body() -> tuple[str, int, int, str]:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            assert isinstance(hook, RustHook) and hook._child is not None
            pid = hook._child.proc.pid
            decision = await hook.call("before_tool_call", tool("introspect"))
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            return decision.reason or "", pid, os.getpgid(pid), environ.decode()

    reason, pid, pgid, environ = run(body())
    assert reason.startswith('{"cwd": "' + tempfile.gettempdir())
    assert "smith-fast-hook-" in reason and reason.endswith('"env": "0"}')
    assert pgid == pid != os.getpgid(0)  # its own process group
    assert environ == ""
    assert not alive(pid)  # closed with the hook


def test_rust_close_kills_and_releases(run: Runner[Any], compiled: Compiled) -> None:
    fds_before = set(os.listdir("/proc/self/fd"))

    async def body() -> tuple[int, str]:
        hook = await load_hook("rust", RUST_ALL, cache_dir=compiled.cache, trusted=True)
        assert isinstance(hook, RustHook) and hook._child is not None
        pid, workdir = hook._child.proc.pid, hook._workdir
        await hook.close()
        await hook.close()  # idempotent
        with pytest.raises(HookFailure, match="the hook is closed"):
            await hook.call("before_tool_call", tool("x"))
        return pid, workdir

    pid, workdir = run(body())
    assert not alive(pid)
    assert not os.path.exists(workdir)
    assert set(os.listdir("/proc/self/fd")) <= fds_before


def test_rust_cancelled_call_replaces_the_process(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> tuple[int, Decision, int]:
        async with loaded("rust", RUST_ALL, compiled, limits=HookLimits(call_timeout=30)) as hook:
            assert isinstance(hook, RustHook) and hook._child is not None
            pid = hook._child.proc.pid
            task = asyncio.ensure_future(hook.call("before_tool_call", tool("loop")))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            after = await hook.call("before_tool_call", tool("fs.write", path="q"))
            return pid, after, hook.restarts

    pid, after, restarts = run(body())
    assert not alive(pid)
    assert after.reason == "writes are not allowed (q)" and restarts == 1


def test_rust_calls_are_serialized(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> list[Decision]:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            return list(await asyncio.gather(*(hook.call("before_tool_call", tool("count")) for _ in range(50))))

    reasons = [d.reason for d in run(body())]
    assert reasons == [f"call {n}" for n in range(1, 51)]


# -- loading and the compile cache: Rust -----------------------------------------------------------


def test_rust_compile_error_carries_rustc_diagnostics(compiled: Compiled) -> None:
    with pytest.raises(HookLoadError) as info:
        asyncio.run(load_hook("rust", RUST_BAD_TYPE, cache_dir=compiled.cache))
    assert info.value.message == "the Rust hook does not compile"
    assert "error[E0308]: mismatched types" in info.value.diagnostics
    assert "--> hook.rs:2:5" in info.value.diagnostics  # points into the hook's own source
    # A failed compile leaves nothing behind in the cache.
    assert not [e for e in os.listdir(compiled.cache) if e.startswith(".")]


def test_rust_without_hooks_macro_is_refused_before_compiling(compiled: Compiled) -> None:
    with pytest.raises(HookLoadError, match=r"registers its functions with hooks! \{ before_tool_call"):
        asyncio.run(load_hook("rust", "fn before_tool_call(_p: &Json) -> Action { Action::Allow }", cache_dir=compiled.cache))


def test_rust_unknown_trigger_is_refused(compiled: Compiled) -> None:
    with pytest.raises(HookLoadError, match="hooks! names unknown trigger.s. before_everything"):
        asyncio.run(load_hook("rust", RUST_UNKNOWN_TRIGGER, cache_dir=compiled.cache))
    assert not list(rust_engine._LIVE)


def test_rust_cache_compiles_once(run: Runner[Any], compiled: Compiled) -> None:
    assert compiled.first_load_hits == {"all": False}
    # Two loads of a new hook at once: one compiles, the other waits and finds it cached.
    assert compiled.concurrent_hits == [False, True]
    assert not [e for e in compiled.entries_after_concurrent if e.startswith(".")], "temporary compile dirs left"
    key = rust_engine.cache_key(RUST_ALL)
    exe = compiled.cache / key / "hook"
    before = exe.stat()

    async def body() -> RustHook:
        async with loaded("rust", RUST_ALL, compiled) as hook:
            assert isinstance(hook, RustHook)
            return hook

    hook = run(body())
    assert hook.cache_hit is True
    assert hook.executable == exe
    after = exe.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_rust_compile_timeout(tmp_path: Path) -> None:
    source = RUST_APPEND + "// a source no cache holds\n"
    with pytest.raises(HookLoadError, match=r"rustc did not finish within 0.05 s"):
        asyncio.run(load_hook("rust", source, limits=HookLimits(rust_compile_timeout=0.05), cache_dir=tmp_path))
    assert os.listdir(tmp_path) == []  # the half-done compile is gone


def test_without_a_working_rustc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SMITH_FAST_RUSTC", "/bin/false")
    rust_engine.rustc_version.cache_clear()
    try:
        assert rust_engine.rustc_version() is None
        with pytest.raises(HookLoadError, match="Rust hooks need rustc, which does not run here"):
            asyncio.run(load_hook("rust", RUST_APPEND + "// uncached\n", cache_dir=tmp_path))
    finally:
        monkeypatch.undo()
        rust_engine.rustc_version.cache_clear()
    assert rust_engine.rustc_version() is not None


def test_rust_cache_key_covers_prelude_and_source() -> None:
    assert rust_engine.cache_key("a") != rust_engine.cache_key("b")
    assert rust_engine.cache_key("a") == rust_engine.cache_key("a")
    assert len(rust_engine.cache_key("a")) == 64


def test_available_kinds() -> None:
    assert available_kinds() == frozenset({"js", "rust"})
    assert rust_engine.rustc_version() is not None and rust_engine.rustc_version().startswith("rustc ")  # type: ignore[union-attr]


def test_hook_files(run: Runner[Any], compiled: Compiled, tmp_path: Path) -> None:
    (tmp_path / "policy.js").write_text(JS_APPEND)
    (tmp_path / "policy.rs").write_text(RUST_APPEND)
    (tmp_path / "broken.js").write_text("function (")
    assert kind_from_path("a/b.JS") == "js" and kind_from_path("x.rs") == "rust"
    with pytest.raises(HookLoadError, match="name it"):
        kind_from_path("policy.py")

    async def body() -> list[str]:
        kinds: list[str] = []
        for name in ("policy.js", "policy.rs"):
            hook = await load_hook_file(tmp_path / name, cache_dir=compiled.cache)
            kinds.append(hook.kind)
            await hook.close()
        return kinds

    assert run(body()) == ["js", "rust"]
    with pytest.raises(HookLoadError) as info:
        asyncio.run(load_hook_file(tmp_path / "broken.js"))
    assert info.value.message.startswith(f"{tmp_path / 'broken.js'}: the JavaScript hook does not load")
    assert "SyntaxError" in info.value.diagnostics
    with pytest.raises(HookLoadError, match="cannot read hook file"):
        asyncio.run(load_hook_file(tmp_path / "missing.js"))


# -- the Rust prelude's JSON, straight through its pipes ---------------------------------------------


@pytest.fixture(scope="module")
def echo_process(compiled: Compiled) -> Iterator[Callable[[str], dict[str, Any]]]:
    """The compiled RUST_ALL binary, spoken to directly: one request line in, one answer line out."""
    exe = compiled.cache / rust_engine.cache_key(RUST_ALL) / "hook"
    r, w = os.pipe()
    proc = subprocess.Popen([str(exe), str(w)], stdin=subprocess.PIPE, pass_fds=(w,), env={})
    os.close(w)
    answers = os.fdopen(r, "rb")
    assert proc.stdin is not None

    def ask(line: str) -> dict[str, Any]:
        proc.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        answer: dict[str, Any] = json.loads(answers.readline())
        return answer

    yield ask
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0  # stdin's EOF ends it cleanly
    answers.close()


def test_rust_prelude_describe_and_bad_requests(echo_process: Callable[[str], dict[str, Any]]) -> None:
    assert echo_process('{"trigger":"__describe__"}') == {"triggers": list(TRIGGERS)}
    assert echo_process("not json")["error"].startswith("bad request: unexpected character at byte 0")
    assert echo_process('{"trigger":"x"} junk') == {"error": "bad request: trailing characters at byte 16"}
    assert echo_process('{"trigger":"on_lunch","payload":{}}') == {"error": "the hook does not define on_lunch"}
    deep = "[" * 600 + "]" * 600
    assert echo_process(f'{{"trigger":"before_tool_call","payload":{deep}}}')["error"].startswith("bad request: nesting too deep")
    # A lone surrogate cannot live in a Rust String: U+FFFD stands in.
    answer = echo_process('{"trigger":"before_tool_call","payload":{"tool":"echo","args":"\\ud800x\\ud83d\\ude00"}}')
    assert answer == {"action": "transform", "data": {"tool": "echo", "args": "\ufffdx\U0001f600"}}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=8), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=json_values)
def test_rust_prelude_json_round_trips(echo_process: Callable[[str], dict[str, Any]], args: Any) -> None:
    """Whatever JSON goes in comes back equal: the prelude's parser and serializer agree with Python's."""
    request = json.dumps({"trigger": "before_tool_call", "payload": {"tool": "echo", "args": args}}, ensure_ascii=False)
    answer = echo_process(request)
    assert answer == {"action": "transform", "data": {"tool": "echo", "args": args}}


# -- chains ----------------------------------------------------------------------------------------


def test_empty_chain_allows_without_copying() -> None:
    payload = tool("x")
    result = asyncio.run(HookChain([]).run("before_tool_call", payload))
    assert result.action == "allow" and result.payload is payload and result.decisions == ()
    assert not HookChain([]).handles("on_shell_output")


def test_chain_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="failure must be 'closed' or 'open'"):
        HookChain([], failure="ajar")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown hook trigger"):
        asyncio.run(HookChain([]).run("before_lunch", {}))
    with pytest.raises(ValueError, match="unknown hook trigger"):
        HookChain([]).handles("before_lunch")


@pytest.mark.parametrize("order", ["js-rust", "rust-js"])
def test_chain_transform_feeds_the_next_in_order(run: Runner[Any], compiled: Compiled, order: str) -> None:
    async def body() -> Any:
        js = await load_hook("js", JS_APPEND, cache_dir=compiled.cache)
        rs = await load_hook("rust", RUST_APPEND, cache_dir=compiled.cache)
        chain = HookChain([js, rs] if order == "js-rust" else [rs, js])
        try:
            assert chain.handles("before_tool_call") and not chain.handles("on_shell_output")
            return await chain.run("before_tool_call", tool("fs.read", path="/x")), js.id, rs.id
        finally:
            await chain.close()

    result, js_id, rs_id = run(body())
    assert result.action == "transform"
    assert result.payload == tool("fs.read", path="/x/js/rs" if order == "js-rust" else "/x/rs/js")
    assert result.hook_id == (rs_id if order == "js-rust" else js_id)  # the last one that transformed
    assert [d.action for d in result.decisions] == ["transform", "transform"]
    assert result.reason is None


def test_chain_block_stops_the_chain(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> Any:
        first = await load_hook("js", JS_APPEND, cache_dir=compiled.cache)
        blocker = await load_hook("js", JS_ALL, cache_dir=compiled.cache)
        never = await load_hook("js", "function beforeToolCall(p) { throw new Error('must not run'); }")
        chain = HookChain([first, blocker, never])
        return await chain.run("before_tool_call", tool("fs.write", path="/etc")), blocker.id

    result, blocker_id = run(body())
    assert result.action == "block"
    assert result.reason == "writes are not allowed (/etc/js)"  # it saw the first hook's transform
    assert result.hook_id == blocker_id
    assert [d.action for d in result.decisions] == ["transform", "block"]


def test_chain_skips_hooks_without_the_trigger(run: Runner[Any], compiled: Compiled) -> None:
    async def body() -> Any:
        a = await load_hook("js", JS_APPEND)
        b = await load_hook("js", JS_ALL)
        return await HookChain([a, b]).run("on_shell_output", {"stream": "stderr", "text": "x"}), b.id

    result, b_id = run(body())
    assert result.action == "transform" and result.payload == {"stream": "stderr", "text": "X"}
    assert [d.hook_id for d in result.decisions] == [b_id]


FAILURES = [
    ("js", "throw", "threw Error: tool throw is cursed"),
    ("js", "malformed", "returned a malformed decision"),
    ("js", "wrong_shape", "returned a malformed transform"),
    ("js", "loop", "ran past its time limit"),
    ("js", "memory", "ran out of memory"),
    ("rust", "panic", "panicked: tool panic is cursed"),
    ("rust", "abort", "crashed: its process died (killed by SIGABRT)"),
    ("rust", "loop", "ran past its time limit"),
    ("rust", "wrong_shape", "returned a malformed transform"),
    ("rust", "garbage", "returned a malformed decision"),
]


@pytest.mark.parametrize("policy", ["closed", "open"])
@pytest.mark.parametrize(("kind", "mode", "fragment"), FAILURES, ids=[f"{k}-{m}" for k, m, _ in FAILURES])
def test_chain_failure_policy(
    run: Runner[Any], compiled: Compiled, caplog: pytest.LogCaptureFixture, policy: str, kind: str, mode: str, fragment: str
) -> None:
    async def body() -> Any:
        failing = await load_hook(kind, SOURCES[kind], limits=FAST, cache_dir=compiled.cache, trusted=True)
        after = await load_hook("js", JS_APPEND)
        chain = HookChain([failing, after], failure=policy)  # type: ignore[arg-type]
        try:
            result = await chain.run("before_tool_call", tool(mode, path="/x"))
            # The chain (and the failed hook) keep serving.
            again = await chain.run("before_tool_call", tool("fs.list", path="/y"))
            return result, again, failing.id
        finally:
            await chain.close()

    with caplog.at_level(logging.WARNING, logger="smith_fast.hooks"):
        result, again, failing_id = run(body())
    assert fragment in (result.reason or "")
    assert f"hook {failing_id} failed in before_tool_call: " in (result.reason or "")
    if policy == "closed":
        assert result.action == "block" and result.hook_id == failing_id
        assert [d.action for d in result.decisions] == ["block"]  # the next hook did not run
    else:
        assert result.action == "transform" and result.payload == tool(mode, path="/x/js")
        assert [d.action for d in result.decisions] == ["allow", "transform"]
        assert fragment in (result.decisions[0].reason or "")
    assert again.action == "transform" and again.payload == tool("fs.list", path="/y/js")
    warnings = [r for r in caplog.records if r.getMessage() == "hook failed"]
    assert [r.fields["hook_id"] for r in warnings] == [failing_id]  # type: ignore[attr-defined]


# -- HookAction --------------------------------------------------------------------------------------


def test_hook_action_messages() -> None:
    from smith_fast.hooks import ChainResult

    block = hook_action(ChainResult("block", tool("x"), "no", "js-1"))
    assert block.type == pb.HOOK_ACTION_TYPE_BLOCK and block.block_reason == "no"
    transform = hook_action(ChainResult("transform", tool("x", a=1), None, "js-1"))
    assert transform.type == pb.HOOK_ACTION_TYPE_TRANSFORM
    assert json.loads(transform.transformed_data) == tool("x", a=1)
    allow = hook_action(ChainResult("allow", tool("x")))
    assert allow.type == pb.HOOK_ACTION_TYPE_ALLOW and json.loads(allow.allowed_data) == tool("x")
    assert hook_action(ChainResult("allow", tool("x")), allowed_data=b'{"raw":1}').allowed_data == b'{"raw":1}'


def test_errors_pickle() -> None:
    import pickle

    failure = pickle.loads(pickle.dumps(HookFailure("js-1", "before_tool_call", "threw")))
    assert (failure.hook_id, failure.trigger, failure.reason) == ("js-1", "before_tool_call", "threw")
    load_error = pickle.loads(pickle.dumps(HookLoadError("does not compile", "error[E0308]")))
    assert (load_error.message, load_error.diagnostics) == ("does not compile", "error[E0308]")
    assert str(load_error) == "does not compile:\nerror[E0308]"


def test_compile_hook_is_public(compiled: Compiled) -> None:
    exe, hit = asyncio.run(compile_hook(RUST_APPEND, cache_dir=compiled.cache))
    assert hit and os.access(exe, os.X_OK)


# -- HOOKS.md: its complete examples load and do what it says ----------------------------------------


def hooks_md_example(kind: str) -> str:
    text = (Path(__file__).resolve().parent.parent / "HOOKS.md").read_text()
    fence = {"js": "js", "rust": "rust"}[kind]
    start = text.index(f"<!-- example: {kind} -->\n```{fence}\n") + len(f"<!-- example: {kind} -->\n```{fence}\n")
    return text[start : text.index("\n```\n", start) + 1]


@pytest.mark.parametrize("kind", KINDS)
def test_hooks_md_examples(run: Runner[Any], compiled: Compiled, kind: str) -> None:
    source = hooks_md_example(kind)
    key = "-----BEGIN PRIVATE KEY-----\nMIIE...\n"

    async def body() -> list[Decision]:
        async with loaded(kind, source, compiled) as hook:
            assert hook.triggers == frozenset(TRIGGERS)
            shell = {"command": "", "shell": None, "cwd": None, "env": {"A": "1"}}
            return [
                await hook.call("before_tool_call", tool("fs.write", path=".git/config", content="x")),
                await hook.call("before_tool_call", tool("fs.write", path="src/x.py", content="x")),
                await hook.call("before_shell_exec", {**shell, "command": "sudo rm -rf / --no-preserve-root"}),
                await hook.call("before_shell_exec", {**shell, "command": "rm -rf /tmp/build"}),
                await hook.call("after_tool_result", {"tool": "fs.read", "success": True, "result": {"content": key, "size": 40}, "error": None}),
                await hook.call("after_tool_result", {"tool": "fs.read", "success": True, "result": {"content": "hi"}, "error": None}),
                await hook.call("on_shell_output", {"stream": "stdout", "text": "id=AKIAABCDEFGHIJKLMNOP, é AKIA12345678901234567\n"}),
                await hook.call("on_shell_output", {"stream": "stderr", "text": "AKIAabcdefghijklmnop\n"}),
                await hook.call("before_hook_load", {"hook_type": "rust", "source": "hooks! {}"}),
                await hook.call("before_hook_load", {"hook_type": "js", "source": ""}),
            ]

    d = run(body())
    assert (d[0].action, d[0].reason) == ("block", "the .git directory is read-only")
    assert d[1].action == "allow"
    assert (d[2].action, d[2].reason) == ("block", "refused: sudo rm -rf / --no-preserve-root")
    assert d[3].action == "transform" and d[3].data["env"] == {"A": "1", "UNDER_POLICY": "1"}
    assert d[4].action == "transform" and d[4].data["result"] == {"content": "[private key removed]", "size": 40}
    assert d[5].action == "allow"
    assert d[6].action == "transform" and d[6].data == {"stream": "stdout", "text": "id=[aws key], é [aws key]7\n"}
    assert d[7].action == "allow"
    assert (d[8].action, d[8].reason) == ("block", "no rust hooks from sessions")
    assert d[9].action == "allow"
