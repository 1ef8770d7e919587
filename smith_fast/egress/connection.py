"""One client connection of the proxy, from accept to its one Record: :class:`ProxyConnection`.

Its task (:meth:`ProxyConnection.run`) reads the first bytes (0x05: SOCKS5, else HTTP), names
the destination, decides (the policy, the observer's hook, the resolver, every address checked),
connects to the checked address, answers the client, then relays with two :class:`~.splice.Pump`\\ s
(zero-copy) until both directions ended, or one failed; whatever ends it (the client, the
destination, the sweeper's timeouts, :meth:`~.proxy.Served.close`) ends in the same ``finally``,
which closes both sockets and gives the one Record.

A forwarded plain-HTTP request is the exception in one direction: its body goes through llhttp
(the head is rewritten, the body is re-framed, nothing after the request is forwarded); its
response is spliced like a tunnel (read by :class:`~.http_response.ResponseRedactor` instead when
its host got secrets), and the connection ends with it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

from . import socks5
from .attempts import Attempt, Observer, Record, Verdict, Via
from .http_proxy import RequestReader, Target, answer, closing_heads, forward_head, parse_absolute, parse_authority
from .http_response import ResponseRedactor
from .rules import IPAddress, parse_address
from .limits import EgressLimits
from .policy import EgressPolicy
from .resolver import Resolver
from .splice import DOWN_PIPE_SIZE, Pump

__all__ = ["ProxyConnection", "ConnectionHost"]

# Phases of a connection, in order.
GREETING, SOCKS_REQUEST, HTTP_HEAD, DECIDING, RELAY, ANSWERED = range(6)
_READ = 65536

# What the proxy answers when it does not connect: (HTTP status, SOCKS5 reply) per verdict rule;
# a policy refusal (any other rule) is 403 / "not allowed by ruleset".
_FAILURES: dict[str, tuple[int, int]] = {
    "unresolved": (502, socks5.UNREACHABLE),
    "unreachable": (502, socks5.REFUSED),
    "timeout": (504, socks5.UNREACHABLE),
    "bad-request": (400, socks5.FAILURE),
    "head-too-large": (431, socks5.FAILURE),
    "limit": (503, socks5.FAILURE),
    "hook-failed": (403, socks5.NOT_ALLOWED),
}


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ConnectionHost(Protocol):
    """What a connection needs of the listener that accepted it (:class:`~.proxy.Served`)."""

    loop: asyncio.AbstractEventLoop
    policy: EgressPolicy
    limits: EgressLimits
    resolver: Resolver
    observer: Observer

    def ended(self, connection: "ProxyConnection", record: Record) -> None: ...

    def refused(self, attempt: Attempt, verdict: Verdict) -> None: ...


class ProxyConnection:
    """One accepted connection and everything it leads to (see the module docstring)."""

    def __init__(self, served: ConnectionHost, client: socket.socket) -> None:
        self.served = served
        self.loop = served.loop
        self.client = client
        self.upstream: socket.socket | None = None
        self.phase = GREETING
        self.buffer = bytearray()
        self.reader: RequestReader | None = None
        self.target = Target("", 0)
        self.attempt = Attempt("", 0, "connect")
        self.verdict = Verdict(False, "bad-request", "no request")
        self.address: str | None = None
        self.forwarding = False   # a plain-HTTP request: body through the reader, the end with its response
        self.echoed: tuple[tuple[bytes, bytes], ...] = ()  # (value, placeholder) of the secrets its host got
        self.pending: list[bytes] = []  # client bytes for upstream (a body, bytes after a head)
        self.out: list[bytes] = []      # the proxy's answers to the client, sent after each read
        self.up = 0
        self.down = 0
        self.quiet = 0   # sweeps without a byte either way (the Served's sweeper counts)
        self.age = 0     # sweeps since accept
        self.up_pump: Pump | None = None
        self.down_pump: Pump | None = None
        self.task: asyncio.Task[None] = None  # type: ignore[assignment]  # set by Served as it starts run()

    # ---- the lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """The connection's task: handshake, decision, relay; always one Record at the end."""
        loop = self.loop
        try:
            while self.phase < DECIDING:
                data = await loop.sock_recv(self.client, _READ)
                if not data:
                    return
                self.quiet = 0
                self._feed(data)
                await self._answer()
            if self.phase == DECIDING:
                await self._connect()
            await self._answer()
            if self.phase == RELAY:
                await self._relay()
            elif self.phase == ANSWERED:
                await self._linger()
        except (asyncio.CancelledError, TimeoutError):
            pass  # the sweeper or Served.close: end as any other end does
        except OSError:
            pass  # the client or the destination went away: what was counted is the Record
        finally:
            for pump in (self.up_pump, self.down_pump):
                if pump is not None:
                    pump.stop()
            if self.upstream is not None:
                self.upstream.close()
            self.client.close()
            self.served.ended(self, Record(self.attempt, self.address, self.verdict, self.up, self.down))

    async def _answer(self) -> None:
        if self.out:
            data = b"".join(self.out)
            self.out.clear()
            await self.loop.sock_sendall(self.client, data)

    async def _linger(self) -> None:
        """After a refusal: FIN, then read what the client still sends (briefly, boundedly), so
        that closing with unread bytes does not reset the connection before the answer is read."""
        self.client.shutdown(socket.SHUT_WR)
        left = self.served.limits.max_head
        async with asyncio.timeout(1.0):
            while left > 0:
                data = await self.loop.sock_recv(self.client, _READ)
                if not data:
                    return
                left -= len(data)

    def moved(self, pump: Pump, count: int) -> None:
        """A pump's report (the :class:`~.splice.Counter` seam)."""
        self.quiet = 0
        if pump is self.up_pump:
            self.up += count
        else:
            self.down += count

    # ---- naming the destination ------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self.phase == GREETING and not self.buffer and data[:1] != b"\x05":
            self.phase = HTTP_HEAD
            self.reader = RequestReader(self.served.limits.max_head, self.pending.append)
        if self.phase == HTTP_HEAD:
            self._http(data)
        else:
            self._socks(data)

    def _http(self, data: bytes) -> None:
        reader = self.reader
        assert reader is not None
        problem = reader.feed(data)
        if problem is not None:
            rule = "head-too-large" if problem == "head too large" else "bad-request"
            self._fail("http", Verdict(False, rule, problem))
            return
        if not reader.head_done:
            return
        if reader.method == b"CONNECT":
            target = parse_authority(reader.url, None)
            via: Via = "connect"
        else:
            target = parse_absolute(reader.url)
            via = "http"
        if target is None:
            what = "CONNECT host:port" if via == "connect" else "an absolute http:// URL (this is a proxy)"
            self._fail(via, Verdict(False, "bad-request", f"bad request target: want {what}"))
            return
        if reader.upgraded and reader.after_head:
            self.pending.append(reader.after_head)
        self.forwarding = via == "http" and not reader.upgraded
        self._named(Attempt(target.host, target.port, via), target)

    def _socks(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > self.served.limits.max_head:
            self._fail("socks5", Verdict(False, "head-too-large", "handshake too large"))
            return
        if self.phase == GREETING:
            greeting = socks5.read_greeting(self.buffer)
            if greeting is None:
                return
            if not greeting.no_auth:
                self.out.append(socks5.NO_METHOD)
                self._fail("socks5", Verdict(False, "bad-request", "the client offers no SOCKS5 method without authentication"),
                           quiet=True)
                return
            self.out.append(socks5.NO_AUTH)
            del self.buffer[:greeting.size]
            self.phase = SOCKS_REQUEST
        request = socks5.read_request(self.buffer, 0)
        if request is None:
            return
        if request.error:
            self._fail("socks5", Verdict(False, "bad-request", "bytes that are no SOCKS5 request"), code=request.error)
            return
        if request.port == 0:
            self._fail("socks5", Verdict(False, "bad-request", "port 0"), code=socks5.BAD_ADDRESS)
            return
        if request.command != 1:
            self._fail("socks5", Verdict(False, "bad-request", "only the SOCKS5 CONNECT command is served"),
                       code=socks5.BAD_COMMAND)
            return
        rest = bytes(self.buffer[request.size:])
        self.buffer.clear()
        if rest:
            self.pending.append(rest)
        host = request.host.lower().rstrip(".")
        self._named(Attempt(host, request.port, "socks5"), Target(host, request.port))

    def _named(self, attempt: Attempt, target: Target) -> None:
        self.attempt, self.target = attempt, target
        self.phase = DECIDING

    # ---- deciding and connecting -----------------------------------------------------------------

    async def _connect(self) -> None:
        served, attempt = self.served, self.attempt
        policy, limits = served.policy, served.limits
        verdict = policy.screen(attempt)
        if verdict is None:
            try:
                said = await asyncio.wait_for(served.observer.before_connect(attempt), limits.within(limits.handshake_timeout))
            except Exception as exc:  # a hook that fails refuses: never a connection no one decided on
                said = Verdict(False, "hook-failed", f"the beforeConnect hook failed ({type(exc).__name__})")
            verdict = said if said is not None else policy.allows(attempt)
        if not verdict.allowed:
            self._fail(attempt.via, verdict)
            return
        literal = parse_address(attempt.host)
        addresses: list[IPAddress]
        if literal is not None:
            addresses = [literal]
        else:
            try:
                texts = await asyncio.wait_for(served.resolver.resolve(attempt.host), limits.within(limits.connect_timeout))
            except asyncio.TimeoutError:
                self._fail(attempt.via, Verdict(False, "timeout", f"resolving {attempt.host} timed out"))
                return
            addresses = [a for a in map(parse_address, texts) if a is not None]
            if not addresses:
                self._fail(attempt.via, Verdict(False, "unresolved", f"{attempt.host} does not resolve"))
                return
        refusal = policy.check_addresses(attempt, addresses)
        if refusal is not None:
            self._fail(attempt.via, refusal)
            return
        try:
            self.upstream, address = await asyncio.wait_for(self._dial(addresses, attempt.port),
                                                            limits.within(limits.connect_timeout))
        except asyncio.TimeoutError:
            self._fail(attempt.via, Verdict(False, "timeout", f"connecting to {attempt.host} timed out"))
            return
        except OSError as exc:
            self._fail(attempt.via, Verdict(False, "unreachable", f"connecting failed ({exc.strerror or exc})"))
            return
        self.verdict, self.address = verdict, str(address)
        if attempt.via == "connect":
            self.out.append(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif attempt.via == "socks5":
            self.out.append(socks5.reply(socks5.SUCCEEDED))
        else:
            assert self.reader is not None
            pairs = policy.substitutions(attempt.host, attempt.port)
            head, encoded = forward_head(self.reader, self.target, pairs)
            self.pending.insert(0, head)
            self.echoed = tuple((value, placeholder) for placeholder, value in pairs) + encoded
        self.phase = RELAY

    async def _dial(self, addresses: list[IPAddress], port: int) -> tuple[socket.socket, IPAddress]:
        """A socket connected to the first address that answers (each one checked, none resolved again)."""
        error: OSError = OSError("no address")
        for address in addresses:
            sock = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self.loop.sock_connect(sock, (str(address), port))
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return sock, address
        raise error

    # ---- relaying --------------------------------------------------------------------------------

    async def _send_pending(self) -> None:
        assert self.upstream is not None
        while self.pending:
            data = b"".join(self.pending)
            self.pending.clear()
            self.up += len(data)
            await self.loop.sock_sendall(self.upstream, data)

    async def _relay(self) -> None:
        upstream = self.upstream
        assert upstream is not None
        await self._send_pending()
        if self.forwarding:
            # the request's body through llhttp while the response comes back: its head
            # rewritten to say the connection closes, the rest spliced; the response's end (the
            # destination closes: Connection: close) ends the connection
            body = self.loop.create_task(self._forward_body())
            try:
                if self.echoed:
                    await self._redacted_response()
                elif await self._response_head():
                    self.down_pump = Pump(self.loop, upstream, self.client, self, DOWN_PIPE_SIZE)
                    error = await self.down_pump.done
                    if error is not None:
                        raise error
            finally:
                body.cancel()
            return
        self.down_pump = Pump(self.loop, upstream, self.client, self, DOWN_PIPE_SIZE)
        self.up_pump = Pump(self.loop, self.client, upstream, self)
        pending = {self.up_pump.done, self.down_pump.done}
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in finished:
                error = future.result()
                if error is not None:
                    raise error

    async def _response_head(self) -> bool:
        """Pass the response's head(s) to the client, the final one saying ``Connection: close``
        (the proxy serves one request per connection: a client told keep-alive would send its
        next request into a closing connection). False when the destination closed already."""
        assert self.upstream is not None
        data = b""
        while True:
            more = await self.loop.sock_recv(self.upstream, _READ)
            self.quiet = 0
            if not more:
                if data:
                    self.down += len(data)
                    await self.loop.sock_sendall(self.client, data)
                return False
            data += more
            heads, data, done = closing_heads(data, self.served.limits.max_head)
            if heads:
                self.down += len(heads)
                await self.loop.sock_sendall(self.client, heads)
            if done:
                if data:
                    self.down += len(data)
                    await self.loop.sock_sendall(self.client, data)
                return True

    async def _redacted_response(self) -> None:
        """The response of a host that got secrets, read instead of spliced: each value it echoes
        reaches the client as its placeholder (:class:`~.http_response.ResponseRedactor`)."""
        assert self.upstream is not None
        redactor = ResponseRedactor(self.echoed, self.served.limits.max_head)
        while not redactor.done:
            data = await self.loop.sock_recv(self.upstream, _READ)
            self.quiet = 0
            out = redactor.feed(data) if data else redactor.end()
            if out is None:
                return  # no HTTP response: nothing unread is passed on
            if out:
                self.down += len(out)
                await self.loop.sock_sendall(self.client, out)
            if not data:
                return

    async def _forward_body(self) -> None:
        reader = self.reader
        assert reader is not None
        while not reader.message_done:
            data = await self.loop.sock_recv(self.client, _READ)
            if not data:
                return
            self.quiet = 0
            if reader.feed(data) is not None:
                return
            await self._send_pending()

    def _fail(self, via: Via, verdict: Verdict, *, code: int | None = None, quiet: bool = False) -> None:
        """Answer the client that no connection is made (sent by run), tell the observer."""
        self.verdict = verdict
        if self.attempt.via != via:
            self.attempt = Attempt(self.attempt.host, self.attempt.port, via)
        status, socks_code = _FAILURES.get(verdict.rule, (403, socks5.NOT_ALLOWED))
        if not quiet:
            if via == "socks5":
                self.out.append(socks5.reply(code if code is not None else socks_code))
            elif status == 403:
                self.out.append(answer(403, f"smith-fast egress: refused {_shown(self.attempt.host, self.attempt.port)} "
                                            f"({verdict.reason})"))
            else:
                where = f" {_shown(self.attempt.host, self.attempt.port)}" if self.attempt.host else ""
                self.out.append(answer(status, f"smith-fast egress:{where} {verdict.reason}"))
        if self.attempt.host:
            self.served.refused(self.attempt, verdict)
        self.phase = ANSWERED
