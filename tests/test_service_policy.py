"""Hooks, plans, recording and tracing through a real ``smith-fast serve`` process."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, beside

BLOCK_RM_AND_REDACT = """
function beforeShellExec(p) {
  if (p.command.includes("rm -rf")) return { action: "block", reason: "no rm -rf here" };
  return { action: "allow" };
}
function onShellOutput(p) {
  const text = p.text.replaceAll("SECRET123", "[redacted]");
  return text === p.text ? { action: "allow" } : { action: "transform", data: { stream: p.stream, text } };
}
function beforeToolCall(p) {
  if (p.tool === "fs.read" && p.args.path === "alias.txt") return { action: "transform", data: { tool: p.tool, args: { path: "real.txt" } } };
  return { action: "allow" };
}
function afterToolResult(p) {
  if (p.result && typeof p.result.content === "string" && p.result.content.includes("PRIVATE"))
    return { action: "transform", data: { ...p, result: { ...p.result, content: "[removed]" } } };
  return { action: "allow" };
}
"""

RUST_BLOCK_CURL = r"""
fn before_shell_exec(p: &Json) -> Action {
    let command = p.get("command").and_then(|c| c.as_str()).unwrap_or("");
    if command.contains("curl") { Action::block("no network from hooks' sessions") } else { Action::Allow }
}
hooks! { before_shell_exec }
"""


def hook_results(events: list[pb.Event]) -> list[pb.HookAction]:
    return [ev.hook_result.action for ev in events if ev.WhichOneof("event_type") == "hook_result"]


async def collect(client: Client, command: str, **kw) -> tuple[str, pb.ShellOutputEvent | None, list[pb.Event], SmithError | None]:  # type: ignore[no-untyped-def]
    events: list[pb.Event] = []
    error = None
    try:
        async for ev in client.shell_exec(command, **kw):
            events.append(ev)
    except SmithError as exc:
        error = exc
    out = "".join(ev.shell_output.stdout for ev in events if ev.WhichOneof("event_type") == "shell_output" and ev.shell_output.HasField("stdout"))
    final = next((ev.shell_output for ev in events if ev.WhichOneof("event_type") == "shell_output" and ev.shell_output.finished), None)
    return out, final, events, error


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"policy-{request.param}")
    (tmp / "real.txt").write_text("the real file\n")
    (tmp / "key.txt").write_text("-----PRIVATE KEY-----\n")
    (tmp / "global.js").write_text('function beforeShellExec(p) { return p.command.includes("forbidden") ? {action: "block", reason: "global policy"} : {action: "allow"}; }')
    # hooks_rust is granted only when the operator lists it (a Rust hook is native code)
    caps = "shell_exec,hooks_js,hooks_rust,replay,tracing"
    srv = ServerProcess(tmp, "--hook", str(tmp / "global.js"), "--record", str(beside(tmp, "rec")), "--capabilities", caps, loop=request.param).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


@pytest.mark.parametrize("protocol", ["v1", "v0"])
async def test_js_hooks_block_and_transform(server: ServerProcess, protocol: str) -> None:
    marker = server.root / f"marker-{protocol}"
    async with await Client.connect(server.unix, protocol=protocol) as client:
        ready = await client.handshake(["shell_exec", "hooks_js"])
        assert pb.CAPABILITY_HOOKS_JS in ready.capabilities
        loaded = await client.load_hook("js", BLOCK_RM_AND_REDACT)
        assert loaded.action.type == pb.HOOK_ACTION_TYPE_ALLOW
        info = json.loads(loaded.action.allowed_data)
        assert info["kind"] == "js" and set(info["triggers"]) == {"before_shell_exec", "on_shell_output", "before_tool_call", "after_tool_result"}

        # a block: the process never starts
        _, final, events, error = await collect(client, f"touch {marker}; rm -rf nothing")
        assert error is not None and error.code == pb.ERROR_CODE_PERMISSION_DENIED and "no rm -rf here" in str(error)
        assert final is None and not marker.exists()
        assert [a.type for a in hook_results(events)] == [pb.HOOK_ACTION_TYPE_BLOCK]
        assert hook_results(events)[0].block_reason == "no rm -rf here"

        # a transform of the output: the secret never leaves the service
        out, final, events, error = await collect(client, "echo token=SECRET123; echo fine")
        assert error is None and final and final.exit_code == 0
        assert "SECRET123" not in out and "token=[redacted]" in out and "fine" in out
        assert pb.HOOK_ACTION_TYPE_TRANSFORM in [a.type for a in hook_results(events)]

        # transform of the args, then of the result
        res = await client.call_tool("fs.read", {"path": "alias.txt"})
        assert res.success and json.loads(res.result)["content"] == "the real file\n"
        res = await client.call_tool("fs.read", {"path": "key.txt"})
        assert json.loads(res.result)["content"] == "[removed]"

        # the global hook runs first, whatever the session's hooks say
        _, _, _, error = await collect(client, "echo forbidden")
        assert error is not None and "global policy" in str(error)


async def test_hook_failures_fail_closed_and_diagnostics(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake(["shell_exec", "hooks_js"])
        with pytest.raises(SmithError, match="SyntaxError") as info:
            await client.load_hook("js", "function beforeShellExec(p) { return {action: ")
        assert info.value.details["reason"] == "hook_load_failed"
        await client.load_hook("js", "function beforeShellExec(p) { if (p.command === 'loop') { while (true) {} } throw new Error('boom'); }")
        for command in ("loop", "echo x"):
            _, final, events, error = await collect(client, command)
            assert error is not None and error.code == pb.ERROR_CODE_PERMISSION_DENIED and final is None
        assert "time limit" in str((await collect(client, "loop"))[3])
        assert "boom" in str((await collect(client, "echo y"))[3])


async def test_hooks_need_their_capability(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake(["shell_exec"])
        with pytest.raises(SmithError) as info:
            await client.load_hook("js", BLOCK_RM_AND_REDACT)
        assert info.value.code == pb.ERROR_CODE_INVALID_CAPABILITY


async def test_rust_hook_blocks_and_compile_errors_carry_diagnostics(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        ready = await client.handshake(["shell_exec", "hooks_rust"])
        assert pb.CAPABILITY_HOOKS_RUST in ready.capabilities
        with pytest.raises(SmithError, match="hook.rs") as info:
            await client.load_hook("rust", "fn before_shell_exec(p: &Json) -> Action { nonsense }\nhooks! { before_shell_exec }")
        assert "error" in str(info.value)
        loaded = await client.load_hook("rust", RUST_BLOCK_CURL)
        assert json.loads(loaded.action.allowed_data)["triggers"] == ["before_shell_exec"]
        _, _, _, error = await collect(client, "curl http://127.0.0.1:1/")
        assert error is not None and "no network" in str(error)
        out, final, _, error = await collect(client, "echo allowed")
        assert error is None and out == "allowed\n" and final and final.exit_code == 0


def test_open_failure_mode_allows(tmp_path: pathlib.Path) -> None:
    async def go() -> None:
        async with await Client.connect(srv.unix) as client:
            await client.handshake(["shell_exec", "hooks_js"])
            await client.load_hook("js", "function beforeShellExec(p) { throw new Error('broken hook'); }")
            out, final, events, error = await collect(client, "echo ran anyway")
            assert error is None and out == "ran anyway\n"

    srv = ServerProcess(tmp_path, "--hook-failure", "open").start()
    try:
        asyncio.run(go())
    finally:
        assert srv.stop() == 0


def test_global_hook_that_does_not_load_stops_the_start(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.js").write_text("function beforeShellExec( {")
    srv = ServerProcess(tmp_path, "--hook", str(tmp_path / "bad.js"))
    with pytest.raises(RuntimeError, match="SyntaxError"):
        srv.start(timeout=20)
    assert srv.proc is not None and srv.proc.wait(10) == 2


# ---- plans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["v1", "v0"])
async def test_plan_is_drawn_and_executed(server: ServerProcess, protocol: str) -> None:
    async with await Client.connect(server.unix, protocol=protocol) as client:
        await client.handshake(["shell_exec"])
        events = [ev async for ev in client.plan("echo one && false && echo never; echo after", {"execute": "true"})]
        deltas = [ev.graph_delta for ev in events if ev.WhichOneof("event_type") == "graph_delta"]
        nodes = {n.id: n for d in deltas for n in d.nodes_added}
        steps = [n for n in nodes.values() if n.node_type == "shell"]
        assert len(steps) == 4 and any(n.node_type == "goal" for n in nodes.values())
        assert all(uuid.UUID(n.id) for n in nodes.values())
        final_status = {}
        for d in deltas:
            for n in d.nodes_added:
                final_status[n.metadata.get("command", n.label)] = n.metadata.get("status")
        assert final_status["echo one"] == "succeeded"
        assert final_status["false"] == "failed"
        assert final_status["echo never"] == "skipped"
        assert final_status["echo after"] == "succeeded"
        outputs = "".join(ev.shell_output.stdout for ev in events if ev.WhichOneof("event_type") == "shell_output" and ev.shell_output.HasField("stdout"))
        assert "one\n" in outputs and "after\n" in outputs and "never" not in outputs


# ---- recording and replay ------------------------------------------------------------------------


def test_sessions_are_recorded_and_replay_identically(server: ServerProcess) -> None:
    async def session() -> str:
        async with await Client.connect(server.unix) as client:
            ready = await client.handshake(["shell_exec"])
            path = ready.service_info["smith_fast.recording"]
            await collect(client, "echo recorded; echo err >&2; exit 3")
            await client.call_tool("fs.read", {"path": "real.txt"})
            await client.shutdown()
            return path

    path = asyncio.run(session())
    assert pathlib.Path(path).exists()
    printed = subprocess.run([sys.executable, "-m", "smith_fast", "replay", path, "--print"], capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and "recorded" in printed.stdout
    same = subprocess.run([sys.executable, "-m", "smith_fast", "replay", path, "--against", server.unix, "--fast"],
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stdout + same.stderr
    other_root = server.root / "other"
    other_root.mkdir(exist_ok=True)
    (other_root / "real.txt").write_text("a different file\n")
    changed = subprocess.run([sys.executable, "-m", "smith_fast", "replay", path, "--spawn", "--serve-args", f"--root {other_root}", "--fast"],
                             capture_output=True, text=True, timeout=120)
    assert changed.returncode == 1 and "a different file" in changed.stdout


def test_replay_capability_records_on_request(tmp_path: pathlib.Path) -> None:
    async def go() -> str:
        async with await Client.connect(srv.unix) as client:
            ready = await client.handshake(["shell_exec", "replay"])
            assert pb.CAPABILITY_REPLAY in ready.capabilities
            await collect(client, "echo hi")
            await client.shutdown()
            return ready.service_info["smith_fast.recording"]

    state = beside(tmp_path, "state")  # the service refuses a root that holds its state
    # replay is granted only when the operator lists it (a recording holds a session's bytes); recorded
    # under the state dir
    srv = ServerProcess(tmp_path, "--capabilities", "shell_exec,replay", env={"XDG_STATE_HOME": str(state)}).start()
    try:
        path = asyncio.run(go())
        assert path.startswith(str(state))
        printed = subprocess.run([sys.executable, "-m", "smith_fast", "replay", path, "--print"], capture_output=True, text=True, timeout=60)
        lines = [json.loads(line) for line in printed.stdout.splitlines() if line.startswith("{")]
        assert any("handshake" in json.dumps(line) for line in lines)
        assert any("hi\\n" in json.dumps(line) for line in lines)
    finally:
        assert srv.stop() == 0


# ---- tracing -------------------------------------------------------------------------------------


def test_tracing_spans_and_child_traceparent(tmp_path: pathlib.Path) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def go() -> str:
        async with await Client.connect(srv.unix) as client:
            await client.handshake(["shell_exec", "tracing"], client_info={"traceparent": parent})
            out, final, _, error = await collect(client, 'echo "$TRACEPARENT $SMITH_TRACE_ID"')
            assert error is None
            await client.shutdown()
            return out

    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "smith-fast-test"}
    srv = ServerProcess(tmp_path, env=env).start()
    try:
        out = asyncio.run(go())
        traceparent, trace_id = out.split()
        assert trace_id == "0af7651916cd43dd8448eb211c80319c"  # the caller's trace continues
        assert traceparent.startswith("00-0af7651916cd43dd8448eb211c80319c-") and not traceparent.endswith("b7ad6b7169203331-01")
    finally:
        assert srv.stop() == 0
    stderr = "\n".join(srv.raw_stderr)
    assert "smith.shell_exec" in stderr and "smith.session" in stderr and "0af7651916cd43dd8448eb211c80319c" in stderr
