"""``smith-fast worker`` and ``smith-fast gateway``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Coroutine
from typing import Any

from ..logs import get_logger
from ..options import DURATIONS, SIZES, HelpFormatter, parse_duration
from ..service import lifecycle
from ..service.config import ServiceConfig
from ..startup import add_listen_options, add_service_options, listen_config, run_service, service_config
from . import config as nats_config

__all__ = ["add_parsers", "run"]

log = get_logger("smith_fast.nats.cli")


_EXAMPLES = {
    "worker": """examples:
  smith-fast worker --nats nats://127.0.0.1:4222 --root /srv/work
  smith-fast worker --nats nats://a:4222,nats://b:4222 --concurrency 16 --drain-timeout 30s
  SMITH_NATS_TOKEN=... smith-fast worker --nats tls://nats.internal:4222 --nats-tls-ca ca.pem
  smith-fast worker --metrics 127.0.0.1:9465          # its own smith_fast_nats_* figures
""",
    "gateway": """examples:
  smith-fast gateway --nats nats://127.0.0.1:4222 --unix /run/smith.sock
  smith-fast gateway --tcp 127.0.0.1:7878 --grpc --metrics
  SMITH_TOKEN=... smith-fast gateway --tcp 0.0.0.0:7878 --allow-remote
  smith-fast gateway --unix /run/smith.sock --queue-notice 5s --queue-timeout 10m   # fail what waits too long
""",
}


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``worker`` and ``gateway`` subcommands."""
    worker = sub.add_parser(
        "worker",
        help="run commands from a NATS JetStream work queue",
        description="Take commands of gateway sessions from the JetStream command stream, run them as "
        "`serve` would, publish their events. Run any number, on any machines. SIGTERM lets running "
        "commands finish (up to --drain-timeout), then hands the rest back to the stream. "
        f"{DURATIONS}; {SIZES}.",
        epilog=_EXAMPLES["worker"], formatter_class=HelpFormatter, allow_abbrev=False,
    )
    nats_config.add_arguments(worker, "worker")
    worker.add_argument("--concurrency", type=int, default=64, metavar="N", help="commands run at once (default 64)")
    worker.add_argument("--drain-timeout", type=parse_duration, default=10.0, metavar="DURATION",
                        help="on SIGTERM, how long running commands may still take (default 10s)")
    worker.add_argument("--metrics", action="append", default=[], nargs="?", const="127.0.0.1:9464", metavar="HOST:PORT",
                        help="serve Prometheus metrics (with the smith_fast_nats_* figures) at http://HOST:PORT/metrics "
                             "(default 127.0.0.1:9464; repeatable)")
    worker.add_argument("--allow-remote", action="store_true", help="allow --metrics on a non-loopback address")
    add_service_options(worker, "worker")

    gateway = sub.add_parser(
        "gateway",
        help="accept frontends and forward their commands to workers over NATS",
        description="Accept v1 and v0 frontends on the usual listeners (with none given: TCP 127.0.0.1:7878) "
        "and forward their requests to `smith-fast worker`s through NATS JetStream; events come back in "
        f"order, each request's final event exactly once. {DURATIONS}; {SIZES}.",
        epilog=_EXAMPLES["gateway"], formatter_class=HelpFormatter, allow_abbrev=False,
    )
    add_listen_options(gateway)
    nats_config.add_arguments(gateway, "gateway")
    gateway.add_argument("--gateway-id", metavar="ID", help="names this gateway's event subjects and consumer (default: a fresh id)")
    add_service_options(gateway, "gateway")


def run(args: argparse.Namespace) -> int:
    """Run ``worker`` or ``gateway`` until SIGTERM/SIGINT; 2 when it cannot start."""
    try:
        config = nats_config.from_arguments(args)
        config.ssl_context()  # an unreadable TLS file stops the start here, before any listener opens
        service = service_config(args, args.command, **({"max_requests": max(args.concurrency, 1)} if args.command == "worker" else {}))
    except ValueError as exc:
        print(f"smith-fast {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "worker":
        return run_service("worker", lambda loop_name: _worker(args, service, config, loop_name), args.loop)
    return run_service("gateway", lambda loop_name: _gateway(args, service, config, loop_name), args.loop)


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


async def _worker(args: argparse.Namespace, service: ServiceConfig, config: nats_config.NatsConfig, loop_name: str) -> int:
    from ..service.core import ServiceCore
    from .worker import Worker

    from ..service.server import ListenError, check_listen_address, mount_servers

    core = ServiceCore(service, loop_name=loop_name)
    try:
        hosts = [check_listen_address(addr, "metrics", args.allow_remote) for addr in args.metrics]
    except ListenError as exc:
        print(f"smith-fast worker: {exc}", file=sys.stderr)
        return 2
    metrics = None
    if hosts:
        from ..service.prometheus import MetricsServer  # prometheus_client only when asked for

        metrics = MetricsServer(core)
    async with lifecycle.running(core, service.hook_files, runs_commands=True):
        stop = lifecycle.stop_on_signals()
        mounted = await mount_servers(core, service)
        worker = Worker(core, config, concurrency=args.concurrency, drain_timeout=args.drain_timeout)
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
            for server in mounted:
                await server.close()
    return 0


async def _gateway(args: argparse.Namespace, service: ServiceConfig, config: nats_config.NatsConfig, loop_name: str) -> int:
    from ..service.server import serve
    from .gateway import Gateway

    listen = listen_config(args)
    gateway = Gateway(service, config, loop_name=loop_name, gateway_id=args.gateway_id)
    # Listen at once, NATS or not: until it is reached, health says why the gateway cannot
    # serve and each command gets an ErrorEvent saying so, instead of a missing socket.
    bridging = asyncio.ensure_future(gateway.bridge.run())
    try:
        return await serve(service, listen, loop_name=loop_name, core=gateway.core)
    finally:
        if not bridging.done():
            bridging.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await bridging
        await gateway.bridge.close()
