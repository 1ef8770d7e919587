"""The service's one HTTP/1.1 server, on asyncio: the MCP front (``/mcp``) and ``/metrics``.

A :class:`HttpServer` owns listeners and their connections and routes each request by its path
to a :class:`Route` (a table: path → route). What every route gets from it, once:

* heads read by llhttp with the stricter checks of :mod:`smith_fast.http.head`; a head larger
  than :attr:`HttpLimits.max_head` is 431, and until the connection's first admitted request
  :attr:`HttpLimits.first_head`;
* admission on the head alone (:meth:`Route.admit`: ``Host``, ``Origin``, a token, the method),
  before any byte of its body is read; a refused request with a body closes the connection;
* bodies of ``Content-Length`` bytes, at most :attr:`HttpLimits.max_body` (413 before any is
  read);
* deadlines: :attr:`HttpLimits.first_timeout` to present an admitted request, then that long for
  each request to arrive once it began (408), :attr:`HttpLimits.idle_timeout` between requests;
* requests answered one after another; while the client does not read a response, nothing more
  of it is read or started, and the :class:`Producer` the response is for is paused;
* with a gate, connections counted against ``--max-connections`` (503 over it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from ..errors import HeadError, HttpRefused
from ..logs import get_logger
from .head import Head, parse_head

__all__ = ["HttpLimits", "HttpServer", "HttpConnection", "Request", "Route", "Producer", "Gate", "IoFigures", "response_head"]

log = get_logger("smith_fast.http")

REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 406: "Not Acceptable", 408: "Request Timeout", 413: "Content Too Large",
    415: "Unsupported Media Type", 421: "Misdirected Request", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
    503: "Service Unavailable", 505: "HTTP Version Not Supported",
}


@dataclass(frozen=True)
class HttpLimits:
    """The limits of one server's connections.

    Attributes:
        max_body: the largest request body (``--max-frame-size``).
        first_timeout: seconds to present the first admitted request (``--handshake-timeout``),
            then for each request to arrive once it began; 0: none.
        idle_timeout: seconds a kept-alive connection may wait between requests, or not read a
            response (``--idle-timeout``); 0: none.
        max_head: the largest request head.
        first_head: the largest head until a request was admitted (``--max-handshake-frame-size``).
    """

    max_body: int
    first_timeout: float
    idle_timeout: float
    max_head: int = 16 * 1024
    first_head: int = 16 * 1024


class Request:
    """An admitted request with its body."""

    __slots__ = ("method", "path", "headers", "body", "keep_alive")

    def __init__(self, head: Head, body: bytes) -> None:
        self.method = head.method
        self.path = head.target
        self.headers = head.headers
        self.body = body
        self.keep_alive = head.keep_alive


class Producer(Protocol):
    """What a response is produced for (an MCP session): paused while a connection carrying its
    output is not read by the client, resumed when it is (or is gone)."""

    def paused_by(self, conn: HttpConnection) -> None: ...

    def resumed_by(self, conn: HttpConnection) -> None: ...


class Route(Protocol):
    """What serves one path."""

    def admit(self, conn: HttpConnection, head: Head) -> None:
        """Whether the request may be served, from its head alone.

        Raises:
            HttpRefused: its answer (its body, if any, is not read).
        """
        ...

    def handle(self, conn: HttpConnection, request: Request) -> None:
        """Answer an admitted request (or start to): ``conn.respond``, or ``conn.write`` and
        ``conn.finished`` for a streamed one.

        Raises:
            HttpRefused: its answer.
        """
        ...

    def closed(self, conn: HttpConnection) -> None:
        """``conn`` ended."""
        ...


class Gate(Protocol):
    """Counts connections against ``--max-connections`` (:class:`~smith_fast.service.connections.ConnectionGate`)."""

    limit: int

    def admit(self, conn: Hashable) -> bool: ...

    def release(self, conn: Hashable) -> None: ...


class IoFigures(Protocol):
    """Frames (requests, responses) and bytes of a protocol (:class:`~smith_fast.service.metrics.IOCounters`)."""

    frames_in: int
    frames_out: int
    bytes_in: int
    bytes_out: int


class _Uncounted:
    frames_in = frames_out = bytes_in = bytes_out = 0


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """A response's status line and header lines, with the blank line that ends them."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}"]
    lines.extend(f"{k}: {v}" for k, v in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class HttpServer:
    """Listeners and connections serving ``routes``.

    Args:
        routes: path (without the query) → its route.
        limits: the connections' limits.
        gate: counts the connections against ``--max-connections`` (None: not counted).
        io: where to count requests, responses and bytes.
        name: the peer label's prefix in logs (``mcp-http``).
    """

    def __init__(
        self, routes: Mapping[str, Route], limits: HttpLimits, *, gate: Gate | None = None, io: IoFigures | None = None,
        name: str = "http",
    ) -> None:
        self.routes = dict(routes)
        self.limits = limits
        self.gate = gate
        self.io: IoFigures = io if io is not None else _Uncounted()
        self.name = name
        self._servers: list[asyncio.base_events.Server] = []
        self._connections: set[HttpConnection] = set()

    async def listen(self, host: str, port: int, *, backlog: int = 128) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0 picks one); the address bound."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: HttpConnection(self), host, port, reuse_address=True, backlog=backlog)
        self._servers.append(server)
        sock = server.sockets[0].getsockname()
        return str(sock[0]), int(sock[1])

    def add_route(self, path: str, route: Route) -> None:
        """Serve ``path`` with ``route`` too (``/metrics`` on an MCP listener's address)."""
        self.routes[path] = route

    def close(self) -> None:
        """Stop listening and close every connection."""
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.abort()

    def route(self, head: Head) -> Route:
        """The route of a request head.

        Raises:
            HttpRefused: 404, no route serves its path.
        """
        route = self.routes.get(head.target.split("?", 1)[0])
        if route is None:
            raise HttpRefused(404, f"no such endpoint; served here: {', '.join(self.routes)}")
        return route

    def opened(self, conn: HttpConnection) -> bool:
        """A connection arrived: False when it is over ``--max-connections``."""
        self._connections.add(conn)
        return self.gate is None or self.gate.admit(conn)

    def ended(self, conn: HttpConnection) -> None:
        self._connections.discard(conn)
        if self.gate is not None:
            self.gate.release(conn)
        for route in set(self.routes.values()):
            route.closed(conn)


class HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 connection: requests answered one after another (no pipelining overlap).

    Until a request of it has been admitted the connection is unauthenticated: it has
    ``first_timeout`` from its start to present one, and its request head may not exceed
    ``first_head``. A request's body is read only once its head was admitted; a refused head is
    answered and, when a body follows it, the connection closed without reading it.

    Attributes:
        peer: ``NAME:ADDRESS:PORT`` for logs.
        local: the address the connection arrived on.
        authenticated: a request of it was admitted.
    """

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.peer = server.name
        self.local: str | None = None
        self.authenticated = False
        self._limits = server.limits
        self._io = server.io
        self._buffer = bytearray()
        self._head: Head | None = None  # an admitted request whose body is being read
        self._route: Route | None = None  # its route
        self._transport: asyncio.Transport | None = None
        self._busy = False  # a response is being produced
        self._keep_alive = True
        self._head_only = False  # the request is HEAD: responses carry no body
        self._closed = False
        self._write_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None  # when the connection expires (loop time), None: never
        self._loop = asyncio.get_running_loop()  # made by the loop's server, in the loop
        self._paused: Producer | None = None  # the producer this connection paused (its output unread)
        self._serving: Producer | None = None  # whose response this connection carries now
        self._on_lost: Callable[[], None] | None = None

    # ---- what a route uses ---------------------------------------------------------------------

    def serve(self, producer: Producer, on_lost: Callable[[], None] | None = None) -> None:
        """The response now being produced is ``producer``'s (paused while the client does not
        read it); ``on_lost`` is called if the connection ends before the response does."""
        self._serving = producer
        self._on_lost = on_lost

    def unsent(self) -> int:
        """Bytes written to the client and not taken by it yet."""
        return self._transport.get_write_buffer_size() if self._transport is not None and not self._closed else 0

    def write(self, data: bytes) -> None:
        """Part of a streamed response."""
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
        self.write(response_head(status, fields) + (b"" if self._head_only else body))
        self.finished()

    def finished(self) -> None:
        """The current response is complete. The next request is read once the client took it
        (until then the producer it was for stays paused)."""
        self._io.frames_out += 1
        self._busy = False
        self._serving = None
        self._on_lost = None
        if not self._write_paused:
            self._release()
        if self._closed:
            return
        if not self._keep_alive:
            assert self._transport is not None
            transport = self._transport
            transport.close()  # once what it holds is taken
            self._closed = True
            if self._write_paused and self._limits.idle_timeout > 0:  # a client that never reads it
                self._loop.call_later(self._limits.idle_timeout, transport.abort)
            return
        if self._write_paused:
            if self._transport is not None:
                self._transport.pause_reading()
            if self.authenticated:
                self._arm(self._limits.idle_timeout)  # a client that does not read for this long is gone
            return
        if self._transport is not None:
            self._transport.resume_reading()
        self._next()

    def abort(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.close()

    # ---- asyncio callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a server protocol is given a full Transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"{self.server.name}:{peer[0]}:{peer[1]}"
        local = transport.get_extra_info("sockname")
        self.local = str(local[0]).lower() if isinstance(local, tuple) else None
        if not self.server.opened(self):
            limit = self.server.gate.limit if self.server.gate is not None else 0
            self._refuse(HttpRefused(503, f"too many connections (max {limit}); try again later", close=True))
            return
        limits = self._limits
        self._arm(limits.first_timeout if limits.first_timeout > 0 else limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        begun = self.authenticated and not self._buffer and not self._busy and self._head is None and not self._write_paused
        self._buffer += data
        self._io.bytes_in += len(data)
        if self._busy or self._write_paused:
            if len(self._buffer) > self._limits.max_head and self._transport is not None:
                self._transport.pause_reading()  # the next request waits; so does its sender
            return
        self._parse()
        if begun and not self._busy and not self._closed and (self._buffer or self._head is not None):
            self._arm(self._limits.first_timeout)  # a request began and did not arrive whole: it has this long

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._release()
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()
        self.server.ended(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        producer = self._serving
        if producer is not None and self._paused is None:
            self._paused = producer
            producer.paused_by(self)

    def resume_writing(self) -> None:
        self._write_paused = False
        self._release()
        if not self._busy and not self._closed and self._transport is not None:
            self._transport.resume_reading()
            self._next()

    def _release(self) -> None:
        """The producer this connection paused may produce again (the client read, or is gone)."""
        producer, self._paused = self._paused, None
        if producer is not None:
            producer.resumed_by(self)

    # ---- reading --------------------------------------------------------------------------------

    def _parse(self) -> None:
        try:
            self._read_requests()
        except Exception as exc:  # a bug of ours: answer it, keep the service
            log.exception("HTTP request failed", extra={"fields": {"peer": self.peer}})
            if not self._busy and not self._closed:
                self._refuse(HttpRefused(500, f"internal error: {type(exc).__name__}", close=True))

    def _read_requests(self) -> None:
        limits = self._limits
        while not self._busy and not self._closed and not self._write_paused:
            buffer = self._buffer
            head = self._head
            if head is None:
                while buffer[:2] == b"\r\n":  # RFC 9112 2.2: empty lines before a request line are ignored
                    del buffer[:2]
                limit = limits.max_head if self.authenticated else min(limits.max_head, limits.first_head)
                end = buffer.find(b"\r\n\r\n", 0, limit + 4)
                if end < 0:
                    if len(buffer) > limit + 3:
                        self._refuse(HeadError(431, f"the request head is larger than {limit} bytes"))
                    return
                self._head_only = False
                try:
                    head = parse_head(bytes(buffer[:end]), limits.max_body)
                except HeadError as exc:
                    self._refuse(exc)
                    return
                del buffer[: end + 4]
                self._head_only = head.method == "HEAD"
                try:
                    route = self.server.route(head)
                    route.admit(self, head)
                except HttpRefused as refused:
                    # its body is not read: with one to skip, the connection cannot go on
                    self._refuse(refused, close=head.length > 0 or not head.keep_alive)
                    return
                if not self.authenticated:
                    self.authenticated = True
                    self._arm(limits.first_timeout)  # the rest of this request has that long
                self._head, self._route = head, route
            if len(buffer) < head.length:
                return
            body = bytes(buffer[: head.length])
            del buffer[: head.length]
            admitted = self._route
            assert admitted is not None
            self._head = self._route = None
            self._keep_alive = head.keep_alive
            self._busy = True
            self._io.frames_in += 1
            self._deadline = None  # no deadline while it is served
            try:
                admitted.handle(self, Request(head, body))
            except HttpRefused as refused:
                self._refuse(refused)
            except Exception as exc:  # a bug of ours: answer it, keep the service
                log.exception("HTTP request failed", extra={"fields": {"peer": self.peer}})
                if self._busy and self._serving is None:
                    self._refuse(HttpRefused(500, f"internal error: {type(exc).__name__}"))

    def _refuse(self, refused: HttpRefused, *, close: bool = False) -> None:
        """Answer ``refused``; ``close`` (or the refusal's own) ends the connection after it."""
        if close or refused.close:
            self._keep_alive = False
        log.info("HTTP request refused", extra={"fields": {"peer": self.peer, "status": refused.status, "error": str(refused)}})
        self._busy = True
        self.respond(refused.status, orjson.dumps({"error": str(refused)}), "application/json", list(refused.headers))

    def _arm(self, seconds: float) -> None:
        """Expire in ``seconds`` (0: never). A timer that fires before the deadline sets it for
        the rest, so a kept-alive connection moving its deadline on at every response (the
        usual case) reschedules nothing."""
        if seconds <= 0:
            self._deadline = None
            return
        loop = self._loop
        deadline = self._deadline = loop.time() + seconds
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self._closed:
            return
        if deadline > self._loop.time():
            self._timer = self._loop.call_at(deadline, self._fire)
            return
        self._deadline = None
        self._expire()

    def _expire(self) -> None:
        if self._busy or self._closed:
            return
        if not self.authenticated:
            log.info("HTTP connection closed: no admitted request in time", extra={"fields": {"peer": self.peer}})
        if (self._buffer or self._head is not None) and not self._write_paused:  # a request that did not arrive in time
            self._keep_alive = False
            self._busy = True
            self._head_only = False
            self.respond(408, orjson.dumps({"error": "the request did not arrive in time"}), "application/json", [])
        else:
            self.abort()

    def _next(self) -> None:
        """Go on with the next request, if one began arriving; else wait for one."""
        if not self.authenticated:
            if self._buffer:
                self._loop.call_soon(self._parse)
            return  # the first deadline runs on
        if self._buffer or self._head is not None:
            self._arm(self._limits.first_timeout)
            self._loop.call_soon(self._parse)
        else:
            self._arm(self._limits.idle_timeout)
