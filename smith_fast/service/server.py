"""Listeners: stdio, Unix sockets, TCP, gRPC and MCP over HTTP, several at once in one process,
sharing one core; and the Prometheus endpoint.

Every network front hands its connections to one :class:`~smith_fast.service.connections.ConnectionGate`
made here, which counts them against ``--max-connections``: a socket connection, a gRPC
``Stream`` call and an MCP HTTP connection are the same kind of slot. (Scrapers of ``/metrics``
take none.)"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Protocol

from ..addresses import split_host_port
from ..errors import ListenError
from ..records import record
from ..logs import get_logger
from ..options import check_key_file
from . import lifecycle
from .config import ServiceConfig
from .connection import MAX_REFUSING, Connection, StdoutProtocol, tcp_address
from .connections import ConnectionGate
from .core import LISTENER_VERSIONS, Endpoint, ServiceCore
from .stdio import take_stdio

if TYPE_CHECKING:
    from ..mcp.http import McpHttpServer
    from ..mcp.mount import MountedServer
    from .grpc_front import GrpcFront
    from .prometheus import MetricsServer

__all__ = ["ListenConfig", "serve", "parse_tcp", "check_listen_address", "ListenError", "listen_backlog"]

log = get_logger("smith_fast.server")

DEFAULT_TCP = "127.0.0.1:7878"  # the original Smith gateway's address


@record()
class ListenConfig:
    """Where to listen. ``grpc`` and ``metrics`` are ``HOST:PORT`` like ``tcp``; ``tls_cert`` and
    ``tls_key`` (PEM files, both or neither) make the gRPC listeners serve TLS."""

    stdio: bool = False
    unix: list[str] = field(default_factory=list)
    tcp: list[str] = field(default_factory=list)
    grpc: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    tls_cert: str | None = None
    tls_key: str | None = None
    allow_remote: bool = False
    mcp: bool = False  # MCP on stdin/stdout
    mcp_http: list[str] = field(default_factory=list)  # MCP Streamable HTTP listeners


def parse_tcp(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` / ``[V6]:PORT`` / ``:PORT`` → (host, port); an empty host means 127.0.0.1."""
    split = split_host_port(addr)
    if split is None:
        raise ListenError(f"TCP address {addr!r} is not HOST:PORT with a port from 0 to 65535")
    return split


def _is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve {host!r}: {exc}") from None
    # sockaddr[0] is the address text for AF_INET and AF_INET6 (typeshed also allows an int for
    # families getaddrinfo does not return here).
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def _checked(addr: str, what: str, allow_remote: bool) -> tuple[str, int]:
    host, port = parse_tcp(addr)
    if not allow_remote and not _is_loopback(host):
        raise ListenError(f"refusing to listen ({what}) on non-loopback address {host}; pass --allow-remote to allow it")
    return host, port


def check_listen_address(addr: str, what: str, allow_remote: bool) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port), refusing a non-loopback host unless ``allow_remote`` (for
    listeners opened outside :func:`serve`: a worker's ``--metrics``).

    Raises:
        ListenError: malformed, unresolvable, or remote without ``allow_remote``.
    """
    return _checked(addr, what, allow_remote)


def _tls(listen: ListenConfig) -> tuple[bytes, bytes] | None:
    if (listen.tls_cert is None) != (listen.tls_key is None):
        raise ListenError("--tls-cert and --tls-key go together")
    if listen.tls_cert is None or listen.tls_key is None:
        return None
    try:
        check_key_file(listen.tls_key, "--tls-key")
    except ValueError as exc:
        raise ListenError(str(exc)) from None
    try:
        with open(listen.tls_cert, "rb") as cert, open(listen.tls_key, "rb") as key:
            return cert.read(), key.read()
    except OSError as exc:
        raise ListenError(f"cannot read TLS certificate or key: {exc}") from None


async def _open_grpc(core: ServiceCore, listen: ListenConfig, gate: ConnectionGate) -> GrpcFront:
    from .grpc_front import GrpcFront  # grpcio costs ~70 ms to import: only when asked for

    hosts = [_checked(addr, "gRPC", listen.allow_remote) for addr in listen.grpc]
    front = GrpcFront(core, tls=_tls(listen), gate=gate)
    for host, port in hosts:
        address = front.add_port(host, port)
        core.endpoints.append(Endpoint(address, (1,)))  # a Stream call is v1, whatever --protocol says
        log.info("listening", extra={"fields": {"address": address, "tls": front.tls is not None}})
    await front.start()
    return front


async def _open_metrics(core: ServiceCore, listen: ListenConfig, mcp: list[McpHttpServer]) -> MetricsServer:
    """``/metrics`` on each ``--metrics`` address: on the MCP front's HTTP server when
    ``--mcp-http`` names the same address (one listener for both), else on a listener of its own."""
    from .prometheus import MetricsServer

    hosts = [_checked(addr, "metrics", listen.allow_remote) for addr in listen.metrics]
    server = MetricsServer(core)
    shared = {address: front.server for front in mcp for address in front.listening}
    for host, port in hosts:
        http = shared.get((host, port)) if port else None
        if http is not None:
            address = server.share(http, host, port)
        else:
            address = await server.listen(host, port, backlog=listen_backlog(core.limits.max_connections))
        log.info("listening", extra={"fields": {"address": address}})
    return server


async def _open_mcp_http(core: ServiceCore, addr: str, allow_remote: bool, gate: ConnectionGate) -> McpHttpServer:
    from ..mcp.http import McpHttpServer  # only when asked for

    host, port = _checked(addr, "MCP HTTP", allow_remote)
    server = McpHttpServer(core, gate)
    address = await server.listen(host, port, backlog=listen_backlog(core.limits.max_connections))
    log.info("listening", extra={"fields": {"address": address}})
    return server


# The kernel's historical SOMAXCONN: a burst of this many connects is taken whatever the limit, so a
# client over --max-connections hears "too many connections" (connection.py) instead of EAGAIN.
_MIN_BACKLOG = 128


def _somaxconn() -> int:
    """The kernel's cap on a listen backlog (per network namespace): a larger one is cut to it."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return socket.SOMAXCONN


def listen_backlog(max_connections: int) -> int:
    """The accept queue of a Unix or TCP listener: room for ``max_connections`` arriving at once.

    asyncio's default (100) makes the 101st connect of a burst fail with ``EAGAIN`` (Unix) or be
    dropped (TCP) while the loop is busy, long before ``--max-connections`` is reached.
    """
    return max(_MIN_BACKLOG, min(max_connections, _somaxconn()))


def _unix_socket(path: str, backlog: int) -> socket.socket:
    """Bind ``path`` mode 0600, replacing a stale socket file but never a live server or other file."""
    if os.path.lexists(path):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenError(f"{path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # stale: nobody listens there
        else:
            raise ListenError(f"{path} is in use by a running server")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no window in which the socket is reachable by others
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        parent = os.path.dirname(path) or "."
        missing = exc.errno == errno.ENOENT and not os.path.isdir(parent)
        why = f"no directory {parent}" if missing else exc.strerror or str(exc)  # "AF_UNIX path too long": no errno
        raise ListenError(f"--unix {path}: {why}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


class StreamFront(Protocol):
    """What a Unix, TCP or stdio listener makes per connection: a
    :class:`~smith_fast.service.connection.Connection` (``serve``), or a NATS gateway's relay."""

    def __call__(
        self, *, protocol: str = "auto", on_closed: Callable[[], None] | None = None, peer: str | None = None,
        trusted: bool = False, finish_on_eof: bool = False, gate: ConnectionGate | None = None,
    ) -> asyncio.BufferedProtocol: ...


async def _open_stdio(front: StreamFront, config: ServiceConfig, closed: asyncio.Event) -> None:
    stdio = take_stdio()
    # trusted: whoever holds the pipes started the service (no token, limit or deadlines). A file
    # on stdin ends without its writer going away: the requests it holds run to their end.
    conn = front(protocol=config.protocol, on_closed=closed.set, peer="stdio", trusted=True, finish_on_eof=stdio.input_is_file)
    conn._writer = await stdio.write_to(StdoutProtocol(conn.pause_writing, conn.resume_writing, conn.connection_lost))  # type: ignore[attr-defined]  # noqa: SLF001 (both fronts have it; set before any byte is read)
    await stdio.read_into(conn)


async def serve(
    config: ServiceConfig, listen: ListenConfig, *, loop_name: str, core: ServiceCore | None = None, front: StreamFront | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT (or, stdio only, until the parent closes the pipe).

    ``core`` replaces the core built from ``config`` (``smith-fast gateway`` passes its own, which
    runs no commands itself: no child guard then), and ``front`` what its stream listeners make per
    connection (the gateway's relay; default: a :class:`Connection` of ``core``).
    """
    # Refuse a bad address or TLS setting before anything is bound.
    if listen.mcp and listen.stdio:
        raise ListenError("--mcp and --stdio both speak on stdin/stdout; pick one")
    for addr, what in [
        *((a, "TCP") for a in listen.tcp), *((a, "gRPC") for a in listen.grpc), *((a, "metrics") for a in listen.metrics),
        *((a, "MCP HTTP") for a in listen.mcp_http),
    ]:
        _checked(addr, what, listen.allow_remote)
    _tls(listen)
    runs_commands = core is None
    if core is None:
        # the sandbox's trial run goes on while the service starts; _listen waits for it
        core = ServiceCore(config, loop_name=loop_name, sockets=listen.unix, check_sandbox_at_once=False)
    # on stdin/stdout alone there is one session (an MCP client's, `smith-fast exec`'s), whatever --max-connections says
    alone = (listen.stdio or listen.mcp) and not (listen.unix or listen.tcp or listen.grpc or listen.mcp_http)
    async with lifecycle.running(core, config.hook_files, runs_commands=runs_commands, unsandboxed=config.sandbox == "off",
                                 limits=config.limits, sessions=("--stdio", 1) if alone else None):
        mounted = await mount_servers(core, config)
        try:
            return await _listen(core, config, listen, loop_name, front or functools.partial(Connection, core))
        finally:
            for server in mounted:
                await server.close()


def _warn_without_token(config: ServiceConfig, address: str) -> None:
    """A TCP listener (socket or gRPC) without a token: any local account, unlike the 0600 Unix
    socket, can connect and run commands as this service's user. Said once per
    listener at start-up, as a warning naming the risk and the remedy."""
    if config.token is None:
        log.warning(
            "TCP listener without a token",
            extra={"fields": {
                "address": address,
                "risk": "any local account (and, with --allow-remote, any host that reaches it) can connect and run "
                        "commands as this service's user; the Unix socket (mode 0600) is not open to them",
                "remedy": "set SMITH_TOKEN (or --token) for the service and its clients, or serve only --unix",
            }},
        )


async def mount_servers(core: ServiceCore, config: ServiceConfig) -> list[MountedServer]:
    """The --mcp-server tools, in the registry before any listener opens (``serve``) or any
    command is taken (``worker``: a NATS peer's ``tools.list`` and calls run on a worker)."""
    if not config.mcp_servers:
        return []
    from ..mcp.mount import mount_all

    return await mount_all(core.tools, config.mcp_servers)


async def _listen(core: ServiceCore, config: ServiceConfig, listen: ListenConfig, loop_name: str, front: StreamFront) -> int:
    """Open every listener, serve until stopped, close them and end the sessions."""
    loop = asyncio.get_running_loop()
    if listen.mcp:
        from ..mcp.stdio import open_mcp_stdio  # imported while the sandbox's trial run goes on
    core.sandbox_checked()  # before any listener: a broken sandbox fails the start, and nothing is served
    stop = lifecycle.stop_on_signals()
    servers: list[asyncio.base_events.Server] = []
    unix_paths: list[str] = []
    grpc_front: GrpcFront | None = None
    metrics_server: MetricsServer | None = None
    mcp_servers: list[McpHttpServer] = []
    gate = ConnectionGate(config.limits.max_connections, max_waiting=MAX_REFUSING)

    def factory() -> asyncio.BufferedProtocol:
        return front(protocol=config.protocol, gate=gate)

    # asyncio (and uvloop) call listen() again when serving starts, with their own default unless told
    backlog = listen_backlog(config.limits.max_connections)
    versions = LISTENER_VERSIONS[config.protocol]  # what Negotiate may point a frontend at
    for path in listen.unix:
        sock = _unix_socket(path, backlog)
        unix_paths.append(path)
        servers.append(await loop.create_unix_server(factory, sock=sock, backlog=backlog))
        core.endpoints.append(Endpoint(f"unix:{path}", versions))
        log.info("listening", extra={"fields": {"address": f"unix:{path}"}})
    for addr in listen.tcp:
        host, port = _checked(addr, "TCP", listen.allow_remote)
        server = await loop.create_server(factory, host, port, reuse_address=True, backlog=backlog)
        servers.append(server)
        for sock in server.sockets:
            address = tcp_address(*sock.getsockname()[:2])
            core.endpoints.append(Endpoint(address, versions))
            log.info("listening", extra={"fields": {"address": address}})
            _warn_without_token(config, address)
    if listen.grpc:
        grpc_front = await _open_grpc(core, listen, gate)
        for endpoint in core.endpoints:
            if endpoint.address.startswith("grpc:"):
                _warn_without_token(config, endpoint.address)
    for addr in listen.mcp_http:
        mcp_servers.append(await _open_mcp_http(core, addr, listen.allow_remote, gate))
    if listen.metrics:
        metrics_server = await _open_metrics(core, listen, mcp_servers)
    if listen.stdio:
        log.info("listening", extra={"fields": {"address": "stdio"}})
        await _open_stdio(front, config, stop)
    if listen.mcp:
        log.info("listening", extra={"fields": {"address": "mcp:stdio"}})
        await open_mcp_stdio(core, stop)
    log.info("ready", extra={"fields": {"service_id": core.service_id, "event_loop": loop_name, "token_required": config.token is not None}})
    try:
        await stop.wait()
    finally:
        log.info("shutting down", extra={"fields": {"sessions": len(core.sessions)}})
        for server in servers:
            server.close()
        if grpc_front is not None:
            await grpc_front.begin_shutdown()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(core.shutdown(), timeout=config.limits.kill_grace + 5)
        if grpc_front is not None:
            with contextlib.suppress(Exception):
                await grpc_front.stop(1.0)  # the sessions' last messages are queued by now
        if metrics_server is not None:
            metrics_server.close()
        for mcp_server in mcp_servers:
            mcp_server.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        for path in unix_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        # give transports one tick to push their last bytes out
        await asyncio.sleep(0)
    return 0
