"""Hostile input against a real ``smith-fast serve`` process: the shared-secret token, environment
injection, oversize and deeply nested input, escapes from the tool workspace, hooks reaching for
the system, non-loopback listeners. RELIABILITY.md lists each case with the test that covers it."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import uuid

import grpc
import pytest
from grpc import aio

from smith_fast.client import Client, GrpcClient, SmithError
from smith_fast.errors import ProtocolError
from smith_fast.refused_env import REFUSED_NAMES, check_env, refused_names
from smith_fast.pb import smith_pb2 as pb
from smith_fast.pb import smith_pb2_grpc
from smith_fast.replay import read_log
from smith_fast.service.auth import REDACTED, metadata_token, token_matches

from .peers import V0Peer, V1Peer, errors, kind, terminal
from harness.server import ServerProcess, assert_clean_log, beside, wait_until

TOKEN = "tok-3f9a1c77e2b04d8c"
CLI = [sys.executable, "-m", "smith_fast"]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "SMITH_TOKEN"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**full, **(env or {})})


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def guarded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A service that needs TOKEN (given as SMITH_TOKEN), recording every session, with gRPC."""
    tmp = tmp_path_factory.mktemp(f"guarded-{request.param}")
    (tmp / "hello.txt").write_text("hello\n")
    srv = ServerProcess(
        tmp, "--grpc", "127.0.0.1:0", "--record", str(beside(tmp, "rec")), env={"SMITH_TOKEN": TOKEN}, loop=request.param
    ).start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)
    # the token is never logged, at debug level either
    assert not any(TOKEN in line for line in srv.raw_stderr)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A service without a token, with small size limits, for the hostile-input tests."""
    tmp = tmp_path_factory.mktemp("plain")
    root = tmp / "root"
    root.mkdir()
    (root / "inside.txt").write_text("inside\n")
    (tmp / "outside.txt").write_text("outside secret\n")
    (tmp / "outdir").mkdir()
    (root / "link-out").symlink_to(tmp / "outside.txt")
    (root / "dir-out").symlink_to(tmp / "outdir")
    (root / "dangling-out").symlink_to(tmp / "does-not-exist")
    srv = ServerProcess(tmp, "--allow-env", "LD_LIBRARY_PATH", "--allow-env", "PYTHONPATH", root=root).start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


# ---- the token -----------------------------------------------------------------------------------


def test_token_matches_is_exact_and_takes_any_text() -> None:
    assert token_matches("abc", "abc")
    assert not token_matches("abc", "abd") and not token_matches("abc", "ab") and not token_matches("abc", "abcd")
    assert not token_matches("abc", None) and not token_matches("abc", "")
    assert token_matches("ünïcødé-✓", "ünïcødé-✓") and not token_matches("ünïcødé-✓", "unicode-v")
    assert metadata_token([("authorization", "Bearer x1")]) == "x1"
    assert metadata_token([("authorization", "bearer  x2 ")]) == "x2"
    assert metadata_token([("smith-token", b"x3")]) == "x3"
    assert metadata_token([("authorization", "Basic eDp5")]) is None and metadata_token(None) is None


@pytest.mark.parametrize("protocol", ["v1", "v0"])
@pytest.mark.parametrize("via", ["unix", "tcp"])
async def test_socket_peers_need_the_token(guarded: ServerProcess, via: str, protocol: str) -> None:
    async with await Client.connect(guarded.address(via), protocol=protocol, token=TOKEN) as client:
        await client.handshake()
        out = [ev.shell_output.stdout async for ev in client.shell_exec("echo in") if ev.shell_output.HasField("stdout")]
        assert out == ["in\n"]
        await client.handshake()  # a later handshake needs no token: the connection is authenticated
    for token, says in [(None, "presents no token"), ("tok-wrong", "presents a wrong token"), (TOKEN[:-1], "wrong token")]:
        client = await Client.connect(guarded.address(via), protocol=protocol, token=token)
        with pytest.raises(SmithError) as info:
            await client.handshake()
        assert info.value.code == pb.ERROR_CODE_PERMISSION_DENIED and says in str(info.value)
        if protocol == "v1":
            assert info.value.details["reason"] == "unauthenticated"
        await asyncio.wait_for(client._closed.wait(), 5)  # noqa: SLF001 (the service closed the connection)
        await client.close()


def test_the_command_line_says_where_the_token_goes(guarded: ServerProcess) -> None:
    import concurrent.futures

    runs = [(token, args) for token in ("", "tok-wrong")
            for args in (["exec", "true"], ["ping"], ["call", "tools.list"], ["ps"])]

    def run(case: tuple[str, list[str]]) -> subprocess.CompletedProcess[str]:
        token, args = case
        return subprocess.run([sys.executable, "-m", "smith_fast", args[0], "--connect", guarded.unix, *args[1:]], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "SMITH_TOKEN": token})

    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        for (token, args), done in zip(runs, pool.map(run, runs)):
            assert done.returncode != 0 and "ERROR_CODE_PERMISSION_DENIED" in done.stderr, (token, args, done.stderr)
            assert done.stderr.rstrip().endswith("closing the connection (give the service's token in $SMITH_TOKEN, or --token)"), (
                token, args, done.stderr)


def test_nothing_but_an_authenticated_handshake_is_served(guarded: ServerProcess) -> None:
    peer = V1Peer(guarded.tcp)
    peer.command(shell_exec=pb.ShellExecCommand(request_id="r", command="touch should-not-exist"))
    envs = peer.rest()
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "shell_exec before an authenticated handshake" in err.message
    assert [e.sequence for e in envs] == list(range(1, len(envs) + 1))
    assert not (guarded.root / "should-not-exist").exists()
    # a health check before the handshake is refused alike
    peer = V1Peer(guarded.unix)
    env = pb.Envelope()
    env.health_check_request.service_name = ""
    peer.send(env)
    (err,) = errors(peer.rest())
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED


def test_v0_token_is_a_member_of_the_handshake_data(guarded: ServerProcess) -> None:
    peer = V0Peer(guarded.unix)
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"], "token": TOKEN}})
    assert peer.until(lambda m: m["type"] == "Ready")[-1]["data"]["version"] == 0
    peer = V0Peer(guarded.unix)
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": [], "token": 42}})
    msgs = peer.rest()
    assert [m["data"]["error_code"] for m in msgs if m["type"] == "Error"] == ["PERMISSION_DENIED"]


async def test_grpc_token_in_metadata_or_handshake(guarded: ServerProcess) -> None:
    target = guarded.grpc.removeprefix("grpc:")
    # the SDK sends it both ways
    async with await Client.connect(guarded.grpc, token=TOKEN) as client:
        assert (await client.handshake()).version == 1
        assert (await client.negotiate()).selected_version == 1  # type: ignore[attr-defined]
    # metadata alone (smith-token or Bearer), handshake alone
    for metadata, info in [((("smith-token", TOKEN),), {}), ((("authorization", f"Bearer {TOKEN}"),), {}), (None, {"token": TOKEN})]:
        async with aio.insecure_channel(target) as channel:
            stub = smith_pb2_grpc.SmithServiceStub(channel)
            call = stub.Stream(metadata=metadata)
            hs = pb.Envelope()
            hs.command.handshake.version = 1
            hs.command.handshake.client_info.update(info)
            await call.write(hs)
            while (await call.read()).event.WhichOneof("event_type") != "ready":
                pass
            await call.done_writing()  # half-close: the call then ends once its events are read
            while await call.read() is not aio.EOF:
                pass
            assert await call.code() == grpc.StatusCode.OK
    # a wrong token in the metadata fails the call at once; a missing one after the ErrorEvent
    # The server takes the handshake, then refuses the call: the client learns it as the refusal
    # (UNAUTHENTICATED, turned into a PERMISSION_DENIED ErrorEvent) every time, never as a write
    # that raced the refusal. Repeated, because that race was one call in ten.
    for _ in range(20):
        client = await GrpcClient.open(target, token="tok-wrong")
        with pytest.raises(SmithError) as info:
            await client.handshake()
        await client.close()
        assert info.value.code == pb.ERROR_CODE_PERMISSION_DENIED and "wrong token" in str(info.value)
        assert client.status == grpc.StatusCode.UNAUTHENTICATED
    client = await GrpcClient.open(target)
    with pytest.raises(SmithError, match="presents no token"):
        await client.handshake()
    await asyncio.wait_for(client._closed.wait(), 5)  # noqa: SLF001
    assert client.status == grpc.StatusCode.UNAUTHENTICATED
    await client.close()
    async with aio.insecure_channel(target) as channel:
        stub = smith_pb2_grpc.SmithServiceStub(channel)
        with pytest.raises(aio.AioRpcError) as rpc:
            await stub.Negotiate(pb.NegotiateRequest(supported_versions=[1]))
        assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = await stub.Negotiate(pb.NegotiateRequest(supported_versions=[1], client_metadata={"token": TOKEN}))
        assert ok.selected_version == 1


def test_cli_sends_the_token(guarded: ServerProcess) -> None:
    res = cli("exec", "--connect", guarded.unix, "--token", TOKEN, "echo via-flag")
    assert (res.returncode, res.stdout) == (0, "via-flag\n"), res.stderr
    res = cli("call", "--connect", guarded.tcp, "fs.read", '{"path": "hello.txt"}', env={"SMITH_TOKEN": TOKEN})
    assert res.returncode == 0 and json.loads(res.stdout)["content"] == "hello\n", res.stderr
    res = cli("ping", "--connect", guarded.unix, "-c", "1", "--protocol", "v0", env={"SMITH_TOKEN": TOKEN})
    assert res.returncode == 0 and "round trip 1" in res.stdout, res.stderr
    res = cli("health", guarded.unix, "--token", TOKEN)
    assert res.returncode == 0 and res.stdout.startswith("SERVING"), res.stderr
    for args in (["exec", "--connect", guarded.unix, "true"], ["call", "--connect", guarded.unix, "tools.list"]):
        res = cli(args[0], "--token", "tok-wrong", *args[1:])  # exec's words after COMMAND are the command's own
        assert res.returncode != 0 and "PERMISSION_DENIED" in res.stderr
        assert "tok-wrong" not in res.stderr
    res = cli("health", guarded.unix)
    assert res.returncode == 2 and "PERMISSION_DENIED" in res.stderr


def test_token_is_not_recorded_and_replay_supplies_it(guarded: ServerProcess) -> None:
    peer = V1Peer(guarded.unix)
    ready = peer.handshake(token=TOKEN)[-1].event.ready
    peer.command(tool_call=pb.ToolCallCommand(request_id="rec-1", tool="fs.read", args=b'{"path": "hello.txt"}'))
    peer.until(terminal("rec-1"))
    log_path = pathlib.Path(ready.service_info["smith_fast.recording"])
    peer.close()
    assert wait_until(lambda: log_path.exists() and read_log(log_path)[1] != [], 5)
    _, records, _ = read_log(log_path)
    handshakes = [r.parse().command.handshake for r in records if r.inbound and r.parse().command.HasField("handshake")]
    assert handshakes and all(h.client_info["token"] == REDACTED for h in handshakes)
    assert TOKEN.encode() not in log_path.read_bytes()
    res = cli("replay", str(log_path), "--against", guarded.unix, "--fast", "--token", TOKEN)
    assert res.returncode == 0 and "identical" in res.stdout, res.stdout + res.stderr
    res = cli("replay", str(log_path), "--against", guarded.unix, "--fast", "--timeout", "3", "--settle", "0.2")
    assert res.returncode == 1  # without it the service refuses the replayed handshake


async def test_stdio_trusts_its_parent(tmp_path: pathlib.Path) -> None:
    """A stdio service was started by its peer: it asks no token even when one is configured."""
    env = {**os.environ, "SMITH_TOKEN": TOKEN}
    async with await Client.spawn("--root", str(tmp_path), env=env) as client:
        assert (await client.handshake()).version == 1


def test_empty_token_flag_is_refused(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--token", "")
    with pytest.raises(RuntimeError, match="--token must not be empty"):
        srv.start(timeout=10)
    assert srv.proc is not None and srv.proc.wait(10) == 2


def test_token_flag(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--token", TOKEN).start()
    try:
        assert kind(V1Peer(srv.unix).handshake(token=TOKEN)[-1]) == "ready"
        assert errors(V1Peer(srv.unix).handshake(token="x"))[0].error_code == pb.ERROR_CODE_PERMISSION_DENIED
        assert any(r.get("event") == "ready" and r.get("token_required") is True for r in srv.logs)
    finally:
        assert srv.stop() == 0
    assert not any(TOKEN in line for line in srv.raw_stderr)


# ---- environment injection ---------------------------------------------------------------------------


def test_refused_names_policy() -> None:
    # PYTHONPATH is refused (a sitecustomize.py there runs in every python3)
    assert refused_names(["LD_PRELOAD", "PATH", "DYLD_INSERT_LIBRARIES", "BASH_FUNC_ls%%", "ld_preload", "PYTHONPATH"]) == [
        "LD_PRELOAD", "DYLD_INSERT_LIBRARIES", "BASH_FUNC_ls%%", "PYTHONPATH",
    ]  # fmt: skip
    assert refused_names(["LD_PRELOAD", "LD_AUDIT"], allow={"LD_AUDIT"}) == ["LD_PRELOAD"]
    assert refused_names(["A=B", ""], allow={"A=B", ""}) == ["A=B", ""]  # no flag makes a name of these
    with pytest.raises(ProtocolError) as caught:
        check_env({"A=B": "c"}, allow={"A=B"})
    assert "not a well-formed name" in str(caught.value) and "--allow-env" not in str(caught.value)
    assert {"BASH_ENV", "ENV", "GCONV_PATH", "GLIBC_TUNABLES", "NODE_OPTIONS", "PS4"} <= REFUSED_NAMES


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "BASH_ENV", "GLIBC_TUNABLES", "NODE_OPTIONS", "BASH_FUNC_ls%%"])
def test_shell_exec_env_injection_is_refused(plain: ServerProcess, name: str) -> None:
    marker = plain.root / f"ran-{uuid.uuid4().hex}"
    peer = V1Peer(plain.unix)
    peer.handshake()
    peer.command(shell_exec=pb.ShellExecCommand(request_id="e", command=f"touch {marker}", env={"OK": "1", name: "/tmp/x.so"}))
    envs = peer.until(terminal("e"))
    if name == "LD_LIBRARY_PATH":  # this service runs with --allow-env LD_LIBRARY_PATH
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY and marker.exists()
        return
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and name in err.message
    assert err.details["reason"] == "env_refused" and err.details["variables"] == name
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_ERROR
    assert not any(kind(e) == "shell_output" for e in envs) and not marker.exists()


def test_allowed_env_reaches_the_command(plain: ServerProcess) -> None:
    peer = V1Peer(plain.unix)
    peer.handshake()
    peer.command(shell_exec=pb.ShellExecCommand(request_id="a", command='echo "$LD_LIBRARY_PATH $PYTHONPATH"', env={"LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "src"}))
    envs = peer.until(terminal("a"))
    assert "".join(e.event.shell_output.stdout for e in envs) == "/opt/lib src\n"


def test_v0_and_shell_run_env_injection_is_refused(plain: ServerProcess) -> None:
    peer = V0Peer(plain.unix)
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
    peer.until(lambda m: m["type"] == "Ready")
    rid = str(uuid.uuid4())
    peer.send({"type": "ShellExec", "data": {"request_id": rid, "command": "true", "shell": None, "cwd": None, "env": {"LD_PRELOAD": "x"}, "timeout_ms": None}})
    msgs = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["request_id"] == rid and m["data"]["state"] in ("Ready", "Error"))
    (err,) = [m["data"] for m in msgs if m["type"] == "Error"]
    assert err["error_code"] == "PERMISSION_DENIED" and "LD_PRELOAD" in err["message"]
    v1 = V1Peer(plain.unix)
    v1.handshake()
    args = json.dumps({"command": "echo hi", "env": {"BASH_ENV": "/tmp/x"}}).encode()
    v1.command(tool_call=pb.ToolCallCommand(request_id="t", tool="shell.run", args=args))
    envs = v1.until(terminal("t"))
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "shell.run env sets BASH_ENV" in err.message


def test_hook_transformed_env_is_checked_after_the_hooks(plain: ServerProcess) -> None:
    peer = V1Peer(plain.unix)
    peer.handshake(caps=(pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_HOOKS_JS))
    script = (
        'function beforeShellExec(p) { return {action: "transform", data: {...p, env: {...p.env, LD_PRELOAD: "/tmp/evil.so"}}}; }\n'
        'function beforeToolCall(p) { return {action: "transform", data: {tool: p.tool, args: {...p.args, env: {GCONV_PATH: "/tmp"}}}}; }'
    )
    peer.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=script))
    peer.until(terminal("h"))
    peer.command(shell_exec=pb.ShellExecCommand(request_id="s", command="echo innocent"))
    (err,) = errors(peer.until(terminal("s")))
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "LD_PRELOAD" in err.message
    peer.command(tool_call=pb.ToolCallCommand(request_id="t", tool="shell.run", args=b'{"command": "echo innocent"}'))
    (err,) = errors(peer.until(terminal("t")))
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "GCONV_PATH" in err.message


# ---- oversize and deeply nested input ------------------------------------------------------------------


def test_huge_commands_are_refused_without_running(plain: ServerProcess) -> None:
    marker = plain.root / "huge-ran"
    peer = V1Peer(plain.unix)
    peer.handshake()
    huge = f"touch {marker}; : " + "x" * (1100 * 1024)
    peer.command(shell_exec=pb.ShellExecCommand(request_id="big", command=huge))
    envs = peer.until(terminal("big"))
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and err.details["reason"] == "too_large"
    assert int(err.details["size"]) > 1100 * 1024 and err.details["limit"] == str(1 << 20)
    assert not any(kind(e) == "shell_output" for e in envs) and not marker.exists()
    # the env counts too; and tool arguments; and plan goals
    peer.command(shell_exec=pb.ShellExecCommand(request_id="env", command="true", env={"BIG": "y" * (1 << 20)}))
    assert errors(peer.until(terminal("env")))[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
    args = json.dumps({"path": "inside.txt", "pad": "z" * (1 << 20)}).encode()
    peer.command(tool_call=pb.ToolCallCommand(request_id="args", tool="fs.read", args=args))
    envs = peer.until(terminal("args"))
    assert errors(envs)[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and not any(kind(e) == "tool_result" for e in envs)
    peer.command(plan=pb.PlanCommand(request_id="plan", goal="echo " + "g" * (1 << 20)))
    assert errors(peer.until(terminal("plan")))[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
    # a large command under the limit runs (Linux itself caps one exec argument at 128 KiB)
    peer.command(shell_exec=pb.ShellExecCommand(request_id="ok", command="echo ok; : " + "x" * (100 * 1024)))
    assert "".join(e.event.shell_output.stdout for e in peer.until(terminal("ok"))) == "ok\n"


def test_hook_cannot_inflate_a_command_past_the_limit(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-command-size", "1k").start()
    try:
        peer = V1Peer(srv.unix)
        peer.handshake(caps=(pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_HOOKS_JS))
        script = 'function beforeShellExec(p) { return {action: "transform", data: {...p, command: p.command + "; :" + " x".repeat(2000)}}; }'
        peer.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=script))
        peer.until(terminal("h"))
        peer.command(shell_exec=pb.ShellExecCommand(request_id="s", command="echo small"))
        (err,) = errors(peer.until(terminal("s")))
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and "after hooks" in err.message
    finally:
        assert srv.stop() == 0


def test_deeply_nested_json_never_crashes_the_service(plain: ServerProcess) -> None:
    depth = 100_000
    peer = V1Peer(plain.unix)
    peer.handshake(caps=(pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_HOOKS_JS))
    cases = {
        "array": b"[" * depth + b"]" * depth,
        "open": b"[" * depth,
        "in-object": b'{"path": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}",
    }
    for name, args in cases.items():
        peer.command(tool_call=pb.ToolCallCommand(request_id=name, tool="fs.read", args=args))
        envs = peer.until(terminal(name))
        (result,) = [e.event.tool_result for e in envs if kind(e) == "tool_result"]
        assert not result.success and "nested too deeply" in result.error, result.error
    # through a before_tool_call hook, which decodes the arguments first
    peer.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script='function beforeToolCall(p) { return {action: "allow"}; }'))
    peer.until(terminal("h"))
    peer.command(tool_call=pb.ToolCallCommand(request_id="hooked", tool="fs.read", args=cases["array"]))
    envs = peer.until(terminal("hooked"))
    assert not [e for e in envs if kind(e) == "tool_result"][0].event.tool_result.success
    # a plan whose steps nest deeply
    peer.command(plan=pb.PlanCommand(request_id="plan", goal="g", context={"steps": "[" * depth}))
    (err,) = errors(peer.until(terminal("plan")))
    assert err.details["reason"] == "invalid_json"
    # v0: nesting is capped per line (serde_json's 127), the session goes on
    v0 = V0Peer(plain.unix)
    v0.send({"type": "Handshake", "data": {"version": 0, "capabilities": []}})
    v0.until(lambda m: m["type"] == "Ready")
    v0.sock.sendall(b'{"type":"ToolCall","data":{"request_id":"' + str(uuid.uuid4()).encode() + b'","tool":"fs.read","args":' + b"[" * depth + b"]" * depth + b',"timeout_ms":null}}\n')
    err = v0.until(lambda m: m["type"] == "Error")[-1]["data"]
    assert "nested deeper" in err["message"]
    v0.send({"type": "Handshake", "data": {"version": 0, "capabilities": []}})
    assert v0.until(lambda m: m["type"] == "Ready")
    # and the service is fine
    peer.command(tool_call=pb.ToolCallCommand(request_id="after", tool="fs.read", args=b'{"path": "inside.txt"}'))
    result = [e for e in peer.until(terminal("after")) if kind(e) == "tool_result"][0].event.tool_result
    assert result.success and json.loads(result.result)["content"] == "inside\n"


# ---- the tool workspace ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("fs.read", {"path": "../outside.txt"}),
        ("fs.read", {"path": "link-out"}),
        ("fs.read", {"path": "dir-out/anything"}),
        ("fs.read", {"path": "dangling-out"}),
        ("fs.read", {"path": "/etc/passwd"}),
        ("fs.read", {"path": "inside.txt/../../outside.txt"}),
        ("fs.write", {"path": "dir-out/planted.txt", "content": "x"}),
        ("fs.write", {"path": "../planted.txt", "content": "x"}),
        ("fs.write", {"path": "dangling-out", "content": "x"}),
        ("fs.list", {"path": ".."}),
        ("fs.list", {"path": "dir-out"}),
        ("fs.search", {"pattern": "secret", "path": ".."}),
        ("shell.run", {"command": "cat outside.txt", "cwd": ".."}),
        ("shell.run", {"command": "pwd", "cwd": "dir-out"}),
    ],
)
def test_workspace_escapes_are_denied(plain: ServerProcess, tool: str, args: dict[str, str]) -> None:
    peer = V1Peer(plain.tcp)
    peer.handshake(caps=())
    peer.command(tool_call=pb.ToolCallCommand(request_id="x", tool=tool, args=json.dumps(args).encode()))
    envs = peer.until(terminal("x"))
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "outside the workspace root" in err.message
    assert not any(kind(e) == "tool_result" for e in envs)
    outside = plain.root.parent
    assert not (outside / "planted.txt").exists() and not (outside / "outdir" / "planted.txt").exists()
    assert not (outside / "does-not-exist").exists()


def test_symlinks_inside_the_workspace_are_followed(plain: ServerProcess) -> None:
    (plain.root / "link-in").unlink(missing_ok=True)
    (plain.root / "link-in").symlink_to("inside.txt")
    peer = V1Peer(plain.unix)
    peer.handshake(caps=())
    peer.command(tool_call=pb.ToolCallCommand(request_id="in", tool="fs.read", args=b'{"path": "link-in"}'))
    result = [e for e in peer.until(terminal("in")) if kind(e) == "tool_result"][0].event.tool_result
    assert result.success and json.loads(result.result)["content"] == "inside\n"


# ---- hooks reaching for the system --------------------------------------------------------------------------

HOSTILE_JS = r"""
function beforeShellExec(p) {
  const names = ["std", "os", "require", "fetch", "process", "XMLHttpRequest", "WebSocket", "Deno", "Bun", "setTimeout"];
  const seen = names.filter((n) => typeof globalThis[n] !== "undefined");
  let opened = "no";
  try { std.open("/etc/passwd", "r"); opened = "yes"; } catch (e) { opened = "threw"; }
  return {action: "transform", data: {...p, command: "echo " + JSON.stringify(seen.join(",") + "|" + opened)}};
}
function beforeToolCall(p) {
  return require("fs").readFileSync("/etc/passwd");   // throws: there is no require
}
"""
RUNAWAY_JS = 'function afterToolResult(p) { while (true) {} }'  # runs past its time limit


def test_js_hooks_cannot_reach_files_network_or_process(plain: ServerProcess) -> None:
    peer = V1Peer(plain.unix)
    peer.handshake(caps=(pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_HOOKS_JS))
    peer.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=HOSTILE_JS))
    assert not errors(peer.until(terminal("h")))
    peer.command(shell_exec=pb.ShellExecCommand(request_id="s", command="true"))
    out = "".join(e.event.shell_output.stdout for e in peer.until(terminal("s")))
    assert out == "|threw\n"  # no global of the list exists, and std.open threw
    # a hook that throws or runs away fails closed: the request is blocked, the service goes on
    peer.command(tool_call=pb.ToolCallCommand(request_id="t", tool="fs.read", args=b'{"path": "inside.txt"}'))
    (err,) = errors(peer.until(terminal("t")))
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "require is not defined" in err.message
    runaway = V1Peer(plain.unix)
    runaway.handshake(caps=(pb.CAPABILITY_HOOKS_JS,))
    runaway.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=RUNAWAY_JS))
    runaway.until(terminal("h"))
    runaway.command(tool_call=pb.ToolCallCommand(request_id="t", tool="fs.read", args=b'{"path": "inside.txt"}'))
    (result,) = [e.event.tool_result for e in runaway.until(terminal("t")) if kind(e) == "tool_result"]
    assert not result.success and "ran past its time limit" in result.error and "inside" not in result.error


# ---- listeners ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "address"),
    [("--tcp", "0.0.0.0:0"), ("--tcp", "[::]:0"), ("--grpc", "0.0.0.0:0"), ("--metrics", "0.0.0.0:0")],
)
def test_non_loopback_listeners_need_allow_remote(tmp_path: pathlib.Path, flag: str, address: str) -> None:
    srv = ServerProcess(tmp_path, flag, address)
    with pytest.raises(RuntimeError, match="non-loopback address .* pass --allow-remote"):
        srv.start(timeout=10)
    assert srv.proc is not None and srv.proc.wait(10) == 2
    assert not os.path.exists(srv.sock_path)  # nothing was bound before the refusal


def test_allow_remote_binds_every_address(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--tcp", "0.0.0.0:0", "--allow-remote").start()
    try:
        assert any(str(r.get("address", "")).startswith("tcp:0.0.0.0:") for r in srv.logs)
    finally:
        assert srv.stop() == 0
