"""The one HTTP server (smith_fast/http) and the seams around the fronts: the head rules on top of
llhttp, one connection gate for every front, /metrics on the same server as /mcp, EventSink an
ABC. Real processes and sockets where a server is involved."""

from __future__ import annotations

import json
import pathlib
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.server import ServerProcess, assert_clean_log
from smith_fast.errors import HeadError, HttpRefused, SmithFastError
from smith_fast.http.head import parse_head
from smith_fast.mcp.sink import Call, McpSink
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.connections import ConnectionGate
from smith_fast.service.sinks import EventSink, V0Sink, V1Sink

from .peers import V1Peer, errors
from .test_mcp_http_doors import _AMBIGUOUS, INIT, read_response, request

# ---- the head rules, without a server ------------------------------------------------------------


def _split(data: bytes) -> bytes:
    return data.split(b"\r\n\r\n", 1)[0]


@pytest.mark.parametrize("name", list(_AMBIGUOUS))
def test_every_ambiguous_head_is_a_head_error(name: str) -> None:
    """Each head the MCP front's doors test sends is refused by parse_head itself, as 400."""
    with pytest.raises(HeadError) as info:
        parse_head(_split(_AMBIGUOUS[name]), 1 << 20)
    assert info.value.status == 400 and info.value.close


@pytest.mark.parametrize(
    "head,status",
    [
        (b"GET /mcp HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket", 400),  # llhttp stops at an upgrade
        (b"CONNECT x:80 HTTP/1.1\r\nHost: x", 400),
        (b"GET http://x/mcp HTTP/1.1\r\nHost: x", 400),  # absolute-form: llhttp takes it
        (b"GET /mcp  HTTP/1.1\r\nHost: x", 400),  # two spaces before the version
        (b"GET /mcp HTTP/2.0\r\nHost: x", 505),
        (b"GET /mcp HTTP/0.9", 505),
        (b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked", 501),
        (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615", 413),
        (b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 1025", 413),
        (b"GET /mcp HTTP/1.1\r\nHost: x\r\nOrigin: a\r\nOrigin: b", 400),
        (b"FOO /mcp HTTP/1.1\r\nHost: x", 400),  # no method llhttp knows
    ],
)
def test_what_llhttp_lets_through_is_checked_on_top(head: bytes, status: int) -> None:
    with pytest.raises(HeadError) as info:
        parse_head(head, 1024)
    assert info.value.status == status, info.value


def test_a_good_head() -> None:
    head = parse_head(b"POST /mcp?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nContent-Length:  12 \r\nX-A: 1\r\nx-a: 2\r\nAccept: \xe9", 100)
    assert (head.method, head.target, head.length, head.keep_alive) == ("POST", "/mcp?x=1", 12, True)
    assert head.headers == {"host": "127.0.0.1:9", "content-length": "12", "x-a": "1, 2", "accept": "\xe9"}
    assert not parse_head(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close", 0).keep_alive
    assert not parse_head(b"GET / HTTP/1.0", 0).keep_alive
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive", 0).keep_alive


_GOOD = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200) | st.lists(st.tuples(st.integers(0, len(_GOOD)), st.binary(max_size=3)), max_size=6))
def test_any_bytes_give_a_head_or_a_head_error(data: bytes | list[tuple[int, bytes]]) -> None:
    """Random bytes, and a good head with bytes inserted at random: a Head or a HeadError, never
    another exception (llhttp's own errors included)."""
    if isinstance(data, list):
        head = bytearray(_GOOD)
        for at, insert in data:
            head[at:at] = insert
        data = bytes(head)
    try:
        parsed = parse_head(data, 1 << 20)
    except HeadError as exc:
        assert exc.status in (400, 413, 501, 505)
    else:
        assert parsed.method and parsed.target.startswith("/")


def test_http_errors_are_in_the_hierarchy() -> None:
    assert issubclass(HeadError, HttpRefused) and issubclass(HttpRefused, SmithFastError)
    from smith_fast.errors import HttpError
    from smith_fast.plan.http import HttpError as PlanHttpError

    assert PlanHttpError is HttpError and issubclass(HttpError, SmithFastError)


# ---- the gate ------------------------------------------------------------------------------------------


def test_gate_counts_and_releases() -> None:
    gate = ConnectionGate(2, max_waiting=1)
    a, b, c, d = object(), object(), object(), object()
    assert gate.admit(a) and gate.admit(a) and gate.admit(b) and len(gate) == 2
    assert not gate.admit(c) and len(gate) == 2
    assert gate.wait(c) and not gate.wait(d)
    gate.waited(c)
    assert gate.wait(d)
    gate.release(a)
    gate.release(a)
    assert len(gate) == 1 and gate.admit(c)


@pytest.fixture
def limited(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    """A service with --max-connections 1 on a Unix socket, MCP over HTTP and /metrics."""
    srv = ServerProcess(tmp_path, "--max-connections", "1", "--mcp-http", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                        tcp=False).start()
    yield srv
    srv.stop()


def _mcp_address(srv: ServerProcess) -> tuple[str, int]:
    url = next(str(r["address"]) for r in srv.logs if str(r.get("address", "")).endswith("/mcp"))
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _initialize(sock: socket.socket) -> dict[str, Any]:
    pending = bytearray()
    sock.sendall(request(INIT))
    answer = read_response(sock, pending)
    assert answer.status == 200, answer.body
    return answer.json()  # type: ignore[no-any-return]


def test_one_gate_for_every_front(limited: ServerProcess) -> None:
    """--max-connections is one count over the socket front and the MCP HTTP front: a kept-alive
    MCP connection takes the one slot (a Unix peer hears "too many connections"); a Unix session
    takes it (an MCP client gets 503); a scrape of /metrics takes none."""
    addr = _mcp_address(limited)
    with socket.create_connection(addr, timeout=20) as mcp:
        assert _initialize(mcp)["result"]["serverInfo"]["name"] == "smith-fast"
        late = V1Peer(limited.unix)
        (err,) = errors(late.handshake() + late.rest())
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and "too many connections (max 1)" in err.message
        metrics = urlsplit(limited.metrics_url)
        with socket.create_connection((metrics.hostname, metrics.port), timeout=20) as scrape:
            scrape.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_response(scrape, bytearray())
            assert answer.status == 200 and b"smith_fast_active_sessions" in answer.body
    peer = None
    for _ in range(100):  # the MCP connection's slot comes back once the server saw it close
        peer = V1Peer(limited.unix)
        if not errors(peer.handshake()):
            break
        peer = None
    assert peer is not None, "the Unix peer never got the slot back"
    with socket.create_connection(addr, timeout=20) as mcp:
        mcp.sendall(request(INIT))
        refused = read_response(mcp, bytearray())
        assert refused.status == 503 and "too many connections (max 1)" in refused.json()["error"]
    assert_clean_log(limited)


def test_metrics_is_served_by_the_same_server(limited: ServerProcess) -> None:
    """/metrics gets the head rules, limits and keep-alive of the one server: two scrapes on one
    connection, HEAD without a body, an ambiguous length and an oversize head refused."""
    parts = urlsplit(limited.metrics_url)
    addr = (parts.hostname, parts.port)
    with socket.create_connection(addr, timeout=20) as sock:
        pending = bytearray()
        for _ in range(2):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n")
            answer = read_response(sock, pending)
            assert answer.status == 200 and answer.headers["content-type"].startswith("application/openmetrics-text")
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        head = read_response_head_only(sock, pending)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: " in head
        assert read_response(sock, pending).status == 404
    for hostile, status in [
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", 405),
    ]:
        with socket.create_connection(addr, timeout=20) as sock:
            sock.sendall(hostile)
            answer = read_response(sock, bytearray())
            assert answer.status == status and answer.headers.get("connection") == "close", answer.body
    assert_clean_log(limited)


def read_response_head_only(sock: socket.socket, pending: bytearray) -> bytes:
    """A HEAD response: its head, no body whatever its Content-Length says."""
    while b"\r\n\r\n" not in pending:
        chunk = sock.recv(65536)
        assert chunk, bytes(pending)
        pending += chunk
    end = pending.index(b"\r\n\r\n")
    head = bytes(pending[:end])
    del pending[: end + 4]
    return head


# ---- EventSink is an ABC -------------------------------------------------------------------------------


def test_a_sink_missing_an_event_method_cannot_be_made() -> None:
    class Partial(EventSink):  # every event method but shell_output_bytes
        def record_to(self, recording: Any) -> None: ...
        def event(self, event: pb.Event) -> None: ...
        def state_change(self, state: int, request_id: str | None = None) -> None: ...
        def shell_output(self, request_id: str, stdout: str | None = None, stderr: str | None = None,
                         exit_code: int | None = None, finished: bool = False) -> None: ...
        def tool_result(self, request_id: str, success: bool, result: bytes, error: str | None, duration_ms: int) -> None: ...
        def log(self, level: int, message: str, request_id: str | None = None, fields: Any = None) -> None: ...
        def error(self, code: int, message: str, request_id: str | None = None, details: Any = None) -> None: ...

    with pytest.raises(TypeError, match="shell_output_bytes"):
        Partial(lambda data: None)  # type: ignore[abstract]
    from smith_fast.jsonl import JsonlCodec

    V1Sink(lambda data: None)
    V0Sink(lambda data: None, JsonlCodec())


class _Host:
    def __init__(self) -> None:
        self.calls: dict[str, Call] = {}
        self.done: list[Call] = []

    def ended(self, rid: str, call: Call) -> None:
        self.done.append(call)

    def log(self, level: str, message: str, rid: str | None, fields: Any) -> None:
        pass


class _Channel:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: bytes, final: bool) -> None:
        self.sent.append(data)


def test_mcp_sink_takes_binary_output_as_text() -> None:
    """McpSink lacked shell_output_bytes: a call's raw output now lands in its result as text
    (invalid UTF-8 replaced), progress included."""
    host, channel = _Host(), _Channel()
    sink = McpSink(host)
    host.calls["r1"] = Call(1, True, channel, "tok", 1 << 20)
    sink.shell_output_bytes("r1", 1, b"out \xff")
    sink.shell_output_bytes("r1", 2, memoryview(b"err"))
    sink.state_change(pb.SERVICE_STATE_READY, "r1")
    (call,) = host.done
    assert call.out == ["out \ufffd"] and call.err == ["err"]
    assert [json.loads(m)["params"]["message"] for m in channel.sent] == ["out \ufffd", "err"]


# ---- one listener for /mcp and /metrics ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_mcp_and_metrics_share_one_address(tmp_path: pathlib.Path) -> None:
    """--mcp-http and --metrics on one address: one listener routes both paths; the MCP route
    keeps its Host rule, /metrics counts the MCP session."""
    port = _free_port()
    srv = ServerProcess(tmp_path, "--mcp-http", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{port}", tcp=False).start()
    try:
        assert srv.metrics_url == f"http://127.0.0.1:{port}/metrics"
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            pending = bytearray()
            sock.sendall(request(INIT))
            assert read_response(sock, pending).status == 200
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # on the same kept-alive connection
            scrape = read_response(sock, pending)
            assert scrape.status == 200 and b'smith_fast_sessions_total{protocol="mcp"} 1.0' in scrape.body
            sock.sendall(request(INIT, host="rebind.attacker.example"))
            assert read_response(sock, pending).status == 421
        assert_clean_log(srv)
    finally:
        srv.stop()
