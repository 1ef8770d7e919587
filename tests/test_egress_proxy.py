"""The egress proxy (smith_fast/egress/) against real sockets, a real local origin and real curl.

Every destination is local: a test name is mapped to 127.0.0.1 by the resolver override, and the
tests that should reach it also allow ``127.0.0.1/32`` explicitly (loopback is refused otherwise:
``test_loopback_refused_without_an_address_rule`` shows it). Each test runs on stdlib asyncio and
on uvloop (the ``run`` fixture), and checks that every connection ended with exactly one Record.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.server
import ipaddress
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
import uvloop

from smith_fast.egress import (
    Attempt,
    EgressLimits,
    EgressPolicy,
    EgressProxy,
    OverrideResolver,
    Record,
    Served,
    Verdict,
    parse_overrides,
    parse_rule,
)
from smith_fast.egress.addresses import special_kind
from smith_fast.errors import EgressRuleError

LOOP = "127.0.0.1/32"
SECRET = "s3cr3t-value-for-the-index"
CURL_ENV = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


class Recorder:
    """An Observer that keeps what it hears; ``hook`` answers before_connect."""

    def __init__(self, hook: Callable[[Attempt], Verdict | None] | None = None) -> None:
        self.refusals: list[tuple[Attempt, Verdict]] = []
        self.records: list[Record] = []
        self.hook = hook
        self.asked: list[Attempt] = []

    async def before_connect(self, attempt: Attempt) -> Verdict | None:
        self.asked.append(attempt)
        return self.hook(attempt) if self.hook is not None else None

    def refused(self, attempt: Attempt, verdict: Verdict) -> None:
        self.refusals.append((attempt, verdict))

    def closed(self, record: Record) -> None:
        self.records.append(record)


SEEN_HEADS: list[bytes] = []  # every request head an origin got, as it got it


async def origin_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A tiny origin: answers each request with its own head and body as the response body
    (``/big?N``: N bytes), then closes."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        SEEN_HEADS.append(head)
        body = b""
        lower = head.lower()
        if b"content-length:" in lower:
            length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        elif b"transfer-encoding: chunked" in lower:
            body = await reader.readuntil(b"0\r\n\r\n")
        target = head.split(b" ")[1]
        payload = b"x" * int(target.split(b"?")[1]) if target.startswith(b"/big?") else head + body
        if target == b"/keep-alive":  # a server that would keep the connection: an interim head first
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(payload), payload))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


class Env:
    """An origin, a TCP echo, and a proxy with the given rules, served on 127.0.0.1."""

    def __init__(self) -> None:
        self.observer = Recorder()
        self.served: Served | None = None
        self.servers: list[asyncio.Server] = []
        self.origin = 0
        self.echo = 0
        self.proxy = 0

    async def start(self, allow: Sequence[str], deny: Sequence[str] = (), secrets: Sequence[str] = (), *,
                    resolve: Sequence[str] = (), limits: EgressLimits | None = None,
                    environ: dict[str, str] | None = None, narrow: Sequence[str] | None = None,
                    hook: Callable[[Attempt], Verdict | None] | None = None) -> "Env":
        origin = await asyncio.start_server(origin_handler, "127.0.0.1", 0)
        echo = await asyncio.start_server(echo_handler, "127.0.0.1", 0)
        self.servers = [origin, echo]
        self.origin = origin.sockets[0].getsockname()[1]
        self.echo = echo.sockets[0].getsockname()[1]
        table = parse_overrides(list(resolve) or ["pypi.test=127.0.0.1"])
        policy = EgressPolicy.from_options(allow, deny, secrets, environ=environ or {"INDEX_TOKEN": SECRET})
        proxy = EgressProxy(policy, resolver=OverrideResolver(table), limits=limits)
        self.observer.hook = hook
        self.served = await proxy.start_tcp("127.0.0.1", 0, self.observer,
                                            policy=None if narrow is None else policy.narrowed(narrow))
        self.proxy = self.served.address[1]
        return self

    async def stop(self) -> None:
        assert self.served is not None
        self.served.close()
        await self.served.wait_closed()
        for server in self.servers:
            server.close()
            await server.wait_closed()

    async def curl(self, url: str, *args: str, scheme: str = "http") -> tuple[int, bytes, bytes]:
        """curl through the proxy (``scheme``: http, or socks5h); returns (HTTP code, body, stderr)."""
        process = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--max-time", "10", "--proxy", f"{scheme}://127.0.0.1:{self.proxy}", "-o", "-",
            "-w", "\n%{http_code} %{http_connect}", *args, url, env=CURL_ENV,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        body, _, codes = out.rpartition(b"\n")
        code, connect = map(int, codes.split())
        # a refused CONNECT: curl gives the proxy's status as http_connect (the origin's is 000)
        return (code or (connect if connect >= 300 else 0)), body, err

    async def settled(self, connections: int) -> list[Record]:
        """The Records once ``connections`` connections ended: exactly one each, never more."""
        for _ in range(200):
            if len(self.observer.records) >= connections and self.served is not None and not self.served.connections:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)
        assert len(self.observer.records) == connections, self.observer.records
        return self.observer.records


def with_env(run: Callable[[Awaitable[Any]], Any], body: Callable[[Env], Awaitable[None]]) -> None:
    async def main() -> None:
        env = Env()
        try:
            await body(env)
        finally:
            if env.served is not None:
                await env.stop()
    run(main())


MODES = [("forward", "http", ()), ("connect", "http", ("--proxytunnel",)), ("socks5", "socks5h", ())]


# ---- reaching an allowed host, and the Record ---------------------------------------------------------


@pytest.mark.parametrize("via,scheme,extra", MODES, ids=[m[0] for m in MODES])
def test_allowed_host_through_each_protocol(run: Any, via: str, scheme: str, extra: tuple[str, ...]) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        code, text, err = await env.curl(f"http://pypi.test:{env.origin}/simple/", *extra, scheme=scheme)
        assert code == 200, err
        assert text.startswith(b"GET /simple/ HTTP/1.1\r\n")
        assert f"host: pypi.test:{env.origin}".encode() in text.lower()
        [record] = await env.settled(1)
        assert record.attempt == Attempt("pypi.test", env.origin, "connect" if via == "connect" else
                                         "http" if via == "forward" else "socks5")
        assert record.address == "127.0.0.1" and record.verdict.allowed and record.verdict.rule == "pypi.test"
        assert record.bytes_down > len(text) and record.bytes_up > 40
        assert env.observer.refusals == []
    with_env(run, body)


def test_denied_host_gets_a_clear_403_and_socks5_code_2(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        code, text, _ = await env.curl(f"http://evil.test:{env.origin}/")
        assert code == 403
        assert text == f"smith-fast egress: refused evil.test:{env.origin} (not in --egress-allow)\n".encode()
        code, text, _ = await env.curl(f"http://evil.test:{env.origin}/", "--proxytunnel")
        assert code == 403
        code, _, err = await env.curl(f"http://evil.test:{env.origin}/", scheme="socks5h")
        assert code == 0 and b"(2)" in err  # curl: "Can't complete SOCKS5 connection ... (2)": not allowed by ruleset
        assert [(a.host, a.via, v.rule) for a, v in env.observer.refusals] == [
            ("evil.test", "http", "not-allowed"), ("evil.test", "connect", "not-allowed"), ("evil.test", "socks5", "not-allowed")]
        records = await env.settled(3)
        assert all(r.address is None and not r.verdict.allowed and r.bytes_down == 0 for r in records)
        assert env.observer.asked == [a for a, _ in env.observer.refusals]  # the hook was asked, said nothing
    with_env(run, body)


def test_deny_wins_over_allow_and_is_never_resolved(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["*.corp.test", LOOP], ["bad.corp.test"],
                        resolve=["good.corp.test=127.0.0.1", "bad.corp.test=127.0.0.1"],
                        hook=lambda attempt: Verdict(True, "hook:open", "the hook allows all"))
        assert (await env.curl(f"http://good.corp.test:{env.origin}/"))[0] == 200
        code, text, _ = await env.curl(f"http://bad.corp.test:{env.origin}/")
        assert code == 403 and b"denied by --egress-deny bad.corp.test" in text
        assert [a.host for a in env.observer.asked] == ["good.corp.test"]  # a denied name never reaches the hook
        await env.settled(2)
    with_env(run, body)


def test_wildcard_matches_subdomains_not_the_apex(run: Any) -> None:
    async def body(env: Env) -> None:
        names = ["a.corp.test", "a.b.corp.test", "corp.test", "xcorp.test", "corp.test.evil"]
        await env.start(["*.corp.test", LOOP], resolve=[f"{n}=127.0.0.1" for n in names])
        codes = [(await env.curl(f"http://{n}:{env.origin}/"))[0] for n in names]
        assert codes == [200, 200, 403, 403, 403]
        await env.settled(len(names))
    with_env(run, body)


def test_port_rule_allows_its_port_only(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start([])
        await env.stop()
        live = await asyncio.start_server(origin_handler, "127.0.0.1", 0)
        other = await asyncio.start_server(origin_handler, "127.0.0.1", 0)
        try:
            allowed_port = live.sockets[0].getsockname()[1]
            other_port = other.sockets[0].getsockname()[1]
            env.observer = Recorder()
            await env.start([f"pypi.test:{allowed_port}", f"127.0.0.1/32:{allowed_port}"])
            assert (await env.curl(f"http://pypi.test:{allowed_port}/"))[0] == 200
            code, text, _ = await env.curl(f"http://pypi.test:{other_port}/")
            assert code == 403 and b"not in --egress-allow" in text
            await env.settled(2)
        finally:
            for server in (live, other):
                server.close()
                await server.wait_closed()
    with_env(run, body)


# ---- addresses ------------------------------------------------------------------------------------------


def test_direct_ip_needs_an_address_rule(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["*"])  # every name: still no IP literal
        code, text, _ = await env.curl(f"http://127.0.0.1:{env.origin}/")
        assert code == 403 and f"refused 127.0.0.1:{env.origin} (not in --egress-allow)".encode() in text
        code, _, err = await env.curl(f"http://[::1]:{env.origin}/", scheme="socks5h")
        assert code == 0 and b"(2)" in err
        await env.settled(2)
    with_env(run, body)


def test_direct_ip_with_an_address_rule(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start([LOOP])
        assert (await env.curl(f"http://127.0.0.1:{env.origin}/"))[0] == 200
        assert (await env.curl(f"http://127.0.0.1:{env.origin}/", scheme="socks5h"))[0] == 200
        await env.settled(2)
    with_env(run, body)


def test_cloud_metadata_refused_by_name_and_by_ip(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["*", "169.254.0.0/17"], resolve=["metadata.test=169.254.169.254", "mapped.test=::ffff:169.254.169.254"])
        for url in ("http://metadata.test/latest/meta-data/", "http://mapped.test/"):
            code, text, _ = await env.curl(url)
            assert code == 403 and b"169.254.169.254, a link-local (cloud metadata) address" in text, text
        code, text, _ = await env.curl("http://169.254.169.254/latest/meta-data/")
        assert code == 403 and b"not in --egress-allow" in text
        assert {v.rule for _, v in env.observer.refusals} == {"private-address", "not-allowed"}
        await env.settled(3)
    with_env(run, body)


def test_loopback_refused_without_an_address_rule(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test"])
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/", "--proxytunnel")
        assert code == 403
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/")
        assert text == (f"smith-fast egress: refused pypi.test:{env.origin} (pypi.test resolves to 127.0.0.1, a loopback "
                        "address (only an --egress-allow address rule such as 127.0.0.1/32 opens it))\n").encode()
        await env.settled(2)
    with_env(run, body)


@pytest.mark.parametrize("address", ["::ffff:127.0.0.1", "::ffff:10.1.2.3", "10.1.2.3", "172.16.5.4", "192.168.1.1",
                                     "100.64.0.1", "0.0.0.0", "::", "fd00::1", "fe80::1", "224.0.0.1", "ff02::1",
                                     "64:ff9b::7f00:1", "2002:7f00:1::1", "255.255.255.255"])
def test_private_ranges_refused_by_name(run: Any, address: str) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test"], resolve=[f"pypi.test={address}"])
        code, text, _ = await env.curl("http://pypi.test/")
        assert code == 403 and b"only an --egress-allow address rule" in text, text
        assert env.observer.refusals[0][1].rule == "private-address"
        await env.settled(1)
    with_env(run, body)


def test_a_name_with_one_private_address_is_refused_whole(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP], resolve=["pypi.test=127.0.0.1,10.0.0.7"])
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/")
        assert code == 403 and b"pypi.test resolves to 10.0.0.7, a private address" in text
        await env.settled(1)
    with_env(run, body)


def test_host_own_addresses_are_refused() -> None:
    own = frozenset({ipaddress.ip_address("203.0.113.9")})
    policy = EgressPolicy.from_options(["host.test"], [], []).with_own(own)
    verdict = policy.check_addresses(Attempt("host.test", 22, "connect"), [ipaddress.ip_address("203.0.113.9")])
    assert verdict is not None and "203.0.113.9, an address of this host" in verdict.reason
    assert special_kind(ipaddress.ip_address("93.184.216.34")) is None
    assert EgressProxy(EgressPolicy.from_options([], [], [])).policy.own  # read from /proc at start


# ---- decisions beyond the rules -------------------------------------------------------------------------


def test_hook_may_refuse_or_allow_but_not_open_private_addresses(run: Any) -> None:
    def hook(attempt: Attempt) -> Verdict | None:
        if attempt.host == "blocked.test":
            return Verdict(False, "hook:policy", "blocked by the session's hook")
        if attempt.host in ("unlisted.test", "inner.test"):
            return Verdict(True, "hook:policy", "the hook allows it")
        return None

    async def body(env: Env) -> None:
        await env.start(["blocked.test", "pypi.test", LOOP], hook=hook,
                        resolve=["blocked.test=127.0.0.1", "unlisted.test=127.0.0.1", "inner.test=10.9.9.9",
                                 "pypi.test=127.0.0.1"])
        code, text, _ = await env.curl(f"http://blocked.test:{env.origin}/")
        assert code == 403 and b"(blocked by the session's hook)" in text
        assert (await env.curl(f"http://unlisted.test:{env.origin}/"))[0] == 200
        code, text, _ = await env.curl(f"http://inner.test:{env.origin}/")
        assert code == 403 and b"a private address" in text
        records = await env.settled(3)
        assert [r.verdict.rule for r in records] == ["hook:policy", "hook:policy", "private-address"]
    with_env(run, body)


def test_a_session_narrows_never_widens(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", "other.test", LOOP], narrow=["pypi.test", "wider.test", LOOP],
                        resolve=["pypi.test=127.0.0.1", "other.test=127.0.0.1", "wider.test=127.0.0.1"])
        assert (await env.curl(f"http://pypi.test:{env.origin}/"))[0] == 200
        code, text, _ = await env.curl(f"http://other.test:{env.origin}/")
        assert code == 403 and b"not in the session's egress allow-list" in text
        code, text, _ = await env.curl(f"http://wider.test:{env.origin}/")
        assert code == 403 and b"not in --egress-allow" in text
        await env.settled(3)
    with_env(run, body)


def test_host_header_cannot_steer_to_another_site(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/", "-H", "Host: evil.test",
                                       "-H", "Proxy-Authorization: Basic eDp5")
        assert code == 200
        lower = text.lower()
        assert f"host: pypi.test:{env.origin}".encode() in lower and b"evil.test" not in lower
        assert b"proxy-authorization" not in lower and b"connection: close" in lower
        await env.settled(1)
    with_env(run, body)


def test_request_bodies_are_forwarded(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/upload", "--data-binary", "a=1&b=2")
        assert code == 200 and text.endswith(b"\r\n\r\na=1&b=2")
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/upload", "-H", "Transfer-Encoding: chunked",
                                       "--data-binary", "chunky")
        assert code == 200 and text.endswith(b"\r\n\r\n6\r\nchunky\r\n0\r\n\r\n")
        await env.settled(2)
    with_env(run, body)


# ---- secrets --------------------------------------------------------------------------------------------


def test_secret_substituted_for_its_host_only(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", "other.test", LOOP], secrets=["INDEX_TOKEN@pypi.test=INDEX_TOKEN"],
                        resolve=["pypi.test=127.0.0.1", "other.test=127.0.0.1"])
        assert env.served is not None
        placeholder = env.served.policy.placeholders()["INDEX_TOKEN"]
        assert placeholder.startswith("smith-egress-secret-") and len(placeholder) == len("smith-egress-secret-") + 24
        assert SECRET not in placeholder
        header = ("-H", f"Authorization: Bearer {placeholder}")
        # the host gets the value; echoed back, it reaches the client as the placeholder again
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/simple/", *header)
        assert f"Bearer {SECRET}".encode() in SEEN_HEADS[-1] and b"Accept-Encoding: identity" in SEEN_HEADS[-1]
        assert code == 200 and f"Bearer {placeholder}".encode() in text and SECRET.encode() not in text
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/simple/", "-u", f"user:{placeholder}")
        assert base64.b64encode(f"user:{SECRET}".encode()) in SEEN_HEADS[-1]
        # echoed back, the Basic token is the client's own again (the value in base64 would be the value)
        assert base64.b64encode(f"user:{placeholder}".encode()) in text and base64.b64encode(f"user:{SECRET}".encode()) not in text
        for url, extra in ((f"http://other.test:{env.origin}/", ()), (f"http://pypi.test:{env.origin}/", ("--proxytunnel",))):
            code, text, _ = await env.curl(url, *header, *extra)
            # another host, or HTTPS-like CONNECT (opaque): the placeholder goes through unchanged
            assert code == 200 and placeholder.encode() in text and SECRET.encode() not in text
        await env.settled(4)
    with_env(run, body)


def test_redact_and_secret_options() -> None:
    policy = EgressPolicy.from_options(["pypi.test"], [], ["TOKEN@pypi.test=INDEX_TOKEN"], environ={"INDEX_TOKEN": SECRET})
    assert policy.redact(f"token={SECRET}; again {SECRET}") == "token=[secret TOKEN]; again [secret TOKEN]"
    assert policy.redact_bytes(SECRET.encode()) == b"[secret TOKEN]"
    assert SECRET not in repr(policy)
    assert policy.narrowed(["pypi.test"]).placeholders() == policy.placeholders()
    with pytest.raises(EgressRuleError, match="environment has no MISSING"):
        EgressPolicy.from_options([], [], ["TOKEN@pypi.test=MISSING"], environ={})
    with pytest.raises(ValueError, match="NAME@HOST=ENV"):
        EgressPolicy.from_options([], [], ["TOKEN=pypi.test"], environ={})
    with pytest.raises(ValueError, match="line break"):
        EgressPolicy.from_options([], [], ["T@pypi.test=E"], environ={"E": "a\r\nX-Injected: 1"})


@pytest.mark.parametrize("pattern,message", [
    ("10.0.0.1/8", "host bits set"), ("a..b", "no host name"), ("x:99999", "port"), ("[::1", "[ADDRESS]:PORT"),
    ("fe80::1%eth0", "[ADDRESS]:PORT"), ("", "empty"), ("ex ample.com", "no host name")])
def test_bad_patterns_are_clear_errors(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_rule(pattern)


def test_pattern_forms() -> None:
    forms = {r.text: (r.kind, r.host, str(r.network) if r.network else None, r.port) for r in map(parse_rule, [
        "PyPI.org.", "*.example.com:443", "*", "10.0.0.0/8", "10.0.0.0/8:22", "::1", "[::1]:8080", "fd00::/8"])}
    assert forms == {
        "PyPI.org.": ("name", "pypi.org", None, None), "*.example.com:443": ("subdomains", "example.com", None, 443),
        "*": ("any-name", "", None, None), "10.0.0.0/8": ("address", "", "10.0.0.0/8", None),
        "10.0.0.0/8:22": ("address", "", "10.0.0.0/8", 22), "::1": ("address", "", "::1/128", None),
        "[::1]:8080": ("address", "", "::1/128", 8080), "fd00::/8": ("address", "", "fd00::/8", None)}


# ---- hostile clients ------------------------------------------------------------------------------------


async def raw(port: int, data: bytes, read: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 5) if read else b""
    finally:
        writer.close()


def test_header_bomb_is_431_and_others_are_served(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        bomb = b"GET http://pypi.test/ HTTP/1.1\r\n" + b"X-Bomb: " + b"a" * 70_000 + b"\r\n\r\n"
        answer = await raw(env.proxy, bomb)
        assert answer.startswith(b"HTTP/1.1 431 ")
        garbage = await raw(env.proxy, b"\x16\x03\x01 not a proxy request\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 ")
        origin_form = await raw(env.proxy, b"GET / HTTP/1.1\r\nHost: pypi.test\r\n\r\n")
        assert origin_form.startswith(b"HTTP/1.1 400 ") and b"absolute http:// URL" in origin_form
        assert (await env.curl(f"http://pypi.test:{env.origin}/"))[0] == 200
        records = await env.settled(4)
        assert [r.verdict.rule for r in records[:3]] == ["head-too-large", "bad-request", "bad-request"]
    with_env(run, body)


def test_stalled_clients_do_not_hold_up_others_and_are_closed(run: Any) -> None:
    async def body(env: Env) -> None:
        limits = EgressLimits(handshake_timeout=0.5, idle_timeout=0.5)
        await env.start(["pypi.test", LOOP], limits=limits)
        # a tunnel that stalls after CONNECT, and a client that never finishes its head
        reader, writer = await asyncio.open_connection("127.0.0.1", env.proxy)
        writer.write(f"CONNECT pypi.test:{env.echo} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", env.proxy)
        slow_writer.write(b"GET http://pypi.test/ HTTP/1.1\r\nX-Slow: ")
        results = await asyncio.gather(*(env.curl(f"http://pypi.test:{env.origin}/big?100000") for _ in range(5)))
        assert all(code == 200 and len(text) == 100000 for code, text, _ in results)
        assert await asyncio.wait_for(reader.read(), 3) == b""  # the idle tunnel was closed
        assert await asyncio.wait_for(slow_reader.read(), 3) == b""  # so was the head that never ended
        writer.close()
        slow_writer.close()
        records = await env.settled(7)
        assert sorted(r.verdict.rule for r in records) == ["bad-request"] + ["pypi.test"] * 6
    with_env(run, body)


def test_many_connections_and_the_connection_limit(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP], limits=EgressLimits(max_connections=40))

        async def tunnel(i: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.proxy)
            # SOCKS5: greeting, then CONNECT pypi.test:echo by name (socks5h), optimistic
            name = b"pypi.test"
            writer.write(b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + env.echo.to_bytes(2, "big"))
            assert await reader.readexactly(2) == b"\x05\x00"
            assert (await reader.readexactly(10))[1] == 0
            writer.write(b"ping %d" % i)
            got = await reader.readexactly(len(b"ping %d" % i))
            writer.close()
            return got

        for round in range(3):
            answers = await asyncio.gather(*(tunnel(i) for i in range(30)))
            assert answers == [b"ping %d" % i for i in range(30)]
            await env.settled(30 * (round + 1))  # the limit counts connections until they ended
        env.observer.records.clear()
        held = [await asyncio.open_connection("127.0.0.1", env.proxy) for _ in range(45)]
        await asyncio.sleep(0.2)
        assert [r.verdict.rule for r in env.observer.records] == ["limit"] * 5
        for _, writer in held:
            writer.close()
        await env.settled(45)
    with_env(run, body)


def test_socks5_refuses_other_commands_and_auth_only_clients(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        assert await raw(env.proxy, b"\x05\x01\x02") == b"\x05\xff"  # username/password only
        bind = await raw(env.proxy, b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50")
        assert bind[:2] == b"\x05\x00" and bind[3] == 7  # BIND: command not supported
        await env.settled(2)
    with_env(run, body)


# ---- the relay --------------------------------------------------------------------------------------------


def test_tunnel_carries_bytes_intact_both_ways_with_half_close(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        reader, writer = await asyncio.open_connection("127.0.0.1", env.proxy)
        writer.write(f"CONNECT pypi.test:{env.echo} HTTP/1.1\r\nHost: pypi.test:{env.echo}\r\n\r\n".encode() + b"early")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
        payload = os.urandom(3_000_000)

        async def send() -> None:
            writer.write(payload)
            await writer.drain()
            writer.write_eof()  # half-close: the echo still answers, then closes

        sent = asyncio.ensure_future(send())
        got = await asyncio.wait_for(reader.read(-1), 10)
        await sent
        writer.close()
        assert got == b"early" + payload
        [record] = await env.settled(1)
        assert record.bytes_up == record.bytes_down == len(payload) + 5
    with_env(run, body)


def test_a_reader_that_pauses_holds_its_own_tunnel_only(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        reader, writer = await asyncio.open_connection("127.0.0.1", env.proxy)
        size = 20_000_000
        writer.write(f"GET http://pypi.test:{env.origin}/big?{size} HTTP/1.1\r\n\r\n".encode())
        await reader.readexactly(1)  # the response started; now this client reads nothing for a while
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/big?1000000")
        assert code == 200 and len(text) == 1_000_000
        assert env.served is not None
        [paused] = [c for c in env.served.connections]
        held = paused.down
        await asyncio.sleep(0.2)
        assert paused.down == held < size // 2  # flow control: the proxy stopped reading the origin
        rest = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        assert rest.endswith(b"x" * 1000) and len(rest) > size
        records = await env.settled(2)
        assert sorted(r.bytes_down for r in records)[1] > size
    with_env(run, body)


# ---- real clients over plain HTTP -----------------------------------------------------------------------


@pytest.fixture
def http_tree() -> Iterator[tuple[pathlib.Path, int]]:
    """A directory under /var/tmp served by a static HTTP server (a thread): a bare git repository
    (dumb HTTP) and a simple package index with one wheel; yields (directory, port)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="smith-egress-", dir="/var/tmp"))
    env = {**CURL_ENV, "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"}
    src = root / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True, env=env)
    (src / "README").write_text("through the egress proxy\n")
    subprocess.run(["git", "-C", str(src), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(root / "repo.git")], check=True, env=env)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True, env=env)
    wheel = root / "packages" / "demo_pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo_pkg/__init__.py", "")
        z.writestr("demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        z.writestr("demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("demo_pkg-1.0.dist-info/RECORD", "")
    index = root / "simple" / "demo-pkg"
    index.mkdir(parents=True)
    (index / "index.html").write_text(f'<a href="../../packages/{wheel.name}">{wheel.name}</a>\n')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]  # quiet test output
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(root)


def test_git_and_pip_over_plain_http(http_tree: tuple[pathlib.Path, int]) -> None:
    root, port = http_tree

    async def main() -> None:
        env = await Env().start(["pypi.test", LOOP])
        proxy = f"http://127.0.0.1:{env.proxy}"
        try:
            clone = root / "clone"
            git = await asyncio.create_subprocess_exec(
                "git", "-c", f"http.proxy={proxy}", "clone", "-q", f"http://pypi.test:{port}/repo.git", str(clone),
                env={**CURL_ENV, "HOME": str(root), "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"},
                stderr=asyncio.subprocess.PIPE)
            _, err = await git.communicate()
            assert git.returncode == 0, err
            assert (clone / "README").read_text() == "through the egress proxy\n"
            pip = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                "--index-url", f"http://pypi.test:{port}/simple/", "--trusted-host", "pypi.test", "--proxy", proxy,
                "-d", str(root / "wheels"), "demo-pkg", env={**CURL_ENV, "HOME": str(root)}, stderr=asyncio.subprocess.PIPE)
            _, err = await pip.communicate()
            assert pip.returncode == 0, err
            assert (root / "wheels" / "demo_pkg-1.0-py3-none-any.whl").exists()
            git_bad = await asyncio.create_subprocess_exec(
                "git", "-c", f"http.proxy={proxy}", "ls-remote", f"http://evil.test:{port}/repo.git",
                env={**CURL_ENV, "HOME": str(root), "GIT_TERMINAL_PROMPT": "0"}, stderr=asyncio.subprocess.PIPE)
            _, err = await git_bad.communicate()
            assert git_bad.returncode != 0 and b"403" in err
            records = env.observer.records
            assert records and all(r.attempt.via == "http" for r in records)
            assert {r.attempt.host for r in records if r.verdict.allowed} == {"pypi.test"}
        finally:
            await env.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def test_a_failing_hook_refuses_and_a_failing_observer_harms_nothing(run: Any) -> None:
    def hook(attempt: Attempt) -> Verdict | None:
        raise RuntimeError("the hook broke")

    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP], hook=hook)
        code, text, _ = await env.curl(f"http://pypi.test:{env.origin}/")
        assert code == 403 and b"the beforeConnect hook failed (RuntimeError)" in text
        await env.settled(1)
        env.observer.hook = None
        env.observer.closed = lambda record: 1 / 0  # type: ignore[method-assign]  # a broken service side
        for _ in range(2):
            assert (await env.curl(f"http://pypi.test:{env.origin}/"))[0] == 200
    with_env(run, body)


def test_serve_a_unix_listener(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])  # for the origin
        path = tempfile.mktemp(prefix="smith-egress-", suffix=".sock", dir="/var/tmp")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()
        policy = EgressPolicy.from_options(["pypi.test", LOOP], [], [])
        recorder = Recorder()
        served = EgressProxy(policy, resolver=OverrideResolver({"pypi.test": ["127.0.0.1"]})).serve(listener, recorder)
        try:
            assert served.address == (path, 0)
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(f"GET http://pypi.test:{env.origin}/ HTTP/1.1\r\nHost: pypi.test\r\n\r\n".encode())
            response = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert response.startswith(b"HTTP/1.1 200 OK") and b"\r\n\r\nGET / HTTP/1.1\r\n" in response
        finally:
            served.close()
            await served.wait_closed()
            os.unlink(path)
        assert [r.verdict.rule for r in recorder.records] == ["pypi.test"]
    with_env(run, body)


def test_random_bytes_each_end_in_one_record(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP], limits=EgressLimits(handshake_timeout=0.4))
        rng = __import__("random").Random(30)
        blobs = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(40)]
        blobs += [b"\x05" + blob for blob in blobs[:20]]
        blobs += [b"\x05\x01\x00\x05\x01\x00\x03\x00\x00\x50", b"\x05\x01\x00\x05\x01\x00\x09", b"CONNECT [::1 HTTP/1.1\r\n\r\n",
                  b"CONNECT pypi.test:0 HTTP/1.1\r\n\r\n", b"GET https://pypi.test/ HTTP/1.1\r\n\r\n",
                  b"GET http://pypi.test:99999/ HTTP/1.1\r\n\r\n", b"GET http://@/ HTTP/1.1\r\n\r\n"]

        async def send(blob: bytes) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.proxy)
            writer.write(blob)
            try:
                await asyncio.wait_for(reader.read(), 3)
            except ConnectionError:
                pass
            writer.close()

        await asyncio.gather(*(send(blob) for blob in blobs))
        records = await env.settled(len(blobs))
        assert not any(r.verdict.allowed for r in records)
    with_env(run, body)


def test_forwarded_responses_say_the_connection_closes(run: Any) -> None:
    async def body(env: Env) -> None:
        await env.start(["pypi.test", LOOP])
        response = await raw(env.proxy, f"GET http://pypi.test:{env.origin}/keep-alive HTTP/1.1\r\n\r\n".encode())
        interim, _, final = response.partition(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue"
        head, _, text = final.partition(b"\r\n\r\n")
        assert head.split(b"\r\n") == [b"HTTP/1.1 200 OK", b"Content-Length: %d" % len(text), b"Connection: close"]
        assert text.startswith(b"GET /keep-alive HTTP/1.1\r\n")
        [record] = await env.settled(1)
        assert record.bytes_down == len(response)
    with_env(run, body)
