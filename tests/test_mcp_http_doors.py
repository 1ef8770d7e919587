"""The doors of ``serve --mcp-http`` (PROTOCOL.md, "MCP"): each reported reproduction,
against a real server process over real sockets.

Each test sends what the attacker sent, checks that the service refused what it must (and ran
nothing), that it stays up, that a legitimate client is still served, and, where the attack was
about memory, that the server's RSS stays within a bound.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from harness.server import SmithProcess, assert_clean_log, wait_until
from smith_fast.mcp import protocol

TOKEN = "s3cret-door"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": protocol.LATEST, "capabilities": {}, "clientInfo": {"name": "doors", "version": "0"}}}


# ---- helpers -----------------------------------------------------------------------------------


def serve(tmp: pathlib.Path, *extra: str, token: str | None = None) -> SmithProcess:
    env = {"SMITH_TOKEN": token} if token else {}
    return SmithProcess(tmp, "serve", "--root", str(tmp), "--mcp-http", "127.0.0.1:0", *extra, env=env).start()


def address(proc: SmithProcess) -> tuple[str, int]:
    for record in proc.logs:
        text = str(record.get("address", ""))
        if record.get("event") == "listening" and text.endswith("/mcp"):
            parts = urlsplit(text)
            assert parts.hostname is not None and parts.port is not None
            return parts.hostname, parts.port
    raise AssertionError(f"no MCP listener in the log: {proc.raw_stderr[-20:]}")


def rss_kb(proc: SmithProcess, field: str = "VmRSS") -> int:
    status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":")))


def request(message: dict[str, Any], *, session: str | None = None, host: str = "127.0.0.1", token: str | None = None,
            extra: str = "") -> bytes:
    body = json.dumps(message).encode()
    head = (f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n{extra}")
    if session:
        head += f"Mcp-Session-Id: {session}\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    return head.encode() + b"\r\n" + body


def exchange(addr: tuple[str, int], data: bytes, timeout: float = 20, *, half_close: bool = False) -> bytes:
    """Send ``data`` (then end the sending side, with ``half_close``), read until the server
    closes (or ``timeout``); what came back."""
    with socket.create_connection(addr, timeout=timeout) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # refused and closed before it all went: the answer is still there to read
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
        return b"".join(chunks)


def status_of(answer: bytes) -> int:
    line = answer.split(b"\r\n", 1)[0]
    assert line.startswith(b"HTTP/1.1 "), answer[:200]
    return int(line.split()[1])


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def read_response(sock: socket.socket, pending: bytearray) -> Response:
    """One Content-Length response off ``sock`` (``pending``: bytes read past the last one)."""
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed after {bytes(pending[:200])!r}")
        pending += chunk
    end = pending.index(b"\r\n\r\n")
    lines = bytes(pending[:end]).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    del pending[: end + 4]
    while len(pending) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed in a body")
        pending += chunk
    body = bytes(pending[:length])
    del pending[:length]
    return Response(int(lines[0].split()[1]), headers, body)


def legit(addr: tuple[str, int], token: str | None = None, host: str | None = None) -> None:
    """A well-behaved client: initialize, then a tool call, answered correctly."""
    conn = http.client.HTTPConnection(*addr, timeout=30)
    try:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if host:
            headers["Host"] = host
        conn.request("POST", "/mcp", json.dumps(INIT), headers)
        answer = conn.getresponse()
        assert answer.status == 200, (answer.status, answer.read())
        assert json.loads(answer.read())["result"]["serverInfo"]["name"] == "smith-fast"
        session = answer.getheader("Mcp-Session-Id")
        assert session
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fs.list", "arguments": {}}}
        conn.request("POST", "/mcp", json.dumps(call), {**headers, "Mcp-Session-Id": session})
        answer = conn.getresponse()
        assert answer.status == 200
        assert json.loads(answer.read())["result"]["isError"] is False
    finally:
        conn.close()


def alive(proc: SmithProcess) -> None:
    assert proc.proc is not None and proc.proc.poll() is None, proc.raw_stderr[-20:]


# ---- DNS rebinding ------------------------------------------------------------------------------


def test_dns_rebinding_is_refused_and_runs_nothing(tmp_path: pathlib.Path) -> None:
    """A page of a name rebound to 127.0.0.1 sends its own name as Host and Origin: refused (no
    session, no command), whether it gives Origin or not; a loopback Host is still served."""
    marker = tmp_path / "pwned"
    proc = serve(tmp_path)
    try:
        addr = address(proc)
        rebound = f"rebind.attacker.example:{addr[1]}"
        origin = f"Origin: http://{rebound}\r\n"
        for extra in (origin, ""):
            answer = exchange(addr, request(INIT, host=rebound, extra=extra))
            assert status_of(answer) in (403, 421), answer[:300]
            assert b"mcp-session-id" not in answer.lower()
        # what the reproduction ran after the 200: the shell tool, with a session id it could not get
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "shell", "arguments": {"command": f"touch {marker}"}}}
        for extra in (origin, ""):
            assert status_of(exchange(addr, request(call, host=rebound, session="guess", extra=extra))) in (403, 421)
        # a foreign Origin with a loopback Host, and an Origin naming loopback itself: not listed, refused
        for page in ("http://rebind.attacker.example", f"http://127.0.0.1:{addr[1]}", "null"):
            assert status_of(exchange(addr, request(INIT, extra=f"Origin: {page}\r\n"))) == 403
        # Host forms that name nothing of ours, or nothing at all
        for host in ("127.0.0.1.attacker.example", "localhost.attacker.example", "0x7f.1", "[::1", "a b", ""):
            assert status_of(exchange(addr, request(INIT, host=host))) in (400, 421), host
        assert not marker.exists()
        alive(proc)
        legit(addr)
        legit(addr, host=f"localhost:{addr[1]}")
        legit(addr, host=f"[::ffff:127.0.0.1]:{addr[1]}")
        assert_clean_log(proc)
    finally:
        proc.stop()


async def test_allow_lists_admit_what_the_operator_listed(tmp_path: pathlib.Path) -> None:
    """--mcp-allow-host and --mcp-allow-origin let a named host and a listed page in; an origin
    on the list does not make a rebound Host acceptable, and the SDK client is served."""
    proc = serve(tmp_path, "--mcp-allow-host", "box.example", "--mcp-allow-origin", "http://app.example:3000")
    try:
        addr = address(proc)
        listed = "Origin: http://app.example:3000\r\n"
        ok = exchange(addr, request(INIT, host=f"box.example:{addr[1]}", extra=listed + "Connection: close\r\n"))
        assert status_of(ok) == 200 and b"mcp-session-id" in ok.lower()
        assert status_of(exchange(addr, request(INIT, host=f"rebind.attacker.example:{addr[1]}", extra=listed))) == 421
        assert status_of(exchange(addr, request(INIT, host=f"box.example:{addr[1]}", extra="Origin: http://app.example:3001\r\n"))) == 403
        async with Client(f"http://127.0.0.1:{addr[1]}/mcp") as client:
            assert not (await client.call_tool("fs.list", {})).is_error
        alive(proc)
    finally:
        proc.stop()


# ---- the token before the body --------------------------------------------------------------------


def test_unauthenticated_bodies_are_never_buffered(tmp_path: pathlib.Path) -> None:
    """With a token, 20 connections that never authenticate each send a 15 MiB body (all but its
    last byte, so a server buffering bodies would hold them all): each is answered 401 on its
    headers, and the server's peak RSS grows by far less than the 300 MB they carried."""
    proc = serve(tmp_path, token=TOKEN)
    try:
        addr = address(proc)
        base = rss_kb(proc)
        size = 15 << 20
        head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\n\r\n").encode()
        answers: list[bytes] = []
        sockets: list[socket.socket] = []

        def attack() -> None:
            sock = socket.create_connection(addr, timeout=15)
            sockets.append(sock)
            block = b" " * (1 << 20)
            sock.sendall(head)
            sock.settimeout(5)
            try:
                answers.append(sock.recv(65536))
            except OSError as exc:
                answers.append(repr(exc).encode())
            try:  # and the body anyway, as an attacker would
                for _ in range(14):
                    sock.sendall(block)
                sock.sendall(block[:-1])
            except OSError:
                pass

        threads = [threading.Thread(target=attack) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        grown = rss_kb(proc, "VmHWM") - base
        for sock in sockets:
            sock.close()
        assert grown < 60 * 1024, f"peak RSS grew by {grown} kB"
        assert all(status_of(a) == 401 for a in answers), [a[:80] for a in answers]
        alive(proc)
        legit(addr, token=TOKEN)
    finally:
        proc.stop()


# ---- a client that never reads ----------------------------------------------------------------------


def test_pipelining_non_reader_is_held_to_the_session_buffer(tmp_path: pathlib.Path) -> None:
    """300 pipelined fs.read calls of a 1 MB file by a client that does not read: the server reads
    and runs only what fits (RSS stays bounded where it held every answer before); another client
    is served meanwhile; once the client reads, every answer arrives, none lost."""
    (tmp_path / "big.bin").write_bytes(b"x" * 1_000_000)
    proc = serve(tmp_path, "--max-session-buffer", "8M")
    try:
        addr = address(proc)
        first = socket.create_connection(addr, timeout=20)
        pending = bytearray()
        first.sendall(request(INIT))
        session = read_response(first, pending).headers["mcp-session-id"]
        base = rss_kb(proc)
        calls = 300
        data = b"".join(
            request({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": {"name": "fs.read", "arguments": {"path": "big.bin"}}},
                    session=session)
            for i in range(calls))
        sender = threading.Thread(target=lambda: first.sendall(data), daemon=True)
        sender.start()
        time.sleep(3)  # not reading: a server that answered each would hold 300 MB by now
        grown = rss_kb(proc) - base
        assert grown < 100 * 1024, f"RSS grew by {grown} kB while the client did not read"
        legit(addr)  # another session is served meanwhile
        # the same session from another connection: served too (within the session's budget)
        with socket.create_connection(addr, timeout=30) as other:
            other.sendall(request({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session=session))
            assert read_response(other, bytearray()).json()["result"] == {}
        ids = []
        for _ in range(calls):
            answer = read_response(first, pending).json()
            assert answer["result"]["isError"] is False
            ids.append(answer["id"])
        assert ids == [10 + i for i in range(calls)]
        sender.join(20)
        first.close()
        alive(proc)
    finally:
        proc.stop()


# ---- silent connections --------------------------------------------------------------------------------


async def test_silent_connections_are_closed_after_the_handshake_timeout(tmp_path: pathlib.Path) -> None:
    """Silent TCP connections to the MCP port fill the shared --max-connections slots; they are
    closed after --handshake-timeout (not --idle-timeout), so an authenticated Unix-socket client
    and an MCP client get in again."""
    from smith_fast.client import Client as SmithClient

    root = tmp_path / "root"  # not where its socket is: the service refuses a root that holds it
    root.mkdir()
    proc = SmithProcess(tmp_path, "serve", "--root", str(root), "--unix", str(tmp_path / "smith.sock"),
                        "--mcp-http", "127.0.0.1:0", "--max-connections", "16", "--handshake-timeout", "1",
                        env={"SMITH_TOKEN": TOKEN}).start()
    silent: list[socket.socket] = []
    try:
        addr = address(proc)
        for _ in range(16):
            silent.append(socket.create_connection(addr, timeout=20))
        assert wait_until(lambda: all(s.recv(1) == b"" for s in silent), 30), "silent connections were not closed"

        async def unix_client_served() -> bool:
            try:
                async with await SmithClient.connect(proc.unix, token=TOKEN) as client:
                    await client.handshake()
                    return (await client.tool("fs.list", {})).value is not None
            except Exception:
                return False

        served = False
        for _ in range(100):
            if served := await unix_client_served():
                break
            await anyio.sleep(0.2)
        assert served, "the Unix-socket client was locked out"
        await anyio.to_thread.run_sync(lambda: legit(addr, token=TOKEN))
        alive(proc)
    finally:
        for sock in silent:
            sock.close()
        proc.stop()


def test_slow_and_refused_connections_do_not_stay(tmp_path: pathlib.Path) -> None:
    """Half a head, or a refused (401) request with no body followed by silence: closed by
    --handshake-timeout; an authenticated keep-alive connection stays for --idle-timeout."""
    proc = serve(tmp_path, "--handshake-timeout", "1", token=TOKEN)
    try:
        addr = address(proc)
        half = socket.create_connection(addr, timeout=20)
        half.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        refused = socket.create_connection(addr, timeout=20)
        refused.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        good = socket.create_connection(addr, timeout=20)
        pending = bytearray()
        good.sendall(request(INIT, token=TOKEN))
        session = read_response(good, pending).headers["mcp-session-id"]
        assert b" 408 " in half.recv(65536).split(b"\r\n")[0] and half.recv(1) == b""
        first = refused.recv(65536)
        assert b" 401 " in first.split(b"\r\n")[0]
        assert wait_until(lambda: refused.recv(1) == b"", 10)
        time.sleep(1.5)  # past the handshake timeout: the admitted connection is not closed by it
        good.sendall(request({"jsonrpc": "2.0", "id": 2, "method": "ping"}, session=session, token=TOKEN))
        assert read_response(good, pending).json()["result"] == {}
        for sock in (half, refused, good):
            sock.close()
        alive(proc)
    finally:
        proc.stop()


# ---- sessions ------------------------------------------------------------------------------------


def test_session_flood_cannot_lock_out_a_client(tmp_path: pathlib.Path) -> None:
    """Without a token, 200 initializes in a burst over 25 connections (8 each) where the service
    holds 40 sessions: a connection's 9th is refused (429), the idle sessions are recycled, and a
    legitimate client still gets a session and runs a call."""
    proc = serve(tmp_path, "--max-connections", "40")
    try:
        addr = address(proc)
        statuses: list[int] = []
        for _ in range(25):
            with socket.create_connection(addr, timeout=20) as sock:
                pending = bytearray()
                for _ in range(8):
                    sock.sendall(request(INIT))
                    statuses.append(read_response(sock, pending).status)
                sock.sendall(request(INIT))
                ninth = read_response(sock, pending)
                assert ninth.status == 429 and ninth.headers.get("connection") == "close"
        assert statuses == [200] * 200
        legit(addr)
        async_ok = anyio.run(_sdk_call, addr)
        assert async_ok
        alive(proc)
    finally:
        proc.stop()


async def _sdk_call(addr: tuple[str, int]) -> bool:
    async with Client(f"http://{addr[0]}:{addr[1]}/mcp") as client:
        return not (await client.call_tool("fs.list", {})).is_error


def test_unauthenticated_peer_makes_no_session(tmp_path: pathlib.Path) -> None:
    """With a token, 200 initializes without it make no session (each 401): the cap stays free."""
    proc = serve(tmp_path, "--max-connections", "40", token=TOKEN)
    try:
        addr = address(proc)
        for _ in range(200):
            assert status_of(exchange(addr, request(INIT))) == 401
        legit(addr, token=TOKEN)
        alive(proc)
    finally:
        proc.stop()


# ---- the parser ------------------------------------------------------------------------------------


def _head(*lines: str, body: bytes = b"{}", version: str = "HTTP/1.1") -> bytes:
    return (f"POST /mcp {version}\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n").encode("utf-8") + body


_AMBIGUOUS: dict[str, bytes] = {
    # b"\xb2" is "²" in latin-1, the charset of header bytes: str.isdigit() is true for it
    "superscript-two": b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \xb2\r\n\r\n{}",
    "superscript-two-utf8": _head("Host: 127.0.0.1", "Content-Length: ²"),
    "5000-digits": _head("Host: 127.0.0.1", "Content-Length: " + "9" * 5000),
    "list": _head("Host: 127.0.0.1", "Content-Length: 5, 999", body=b"{}   "),
    "same-twice": _head("Host: 127.0.0.1", "Content-Length: 2", "Content-Length: 2"),
    "differ": _head("Host: 127.0.0.1", "Content-Length: 2", "Content-Length: 3"),
    "cl-and-te": _head("Host: 127.0.0.1", "Content-Length: 2", "Transfer-Encoding: chunked"),
    "te-and-cl": _head("Host: 127.0.0.1", "Transfer-Encoding: chunked", "Content-Length: 2"),
    "te-list": _head("Host: 127.0.0.1", "Transfer-Encoding: gzip, chunked", body=b"0\r\n\r\n"),
    "te-twice": _head("Host: 127.0.0.1", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked", body=b"0\r\n\r\n"),
    "te-unknown": _head("Host: 127.0.0.1", "Transfer-Encoding: xchunked", body=b"0\r\n\r\n"),
    "te-http10": _head("Host: 127.0.0.1", "Transfer-Encoding: chunked", body=b"0\r\n\r\n", version="HTTP/1.0"),
    "plus": _head("Host: 127.0.0.1", "Content-Length: +2"),
    "minus": _head("Host: 127.0.0.1", "Content-Length: -2"),
    "hex": _head("Host: 127.0.0.1", "Content-Length: 0x2"),
    "spaced": _head("Host: 127.0.0.1", "Content-Length: 2 2"),
    "empty": _head("Host: 127.0.0.1", "Content-Length: "),
    "arabic-digit": _head("Host: 127.0.0.1", "Content-Length: ٢"),
    "space-before-colon": _head("Host: 127.0.0.1", "Content-Length : 2"),
    "folded": _head("Host: 127.0.0.1", "Content-Length:", " 2"),
    "nul": _head("Host: 127.0.0.1", "Content-Length: 2\x00"),
    "vertical-tab": _head("Host: 127.0.0.1", "Content-Length: \x0b2"),
    "bare-lf": b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\nContent-Length: 2\r\n\r\n{}",
    "bare-cr": b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\rContent-Length: 2\r\n\r\n{}",
    "no-host": _head("Content-Length: 2"),
    "two-hosts": _head("Host: 127.0.0.1", "Host: rebind.attacker.example", "Content-Length: 2"),
    "name-non-ascii": _head("Host: 127.0.0.1", "Cöntent-Length: 2", "Content-Length: 2"),
    "request-line-spaces": b"POST  /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}",
    "target-non-ascii": "POST /mcpé HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}".encode(),
}


@pytest.fixture(scope="module")
def parser_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmithProcess]:
    tmp = tmp_path_factory.mktemp("parser")
    proc = serve(tmp)
    yield proc
    proc.stop()


@pytest.mark.parametrize("name", list(_AMBIGUOUS))
def test_malformed_or_ambiguous_lengths_get_400(parser_server: SmithProcess, name: str) -> None:
    """Every malformed or ambiguous Content-Length / Transfer-Encoding / header line: 400 and the
    connection closed, never a traceback; the service serves the next client."""
    addr = address(parser_server)
    answer = exchange(addr, _AMBIGUOUS[name])
    assert status_of(answer) == 400, answer[:300]
    assert b"Connection: close" in answer.split(b"\r\n\r\n", 1)[0]
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    assert len(body) == length, answer  # one answer: nothing after it was read as another request
    alive(parser_server)
    legit(addr)
    assert_clean_log(parser_server)


def test_random_heads_never_break_the_service(parser_server: SmithProcess) -> None:
    """300 heads mutated at random (bytes flipped, inserted, cut): each gets an HTTP answer or a
    close, never a traceback; the service stays up and serves a client after them."""
    addr = address(parser_server)
    rng = random.Random(25)
    seed = bytearray(request({"jsonrpc": "2.0", "id": 1, "method": "ping"}, extra="Content-Length: 40\r\nTransfer-Encoding: chunked\r\n"))
    for _ in range(300):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.4:
                data[at] = rng.randrange(256)
            elif choice < 0.7:
                data[at:at] = bytes([rng.choice(b"\r\n:, \t\x00\xb2509")])
            else:
                del data[at]
        answer = exchange(addr, bytes(data) + b"\r\n\r\n", timeout=15, half_close=True)
        if answer:
            assert answer.startswith(b"HTTP/1.1 "), answer[:200]
            assert status_of(answer) != 500, answer[:300]
    alive(parser_server)
    legit(addr)
    assert_clean_log(parser_server)
    assert not any("Traceback" in line for line in parser_server.raw_stderr)


async def test_sdk_client_still_works_with_a_token(tmp_path: pathlib.Path) -> None:
    """The official SDK client, bearer token in its headers, over the hardened front."""
    proc = serve(tmp_path, token=TOKEN)
    try:
        addr = address(proc)
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http_client:
            async with Client(streamable_http_client(f"http://127.0.0.1:{addr[1]}/mcp", http_client=http_client)) as client:
                result = await client.call_tool("shell", {"command": "echo door"})
                assert result.structured_content is not None and result.structured_content["stdout"] == "door\n"
        alive(proc)
    finally:
        proc.stop()
