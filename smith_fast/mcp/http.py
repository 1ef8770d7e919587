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
* Who may call (each checked on the request's head, before any byte of its body is read):
  ``Host`` must name a loopback address, ``localhost``, the address the connection arrived on or
  a ``--mcp-allow-host`` name (else 421: a page of a name rebound to 127.0.0.1 by DNS gives its own
  name); a browser's ``Origin`` must be on the ``--mcp-allow-origin`` list (else 403; never
  derived from ``Host``, which the same page controls); with ``--token``, ``Authorization: Bearer
  TOKEN`` (else 401). A refused request's body is never read: the connection is closed.

Limits: a request head 16 KiB (431), and ``--max-handshake-frame-size`` until the connection's
first admitted request; a body ``--max-frame-size`` (413); a connection has
``--handshake-timeout`` to present an admitted request (else it is closed) and then each request
that long to arrive (408); connections count towards ``--max-connections`` (503 over it). While a
client does not read a response, its connection reads and starts nothing more and the session
stays paused (its output held within ``--max-session-buffer``). A connection initializes at most
``--mcp-sessions-per-connection`` sessions (429); at ``--max-connections`` sessions the idle one
used least recently is ended to make room (503 when none is idle); sessions idle for
``--idle-timeout`` are ended. The head parser (:mod:`smith_fast.mcp.http_head`) refuses every
malformed or ambiguous length with 400. Resumption with ``Last-Event-ID`` is not offered (events
carry no ids), so a client whose stream broke sends its request again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson

from ..errors import ListenError
from ..logs import get_logger
from ..service.auth import token_matches
from . import protocol
from .endpoint import McpEndpoint
from .http_head import Head, HeadError, parse_head, split_host

if TYPE_CHECKING:
    from ..service.core import ServiceCore

__all__ = ["McpHttpServer", "PATH", "MAX_HEAD"]

log = get_logger("smith_fast.mcp")

PATH = "/mcp"
MAX_HEAD = 16 * 1024
_REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 406: "Not Acceptable", 408: "Request Timeout", 413: "Content Too Large",
    415: "Unsupported Media Type", 421: "Misdirected Request", 429: "Too Many Requests", 431: "Request Header Fields Too Large", 501: "Not Implemented",
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

    def __init__(self, head: Head, body: bytes) -> None:
        self.method = head.method
        self.path = head.target
        self.headers = head.headers
        self.body = body
        self.keep_alive = head.keep_alive


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
    lines.extend(f"{k}: {v}" for k, v in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Session:
    """An MCP session of the HTTP front: its endpoint, its GET stream, when it was last used, and
    the connections that still hold output of it the client has not read."""

    __slots__ = ("id", "endpoint", "stream", "last_seen", "holders")

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.endpoint: McpEndpoint
        self.stream: _Reply | None = None  # the GET stream
        self.last_seen = time.monotonic()
        self.holders: set[_Connection] = set()

    def send(self, data: bytes, final: bool) -> None:
        """The endpoint's channel for messages of no request: the GET stream, if one is open."""
        if self.stream is not None:
            self.stream.send(data, False)

    def unsent(self) -> int:
        """What its connections still hold for the client: counted against ``--max-session-buffer``."""
        return sum(conn.unsent() for conn in self.holders)

    @property
    def idle(self) -> bool:
        """Nothing runs for it and no stream of it is open: it may be ended to make room."""
        return not self.endpoint.calls and self.stream is None and not self.holders


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
        self.allow_hosts = frozenset(name.lower().rstrip(".") for name in core.config.mcp_allow_hosts)
        origins = {}
        for origin in core.config.mcp_allow_origins:
            key = _origin_key(origin)
            if key is None:
                raise ListenError(f"--mcp-allow-origin {origin!r} is not an origin (http[s]://HOST[:PORT])")
            origins[key] = origin
        self.allow_origins = frozenset(origins)
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
                if entry.last_seen < cutoff and entry.idle:
                    log.info("closing idle MCP session", extra={"fields": {"session": entry.id[:8]}})
                    self._drop(entry)

    def _drop(self, entry: _Session) -> None:
        self.sessions.pop(entry.id, None)
        asyncio.get_running_loop().create_task(entry.endpoint.shutdown())

    # ---- requests ------------------------------------------------------------------------------

    def admit(self, conn: _Connection, head: Head) -> None:
        """Whether a request may be served, from its head alone (before any byte of its body is
        read): its ``Origin``, its ``Host`` (DNS rebinding), its token.

        Raises:
            _Refused: 403 (``Origin``), 421 (``Host``), 401 (token).
        """
        origin = head.headers.get("origin")
        if origin is not None and _origin_key(origin) not in self.allow_origins:
            raise _Refused(403, f"origin {origin} is not allowed (--mcp-allow-origin)")
        host = head.headers.get("host")
        if host is None or (host != conn.admitted_host and not self._host_allowed(host, conn.local)):
            raise _Refused(421, f"Host {host!r} is not this service: a loopback address, localhost, the listener's address or a --mcp-allow-host name")
        token = self.core.config.token
        if token is not None:
            scheme, _, presented = head.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token_matches(token, presented.strip()):
                raise _Refused(401, "this service needs Authorization: Bearer TOKEN", headers=(("WWW-Authenticate", 'Bearer realm="smith-fast"'),))
        conn.admitted_host = host  # a keep-alive client sends the same one each time

    def _host_allowed(self, host: str, local: str | None) -> bool:
        parts = split_host(host)
        if parts is None:
            return False
        name = parts[0]
        if name in self.allow_hosts or name == "localhost" or name == local:
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return ip.is_loopback or (mapped is not None and mapped.is_loopback)

    def handle(self, conn: _Connection, req: _Request) -> None:
        """Answer one admitted request (or start answering it): through ``conn.respond`` or a :class:`_Reply`."""
        path = req.path.split("?", 1)[0]
        if path != PATH:
            raise _Refused(404, f"no such endpoint; MCP is served at {PATH}")
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
        conn.serving = entry
        entry.endpoint.handle(message, reply)

    def _new_session(self, conn: _Connection) -> _Session:
        """A session for an ``initialize``: at most ``--mcp-sessions-per-connection`` per
        connection; at ``--max-connections`` sessions the idle one used least recently is ended
        (a client told 404 initializes again), so idle sessions cannot lock new clients out."""
        limits = self.core.limits
        if conn.sessions_made >= limits.mcp_sessions_per_connection:
            raise _Refused(429, f"this connection made {conn.sessions_made} MCP sessions (--mcp-sessions-per-connection); open another", close=True)
        if len(self.sessions) >= limits.max_connections:
            victim = min((e for e in self.sessions.values() if e.idle), key=lambda e: e.last_seen, default=None)
            if victim is None:
                raise _Refused(503, f"too many busy MCP sessions (max {limits.max_connections}, --max-connections); try again later")
            log.info("ending the least recently used idle MCP session to make room", extra={"fields": {"session": victim.id[:8], "peer": conn.peer}})
            self._drop(victim)
        conn.sessions_made += 1
        entry = _Session(secrets.token_urlsafe(24))
        entry.endpoint = McpEndpoint(
            self.core, peer=conn.peer, close=lambda: self._ended(entry), authenticated=True, notify=entry,
            unsent=entry.unsent,
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
        conn.serving = entry
        conn.on_lost = lambda: _forget_stream(entry, reply)
        reply.started = True
        conn.write(_head(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Transfer-Encoding", "chunked")]))


def _forget_stream(entry: _Session, reply: _Reply) -> None:
    if entry.stream is reply:
        entry.stream = None


def _origin_key(origin: str) -> str | None:
    """An origin as browsers send it, to compare with the allow-list: lower-case scheme and host,
    the port only when it is not the scheme's default; None when it is no http(s) origin."""
    try:
        parts = urlsplit(origin.strip())
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not name or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    shown = f"[{name}]" if ":" in name else name
    default = 80 if parts.scheme.lower() == "http" else 443
    return f"{parts.scheme.lower()}://{shown.lower()}" + (f":{port}" if port is not None and port != default else "")


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: requests answered one after another (no pipelining overlap).

    Until a request of it has been admitted (:meth:`McpHttpServer.admit`: ``Origin``, ``Host``,
    token) the connection is unauthenticated: it has ``--handshake-timeout`` from its start to
    present one, and its request head may not exceed ``--max-handshake-frame-size``. A request's
    body is read only once its head was admitted; a refused head is answered and, when a body
    follows it, the connection closed without reading it. While the client does not read a
    response (the transport paused writing), no further request of it is read or started.
    """

    def __init__(self, server: McpHttpServer) -> None:
        self.server = server
        self.core = server.core
        self.peer = "?"
        self.local: str | None = None  # the address the connection arrived on
        self.authenticated = False
        self.admitted_host: str | None = None  # the Host of its last admitted request
        self.sessions_made = 0
        self._buffer = bytearray()
        self._head: Head | None = None  # an admitted request whose body is being read
        self._transport: asyncio.Transport | None = None
        self._busy = False  # a response is being produced
        self._keep_alive = True
        self._closed = False
        self._counted = False
        self._write_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._paused: _Session | None = None  # the session this connection paused (its output unread)
        self.serving: _Session | None = None  # whose response this connection carries now
        self.on_lost: Callable[[], None] | None = None
        self._io = self.core.metrics.io["mcp"]

    # ---- asyncio callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a server protocol is given a full Transport
        peer = transport.get_extra_info("peername")
        self.peer = f"mcp-http:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "mcp-http"
        local = transport.get_extra_info("sockname")
        self.local = str(local[0]).lower() if isinstance(local, tuple) else None
        self.server._connections.add(self)  # noqa: SLF001 (the server's own bookkeeping)
        core = self.core
        if core.connections >= core.limits.max_connections:
            self._refuse(_Refused(503, f"too many connections (max {core.limits.max_connections}); try again later", close=True))
            return
        core.connections += 1
        self._counted = True
        limits = core.limits
        self._arm(limits.handshake_timeout if limits.handshake_timeout > 0 else limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self.authenticated and not self._buffer and not self._busy and self._head is None and not self._write_paused:
            self._arm(self.core.limits.handshake_timeout)  # a request has begun: it has this long to arrive
        self._buffer += data
        self._io.bytes_in += len(data)
        if self._busy or self._write_paused:
            if len(self._buffer) > MAX_HEAD and self._transport is not None:
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
        self._release()
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self) -> None:
        self._write_paused = True
        entry = self.serving
        if entry is not None and self._paused is None:
            self._paused = entry
            entry.holders.add(self)
            entry.endpoint.pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._release()
        if not self._busy and not self._closed and self._transport is not None:
            self._transport.resume_reading()
            self._next()

    def _release(self) -> None:
        """The session this connection paused may produce again (the client read, or is gone)."""
        entry, self._paused = self._paused, None
        if entry is not None:
            entry.holders.discard(self)
            entry.endpoint.resume()

    def unsent(self) -> int:
        """Bytes written to the client and not taken by it yet."""
        return self._transport.get_write_buffer_size() if self._transport is not None and not self._closed else 0

    # ---- reading --------------------------------------------------------------------------------

    def _parse(self) -> None:
        try:
            self._read_requests()
        except Exception as exc:  # a bug of ours: answer it, keep the service
            log.exception("MCP HTTP request failed", extra={"fields": {"peer": self.peer}})
            if not self._busy and not self._closed:
                self._refuse(_Refused(500, f"internal error: {type(exc).__name__}", close=True))

    def _read_requests(self) -> None:
        limits = self.core.limits
        while not self._busy and not self._closed and not self._write_paused:
            buffer = self._buffer
            head = self._head
            if head is None:
                while buffer[:2] == b"\r\n":  # RFC 9112 2.2: empty lines before a request line are ignored
                    del buffer[:2]
                limit = MAX_HEAD if self.authenticated else min(MAX_HEAD, limits.max_handshake_frame_size)
                end = buffer.find(b"\r\n\r\n", 0, limit + 4)
                if end < 0:
                    if len(buffer) > limit + 3:
                        self._refuse(_Refused(431, f"the request head is larger than {limit} bytes", close=True))
                    return
                try:
                    head = parse_head(bytes(buffer[:end]), limits.max_frame_size)
                except HeadError as exc:
                    self._refuse(_Refused(exc.status, str(exc), close=True))
                    return
                del buffer[: end + 4]
                try:
                    self.server.admit(self, head)
                except _Refused as refused:
                    # its body is not read: with one to skip, the connection cannot go on
                    refused.close = refused.close or head.length > 0 or not head.keep_alive
                    self._refuse(refused)
                    return
                if not self.authenticated:
                    self.authenticated = True
                    self._arm(limits.handshake_timeout)  # the rest of this request has that long
                self._head = head
            if len(buffer) < head.length:
                return
            body = bytes(buffer[: head.length])
            del buffer[: head.length]
            self._head = None
            self._keep_alive = head.keep_alive
            self._busy = True
            self._io.frames_in += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            try:
                self.server.handle(self, _Request(head, body))
            except _Refused as refused:
                self._refuse(refused)
            except Exception as exc:  # a bug of ours: answer it, keep the service
                log.exception("MCP HTTP request failed", extra={"fields": {"peer": self.peer}})
                if self._busy and self.serving is None:
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
        if not self.authenticated:
            log.info("MCP HTTP connection closed: no admitted request within --handshake-timeout", extra={"fields": {"peer": self.peer}})
        if (self._buffer or self._head is not None) and not self._write_paused:  # a request that did not arrive in time
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
        """The current response is complete. The next request is read once the client took it
        (until then the session it was for stays paused: ``--max-session-buffer``)."""
        self._io.frames_out += 1
        self._busy = False
        self.serving = None
        self.on_lost = None
        if not self._write_paused:
            self._release()
        if self._closed:
            return
        if not self._keep_alive:
            assert self._transport is not None
            transport = self._transport
            transport.close()  # once what it holds is taken
            self._closed = True
            if self._write_paused and self.core.limits.idle_timeout > 0:  # a client that never reads it
                asyncio.get_running_loop().call_later(self.core.limits.idle_timeout, transport.abort)
            return
        if self._write_paused:
            if self._transport is not None:
                self._transport.pause_reading()
            if self.authenticated:
                self._arm(self.core.limits.idle_timeout)  # a client that does not read for this long is gone
            return
        if self._transport is not None:
            self._transport.resume_reading()
        self._next()

    def _next(self) -> None:
        """Go on with the next request, if one began arriving; else wait for one."""
        if not self.authenticated:
            if self._buffer:
                asyncio.get_running_loop().call_soon(self._parse)
            return  # the handshake deadline runs on
        if self._buffer or self._head is not None:
            self._arm(self.core.limits.handshake_timeout)
            asyncio.get_running_loop().call_soon(self._parse)
        else:
            self._arm(self.core.limits.idle_timeout)

    def abort(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.close()
