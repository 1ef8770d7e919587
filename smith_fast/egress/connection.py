"""One client connection of the proxy, from accept to its one Record: :class:`ProxyConnection`.

It reads the first bytes (0x05: SOCKS5, else HTTP), names the destination, decides (the policy,
the observer's hook, the resolver, every address checked), connects to the checked address, answers
the client, then relays bytes both ways until either end closes. Its upstream end
(:class:`Upstream`) is a second asyncio protocol that writes into the client's transport; each
end pauses the other's reading when its own transport's buffer is full, so a slow reader holds at
most one transport buffer per direction.

The relay does no per-chunk work but a count and a write: asyncio (uvloop in production) reads
up to its own buffer size (256 KiB in uvloop) and writes at once when the socket takes it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, cast

from . import socks5
from .attempts import Attempt, Record, Verdict, Via
from .http_proxy import RequestReader, Target, answer, forward_head, parse_absolute, parse_authority
from .rules import IPAddress, parse_address

if TYPE_CHECKING:
    from .proxy import Served

__all__ = ["ProxyConnection", "Upstream"]

# Phases of a connection.
GREETING, SOCKS_REQUEST, HTTP_HEAD, DECIDING, RELAY, ANSWERED, CLOSED = range(7)

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


class Upstream(asyncio.Protocol):
    """The destination's end of a relay: what it sends goes to the client."""

    __slots__ = ("owner", "transport")

    def __init__(self, owner: "ProxyConnection") -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no asyncio.Transport subclass, but have its methods
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        owner.down += len(data)
        owner.quiet = 0
        owner.client.write(data)

    def eof_received(self) -> bool:
        return self.owner.upstream_eof()

    def pause_writing(self) -> None:
        self.owner.client.pause_reading()

    def resume_writing(self) -> None:
        self.owner.client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.upstream_lost()


class ProxyConnection(asyncio.Protocol):
    """One accepted connection and everything it leads to (see the module docstring)."""

    def __init__(self, served: "Served") -> None:
        self.served = served
        self.client: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made, the first call
        self.phase = GREETING
        self.buffer = bytearray()
        self.reader: RequestReader | None = None
        self.attempt = Attempt("", 0, "connect")
        self.verdict = Verdict(False, "bad-request", "no request")
        self.address: str | None = None
        self.upstream: Upstream | None = None
        self.forwarding = False   # a plain-HTTP request: body through the reader, close after the response
        self.pending: list[bytes] = []  # client bytes for upstream before it is connected
        self.up = 0
        self.down = 0
        self.quiet = 0   # sweeps without a byte either way (the Served's sweeper counts)
        self.age = 0     # sweeps since accept
        self.eofs = 0    # ends that sent EOF in a tunnel; at 2 both are closed
        self.task: asyncio.Task[None] | None = None

    # ---- the client's transport -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.quiet = 0
        if self.phase == RELAY:
            if self.forwarding:
                assert self.reader is not None
                self.reader.feed(data)
            else:
                self.up += len(data)
                assert self.upstream is not None and self.upstream.transport is not None
                self.upstream.transport.write(data)
            return
        if self.phase == DECIDING:
            self._hold(data)
            return
        if self.phase >= ANSWERED:
            return
        if self.phase == GREETING and not self.buffer and data[:1] != b"\x05":
            self.phase = HTTP_HEAD
            self.reader = RequestReader(self.served.limits.max_head, self._hold)
        if self.phase == HTTP_HEAD:
            self._http(data)
        else:
            self._socks(data)

    def _hold(self, data: bytes) -> None:
        """Client bytes for upstream (a body): written now when connected, else kept until it is."""
        if self.phase == RELAY and self.upstream is not None and self.upstream.transport is not None:
            self.up += len(data)
            self.upstream.transport.write(data)
        else:
            self.pending.append(data)

    def eof_received(self) -> bool:
        if self.phase != RELAY:
            self.client.close()
            return False
        if self.forwarding:
            return True   # the request was read; its response still comes
        upstream = self.upstream.transport if self.upstream is not None else None
        if upstream is not None and upstream.can_write_eof():
            upstream.write_eof()
        return self._eof()

    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.phase == CLOSED:
            return
        self.phase = CLOSED
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()
        self.served.ended(self, Record(self.attempt, self.address, self.verdict, self.up, self.down))

    # ---- the upstream's end -------------------------------------------------------------------

    def upstream_eof(self) -> bool:
        if self.forwarding:
            self.client.close()   # the response ended: close after what is buffered is sent
            return False
        if self.client.can_write_eof():
            self.client.write_eof()
        return self._eof()

    def _eof(self) -> bool:
        self.eofs += 1
        if self.eofs >= 2:
            self.client.close()
            return False
        return True

    def upstream_lost(self) -> None:
        if self.phase != CLOSED:
            self.client.close()

    def close(self, abort: bool = False) -> None:
        """End the connection (and its upstream); its Record follows from connection_lost."""
        if abort:
            self.client.abort()
        else:
            self.client.close()
        if self.upstream is not None and self.upstream.transport is not None:
            if abort:
                self.upstream.transport.abort()
            else:
                self.upstream.transport.close()

    # ---- naming the destination ------------------------------------------------------------------

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
        if via == "connect" and reader.after_head:
            self.pending.append(reader.after_head)
        elif via == "http":
            self.forwarding = not reader.upgraded
            if reader.upgraded and reader.after_head:
                self.pending.append(reader.after_head)
        self._decide(Attempt(target.host, target.port, via), target)

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
                self.client.write(socks5.NO_METHOD)
                self._fail("socks5", Verdict(False, "bad-request", "the client offers no SOCKS5 method without authentication"), quiet=True)
                return
            self.client.write(socks5.NO_AUTH)
            del self.buffer[:greeting.size]
            self.phase = SOCKS_REQUEST
        request = socks5.read_request(self.buffer, 0)
        if request is None:
            return
        if request.error:
            self._fail("socks5", Verdict(False, "bad-request", "bytes that are no SOCKS5 request"), code=request.error)
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
        self._decide(Attempt(host, request.port, "socks5"), Target(host, request.port))

    def _decide(self, attempt: Attempt, target: Target) -> None:
        self.attempt = attempt
        self.phase = DECIDING
        self.client.pause_reading()
        self.task = asyncio.get_running_loop().create_task(self._connect(target))

    # ---- deciding and connecting -----------------------------------------------------------------

    async def _connect(self, target: Target) -> None:
        served, attempt = self.served, self.attempt
        policy, limits = served.policy, served.limits
        verdict = policy.screen(attempt)
        if verdict is None:
            try:
                said = await asyncio.wait_for(served.observer.before_connect(attempt), limits.handshake_timeout)
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
                texts = await asyncio.wait_for(served.resolver.resolve(attempt.host), limits.connect_timeout)
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
            sock, address = await asyncio.wait_for(self._dial(addresses, attempt.port), limits.connect_timeout)
        except asyncio.TimeoutError:
            self._fail(attempt.via, Verdict(False, "timeout", f"connecting to {attempt.host} timed out"))
            return
        except OSError as exc:
            self._fail(attempt.via, Verdict(False, "unreachable", f"connecting failed ({exc.strerror or exc})"))
            return
        self.verdict, self.address = verdict, str(address)
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(lambda: Upstream(self), sock=sock)
        except OSError as exc:
            sock.close()
            self._fail(attempt.via, Verdict(False, "unreachable", f"connecting failed ({exc})"))
            return
        if self.phase == CLOSED:
            if upstream.transport is not None:
                upstream.transport.close()
            return
        self.upstream = upstream
        self._relay(target)

    async def _dial(self, addresses: list[IPAddress], port: int) -> tuple[socket.socket, IPAddress]:
        """A socket connected to the first address that answers (each one checked, none resolved again)."""
        loop = asyncio.get_running_loop()
        error: OSError = OSError("no address")
        for address in addresses:
            sock = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, (str(address), port))
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return sock, address
        raise error

    def _relay(self, target: Target) -> None:
        attempt = self.attempt
        assert self.upstream is not None and self.upstream.transport is not None
        upstream = self.upstream.transport
        if attempt.via == "connect":
            self.client.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif attempt.via == "socks5":
            self.client.write(socks5.reply(socks5.SUCCEEDED))
        else:
            assert self.reader is not None
            head = forward_head(self.reader, target, self.served.policy.substitutions(attempt.host, attempt.port))
            self.up += len(head)
            upstream.write(head)
        self.phase = RELAY
        for data in self.pending:
            self.up += len(data)
            upstream.write(data)
        self.pending.clear()
        self.client.resume_reading()

    def _fail(self, via: Via, verdict: Verdict, *, code: int | None = None, quiet: bool = False) -> None:
        """Answer the client that no connection is made, tell the observer, close."""
        self.verdict = verdict
        if self.attempt.via != via:
            self.attempt = Attempt(self.attempt.host, self.attempt.port, via)
        status, socks_code = _FAILURES.get(verdict.rule, (403, socks5.NOT_ALLOWED))
        if not quiet:
            if via == "socks5":
                self.client.write(socks5.reply(code if code is not None else socks_code))
            elif status == 403:
                self.client.write(answer(403, f"smith-fast egress: refused {_shown(self.attempt.host, self.attempt.port)} "
                                              f"({verdict.reason})"))
            else:
                where = f" {_shown(self.attempt.host, self.attempt.port)}" if self.attempt.host else ""
                self.client.write(answer(status, f"smith-fast egress:{where} {verdict.reason}"))
        if self.attempt.host:
            self.served.observer.refused(self.attempt, verdict)
        self.phase = ANSWERED
        self.client.close()
