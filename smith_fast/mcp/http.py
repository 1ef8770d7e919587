"""``smith-fast serve --mcp-http HOST:PORT``: MCP's Streamable HTTP transport at ``/mcp``.

The MCP front is a route of the service's HTTP server (:mod:`smith_fast.http.server`: llhttp
heads, limits, deadlines, keep-alive, flow control); what is MCP's is here.

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

Limits (the HTTP server's): a request head 16 KiB (431), and ``--max-handshake-frame-size``
until the connection's first admitted request; a body ``--max-frame-size`` (413); a connection
has ``--handshake-timeout`` to present an admitted request (else it is closed) and then each
request that long to arrive (408); connections count towards ``--max-connections`` (503 over it);
every malformed or ambiguous head is 400 (:mod:`smith_fast.http.head`). While a client does not
read a response, its connection reads and starts nothing more and the session stays paused (its
output held within ``--max-session-buffer``). The MCP front's own: a connection initializes at
most ``--mcp-sessions-per-connection`` sessions (429); at ``--max-connections`` sessions the idle
one used least recently is ended to make room (503 when none is idle); sessions idle for
``--idle-timeout`` are ended. Resumption with ``Last-Event-ID`` is not offered (events
carry no ids), so a client whose stream broke sends its request again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import time
from typing import TYPE_CHECKING

import orjson

from ..errors import HttpRefused, ListenError
from ..http.head import Head, origin_key, split_host
from ..http.server import Gate, HttpConnection, HttpLimits, HttpServer, Request, response_head
from ..logs import get_logger
from ..service.auth import token_matches
from . import protocol
from .endpoint import McpEndpoint, discover
from .envelope import EnvelopeError, envelope, header_mismatch, is_modern
from .tasks import TaskTable

if TYPE_CHECKING:
    from ..service.core import ServiceCore

__all__ = ["McpHttpServer", "PATH"]

log = get_logger("smith_fast.mcp")

PATH = "/mcp"


class _Peer:
    """What the MCP front remembers of one connection."""

    __slots__ = ("admitted_host", "sessions_made")

    def __init__(self) -> None:
        self.admitted_host: str | None = None  # the Host of its last admitted request
        self.sessions_made = 0


class _Session:
    """An MCP session of the HTTP front: its endpoint, its GET stream, when it was last used, and
    the connections that still hold output of it the client has not read."""

    __slots__ = ("id", "endpoint", "stream", "last_seen", "holders")

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.endpoint: McpEndpoint
        self.stream: _Reply | None = None  # the GET stream
        self.last_seen = time.monotonic()
        self.holders: set[HttpConnection] = set()

    def send(self, data: bytes, final: bool) -> None:
        """The endpoint's channel for messages of no request: the GET stream, if one is open."""
        if self.stream is not None:
            self.stream.send(data, False)

    def unsent(self) -> int:
        """What its connections still hold for the client: counted against ``--max-session-buffer``."""
        return sum(conn.unsent() for conn in self.holders)

    def paused_by(self, conn: HttpConnection) -> None:
        """``conn`` holds output of this session its client has not read: produce nothing more."""
        self.holders.add(conn)
        self.endpoint.pause()

    def resumed_by(self, conn: HttpConnection) -> None:
        self.holders.discard(conn)
        self.endpoint.resume()

    @property
    def idle(self) -> bool:
        """Nothing runs for it and no stream of it is open: it may be ended to make room."""
        return not self.endpoint.calls and self.stream is None and not self.holders


class _Reply:
    """The answer to one request: a JSON body, or an SSE stream once more than one message goes out."""

    __slots__ = ("conn", "headers", "started", "done", "rename")

    def __init__(self, conn: HttpConnection, headers: list[tuple[str, str]], rename: tuple[bytes, bytes] | None = None) -> None:
        self.conn = conn
        self.headers = headers
        self.started = False
        self.done = False
        # A stateless request's: (our id, the client's), as JSON, to put back in its response, whose
        # first "id" member is the id (``{"jsonrpc":"2.0","id":…``), and in its logs' "requestId".
        self.rename = rename

    def send(self, data: bytes, final: bool) -> None:
        if self.done:
            return
        if self.rename is not None:
            key = b'"id":' if final else b'"requestId":'
            data = data.replace(key + self.rename[0], key + self.rename[1], 1)
        conn = self.conn
        if not self.started and final:
            self.done = True
            conn.respond(200, data, "application/json", self.headers)
            return
        out: list[bytes] = []
        if not self.started:
            self.started = True
            out.append(response_head(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Transfer-Encoding", "chunked"), *self.headers]))
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
        gate: counts the connections against ``--max-connections`` (the server's, shared by
            every front).
    """

    def __init__(self, core: ServiceCore, gate: Gate | None = None) -> None:
        self.core = core
        self.allow_hosts = frozenset(name.lower().rstrip(".") for name in core.config.mcp_allow_hosts)
        origins = {}
        for origin in core.config.mcp_allow_origins:
            key = origin_key(origin)
            if key is None:
                raise ListenError(f"--mcp-allow-origin {origin!r} is not an origin (http[s]://HOST[:PORT])")
            origins[key] = origin
        self.allow_origins = frozenset(origins)
        self.sessions: dict[str, _Session] = {}
        self._stateless: _Session | None = None  # the endpoint of every 2026-07-28 request
        self._stateless_ids = 0
        self._peers: dict[HttpConnection, _Peer] = {}
        self.listening: list[tuple[str, int]] = []  # (host as asked, port bound)
        self._sweeper: asyncio.Task[None] | None = None
        limits = core.limits
        self.server = HttpServer(
            {PATH: self},
            HttpLimits(max_body=limits.max_frame_size, first_timeout=limits.handshake_timeout, idle_timeout=limits.idle_timeout,
                       first_head=limits.max_handshake_frame_size),
            gate=gate, io=core.metrics.io["mcp"], name="mcp-http",
        )

    async def listen(self, host: str, port: int, *, backlog: int = 128) -> str:
        """Listen on ``host:port``; the URL of the endpoint."""
        bound, port = await self.server.listen(host, port, backlog=backlog)
        self.listening.append((host, port))
        if self._sweeper is None and self.core.limits.idle_timeout > 0:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(self.core.limits.idle_timeout))
        shown = f"[{bound}]" if ":" in bound else bound
        return f"http://{shown}:{port}{PATH}"

    def close(self) -> None:
        self.server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()

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

    def admit(self, conn: HttpConnection, head: Head) -> None:
        """Whether a request may be served, from its head alone (before any byte of its body is
        read): its ``Origin``, its ``Host`` (DNS rebinding), its token.

        Raises:
            HttpRefused: 403 (``Origin``), 421 (``Host``), 401 (token).
        """
        origin = head.headers.get("origin")
        if origin is not None and origin_key(origin) not in self.allow_origins:
            raise HttpRefused(403, f"origin {origin} is not allowed (--mcp-allow-origin)")
        host = head.headers.get("host")
        peer = self._peers.get(conn)
        if peer is None:
            peer = self._peers[conn] = _Peer()
        if host is None or (host != peer.admitted_host and not self._host_allowed(host, conn.local)):
            raise HttpRefused(421, f"Host {host!r} is not this service: a loopback address, localhost, the listener's address or a --mcp-allow-host name")
        token = self.core.config.token
        if token is not None:
            scheme, _, presented = head.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token_matches(token, presented.strip()):
                raise HttpRefused(401, "this service needs Authorization: Bearer TOKEN", headers=(("WWW-Authenticate", 'Bearer realm="smith-fast"'),))
        peer.admitted_host = host  # a keep-alive client sends the same one each time

    def closed(self, conn: HttpConnection) -> None:
        self._peers.pop(conn, None)

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

    def handle(self, conn: HttpConnection, req: Request) -> None:
        """Answer one admitted request (or start answering it): through ``conn.respond`` or a :class:`_Reply`."""
        version = req.headers.get("mcp-protocol-version")
        if version == protocol.MODERN:
            if req.method != "POST":  # no session to stream or end in the stateless revision
                raise HttpRefused(405, f"MCP {version} has no {req.method} on {PATH}: POST a request", headers=(("Allow", "POST"),))
            self._stateless_post(conn, req)
            return
        if version is not None and version not in protocol.REVISIONS:
            raise HttpRefused(400, f"MCP-Protocol-Version {version} is not supported (supported: {', '.join(protocol.REVISIONS)})")
        if req.method == "POST":
            self._post(conn, req)
        elif req.method == "GET":
            self._get(conn, req)
        elif req.method == "DELETE":
            entry = self._session(req)
            self._drop(entry)
            conn.respond(200, b"", None, [])
        else:
            raise HttpRefused(405, f"{req.method} is not allowed on {PATH}", headers=(("Allow", "GET, POST, DELETE"),))

    def _session(self, req: Request) -> _Session:
        session_id = req.headers.get("mcp-session-id")
        if session_id is None:
            raise HttpRefused(400, "Mcp-Session-Id is missing: send initialize first and present the id it returns")
        entry = self.sessions.get(session_id)
        if entry is None or entry.endpoint.closing:
            raise HttpRefused(404, "no such session (it ended or never existed); initialize a new one")
        entry.last_seen = time.monotonic()
        return entry

    def _stateless_post(self, conn: HttpConnection, req: Request) -> None:
        """A request of the stateless revision: its headers must agree with its body; it is served
        by the one endpoint of such requests (their tasks outlive them), under an id of ours, since
        ids of different clients collide; the client closing its stream cancels it."""
        message = self._message(conn, req)
        if message is None:
            return
        if "id" not in message or "method" not in message:
            conn.respond(202, b"", None, [])  # 2026-07-28 has no client notifications: nothing to do
            return
        request_id = message["id"]
        if not is_modern(message.get("params")):
            conn.respond(400, protocol.error_response(request_id, protocol.INVALID_PARAMS,
                                                      f"an MCP {protocol.MODERN} request carries its protocol version and client capabilities in params._meta"),
                         "application/json", [])
            return
        mismatch = header_mismatch(req.headers, message)
        if mismatch is not None:
            conn.respond(400, protocol.error_response(request_id, protocol.HEADER_MISMATCH, mismatch), "application/json", [])
            return
        params = message["params"]
        assert isinstance(params, dict)  # is_modern says so
        if message["method"] == "server/discover":
            # Answered without a session: negotiating clients send it first, and without
            # --mcp-discover go on with initialize (a session of their own).
            found = envelope(params)
            answer = protocol.error_response(request_id, found.code, found.message, found.data) if isinstance(found, EnvelopeError) else discover(self.core, request_id)
            conn.respond(200, answer, "application/json", [])
            return
        entry = self._stateless_entry(conn)
        self._stateless_ids += 1
        ours = f"stateless-{self._stateless_ids}"
        reply = _Reply(conn, [], rename=(orjson.dumps(ours), orjson.dumps(request_id)))
        conn.serve(entry, on_lost=lambda: entry.endpoint.handle({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ours}}, _DISCARD))
        entry.endpoint.handle({**message, "id": ours}, reply)

    def _stateless_entry(self, conn: HttpConnection) -> _Session:
        entry = self._stateless
        if entry is None or entry.endpoint.closing:
            entry = self._stateless = _Session("stateless")
            entry.endpoint = McpEndpoint(self.core, peer=f"{conn.peer} (MCP {protocol.MODERN})", close=lambda: self._stateless_ended(entry),
                                         authenticated=True, unsent=entry.unsent, tasks=TaskTable())
        return entry

    def _stateless_ended(self, entry: _Session) -> None:
        if self._stateless is entry:
            self._stateless = None

    def _message(self, conn: HttpConnection, req: Request) -> dict[str, object] | None:
        """The JSON-RPC message a POST carries, or None when it was answered with an error."""
        content_type = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise HttpRefused(415, "the body must be application/json")
        accept = req.headers.get("accept", "*/*")
        if not any(kind in accept for kind in ("application/json", "text/event-stream", "*/*")):
            raise HttpRefused(406, "Accept must include application/json and text/event-stream")
        try:
            message = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            conn.respond(400, protocol.error_response(None, protocol.PARSE_ERROR, f"the body is not JSON: {exc}"), "application/json", [])
            return None
        if not isinstance(message, dict):
            conn.respond(400, protocol.error_response(None, protocol.INVALID_REQUEST, "one JSON-RPC message per POST (batches are not supported)"), "application/json", [])
            return None
        return message

    def _post(self, conn: HttpConnection, req: Request) -> None:
        message = self._message(conn, req)
        if message is None:
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
        conn.serve(entry)
        entry.endpoint.handle(message, reply)

    def _new_session(self, conn: HttpConnection) -> _Session:
        """A session for an ``initialize``: at most ``--mcp-sessions-per-connection`` per
        connection; at ``--max-connections`` sessions the idle one used least recently is ended
        (a client told 404 initializes again), so idle sessions cannot lock new clients out."""
        limits = self.core.limits
        peer = self._peers[conn]  # made by admit
        if peer.sessions_made >= limits.mcp_sessions_per_connection:
            raise HttpRefused(429, f"this connection made {peer.sessions_made} MCP sessions (--mcp-sessions-per-connection); open another", close=True)
        if len(self.sessions) >= limits.max_connections:
            victim = min((e for e in self.sessions.values() if e.idle), key=lambda e: e.last_seen, default=None)
            if victim is None:
                raise HttpRefused(503, f"too many busy MCP sessions (max {limits.max_connections}, --max-connections); try again later")
            log.info("ending the least recently used idle MCP session to make room", extra={"fields": {"session": victim.id[:8], "peer": conn.peer}})
            self._drop(victim)
        peer.sessions_made += 1
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

    def _get(self, conn: HttpConnection, req: Request) -> None:
        entry = self._session(req)
        if "text/event-stream" not in req.headers.get("accept", ""):
            raise HttpRefused(406, "a GET stream needs Accept: text/event-stream")
        if entry.stream is not None:
            entry.stream.end()
        reply = _Reply(conn, [])
        entry.stream = reply
        conn.serve(entry, on_lost=lambda: _forget_stream(entry, reply))
        reply.started = True
        conn.write(response_head(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Transfer-Encoding", "chunked")]))


def _forget_stream(entry: _Session, reply: _Reply) -> None:
    if entry.stream is reply:
        entry.stream = None
