"""``smith-fast serve --mcp-http HOST:PORT``: MCP's Streamable HTTP transport at ``/mcp``.

HTTP/1.1 is spoken here directly on asyncio rather than through a web framework: the transport
needs four things (a strict request parser with size limits, ``Content-Length`` bodies, JSON
responses and chunked ``text/event-stream`` responses), and none of the service's dependencies
is an HTTP server (uvicorn/starlette would come only with the MCP SDK, a development dependency,
and add a thread-free but much slower stack to every call).

* ``POST /mcp`` carries one JSON-RPC message. ``initialize`` makes a session and answers with its
  ``Mcp-Session-Id``; every later message must present it (missing: 400, unknown or ended: 404).
  A notification or response is answered ``202 Accepted``; a request with one JSON body, or, as
  soon as something is sent before its response (progress, a log), with an SSE stream that ends
  with the response.
* ``GET /mcp`` opens the session's stream for messages that belong to no request (logs).
* ``DELETE /mcp`` ends the session (its running calls are cancelled).
* With ``--token``, every request presents ``Authorization: Bearer TOKEN`` (else 401). A
  browser's ``Origin`` other than the listener's own host or a loopback name is refused (403),
  against DNS rebinding. Sessions idle for ``--idle-timeout`` are ended.

Limits: request head 16 KiB (431), body ``--max-frame-size`` (413), a request must arrive within
``--handshake-timeout``; connections count towards ``--max-connections`` (503 over it), and so do
sessions. Resumption with ``Last-Event-ID`` is not offered (events carry no ids), so a client
whose stream broke sends its request again.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson

from ..logs import get_logger
from ..service.auth import token_matches
from . import protocol
from .endpoint import McpEndpoint

if TYPE_CHECKING:
    from ..service.core import ServiceCore

__all__ = ["McpHttpServer", "PATH", "MAX_HEAD"]

log = get_logger("smith_fast.mcp")

PATH = "/mcp"
MAX_HEAD = 16 * 1024
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
_REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 406: "Not Acceptable", 408: "Request Timeout", 413: "Content Too Large",
    415: "Unsupported Media Type", 431: "Request Header Fields Too Large", 501: "Not Implemented",
    500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported",
}


class _Refused(Exception):
    """An HTTP error answer: status, message; ``close``: the connection cannot go on."""

    def __init__(self, status: int, message: str, *, close: bool = False, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.headers = headers


class _Request:
    __slots__ = ("method", "path", "headers", "body", "keep_alive")

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes, keep_alive: bool) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
    lines.extend(f"{k}: {v}" for k, v in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes, max_body: int) -> tuple[str, str, dict[str, str], int, bool]:
    """Request line and headers → (method, target, headers, content length, keep-alive).

    Raises:
        _Refused: anything malformed, unsupported or too large.
    """
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover (latin-1 decodes every byte)
        raise _Refused(400, "undecodable request head", close=True) from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise _Refused(400, "malformed request line", close=True)
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refused(505, f"{version} is not spoken here; use HTTP/1.1", close=True)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or not name.isascii() or any(c in name for c in " \t"):
            raise _Refused(400, "malformed header line", close=True)
        key = name.lower()
        value = value.strip()
        if key in headers:
            if key == "content-length" and headers[key] != value:
                raise _Refused(400, "conflicting Content-Length headers", close=True)
            headers[key] = headers[key] + ", " + value
        else:
            headers[key] = value
    if "transfer-encoding" in headers:
        raise _Refused(501, "Transfer-Encoding request bodies are not supported; send Content-Length", close=True)
    length_text = headers.get("content-length", "0").split(",")[0].strip()
    if not length_text.isdigit():
        raise _Refused(400, "Content-Length is not a number", close=True)
    length = int(length_text)
    if length > max_body:
        raise _Refused(413, f"the body is larger than {max_body} bytes (--max-frame-size)", close=True)
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return method, target, headers, length, keep_alive


class _Session:
    """An MCP session of the HTTP front: its endpoint, its GET stream, when it was last used."""

    __slots__ = ("id", "endpoint", "stream", "last_seen")

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.endpoint: McpEndpoint
        self.stream: _Reply | None = None  # the GET stream
        self.last_seen = time.monotonic()

    def send(self, data: bytes, final: bool) -> None:
        """The endpoint's channel for messages of no request: the GET stream, if one is open."""
        if self.stream is not None:
            self.stream.send(data, False)


class _Reply:
    """The answer to one request: a JSON body, or an SSE stream once more than one message goes out."""

    __slots__ = ("conn", "headers", "started", "done")

    def __init__(self, conn: _Connection, headers: list[tuple[str, str]]) -> None:
        self.conn = conn
        self.headers = headers
        self.started = False
        self.done = False

    def send(self, data: bytes, final: bool) -> None:
        if self.done:
            return
        conn = self.conn
        if not self.started and final:
            self.done = True
            conn.respond(200, data, "application/json", self.headers)
            return
        out: list[bytes] = []
        if not self.started:
            self.started = True
            out.append(_head(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Transfer-Encoding", "chunked"), *self.headers]))
        event = b"event: message\r\ndata: " + data + b"\r\n\r\n"
        out.append(b"%x\r\n%s\r\n" % (len(event), event))
        if final:
            self.done = True
            out.append(b"0\r\n\r\n")
        conn.write(b"".join(out))
        if final:
            conn.finished()

    def end(self) -> None:
        """Close a stream that ends without a response (the GET stream)."""
        if not self.done:
            self.done = True
            if self.started:
                self.conn.write(b"0\r\n\r\n")
            self.conn.finished()


class _Discard:
    """The channel of a notification: nothing is sent back for it."""

    def send(self, data: bytes, final: bool) -> None:
        pass


_DISCARD = _Discard()


class McpHttpServer:
    """The Streamable HTTP listeners and sessions of one service core.

    Args:
        core: the service core.
    """

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.sessions: dict[str, _Session] = {}
        self._servers: list[asyncio.base_events.Server] = []
        self._connections: set[_Connection] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def listen(self, host: str, port: int, *, backlog: int = 128) -> str:
        """Listen on ``host:port``; the URL of the endpoint."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True, backlog=backlog)
        self._servers.append(server)
        if self._sweeper is None and self.core.limits.idle_timeout > 0:
            self._sweeper = loop.create_task(self._sweep(self.core.limits.idle_timeout))
        sock = server.sockets[0].getsockname()
        shown = f"[{sock[0]}]" if ":" in sock[0] else sock[0]
        return f"http://{shown}:{sock[1]}{PATH}"

    def close(self) -> None:
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._connections):
            conn.abort()

    async def _sweep(self, idle: float) -> None:
        while True:
            await asyncio.sleep(max(1.0, idle / 4))
            cutoff = time.monotonic() - idle
            for entry in list(self.sessions.values()):
                if entry.last_seen < cutoff and not entry.endpoint.calls and entry.stream is None:
                    log.info("closing idle MCP session", extra={"fields": {"session": entry.id[:8]}})
                    self._drop(entry)

    def _drop(self, entry: _Session) -> None:
        self.sessions.pop(entry.id, None)
        asyncio.get_running_loop().create_task(entry.endpoint.shutdown())

    # ---- requests ------------------------------------------------------------------------------

    def handle(self, conn: _Connection, req: _Request) -> None:
        """Answer one request (or start answering it): through ``conn.respond`` or a :class:`_Reply`."""
        core = self.core
        path = req.path.split("?", 1)[0]
        if path != PATH:
            raise _Refused(404, f"no such endpoint; MCP is served at {PATH}")
        origin = req.headers.get("origin")
        if origin is not None and not _origin_allowed(origin, req.headers.get("host", "")):
            raise _Refused(403, f"origin {origin} is not allowed")
        if core.config.token is not None:
            scheme, _, presented = req.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token_matches(core.config.token, presented.strip()):
                raise _Refused(401, "this service needs Authorization: Bearer TOKEN", headers=(("WWW-Authenticate", 'Bearer realm="smith-fast"'),))
        version = req.headers.get("mcp-protocol-version")
        if version is not None and version not in protocol.REVISIONS:
            raise _Refused(400, f"MCP-Protocol-Version {version} is not supported (supported: {', '.join(protocol.REVISIONS)})")
        if req.method == "POST":
            self._post(conn, req)
        elif req.method == "GET":
            self._get(conn, req)
        elif req.method == "DELETE":
            entry = self._session(req)
            self._drop(entry)
            conn.respond(200, b"", None, [])
        else:
            raise _Refused(405, f"{req.method} is not allowed on {PATH}", headers=(("Allow", "GET, POST, DELETE"),))

    def _session(self, req: _Request) -> _Session:
        session_id = req.headers.get("mcp-session-id")
        if session_id is None:
            raise _Refused(400, "Mcp-Session-Id is missing: send initialize first and present the id it returns")
        entry = self.sessions.get(session_id)
        if entry is None or entry.endpoint.closing:
            raise _Refused(404, "no such session (it ended or never existed); initialize a new one")
        entry.last_seen = time.monotonic()
        return entry

    def _post(self, conn: _Connection, req: _Request) -> None:
        content_type = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise _Refused(415, "the body must be application/json")
        accept = req.headers.get("accept", "*/*")
        if not any(kind in accept for kind in ("application/json", "text/event-stream", "*/*")):
            raise _Refused(406, "Accept must include application/json and text/event-stream")
        try:
            message = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            conn.respond(400, protocol.error_response(None, protocol.PARSE_ERROR, f"the body is not JSON: {exc}"), "application/json", [])
            return
        if not isinstance(message, dict):
            conn.respond(400, protocol.error_response(None, protocol.INVALID_REQUEST, "one JSON-RPC message per POST (batches are not supported)"), "application/json", [])
            return
        if message.get("method") == "initialize" and "id" in message:
            entry = self._new_session(conn)
            headers = [("Mcp-Session-Id", entry.id)]
        else:
            entry = self._session(req)
            headers = []
        if "id" not in message or "method" not in message:  # a notification or a response
            entry.endpoint.handle(message, _DISCARD)
            conn.respond(202, b"", None, headers)
            return
        reply = _Reply(conn, headers)
        conn.serving = entry.endpoint
        entry.endpoint.handle(message, reply)

    def _new_session(self, conn: _Connection) -> _Session:
        if len(self.sessions) >= self.core.limits.max_connections:
            raise _Refused(503, f"too many MCP sessions (max {self.core.limits.max_connections}, --max-connections); try again later")
        entry = _Session(secrets.token_urlsafe(24))
        entry.endpoint = McpEndpoint(
            self.core, peer=conn.peer, close=lambda: self._ended(entry), authenticated=True, notify=entry
        )
        self.sessions[entry.id] = entry
        return entry

    def _ended(self, entry: _Session) -> None:
        self.sessions.pop(entry.id, None)
        if entry.stream is not None:
            stream, entry.stream = entry.stream, None
            stream.end()

    def _get(self, conn: _Connection, req: _Request) -> None:
        entry = self._session(req)
        if "text/event-stream" not in req.headers.get("accept", ""):
            raise _Refused(406, "a GET stream needs Accept: text/event-stream")
        if entry.stream is not None:
            entry.stream.end()
        reply = _Reply(conn, [])
        entry.stream = reply
        conn.serving = entry.endpoint
        conn.on_lost = lambda: _forget_stream(entry, reply)
        reply.started = True
        conn.write(_head(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Transfer-Encoding", "chunked")]))


def _forget_stream(entry: _Session, reply: _Reply) -> None:
    if entry.stream is reply:
        entry.stream = None


def _origin_allowed(origin: str, host: str) -> bool:
    try:
        parts = urlsplit(origin)
        name = parts.hostname
    except ValueError:
        return False
    if name is None:
        return False
    own = host.rsplit(":", 1)[0].strip("[]").lower() if host else ""
    return name.lower() in _LOOPBACK_NAMES or name.lower() == own


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: requests answered one after another (no pipelining overlap)."""

    def __init__(self, server: McpHttpServer) -> None:
        self.server = server
        self.core = server.core
        self.peer = "?"
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False  # a response is being produced
        self._keep_alive = True
        self._closed = False
        self._counted = False
        self._timer: asyncio.TimerHandle | None = None
        self._paused: McpEndpoint | None = None
        self.serving: McpEndpoint | None = None  # whose response this connection carries now
        self.on_lost: Callable[[], None] | None = None
        self._io = self.core.metrics.io["mcp"]

    # ---- asyncio callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a server protocol is given a full Transport
        peer = transport.get_extra_info("peername")
        self.peer = f"mcp-http:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "mcp-http"
        self.server._connections.add(self)  # noqa: SLF001 (the server's own bookkeeping)
        core = self.core
        if core.connections >= core.limits.max_connections:
            self._refuse(_Refused(503, f"too many connections (max {core.limits.max_connections}); try again later", close=True))
            return
        core.connections += 1
        self._counted = True
        self._arm(core.limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if not self._buffer and not self._busy:
            self._arm(self.core.limits.handshake_timeout)  # a request has begun: it has this long to arrive
        self._buffer += data
        self._io.bytes_in += len(data)
        if self._busy:
            if len(self._buffer) > MAX_HEAD + self.core.limits.max_frame_size and self._transport is not None:
                self._transport.pause_reading()  # the next request waits; so does its sender
            return
        self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server._connections.discard(self)  # noqa: SLF001
        if self._timer is not None:
            self._timer.cancel()
        if self._counted:
            self.core.connections -= 1
            self._counted = False
        if self._paused is not None:
            self._paused.resume()
            self._paused = None
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self) -> None:
        if self.serving is not None and self._paused is None:
            self._paused = self.serving
            self._paused.pause()

    def resume_writing(self) -> None:
        if self._paused is not None:
            self._paused.resume()
            self._paused = None

    # ---- reading --------------------------------------------------------------------------------

    def _parse(self) -> None:
        while not self._busy and not self._closed:
            buffer = self._buffer
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    self._refuse(_Refused(431, f"the request head is larger than {MAX_HEAD} bytes", close=True))
                return
            if end > MAX_HEAD:
                self._refuse(_Refused(431, f"the request head is larger than {MAX_HEAD} bytes", close=True))
                return
            try:
                method, target, headers, length, keep_alive = _parse_head(bytes(buffer[:end]), self.core.limits.max_frame_size)
            except _Refused as refused:
                self._refuse(refused)
                return
            if len(buffer) < end + 4 + length:
                return
            body = bytes(buffer[end + 4 : end + 4 + length])
            del buffer[: end + 4 + length]
            self._keep_alive = keep_alive
            self._busy = True
            self._io.frames_in += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            try:
                self.server.handle(self, _Request(method, target, headers, body, keep_alive))
            except _Refused as refused:
                self._refuse(refused)
            except Exception as exc:  # a bug of ours: answer it, keep the service
                log.exception("MCP HTTP request failed", extra={"fields": {"peer": self.peer}})
                self._refuse(_Refused(500, f"internal error: {type(exc).__name__}"))

    def _refuse(self, refused: _Refused) -> None:
        if refused.close:
            self._keep_alive = False
        log.info("MCP HTTP request refused", extra={"fields": {"peer": self.peer, "status": refused.status, "error": str(refused)}})
        body = orjson.dumps({"error": str(refused)})
        self._busy = True
        self.respond(refused.status, body, "application/json", list(refused.headers))

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if seconds > 0:
            self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._busy or self._closed:
            return
        if self._buffer:  # a request that did not arrive in time
            self._keep_alive = False
            self._busy = True
            self.respond(408, orjson.dumps({"error": "the request did not arrive in time"}), "application/json", [])
        else:
            self.abort()

    # ---- writing --------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._closed:
            self._transport.write(data)
            self._io.bytes_out += len(data)

    def respond(self, status: int, body: bytes, content_type: str | None, headers: list[tuple[str, str]]) -> None:
        """A whole response; then the next request (or the end of the connection)."""
        fields = [("Content-Length", str(len(body))), *headers]
        if content_type is not None:
            fields.insert(0, ("Content-Type", content_type))
        if not self._keep_alive:
            fields.append(("Connection", "close"))
        self.write(_head(status, fields) + body)
        self.finished()

    def finished(self) -> None:
        """The current response is complete."""
        self._io.frames_out += 1
        self._busy = False
        self.serving = None
        self.on_lost = None
        if self._paused is not None:
            self._paused.resume()
            self._paused = None
        if self._closed:
            return
        if not self._keep_alive:
            assert self._transport is not None
            self._transport.close()
            self._closed = True
            return
        if self._transport is not None:
            self._transport.resume_reading()
        if self._buffer:
            self._arm(self.core.limits.handshake_timeout)
            asyncio.get_running_loop().call_soon(self._parse)
        else:
            self._arm(self.core.limits.idle_timeout)

    def abort(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.close()

