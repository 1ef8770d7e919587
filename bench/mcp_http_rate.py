"""MCP over HTTP calls/s and the server's CPU per call: C keep-alive connections, each sending
fs.read calls (of a 72-byte file) one after another, N in all, against `smith-fast serve
--mcp-http`. The CPU per call is the steadier figure on a shared machine. Run from the repository
root: .venv/bin/python bench/mcp_http_rate.py [N] [C]"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys
import tempfile
import time
from urllib.parse import urlsplit

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from harness.server import SmithProcess  # noqa: E402


def _cpu(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _url(proc: SmithProcess) -> str:
    return next(str(r["address"]) for r in proc.logs if str(r.get("address", "")).endswith("/mcp"))


def _request(body: bytes, session: str | None) -> bytes:
    head = ("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n")
    if session:
        head += f"Mcp-Session-Id: {session}\r\n"
    return head.encode() + b"\r\n" + body


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


async def main(n: int, c: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "small.txt").write_bytes(b"x" * 71 + b"\n")
        proc = SmithProcess(root, "serve", "--root", str(root), "--mcp-http", "127.0.0.1:0", "--log-level", "info").start()
        try:
            parts = urlsplit(_url(proc))
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}}}
            writer.write(_request(json.dumps(init).encode(), None))
            head, _ = await _response(reader)
            session = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n") if line.lower().startswith(b"mcp-session-id:"))
            writer.close()

            async def worker(count: int) -> None:
                r, w = await asyncio.open_connection(parts.hostname, parts.port)
                for i in range(count):
                    body = json.dumps({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {"name": "fs.read", "arguments": {"path": "small.txt"}}}).encode()
                    w.write(_request(body, session))
                    _, answer = await _response(r)
                    assert b'"isError":false' in answer, answer[:200]
                w.close()

            await asyncio.gather(*(worker(50) for _ in range(c)))  # warm
            best, cpu = 0.0, []
            for _ in range(5):
                t0, c0 = time.perf_counter(), _cpu(proc.pid)
                await asyncio.gather(*(worker(n // c) for _ in range(c)))
                best = max(best, n / (time.perf_counter() - t0))
                cpu.append((_cpu(proc.pid) - c0) / n * 1e6)
            print(f"MCP HTTP fs.read: {best:.0f} calls/s (best of 5), server CPU {min(cpu):.0f} µs/call (least of 5); "
                  f"{n} calls over {c} keep-alive connections")
        finally:
            proc.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 6000, int(sys.argv[2]) if len(sys.argv) > 2 else 8))
