"""The MCP front against the official MCP Python SDK (``mcp``, pinned in requirements-dev.txt): its
client spawns ``smith-fast serve --mcp`` (stdio) or talks to ``serve --mcp-http`` (Streamable HTTP),
lists and calls every built-in tool, streams a shell command's progress, cancels one, and is
refused by a JS hook. Every check runs over both transports.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import StdioServerParameters
from mcp.client.client import Client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from harness.server import ROOT, SmithProcess, beside, host_pids, pid_alive, wait_until
from smith_fast.mcp import protocol

BUILTINS = ["fs.list", "fs.read", "fs.search", "fs.write", "shell.run", "tools.list"]
TRANSPORTS = ["stdio", "http"]

BLOCK_RM = """
function beforeShellExec(p) {
  if (p.command.includes("rm ")) return { action: "block", reason: "no rm via MCP" };
  return { action: "allow" };
}
"""


def mcp_url(proc: SmithProcess) -> str:
    for record in proc.logs:
        address = str(record.get("address", ""))
        if record.get("event") == "listening" and address.endswith("/mcp"):
            return address
    raise AssertionError(f"no MCP listener in the log: {proc.raw_stderr[-20:]}")


@contextlib.asynccontextmanager
async def connect(transport: str, tmp: pathlib.Path, *extra: str, **client: Any) -> AsyncIterator[Client]:
    """An SDK client connected to a fresh smith-fast over ``transport``."""
    args = ["serve", "--root", str(tmp), "--log-level", "debug", *extra]
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable, args=["-m", "smith_fast", *args, "--mcp"], cwd=str(ROOT))
        with open(tmp / "server.log", "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), **client) as sdk:
                yield sdk
        return
    proc = SmithProcess(tmp, *args, "--mcp-http", "127.0.0.1:0").start()
    try:
        async with Client(mcp_url(proc), **client) as sdk:
            yield sdk
    finally:
        proc.stop()


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.filterwarnings("ignore:ping is removed")
async def test_initialize_and_list(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path) as client:
        assert client.protocol_version == protocol.LATEST
        caps = client.server_capabilities
        assert caps is not None and caps.tools is not None and caps.logging is not None
        listed = (await client.list_tools()).tools
        names = [t.name for t in listed]
        assert names == [n for n in BUILTINS if n not in protocol.HIDDEN_TOOLS] + ["shell"]
        by_name = {t.name: t for t in listed}
        assert by_name["fs.read"].annotations is not None and by_name["fs.read"].annotations.read_only_hint is True
        assert by_name["fs.write"].annotations is not None and by_name["fs.write"].annotations.destructive_hint is True
        assert by_name["shell"].input_schema["required"] == ["command"]
        assert by_name["shell"].output_schema is not None
        assert by_name["fs.search"].input_schema["properties"]["pattern"]["type"] == "string"
        await client.send_ping()


async def test_every_builtin_tool(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path, "--mcp-expose-all-tools") as client:
        wrote = await client.call_tool("fs.write", {"path": "notes/a.txt", "content": "alpha\nbeta\n", "create_dirs": True})
        assert not wrote.is_error, wrote.content
        assert (tmp_path / "notes" / "a.txt").read_text() == "alpha\nbeta\n"
        read = await client.call_tool("fs.read", {"path": "notes/a.txt"})
        assert not read.is_error
        assert json.loads(read.content[0].text)["content"] == "alpha\nbeta\n"  # type: ignore[union-attr]
        listing = await client.call_tool("fs.list", {"path": "notes"})
        assert "a.txt" in listing.content[0].text  # type: ignore[union-attr]
        found = await client.call_tool("fs.search", {"pattern": "be+ta"})
        assert "notes/a.txt" in found.content[0].text  # type: ignore[union-attr]
        ran = await client.call_tool("shell.run", {"command": "echo ran-$((6*7))"})
        assert "ran-42" in ran.content[0].text  # type: ignore[union-attr]
        tools = await client.call_tool("tools.list", {})
        assert [t["name"] for t in json.loads(tools.content[0].text)["tools"]] == BUILTINS  # type: ignore[union-attr]
        # a tool's own failure is a tool error (isError), the session goes on
        outside = await client.call_tool("fs.read", {"path": "../../etc/passwd"})
        assert outside.is_error
        bad = await client.call_tool("fs.read", {"nonsense": 1})
        assert bad.is_error
        with pytest.raises(Exception, match="unknown tool"):
            await client.call_tool("no.such.tool", {})
        again = await client.call_tool("fs.read", {"path": "notes/a.txt"})
        assert not again.is_error


async def test_shell_streams_progress_and_result(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path, "--tool-max-output", "100000") as client:
        progress: list[tuple[float, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, message))

        result = await client.call_tool(
            "shell", {"command": "echo one; sleep 0.2; echo two >&2; exit 3", "env": {"X": "1"}}, progress_callback=on_progress
        )
        assert result.is_error  # exit 3: the command did not succeed
        sc = result.structured_content
        assert sc is not None and (sc["stdout"], sc["stderr"], sc["exit_code"], sc["stdout_bytes"], sc["stderr_bytes"], sc["truncated"]) == (
            "one\n", "two\n", 3, 4, 4, False)
        assert "[exit code 3]" in result.content[0].text  # type: ignore[union-attr]
        assert [m for _, m in progress] == ["one\n", "two\n"]
        assert [v for v, _ in progress] == [4, 8]
        # large output: its head and tail within --mcp-max-result-chars, with a marker and the byte counts
        big = await client.call_tool("shell", {"command": "head -c 300000 /dev/zero | tr '\\0' x"})
        sc = big.structured_content
        assert sc is not None and sc["truncated"] is True and sc["stdout_bytes"] == 300000 and len(sc["stdout"]) < 30000
        assert sc["cut"]["stdout"]["total_bytes"] == 300000 and "cut here" in sc["stdout"]
        # a timeout: the process group is stopped and the call says so
        slow = await client.call_tool("shell", {"command": "sleep 30", "timeout": 0.3})
        assert slow.is_error and "timed out" in slow.content[0].text  # type: ignore[union-attr]


async def test_cancel_stops_the_process(transport: str, tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "pid"
    async with connect(transport, tmp_path) as client:
        with anyio.move_on_after(30) as scope:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await client.call_tool("shell", {"command": f"echo $$ > {pid_file}; sleep 60"})  # the shell, its line naming pid_file, stays

                tg.start_soon(call)
                assert await anyio.to_thread.run_sync(lambda: wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 20))
                (pid,) = host_pids(None, [int(pid_file.read_text())], str(pid_file))  # printed in its pid namespace
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled for the abandoned request
        assert not scope.cancelled_caught
        assert await anyio.to_thread.run_sync(lambda: wait_until(lambda: not pid_alive(pid), 15)), "the cancelled command still runs"
        after = await client.call_tool("shell", {"command": "echo still-here"})
        assert after.structured_content is not None and after.structured_content["stdout"] == "still-here\n"


async def test_concurrent_calls_run_concurrently(transport: str, tmp_path: pathlib.Path) -> None:
    """The first call waits for a file that only the second creates: sequential handling would hang."""
    async with connect(transport, tmp_path) as client:
        flag = tmp_path / "flag"
        results: dict[str, Any] = {}
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    results["wait"] = await client.call_tool("shell", {"command": f"while [ ! -e {flag} ]; do sleep 0.05; done; echo saw-it"})

                async def maker() -> None:
                    await anyio.sleep(0.3)
                    results["make"] = await client.call_tool("fs.write", {"path": "flag", "content": ""})

                tg.start_soon(waiter)
                tg.start_soon(maker)
                for i in range(20):  # and many small reads pipelined beside them
                    tg.start_soon(lambda i=i: _read_into(client, results, i))
        assert results["wait"].structured_content["stdout"] == "saw-it\n"
        assert not results["make"].is_error
        assert all(not results[f"read{i}"].is_error for i in range(20))


async def _read_into(client: Client, results: dict[str, Any], i: int) -> None:
    results[f"read{i}"] = await client.call_tool("fs.list", {})


async def test_js_hook_blocks_mcp_shell(transport: str, tmp_path: pathlib.Path) -> None:
    hook = tmp_path / "block.js"
    hook.write_text(BLOCK_RM)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    async with connect(transport, tmp_path, "--hook", str(hook)) as client:
        blocked = await client.call_tool("shell", {"command": f"rm {victim}"})
        assert blocked.is_error
        assert "no rm via MCP" in blocked.content[0].text  # type: ignore[union-attr]
        assert blocked.structured_content is not None and blocked.structured_content["exit_code"] is None
        assert victim.read_text() == "keep me"
        allowed = await client.call_tool("shell", {"command": "echo fine"})
        assert allowed.structured_content is not None and allowed.structured_content["stdout"] == "fine\n"


# ---- initialize with each revision (raw JSON-RPC, checked with the SDK's own types) ---------------


def _stdio_exchange(tmp: pathlib.Path, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(tmp)],
        input=b"".join(json.dumps(m).encode() + b"\n" for m in lines), capture_output=True, cwd=ROOT, timeout=60,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.parametrize("revision", [*protocol.REVISIONS, "2024-11-05", "1999-01-01"])
def test_initialize_each_revision(revision: str, tmp_path: pathlib.Path) -> None:
    import mcp_types

    answers = _stdio_exchange(tmp_path, [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": revision, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ])
    assert [a["id"] for a in answers] == [1, 2]
    result = mcp_types.InitializeResult.model_validate(answers[0]["result"])
    assert result.protocol_version == (revision if revision in protocol.REVISIONS else protocol.LATEST)
    assert result.server_info.name == "smith-fast"
    listed = mcp_types.ListToolsResult.model_validate(answers[1]["result"])
    assert [t.name for t in listed.tools] == [n for n in BUILTINS if n not in protocol.HIDDEN_TOOLS] + ["shell"]


def test_jsonrpc_errors(tmp_path: pathlib.Path) -> None:
    answers = _stdio_exchange(tmp_path, [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},  # before initialize
        {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": protocol.LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "no/such"},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "nope"}},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "shell", "arguments": {"command": 7}}},
        {"jsonrpc": "1.0", "id": 6, "method": "ping"},
        {"jsonrpc": "2.0", "id": 7, "method": "logging/setLevel", "params": {"level": "loud"}},
        {"jsonrpc": "2.0", "id": 8, "method": "ping"},
    ])
    by_id = {a.get("id"): a for a in answers}
    assert by_id[1]["error"]["code"] == protocol.INVALID_REQUEST
    assert by_id[3]["error"]["code"] == protocol.METHOD_NOT_FOUND
    assert by_id[4]["error"]["code"] == protocol.INVALID_PARAMS
    assert by_id[5]["result"]["isError"] is True
    assert by_id[6]["error"]["code"] == protocol.INVALID_REQUEST
    assert by_id[7]["error"]["code"] == protocol.INVALID_PARAMS
    assert by_id[8]["result"] == {}


def test_stdio_bad_lines_lose_nothing(tmp_path: pathlib.Path) -> None:
    """Garbage and an over-long line are answered with errors; the requests around them are served."""
    import subprocess

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": protocol.LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    data = (
        json.dumps(init).encode() + b"\n{not json\n" + b"x" * 5000 + b"\n"
        + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode() + b"\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(tmp_path), "--max-frame-size", "4096"],
        input=data, capture_output=True, cwd=ROOT, timeout=60,
    )
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    assert [a.get("id") for a in answers] == [1, None, None, 2]
    assert answers[1]["error"]["code"] == protocol.PARSE_ERROR
    assert "4096" in answers[2]["error"]["message"]


# ---- HTTP specifics ---------------------------------------------------------------------------------


@pytest.fixture
def http_server(tmp_path: pathlib.Path) -> Any:
    proc = SmithProcess(
        tmp_path, "serve", "--root", str(tmp_path), "--mcp-http", "127.0.0.1:0", "--max-frame-size", "65536",
        env={"SMITH_TOKEN": "s3cret"},
    ).start()
    yield proc
    proc.stop()


async def test_http_bearer_token(http_server: SmithProcess) -> None:
    url = mcp_url(http_server)
    async with httpx2.AsyncClient() as plain:
        refused = await plain.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                   headers={"Accept": "application/json, text/event-stream"})
        assert refused.status_code == 401 and "Bearer" in refused.headers["www-authenticate"]
    async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as wrong:
        with pytest.raises(Exception):
            async with Client(streamable_http_client(url, http_client=wrong)):
                pass
    async with httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as good:
        async with Client(streamable_http_client(url, http_client=good)) as client:
            result = await client.call_tool("shell", {"command": "echo authed"})
            assert result.structured_content is not None and result.structured_content["stdout"] == "authed\n"


def _raw(url: str, data: bytes) -> bytes:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=20) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" in b"".join(chunks):
                break
        return b"".join(chunks)


_HOSTILE: list[tuple[bytes, bytes]] = [
    (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n", b" 431 "),
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", b" 413 "),
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b" 501 "),
    (b"BLAH\r\n\r\n", b" 400 "),
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", b" 400 "),
    (b"GET /mcp HTTP/2.0\r\n\r\n", b" 505 "),
    (b"POST /mcp HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", b" 403 "),
    (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/json\r\n"
     b"Mcp-Session-Id: forged\r\nContent-Length: 40\r\nConnection: close\r\n\r\n"
     b'{"jsonrpc":"2.0","id":1,"method":"ping"}', b" 404 "),
]


@pytest.mark.parametrize("hostile,status", _HOSTILE, ids=["head", "body", "chunked", "line", "lengths", "version", "origin", "session"])
async def test_http_hostile_bytes(http_server: SmithProcess, hostile: bytes, status: bytes) -> None:
    """Each is refused with its status; the service stays up and serves a proper client after it."""
    url = mcp_url(http_server)
    answer = await anyio.to_thread.run_sync(lambda: _raw(url, hostile))
    assert status in answer.split(b"\r\n", 1)[0], answer[:200]
    async with httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as good:
        async with Client(streamable_http_client(url, http_client=good)) as client:
            assert not (await client.call_tool("fs.list", {})).is_error
    assert http_server.proc is not None and http_server.proc.poll() is None



# ---- what applies because MCP calls are ordinary requests -------------------------------------------


async def test_recording_and_metrics_apply(tmp_path: pathlib.Path) -> None:
    """--record logs an MCP session's commands and events; the metrics count it as protocol mcp."""
    from smith_fast.replay.reader import read_log

    record = beside(tmp_path, "rec")
    proc = SmithProcess(tmp_path, "serve", "--root", str(tmp_path), "--mcp-http", "127.0.0.1:0", "--record", str(record),
                        "--metrics", "127.0.0.1:0").start()
    try:
        async with Client(mcp_url(proc)) as client:
            assert not (await client.call_tool("fs.list", {})).is_error
            ran = await client.call_tool("shell", {"command": "echo recorded"})
            assert ran.structured_content is not None and ran.structured_content["stdout"] == "recorded\n"
        metrics_url = next(str(r["address"]) for r in proc.logs if str(r.get("address", "")).endswith("/metrics"))
        async with httpx2.AsyncClient() as http:
            text = (await http.get(metrics_url)).text
        assert 'smith_fast_sessions_total{protocol="mcp"} 1.0' in text
        assert any(line.startswith('smith_fast_commands_total{type="shell_exec"} 1') for line in text.splitlines())
    finally:
        proc.stop()
    logs = list(record.glob("**/*"))
    files = [p for p in logs if p.is_file()]
    assert len(files) == 1, logs
    _header, records, torn = read_log(files[0])
    assert torn is None
    inbound = [r.parse().command.WhichOneof("command_type") for r in records if r.inbound]
    assert inbound == ["handshake", "tool_call", "shell_exec"]
    outbound = [r.parse() for r in records if not r.inbound]
    outputs = [e.event.shell_output.stdout for e in outbound if e.event.WhichOneof("event_type") == "shell_output"]
    assert "recorded\n" in outputs


async def test_a_tool_call_is_counted_and_audited_as_a_sockets(tmp_path: pathlib.Path) -> None:
    """MCP's tools/call starts a tool without a pb.Command where the session may
    (Session.start_tool_call): answered, counted and audited as a socket's ToolCall is."""
    (tmp_path / "a.txt").write_text("hello\n")
    proc = SmithProcess(tmp_path, "serve", "--root", str(tmp_path), "--mcp-http", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                        "--log-level", "info").start()
    try:
        async with Client(mcp_url(proc)) as client:
            for _ in range(2):
                got = await client.call_tool("fs.read", {"path": "a.txt"})
                assert not got.is_error and got.structured_content is not None and got.structured_content["content"] == "hello\n"
            assert (await client.call_tool("fs.read", {"path": "missing.txt"})).is_error
        metrics_url = next(str(r["address"]) for r in proc.logs if str(r.get("address", "")).endswith("/metrics"))
        async with httpx2.AsyncClient() as http:
            text = (await http.get(metrics_url)).text
        assert any(line.startswith('smith_fast_commands_total{type="tool_call"} 3') for line in text.splitlines()), text
        def audited() -> list[dict[str, Any]]:
            return [r for r in proc.logs if r.get("event") == "request" and r.get("kind") == "tool_call"]

        assert await anyio.to_thread.run_sync(lambda: wait_until(lambda: len(audited()) == 3, 10))
        lines = audited()
        assert [(r["tool"], r["success"], r["outcome"]) for r in lines] == [("fs.read", True, "ok")] * 2 + [("fs.read", False, "ok")]
    finally:
        proc.stop()


def test_stdio_huge_line_stays_within_memory(tmp_path: pathlib.Path) -> None:
    """200 MB without a newline is dropped as it arrives (answered once), not buffered; the next
    request is served."""
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(tmp_path), "--max-frame-size", "65536"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        block = b"y" * (1 << 20)
        for _ in range(200):
            proc.stdin.write(block)
        proc.stdin.write(b"\n" + json.dumps({"jsonrpc": "2.0", "id": 9, "method": "ping"}).encode() + b"\n")
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline())
        assert first["error"]["code"] == protocol.INVALID_REQUEST and "65536" in first["error"]["message"]
        assert json.loads(proc.stdout.readline()) == {"jsonrpc": "2.0", "id": 9, "result": {}}
        status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
        peak_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
        assert peak_kb < 150 * 1024, f"peak RSS {peak_kb} kB after a 200 MB line"
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_stdio_backpressure_bounds_memory(tmp_path: pathlib.Path) -> None:
    """A client that stops reading while `yes` streams progress: the command's pipes are paused, so
    the server's memory stays bounded; once the client reads again and cancels, it is answered."""
    import subprocess
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(tmp_path), "--max-output", "8G"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    send = lambda m: (proc.stdin.write(json.dumps(m).encode() + b"\n"), proc.stdin.flush())  # noqa: E731
    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": protocol.LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
        assert json.loads(proc.stdout.readline())["id"] == 1
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "shell", "arguments": {"command": "yes"}, "_meta": {"progressToken": "p"}}})
        time.sleep(3)  # not reading: `yes` alone would write gigabytes by now
        status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        assert rss_kb < 200 * 1024, f"RSS {rss_kb} kB while the client did not read"
        send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
        send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
        progress = 0
        while True:
            message = json.loads(proc.stdout.readline())
            if message.get("method") == "notifications/progress":
                progress += 1
                continue
            assert message == {"jsonrpc": "2.0", "id": 3, "result": {}}  # no answer for the cancelled call
            break
        assert progress > 0
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_http_backpressure_bounds_memory(tmp_path: pathlib.Path) -> None:
    """The same over Streamable HTTP: an SSE response nobody reads pauses the command's pipes."""
    import socket
    import time
    from urllib.parse import urlsplit

    proc = SmithProcess(tmp_path, "serve", "--root", str(tmp_path), "--mcp-http", "127.0.0.1:0", "--max-output", "8G").start()
    try:
        parts = urlsplit(mcp_url(proc))

        def post(sock: socket.socket, message: dict[str, Any], session: str | None = None) -> None:
            body = json.dumps(message).encode()
            head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n")
            if session:
                head += f"Mcp-Session-Id: {session}\r\n"
            sock.sendall(head.encode() + b"\r\n" + body)

        with socket.create_connection((parts.hostname, parts.port), timeout=20) as first:
            post(first, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": protocol.LATEST, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
            answer = first.recv(65536).decode()
            session = next(line.split(":", 1)[1].strip() for line in answer.split("\r\n") if line.lower().startswith("mcp-session-id:"))
        with socket.create_connection((parts.hostname, parts.port), timeout=20) as stream:
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            post(stream, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "shell", "arguments": {"command": "yes"}, "_meta": {"progressToken": "p"}}}, session)
            time.sleep(3)  # not reading
            status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
            rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            assert rss_kb < 200 * 1024, f"RSS {rss_kb} kB while the client did not read"
            assert b"notifications/progress" in stream.recv(65536)
        # the service still answers (the call's connection went away; its session lives on)
        with socket.create_connection((parts.hostname, parts.port), timeout=20) as again:
            post(again, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, session)
            assert b'"result":{}' in again.recv(65536)
    finally:
        proc.stop()


async def test_http_session_lifecycle(tmp_path: pathlib.Path) -> None:
    """DELETE ends a session (then 404); at --max-connections sessions, a new one ends the idle
    session used least recently (which then answers 404) instead of being refused."""
    proc = SmithProcess(tmp_path, "serve", "--root", str(tmp_path), "--mcp-http", "127.0.0.1:0", "--max-connections", "3").start()
    try:
        url = mcp_url(proc)
        headers = {"Accept": "application/json, text/event-stream"}
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        async with httpx2.AsyncClient(headers=headers) as http:
            first = await http.post(url, json=init)
            assert first.status_code == 200 and first.json()["result"]["protocolVersion"] == "2025-06-18"
            sid = first.headers["mcp-session-id"]
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            assert (await http.post(url, json=ping, headers={"Mcp-Session-Id": sid})).json()["result"] == {}
            assert (await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={"Mcp-Session-Id": sid})).status_code == 202
            assert (await http.post(url, json=ping)).status_code == 400  # no session id
            assert (await http.post(url, json=ping, headers={"Mcp-Session-Id": sid, "MCP-Protocol-Version": "1999-01-01"})).status_code == 400
            assert (await http.delete(url, headers={"Mcp-Session-Id": sid})).status_code == 200
            assert (await http.post(url, json=ping, headers={"Mcp-Session-Id": sid})).status_code == 404
            made = [await http.post(url, json=init) for _ in range(4)]
            assert [r.status_code for r in made] == [200, 200, 200, 200]
            ids = [r.headers["mcp-session-id"] for r in made]
            assert (await http.post(url, json=ping, headers={"Mcp-Session-Id": ids[0]})).status_code == 404
            assert (await http.post(url, json=ping, headers={"Mcp-Session-Id": ids[3]})).json()["result"] == {}
    finally:
        proc.stop()
