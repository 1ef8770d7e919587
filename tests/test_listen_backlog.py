"""A burst of connections is taken by every listener of a real ``smith-fast serve``.

The service is stopped (SIGSTOP) while the burst arrives, so not one connection is accepted during
it: the listen backlog alone must hold all of them. With asyncio's default backlog (100) the 101st
Unix connect fails with ``EAGAIN`` and the 101st TCP SYN is dropped (its connect never completes
while the queue stays full). Every connection sends a few bytes and closes; once the service runs
again it still answers a ping on every protocol listener.
"""

from __future__ import annotations

import errno
import pathlib
import select
import signal
import socket
import time
from urllib.parse import urlsplit

import pytest

from smith_fast.client import Client

from .server import ServerProcess, assert_clean_log

BURST = 500
# How long the kernel is given to finish the loopback handshakes (it needs no help from the
# stopped service): SYNs dropped on a full queue are retried after 1 s and 3 s, and dropped again.
HANDSHAKE_WAIT = 5.0
LISTENERS = ["unix", "tcp", "grpc", "metrics"]


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"backlog-{request.param}")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--metrics", "127.0.0.1:0", loop=request.param).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def _target(server: ServerProcess, kind: str) -> tuple[int, object]:
    if kind == "unix":
        return socket.AF_UNIX, server.sock_path
    if kind == "metrics":
        url = urlsplit(server.metrics_url)
        return socket.AF_INET, (url.hostname, url.port)
    address = server.tcp if kind == "tcp" else server.grpc
    host, _, port = address.split(":", 1)[1].rpartition(":")
    return socket.AF_INET, (host, int(port))


def _burst(family: int, target: object) -> tuple[list[socket.socket], list[str]]:
    """Non-blocking connects in a tight loop; returns the sockets and the failures (as errno names)."""
    socks: list[socket.socket] = []
    failures: list[str] = []
    for _ in range(BURST):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(target)  # type: ignore[arg-type]
        if code in (0, errno.EINPROGRESS):
            socks.append(sock)
        else:
            failures.append(errno.errorcode.get(code, str(code)))
            sock.close()
    return socks, failures


def _unconnected(socks: list[socket.socket]) -> int:
    """How many sockets did not finish connecting within :data:`HANDSHAKE_WAIT`."""
    poller = select.poll()
    pending = {s.fileno(): s for s in socks}
    for fd in pending:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + HANDSHAKE_WAIT
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            sock = pending.pop(fd)
            poller.unregister(fd)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    return len(pending)


@pytest.mark.parametrize("kind", LISTENERS)
async def test_a_burst_of_connections_is_accepted(server: ServerProcess, kind: str) -> None:
    family, target = _target(server, kind)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    try:
        socks, failures = _burst(family, target)
        unconnected = _unconnected(socks)
        for sock in socks:
            if unconnected == 0:
                sock.send(b"hello\n")
            sock.close()
    finally:
        server.proc.send_signal(signal.SIGCONT)
    assert not failures, f"{len(failures)} of {BURST} connects to {kind} failed: {sorted(set(failures))}"
    assert unconnected == 0, f"{unconnected} of {BURST} connects to {kind} never completed (backlog full)"
    for address, protocol in [(server.unix, "v1"), (server.unix, "v0"), (server.tcp, "v1"), (server.grpc, "v1")]:
        async with await Client.connect(address, protocol=protocol) as client:
            await client.handshake()
            assert await client.ping() >= 0
    assert server.proc.poll() is None
    assert_clean_log(server)


def test_backlog_fits_max_connections(tmp_path: pathlib.Path) -> None:
    """A small --max-connections keeps a backlog that takes a burst (the over-limit ones are told
    "too many connections" instead of being refused by the kernel); a large one is cut to what the
    kernel allows."""
    from smith_fast.service.server import listen_backlog

    somaxconn = int(pathlib.Path("/proc/sys/net/core/somaxconn").read_text())
    assert listen_backlog(1024) == min(1024, somaxconn)
    assert listen_backlog(1 << 20) == somaxconn
    assert listen_backlog(1) >= 100
