"""``serve --mcp-server``: a server written with the official MCP SDK (``MCPServer``), mounted over
stdio and over Streamable HTTP, its tools called from a v1 peer, a gRPC peer and an MCP client
(the SDK's) through smith-fast, with hooks applied; a mounted server that dies is restarted."""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from mcp import StdioServerParameters
from mcp.client.client import Client as McpClient
from mcp.client.stdio import stdio_client

from harness.server import ROOT, ServerProcess, wait_until
from smith_fast.client import Client
from smith_fast.mcp.mount import parse_mount

DEMO = '''
import os, sys
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("demo")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
def die() -> str:
    """Exit the server process at once."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        mcp.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True)
    else:
        mcp.run()
'''

BLOCK_13 = """
function beforeToolCall(p) {
  if (p.tool === "demo.add" && p.args && p.args.a === 13) return { action: "block", reason: "13 is unlucky" };
  return { action: "allow" };
}
"""


@pytest.fixture
def demo(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "demo_server.py"
    path.write_text(DEMO)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_parse_mount() -> None:
    spec = parse_mount("fs=npx -y '@scope/server' --flag")
    assert spec.name == "fs" and spec.argv == ["npx", "-y", "@scope/server", "--flag"] and spec.url is None
    assert parse_mount("web=https://example.test/mcp").url == "https://example.test/mcp"
    for bad in ["nameless", "=cmd", "bad name=cmd", "x=", "x='unclosed"]:
        with pytest.raises(ValueError):
            parse_mount(bad)


async def test_stdio_mount_from_v1_grpc_and_mcp(tmp_path: pathlib.Path, demo: pathlib.Path) -> None:
    hook = tmp_path / "block.js"
    hook.write_text(BLOCK_13)
    server = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--hook", str(hook), "--mcp-server", f"demo={sys.executable} {demo}").start(60)
    try:
        for address in (server.unix, server.grpc):
            async with await Client.connect(address) as client:
                await client.handshake()
                listed = await client.call_tool("tools.list", {})
                names = [t["name"] for t in json.loads(listed.result)["tools"]]
                assert "demo.add" in names and "demo.die" in names
                added = await client.call_tool("demo.add", {"a": 2, "b": 40})
                assert added.success, added.error
                assert json.loads(added.result)["structuredContent"] == {"result": 42}
                bad = await client.call_tool("demo.add", {"a": "two"})
                assert not bad.success
                with pytest.raises(Exception, match="13 is unlucky"):
                    await client.call_tool("demo.add", {"a": 13, "b": 1})
    finally:
        server.stop()
    # and from an MCP client, through smith-fast's own MCP front
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "smith_fast", "serve", "--mcp", "--root", str(tmp_path), "--hook", str(hook), "--mcp-server", f"demo={sys.executable} {demo}"],
        cwd=str(ROOT),
    )
    with open(tmp_path / "mcp.log", "w") as errlog:
        async with McpClient(stdio_client(params, errlog=errlog)) as mcp:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert tools["demo.add"].input_schema["properties"]["a"]["type"] == "integer"
            result = await mcp.call_tool("demo.add", {"a": 20, "b": 22})
            assert not result.is_error and json.loads(result.content[0].text)["structuredContent"] == {"result": 42}  # type: ignore[union-attr]
            blocked = await mcp.call_tool("demo.add", {"a": 13, "b": 0})
            assert blocked.is_error and "13 is unlucky" in blocked.content[0].text  # type: ignore[union-attr]


async def test_a_dead_server_is_restarted(tmp_path: pathlib.Path, demo: pathlib.Path) -> None:
    server = ServerProcess(tmp_path, "--mcp-server", f"demo={sys.executable} {demo}").start(60)
    try:
        async with await Client.connect(server.unix) as client:
            await client.handshake()
            assert (await client.call_tool("demo.add", {"a": 1, "b": 1})).success
            died = await client.call_tool("demo.die", {})
            assert not died.success  # the call's connection went away under it
            deadline = time.monotonic() + 60
            while True:  # calls fail while it is down, then work again
                again = await client.call_tool("demo.add", {"a": 1, "b": 2})
                if again.success or time.monotonic() > deadline:
                    break
                assert "demo" in (again.error or "")
                await asyncio.sleep(0.2)
            assert again.success and json.loads(again.result)["structuredContent"] == {"result": 3}
        assert wait_until(lambda: any(r.get("event") == "mounted MCP server" and r.get("restarts", 0) >= 1 for r in server.logs), 10)
    finally:
        server.stop()


async def test_http_mount(tmp_path: pathlib.Path, demo: pathlib.Path) -> None:
    port = _free_port()
    sdk = subprocess.Popen([sys.executable, str(demo), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(up, 30)
        server = ServerProcess(tmp_path, "--mcp-server", f"web=http://127.0.0.1:{port}/mcp").start(60)
        try:
            async with await Client.connect(server.unix) as client:
                await client.handshake()
                added = await client.call_tool("web.add", {"a": 5, "b": 6})
                assert added.success, added.error
                assert json.loads(added.result)["structuredContent"] == {"result": 11}
        finally:
            server.stop()
    finally:
        sdk.terminate()
        sdk.wait(10)


def test_a_server_that_never_comes_up_fails_the_start(tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "smith_fast", "serve", "--stdio", "--root", str(tmp_path), "--mcp-server", "gone=/nonexistent/mcp-server"],
        capture_output=True, cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2
    assert b"--mcp-server gone=/nonexistent/mcp-server" in out.stderr and b"did not come up" in out.stderr


async def test_a_mount_on_the_workers_serves_nats_peers(tmp_path: pathlib.Path, demo: pathlib.Path) -> None:
    # Behind a gateway, tools.list and tool calls run on a worker: `worker --mcp-server` puts the
    # mounted tools there, so a peer of the gateway lists and calls them like a peer of `serve`.
    from harness.nats_cluster import Cluster

    cluster = Cluster(
        tmp_path, workers=1, nats_args=("--ack-wait", "2", "--duplicate-window", "60"),
        worker_args=("--mcp-server", f"demo={sys.executable} {demo}"),
    ).start()
    try:
        async with await Client.connect(cluster.unix) as client:
            await client.handshake()
            listed = await client.call_tool("tools.list", {})
            assert "demo.add" in [t["name"] for t in json.loads(listed.result)["tools"]]
            added = await client.call_tool("demo.add", {"a": 40, "b": 2})
            assert added.success, added.error
            assert json.loads(added.result)["structuredContent"] == {"result": 42}
    finally:
        cluster.stop()
