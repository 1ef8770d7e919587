"""The policy bypasses the hostile-input review found: every finding as written, against a real ``smith-fast serve``.

* the shell hooks see ``shell.run`` (and plan steps) as they see a ShellExec: one choke point;
* loading a Rust hook does not get around ``--hook``: ``--capabilities``, ``hooks_rust`` off by
  default, ``beforeHookLoad``, the token check (no ``include_str!``, no ``.init_array``);
* env variables that load code (``OPENSSL_CONF``, ``GIT_CONFIG_*``, ``PYTHONPATH``) are refused,
  and ``--env-policy allowlist`` refuses all but the safe and the listed names;
* the audit trail: one JSON line per request on the server's stderr.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, wait_until

BLOCK_RM = """
function beforeShellExec(p) {
  return p.command.includes("rm ") ? { action: "block", reason: "no rm here" } : { action: "allow" };
}
function onShellOutput(p) {
  const text = p.text.replaceAll("SECRET123", "[redacted]");
  return text === p.text ? { action: "allow" } : { action: "transform", data: { stream: p.stream, text } };
}
"""

# The deny.js: every command and every tool but fs.read is blocked.
DENY = """
function beforeShellExec(p) { return { action: "block", reason: "no commands" }; }
function beforeToolCall(p) { return p.tool === "fs.read" ? { action: "allow" } : { action: "block", reason: "only fs.read" }; }
"""
DENY_LOADS = DENY + 'function beforeHookLoad(p) { return { action: "block", reason: `no ${p.hook_type} hooks from peers` }; }\n'

LEAK = 'const LEAK: &str = include_str!("{path}");\nfn before_tool_call(_p: &Json) -> Action {{ Action::block(LEAK) }}\nhooks! {{ before_tool_call }}\n'
INIT_ARRAY = r"""
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
extern "C" fn init() {
    let _ = std::process::Command::new("/bin/sh").arg("-c").arg("id > {marker}").status();
}
fn before_tool_call(_p: &Json) -> Action { Action::Allow }
hooks! { before_tool_call }
"""


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def exec_(client: Client, command: str, **kw: Any) -> tuple[str, SmithError | None]:
    out = []
    try:
        async for ev in client.shell_exec(command, **kw):
            if ev.WhichOneof("event_type") == "shell_output":
                out.append(ev.shell_output.stdout)
    except SmithError as exc:
        return "".join(out), exc
    return "".join(out), None


async def shell_run(client: Client, args: dict[str, Any]) -> tuple[dict[str, Any] | None, SmithError | None]:
    try:
        res = await client.call_tool("shell.run", args)
    except SmithError as exc:
        return None, exc
    assert res.success, res.error
    return json.loads(res.result), None


def audit_lines(srv: ServerProcess) -> list[dict[str, Any]]:
    return [line for line in srv.logs if line.get("logger") == "smith_fast.audit" and line.get("event") == "request"]


def audit_for(srv: ServerProcess, **match: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in audit_lines(srv):
            if all(line.get(k) == v for k, v in match.items()):
                return line
        time.sleep(0.05)
    raise AssertionError(f"no audit line with {match}; have {audit_lines(srv)}")


@pytest.fixture
def block_rm(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    (tmp_path / "block_rm.js").write_text(BLOCK_RM)
    root = tmp_path / "root"
    root.mkdir()
    srv = ServerProcess(tmp_path, "--hook", str(tmp_path / "block_rm.js"), root=root).start()
    yield srv
    assert srv.stop() == 0


# ---- one choke point ---------------------------------------------------------------------------------


def test_before_shell_exec_sees_shell_run(block_rm: ServerProcess) -> None:
    """The finding: `exec 'rm file.txt'` was blocked, `call shell.run '{"command":"rm file.txt"}'` deleted it."""
    victim = block_rm.root / "file.txt"
    victim.write_text("keep me\n")

    async def go() -> None:
        async with await Client.connect(block_rm.unix) as client:
            await client.handshake(["shell_exec"])
            _, error = await exec_(client, "rm file.txt")
            assert error is not None and error.code == pb.ERROR_CODE_PERMISSION_DENIED
            result, error = await shell_run(client, {"command": "rm file.txt"})
            assert result is None and error is not None
            assert error.code == pb.ERROR_CODE_PERMISSION_DENIED and error.details["reason"] == "hook_blocked"
            assert "no rm here" in str(error)
            # what the hook allows runs, and its output passes the output hooks too
            result, error = await shell_run(client, {"command": "echo SECRET123 ok; echo SECRET123 >&2"})
            assert error is None and result is not None
            assert result["stdout"] == "[redacted] ok\n" and result["stderr"] == "[redacted]\n" and result["exit_code"] == 0
            # in chunks of --chunk-size, as a ShellExec's output: each fits what the hook may see
            result, error = await shell_run(client, {"command": "python3 -c \"print('SECRET123 ' * 30000)\""})
            assert error is None and result is not None
            assert result["stdout"].count("[redacted]") >= 29000 and len(result["stdout"]) > 64 * 1024

    run(go())
    assert victim.read_text() == "keep me\n"
    line = audit_for(block_rm, kind="tool_call", tool="shell.run", outcome="blocked")
    assert line["command"] == "rm file.txt" and line["origin"] == "shell.run"
    assert line["hooks"][0]["trigger"] == "before_shell_exec" and line["hooks"][0]["action"] == "block"


def test_plan_steps_pass_the_choke_point(block_rm: ServerProcess) -> None:
    victim = block_rm.root / "plan.txt"
    victim.write_text("keep me\n")

    async def go() -> list[pb.Event]:
        async with await Client.connect(block_rm.unix) as client:
            await client.handshake(["shell_exec"])
            events = []
            try:
                async for ev in client.plan("rm plan.txt", context={"execute": "true"}):
                    events.append(ev)
            except SmithError:
                pass
            return events

    run(go())
    assert victim.exists()
    line = audit_for(block_rm, kind="plan_step", outcome="blocked")
    assert "rm" in line["command"] and line["origin"] == "plan_step" and line["parent"]


PLUGIN = """
from smith_fast.tools import ProcessRequest, Tool

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


async def _run(args, ctx):
    done = await ctx.run_process(ProcessRequest(command=args["command"]))
    return {"exit_code": done.exit_code, "stdout": done.stdout.decode()}


TOOL = Tool("plug.run", "Run a command through the service.", SCHEMA, _run)
"""


def test_a_plugin_tools_processes_pass_the_choke_point(tmp_path: pathlib.Path) -> None:
    """A plug-in tool starts processes through ``ToolContext.run_process``: the shell hooks see them."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "smith_plug.py").write_text(PLUGIN)
    dist = site / "smith_plug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: smith_plug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[smith_fast.tools]\nrun = smith_plug:TOOL\n")
    (tmp_path / "block_rm.js").write_text(BLOCK_RM)
    root = tmp_path / "root"
    root.mkdir()
    victim = root / "file.txt"
    victim.write_text("keep me\n")
    srv = ServerProcess(tmp_path, "--hook", str(tmp_path / "block_rm.js"), root=root, env={"PYTHONPATH": str(site)}).start()
    try:
        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                await client.handshake(["shell_exec"])
                with pytest.raises(SmithError) as info:
                    await client.call_tool("plug.run", {"command": "rm file.txt"})
                assert info.value.code == pb.ERROR_CODE_PERMISSION_DENIED and info.value.details["reason"] == "hook_blocked"
                res = await client.call_tool("plug.run", {"command": "echo SECRET123"})
                assert res.success and json.loads(res.result) == {"exit_code": 0, "stdout": "[redacted]\n"}

        run(go())
    finally:
        assert srv.stop() == 0
    assert victim.read_text() == "keep me\n"
    line = audit_for(srv, kind="tool_call", tool="plug.run", outcome="blocked")
    assert line["origin"] == "plug.run" and line["command"] == "rm file.txt"


# ---- Rust hooks and --hook -------------------------------------------------------------------------


def _deny_server(tmp_path: pathlib.Path, script: str, *extra: str) -> ServerProcess:
    (tmp_path / "deny.js").write_text(script)
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return ServerProcess(tmp_path, "--hook", str(tmp_path / "deny.js"), *extra, root=root).start()


def test_hooks_rust_is_off_unless_the_operator_enables_it(tmp_path: pathlib.Path) -> None:
    srv = _deny_server(tmp_path, DENY)
    try:
        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                ready = await client.handshake(["shell_exec", "hooks_js", "hooks_rust"])
                assert pb.CAPABILITY_HOOKS_RUST not in ready.capabilities
                assert pb.CAPABILITY_HOOKS_JS in ready.capabilities
                with pytest.raises(SmithError) as info:
                    await client.load_hook("rust", LEAK.format(path="/etc/shadow"))
                assert info.value.code == pb.ERROR_CODE_INVALID_CAPABILITY

        run(go())
    finally:
        assert srv.stop() == 0


def test_capabilities_allow_list(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--capabilities", "shell_exec").start()
    try:
        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                ready = await client.handshake(["shell_exec", "hooks_js", "replay"])
                assert list(ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
                with pytest.raises(SmithError) as info:
                    await client.load_hook("js", BLOCK_RM)
                assert info.value.code == pb.ERROR_CODE_INVALID_CAPABILITY

        run(go())
    finally:
        assert srv.stop() == 0
    (tmp_path / "bad").mkdir()
    # a tool or a plan step cannot start what a ShellExec may not
    (tmp_path / "noexec").mkdir()
    srv = ServerProcess(tmp_path / "noexec", "--capabilities", "hooks_js").start()
    try:
        async def no_exec() -> None:
            async with await Client.connect(srv.unix) as client:
                await client.handshake(["shell_exec", "hooks_js"])
                result, error = await shell_run(client, {"command": "touch made-by-shell-run"})
                assert result is None and error is not None and error.code == pb.ERROR_CODE_INVALID_CAPABILITY
                async for _ in client.plan("touch made-by-plan", context={"execute": "true"}):
                    pass

        run(no_exec())
    finally:
        assert srv.stop() == 0
    assert not (srv.root / "made-by-shell-run").exists() and not (srv.root / "made-by-plan").exists()
    step = audit_for(srv, kind="plan_step")
    assert step["error_code"] == "INVALID_CAPABILITY" and "needs capability shell_exec" in step["reason"]
    bad = ServerProcess(tmp_path / "bad", "--capabilities", "shell_exec,root")
    with pytest.raises(RuntimeError, match="unknown capability root"):
        bad.start(timeout=20)
    assert bad.proc is not None and bad.proc.wait(10) == 2
    assert not any("Traceback" in line for line in bad.raw_stderr)


def test_rust_hook_exploits_are_refused(tmp_path: pathlib.Path) -> None:
    """The finding with hooks_rust enabled: the compiler does not read a file, nothing runs at load."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-7f3a\n")
    marker = tmp_path / f"ran-{uuid.uuid4().hex}"
    srv = _deny_server(tmp_path, DENY, "--capabilities", "shell_exec,hooks_js,hooks_rust")
    try:
        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                ready = await client.handshake(["shell_exec", "hooks_rust"])
                assert pb.CAPABILITY_HOOKS_RUST in ready.capabilities
                for path in ("/etc/shadow", str(secret)):
                    with pytest.raises(SmithError) as info:
                        await client.load_hook("rust", LEAK.format(path=path))
                    assert "include_str" in str(info.value) and "TOPSECRET" not in str(info.value)
                    assert info.value.details["reason"] == "hook_load_failed"
                with pytest.raises(SmithError) as info:
                    await client.load_hook("rust", INIT_ARRAY.replace("{marker}", str(marker)))
                assert "is not allowed in a session's Rust hook" in str(info.value)
                # hidden from a text search, not from the tokens
                hidden = 'macro_rules! m { ($i:ident) => { $i!("' + str(secret) + '") } }\nconst L: &str = m!(r#include_str);\n'
                with pytest.raises(SmithError, match="include_str"):
                    await client.load_hook("rust", hidden + "fn before_tool_call(_p: &Json) -> Action { Action::block(L) }\nhooks! { before_tool_call }\n")
                # the session still works under the global policy
                _, error = await exec_(client, "echo hi")
                assert error is not None and "no commands" in str(error)

        run(go())
    finally:
        assert srv.stop() == 0
    assert not marker.exists()
    assert not any("TOPSECRET" in line for line in srv.raw_stderr)


def test_before_hook_load_lets_the_operator_block_loads(tmp_path: pathlib.Path) -> None:
    srv = _deny_server(tmp_path, DENY_LOADS, "--capabilities", "shell_exec,hooks_js,hooks_rust")
    try:
        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                await client.handshake(["shell_exec", "hooks_js", "hooks_rust"])
                for kind, source in (("js", BLOCK_RM), ("rust", "fn before_tool_call(_p: &Json) -> Action { Action::Allow }\nhooks! { before_tool_call }\n")):
                    with pytest.raises(SmithError) as info:
                        await client.load_hook(kind, source)
                    assert info.value.code == pb.ERROR_CODE_PERMISSION_DENIED
                    assert info.value.details["reason"] == "hook_blocked" and f"no {kind} hooks from peers" in str(info.value)

        run(go())
    finally:
        assert srv.stop() == 0
    line = audit_for(srv, kind="hook_load", hook_type="rust")
    assert line["outcome"] == "blocked" and line["hooks"][0]["trigger"] == "before_hook_load"
    assert not any(entry.get("event") == "protocol error" and "hook" in str(entry.get("error")) for entry in srv.logs)


# ---- env variables that load code ------------------------------------------------------------------


ENGINE_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void smith_evil(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("engine ran\n", f); fclose(f); }
}
"""


@pytest.fixture(scope="module")
def env_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("env")
    root = tmp / "root"
    root.mkdir()
    srv = ServerProcess(tmp, root=root).start()
    yield srv
    assert srv.stop() == 0


def _openssl_engine(root: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    """An OpenSSL config naming an engine .so whose constructor writes ``marker`` (as uploaded by fs.write)."""
    (root / "evil.c").write_text(ENGINE_C)
    so = root / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(so), str(root / "evil.c")], check=True)
    conf = root / "evil.cnf"
    conf.write_text(
        "openssl_conf = openssl_init\n[openssl_init]\nengines = engine_section\n"
        f"[engine_section]\nevil = evil_section\n[evil_section]\ndynamic_path = {so}\ninit = 1\n"
    )
    return conf


def _attacks(root: pathlib.Path, marker: pathlib.Path) -> list[tuple[str, dict[str, str], str]]:
    conf = _openssl_engine(root, marker)
    site = root / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('site ran')\n")
    return [
        ("openssl version", {"OPENSSL_CONF": str(conf)}, "OPENSSL_CONF"),
        ("python3 -c 'import ssl'", {"OPENSSL_CONF": str(conf)}, "OPENSSL_CONF"),
        ("curl -s file:///dev/null", {"OPENSSL_CONF": str(conf)}, "OPENSSL_CONF"),
        ("git init -q g && cd g && git status", {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": f"touch {marker}"}, "GIT_CONFIG_COUNT"),
        ("python3 -c pass", {"PYTHONPATH": str(site)}, "PYTHONPATH"),
    ]


@pytest.mark.parametrize("case", range(5), ids=["openssl", "python-ssl", "curl", "git-fsmonitor", "pythonpath"])
def test_env_that_loads_code_is_refused(env_server: ServerProcess, case: int) -> None:
    marker = env_server.root / f"ran-{uuid.uuid4().hex}"
    command, env, name = _attacks(env_server.root, marker)[case]

    async def go() -> None:
        async with await Client.connect(env_server.unix) as client:
            await client.handshake(["shell_exec"])
            _, error = await exec_(client, command, env=env)
            assert error is not None and error.code == pb.ERROR_CODE_PERMISSION_DENIED
            assert error.details["reason"] == "env_refused" and name in error.details["variables"].split(",")
            result, error = await shell_run(client, {"command": command, "env": env})
            assert result is None and error is not None and error.details["reason"] == "env_refused"

    run(go())
    assert not marker.exists()


def test_the_env_attacks_are_real_when_allowed(tmp_path: pathlib.Path) -> None:
    """The same bytes with --allow-env: each one runs code (so the refusal above is what stops it)."""
    root = tmp_path / "root"
    root.mkdir()
    names = ["OPENSSL_CONF", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0", "PYTHONPATH"]
    srv = ServerProcess(tmp_path, *[a for n in names for a in ("--allow-env", n)], root=root).start()
    try:
        markers = []

        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                await client.handshake(["shell_exec"])
                for case in range(5):
                    marker = root / f"ran-{case}"
                    markers.append(marker)
                    command, env, _ = _attacks(root, marker)[case]
                    await exec_(client, command, env=env)

        run(go())
        assert [m.exists() for m in markers] == [True] * 5
    finally:
        assert srv.stop() == 0


def test_env_policy_allowlist(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--env-policy", "allowlist", "--allow-env", "GREETING").start()
    try:
        async def go() -> None:
            async with await Client.connect(srv.unix) as client:
                await client.handshake(["shell_exec"])
                out, error = await exec_(client, 'echo "$GREETING $LANG"', env={"GREETING": "hi", "LANG": "C.UTF-8"})
                assert error is None and out == "hi C.UTF-8\n"
                _, error = await exec_(client, "true", env={"SOMETHING_ELSE": "1"})
                assert error is not None and error.details["reason"] == "env_refused" and error.details["env_policy"] == "allowlist"
                assert "SOMETHING_ELSE" in str(error)

        run(go())
    finally:
        assert srv.stop() == 0


# ---- the audit trail -------------------------------------------------------------------------------


def test_audit_line_per_request(block_rm: ServerProcess) -> None:
    async def go() -> str:
        async with await Client.connect(block_rm.unix) as client:
            await client.handshake(["shell_exec"])
            await exec_(client, "echo fine")
            await exec_(client, "rm -f nothing")
            await exec_(client, "sleep 5", timeout_ms=200)
            await client.call_tool("fs.list", {"path": "."})
            with pytest.raises(SmithError):
                await client.load_hook("js", BLOCK_RM)  # not granted: refused before it runs
            return client.ready.service_id if client.ready else ""

    run(go())
    ok = audit_for(block_rm, kind="shell_exec", command="echo fine")
    assert ok["outcome"] == "ok" and ok["exit_code"] == 0 and ok["hooks"] == [{"trigger": "before_shell_exec", "action": "allow"}]
    assert {"session", "peer", "request_id", "duration_ms"} <= ok.keys() and "killed" not in ok
    blocked = audit_for(block_rm, kind="shell_exec", command="rm -f nothing")
    assert blocked["outcome"] == "blocked" and blocked["error_code"] == "PERMISSION_DENIED" and blocked["blocked_by"]
    assert "exit_code" not in blocked
    killed = audit_for(block_rm, kind="shell_exec", command="sleep 5")
    assert killed["outcome"] == "timeout" and killed["killed"] is True and killed["kill_reason"] == "timeout"
    tool = audit_for(block_rm, kind="tool_call", tool="fs.list")
    assert tool["outcome"] == "ok" and tool["success"] is True
    def refused_lines() -> list[dict[str, Any]]:  # (the log is read as it comes: it may lag the answer)
        return [line for line in audit_lines(block_rm) if line.get("outcome") == "refused" and "hooks_js" in line.get("reason", "")]

    assert wait_until(refused_lines, 10), audit_lines(block_rm)
    refused = refused_lines()
    assert refused[0]["error_code"] == "INVALID_CAPABILITY" and refused[0]["request_id"]
    # a hook block is a block in the log, not a protocol error
    assert not any(line.get("event") == "protocol error" and "blocked by hook" in str(line.get("error")) for line in block_rm.logs)


def test_long_commands_are_cut_in_the_audit_line(block_rm: ServerProcess) -> None:
    command = "echo " + "x" * 5000

    async def go() -> None:
        async with await Client.connect(block_rm.unix) as client:
            await client.handshake(["shell_exec"])
            await exec_(client, command)

    run(go())
    line = audit_for(block_rm, kind="shell_exec", outcome="ok")
    assert len(line["command"]) <= 256 and line["command"].startswith("echo xxx")


def test_gcc_and_git_are_here() -> None:
    # the env tests build and run real programs: they must exist, not be skipped
    for tool in ("gcc", "git", "openssl", "python3", "curl"):
        assert shutil.which(tool), tool
