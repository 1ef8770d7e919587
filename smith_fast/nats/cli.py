"""``smith-fast worker`` and ``smith-fast gateway``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import pathlib
import sys
from collections.abc import Coroutine
from typing import Any

from ..logs import get_logger
from ..options import DURATIONS, SIZES, HelpFormatter, parse_duration
from ..service import lifecycle
from ..service.config import ServiceConfig
from ..startup import add_listen_options, add_service_options, enter_workspaces, listen_config, run_service, service_config
from . import auth
from . import config as nats_config
from .placement import parse_labels

__all__ = ["add_parsers", "run"]

log = get_logger("smith_fast.nats.cli")


_EXAMPLES = {
    "worker": """examples:
  smith-fast worker --nats nats://127.0.0.1:4222 --root /srv/work
  smith-fast worker --nats nats://a:4222,nats://b:4222 --label zone=b --label gpu=1 --max-sessions 64
  smith-fast worker --worker-id w1 --nats-nkey /etc/smith/worker-w1.nk --nats tls://nats.internal:4222
  smith-fast worker --metrics 127.0.0.1:9465          # its own smith_fast_nats_* figures
""",
    "gateway": """examples:
  smith-fast gateway --nats nats://127.0.0.1:4222 --unix /run/smith.sock
  smith-fast gateway --gateway-id gw1 --nats-nkey /etc/smith/gateway-gw1.nk --tcp 127.0.0.1:7878 --metrics
  SMITH_TOKEN=... smith-fast gateway --tcp 0.0.0.0:7878 --allow-remote
  smith-fast gateway --unix /run/smith.sock --queue-notice 5s --queue-timeout 2m   # how long a session waits for a worker
""",
}


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``worker`` and ``gateway`` subcommands."""
    worker = sub.add_parser(
        "worker",
        help="serve the sessions NATS gateways place on it",
        description="Serve, as `serve` would, the sessions that gateways place on this worker over NATS: each "
        "session lives on one worker for its lifetime (its files, processes and hooks are here). Run any number, "
        "on any machines. SIGTERM: no new session; running requests get --drain-timeout, then the sessions end. "
        f"{DURATIONS}; {SIZES}.",
        epilog=_EXAMPLES["worker"], formatter_class=HelpFormatter, allow_abbrev=False,
    )
    nats_config.add_arguments(worker, "worker")
    auth.add_auth_arguments(worker)
    worker.add_argument("--worker-id", metavar="ID", help="this worker's id: its subjects and NATS identity (default HOST-PID)")
    worker.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        help="what a session may ask its worker to have (client_info smith_fast.placement); repeatable")
    worker.add_argument("--max-sessions", type=int, default=256, metavar="N", help="sessions served at once (default 256)")
    worker.add_argument("--concurrency", type=int, default=None, metavar="N", help=argparse.SUPPRESS)  # retired: --max-processes
    worker.add_argument("--drain-timeout", type=parse_duration, default=10.0, metavar="DURATION",
                        help="on SIGTERM, how long running requests may still take (default 10s)")
    worker.add_argument("--metrics", action="append", default=[], nargs="?", const="127.0.0.1:9464", metavar="HOST:PORT",
                        help="serve Prometheus metrics (with the smith_fast_nats_* figures) at http://HOST:PORT/metrics "
                             "(default 127.0.0.1:9464; repeatable)")
    worker.add_argument("--allow-remote", action="store_true", help="allow --metrics on a non-loopback address")
    add_service_options(worker, "worker")

    gateway = sub.add_parser(
        "gateway",
        help="accept frontends and place each session on a worker over NATS",
        description="Accept v1 and v0 frontends on the usual listeners (with none given: TCP 127.0.0.1:7878), "
        "check their token, place each session on one `smith-fast worker` (by its labels and load) and relay it "
        f"there over NATS. {DURATIONS}; {SIZES}.",
        epilog=_EXAMPLES["gateway"], formatter_class=HelpFormatter, allow_abbrev=False,
    )
    add_listen_options(gateway)
    nats_config.add_arguments(gateway, "gateway")
    auth.add_auth_arguments(gateway)
    gateway.add_argument("--gateway-id", metavar="ID", help="this gateway's id: its subjects and NATS identity (default: a fresh id)")
    add_service_options(gateway, "gateway")


def _refused_listeners(args: argparse.Namespace) -> str | None:
    """The gateway relays byte streams; MCP and gRPC are not relayed (yet): they run on ``serve``."""
    for flag, given in (("--grpc", getattr(args, "grpc", None)), ("--mcp", getattr(args, "mcp", False)),
                        ("--mcp-http", getattr(args, "mcp_http", None))):
        if given:
            return (f"{flag} is not offered by the gateway: it relays Smith v1/v0 over Unix, TCP and stdio. Serve MCP or gRPC "
                    "frontends with `smith-fast serve`, or connect them through a Unix or TCP listener")
    return None


def run(args: argparse.Namespace) -> int:
    """Run ``worker`` or ``gateway`` until SIGTERM/SIGINT; 2 when it cannot start."""
    try:
        config = nats_config.from_arguments(args)
        config.ssl_context()  # an unreadable TLS file stops the start here, before any listener opens
        named = auth.key_identity(args.nats_nkey)
        id_flag = "worker_id" if args.command == "worker" else "gateway_id"
        if named is not None and named[0] == args.command and getattr(args, id_flag) is None:
            setattr(args, id_flag, named[1])  # the id its key (and so its permissions) were made for
        options = dict(auth.connect_options(args, role=args.command, identity=getattr(args, id_flag)))
        extra: dict[str, Any] = {}
        if args.command == "worker" and args.concurrency is not None:
            extra["max_processes"] = max(args.concurrency, 1)
        service = service_config(args, args.command, **extra)
        # whoever reads a key file is that process on NATS: no command may read one
        hidden = tuple(pathlib.Path(p) for p in auth.private_paths(args))
        if hidden:
            service = dataclasses.replace(service, sandbox_deny_read=(*service.sandbox_deny_read, *hidden))
        labels = parse_labels(",".join(args.label), "--label") if args.command == "worker" else {}
        if args.command == "gateway" and (refused := _refused_listeners(args)) is not None:
            raise ValueError(refused)
    except ValueError as exc:
        print(f"smith-fast {args.command}: {exc}", file=sys.stderr)
        return 2
    for flag in nats_config.retired_flags(args):
        log.warning("retired option ignored", extra={"fields": {"option": flag, "why": "sessions are placed on workers; nothing is queued in NATS"}})
    auth.warn_without_credentials(config.servers, args.command, args)
    if args.command == "worker":
        if not enter_workspaces(service, "worker"):
            return 2
        return run_service("worker", lambda loop_name: _worker(args, service, config, options, labels, loop_name), args.loop)
    return run_service("gateway", lambda loop_name: _gateway(args, service, config, options, loop_name), args.loop)


async def _started(start: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``start`` (connecting to NATS, which retries for ever) unless ``stop`` is set first.

    Returns:
        True once started; False when SIGTERM/SIGINT came first (``start`` is then cancelled).
    """
    starting = asyncio.ensure_future(start)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        starting.result()  # its exception, if it failed
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await starting
    log.info("stopped before NATS could be reached")
    return False


async def _worker(args: argparse.Namespace, service: ServiceConfig, config: nats_config.NatsConfig, options: dict[str, Any],
                  labels: dict[str, str], loop_name: str) -> int:
    from ..service.server import ListenError, check_listen_address, mount_servers
    from .worker import Worker

    try:
        worker = Worker(service, config, loop_name=loop_name, worker_id=args.worker_id, labels=labels, max_sessions=args.max_sessions,
                        drain_timeout=args.drain_timeout, connect_options=options)
        hosts = [check_listen_address(addr, "metrics", args.allow_remote) for addr in args.metrics]
    except (ListenError, ValueError) as exc:
        print(f"smith-fast worker: {exc}", file=sys.stderr)
        return 2
    core = worker.core
    metrics = None
    if hosts:
        from ..service.prometheus import MetricsServer  # prometheus_client only when asked for

        metrics = MetricsServer(core)
    async with lifecycle.running(core, service.hook_files, runs_commands=True, unsandboxed=service.sandbox == "off",
                                 limits=service.limits, sessions=("--max-sessions", args.max_sessions)):
        stop = lifecycle.stop_on_signals()
        mounted = await mount_servers(core, service)
        try:
            if metrics is not None:
                for host, port in hosts:
                    log.info("listening", extra={"fields": {"address": await metrics.listen(host, port)}})
            if await _started(worker.start(), stop):
                await stop.wait()
        finally:
            if metrics is not None:
                metrics.close()
            await worker.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(core.shutdown(), timeout=service.limits.kill_grace + 5)
            await worker.close()
            for server in mounted:
                await server.close()
    return 0


async def _gateway(args: argparse.Namespace, service: ServiceConfig, config: nats_config.NatsConfig, options: dict[str, Any],
                   loop_name: str) -> int:
    from ..service.server import serve
    from .gateway import Gateway

    listen = listen_config(args)
    try:
        gateway = Gateway(service, config, loop_name=loop_name, gateway_id=args.gateway_id, connect_options=options)
    except ValueError as exc:
        print(f"smith-fast gateway: {exc}", file=sys.stderr)
        return 2
    # Listen at once, NATS or not: until it is reached, health says why the gateway cannot serve
    # and a session waits for it (up to --queue-timeout), instead of a missing socket.
    running = asyncio.ensure_future(gateway.run())
    try:
        return await serve(service, listen, loop_name=loop_name, core=gateway.core, front=gateway.front)
    finally:
        if not running.done():
            running.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await running
        await gateway.close()
