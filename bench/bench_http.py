"""The HTTP server's own cost per request (smith_fast/http), in process: what a kept-alive MCP
``tools/call`` POST costs the server before and after its route (llhttp's head, the checks on
top, admission, the body, the response head, the deadlines), with a route that answers at once
and a transport that only counts bytes. The end-to-end figure over a real socket, with the MCP
session behind the route, is ``bench/mcp_http_rate.py``.

Run: ``.venv/bin/pytest bench/bench_http.py --benchmark-only -p no:cacheprovider``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from smith_fast.http.head import Head, parse_head
from smith_fast.http.server import HttpConnection, HttpLimits, HttpServer, Request

N = 2000
_BODY = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "fs.read", "arguments": {"path": "small.txt"}}}).encode()
_HEAD = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8931\r\nContent-Type: application/json\r\n"
         b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n"
         b"Mcp-Session-Id: abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ\r\nMcp-Protocol-Version: 2025-06-18" % len(_BODY))
REQUEST = _HEAD + b"\r\n\r\n" + _BODY


class _Transport:
    def __init__(self) -> None:
        self.sent = 0

    def write(self, data: bytes) -> None:
        self.sent += len(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 8931)


class _Answer:
    """A route that answers each request at once, as an MCP call that ends in one step does."""

    def admit(self, conn: HttpConnection, head: Head) -> None:
        pass

    def handle(self, conn: HttpConnection, request: Request) -> None:
        conn.respond(200, b'{"jsonrpc":"2.0","id":7,"result":{}}', "application/json", [])

    def closed(self, conn: HttpConnection) -> None:
        pass


def test_parse_head(benchmark: Any) -> None:
    benchmark.group = "http head"

    def run() -> None:
        for _ in range(N):
            parse_head(_HEAD, 1 << 20)

    benchmark(run)
    benchmark.extra_info["requests"] = N


def test_kept_alive_requests(benchmark: Any) -> None:
    """N requests on one kept-alive connection, each arriving whole and answered at once."""
    benchmark.group = "http server"

    async def connection() -> tuple[HttpConnection, _Transport]:
        server = HttpServer({"/mcp": _Answer()}, HttpLimits(max_body=1 << 20, first_timeout=10.0, idle_timeout=300.0))
        conn, transport = HttpConnection(server), _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]  # counts bytes, enough for the server
        return conn, transport

    loop = asyncio.new_event_loop()
    try:
        conn, transport = loop.run_until_complete(connection())

        def run() -> None:
            for _ in range(N):
                conn.data_received(REQUEST)

        benchmark(run)
        assert transport.sent > 0
    finally:
        loop.close()
    benchmark.extra_info["requests"] = N
