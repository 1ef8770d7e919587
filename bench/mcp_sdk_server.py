"""The benchmark's contender: an MCP server written with the official SDK the way its documentation
shows (``MCPServer``, decorated tools, ``run()`` on stdio), exposing the same ``read_file`` and
``shell`` tools as smith-fast's MCP front (``fs.read`` and ``shell``).

Run: ``python bench/mcp_sdk_server.py ROOT``.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

from mcp.server.mcpserver import MCPServer

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()

mcp = MCPServer("sdk-contender")


@mcp.tool()
def read_file(path: str) -> str:
    """Read a UTF-8 text file inside the workspace."""
    target = (ROOT / path).resolve()
    if not target.is_relative_to(ROOT):
        raise ValueError(f"{path} is outside the workspace")
    return target.read_text()


@mcp.tool()
async def shell(command: str) -> dict[str, object]:
    """Run a shell command in the workspace; stdout, stderr and the exit code."""
    proc = await asyncio.create_subprocess_shell(
        command, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    return {"stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace"), "exit_code": proc.returncode}


if __name__ == "__main__":
    mcp.run()
