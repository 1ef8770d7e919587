"""``smith-fast worker`` and ``smith-fast gateway``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from ..errors import SmithFastError
from ..logs import get_logger
from . import config as nats_config

__all__ = ["add_parsers", "run"]

log = get_logger("smith_fast.nats.cli")


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``worker`` and ``gateway`` subcommands."""
    from ..cli import _size, listen_options

    worker = sub.add_parser(
        "worker",
        help="run commands from a NATS JetStream work queue",
        description="Take commands of gateway sessions from the JetStream command stream, run them as "
        "`serve` would, publish their events. Run any number, on any machines. SIGTERM lets running "
        "commands finish (up to --drain-timeout), then hands the rest back to the stream.",
    )
    nats_config.add_arguments(worker)
    worker.add_argument("--concurrency", type=int, default=64, metavar="N", help="commands run at once (default 64)")
    worker.add_argument("--drain-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="on SIGTERM, seconds running commands may still take (default 10)")
    worker.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd(), help="tool workspace root (default: current directory)")
    worker.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="event loop (default: uvloop when importable)")
    worker.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="stderr log level")
    limits = worker.add_argument_group("limits (as for serve; sizes accept k/M/G suffixes)")
    limits.add_argument("--max-output", type=_size, default=64 << 20, help="output forwarded per shell command before truncation (default 64M)")
    limits.add_argument("--max-processes", type=int, default=64, help="shell commands running at once in this worker (default 64)")
    limits.add_argument("--timeout-ms", type=int, default=0, help="default command timeout; 0 = none (default 0)")
    limits.add_argument("--kill-grace", type=float, default=2.0, help="seconds between SIGTERM and SIGKILL (default 2)")
    limits.add_argument("--chunk-size", type=_size, default=64 << 10, help="largest ShellOutput chunk (default 64k)")
    limits.add_argument("--tool-max-output", type=_size, default=1 << 20, help="largest tool output (default 1M)")
    limits.add_argument("--max-command-size", type=_size, default=256 << 10, help="largest shell command, tool arguments or plan goal (default 256k)")
    limits.add_argument("--allow-env", action="append", default=[], metavar="NAME", help="let requests set this refused environment variable (repeatable)")
    policy = worker.add_argument_group("hooks, planning")
    policy.add_argument("--hook", action="append", default=[], type=pathlib.Path, metavar="FILE",
                        help="a .js or .rs hook every command runs first (repeatable; see HOOKS.md)")
    policy.add_argument("--hook-failure", choices=["closed", "open"], default="closed", help="a failing hook blocks (closed, default) or allows (open)")
    policy.add_argument("--planner", choices=["rules", "llm"], default="rules", help="how PlanCommands are planned (default rules)")
    policy.add_argument("--planner-url", help="OpenAI-compatible endpoint for --planner llm (key from SMITH_PLANNER_API_KEY)")
    policy.add_argument("--planner-model", help="model name for --planner llm")

    gateway = sub.add_parser(
        "gateway",
        help="accept frontends and forward their commands to workers over NATS",
        description="Accept v1 and v0 frontends on the usual listeners (with none given: TCP 127.0.0.1:7878) "
        "and forward their requests to `smith-fast worker`s through NATS JetStream; events come back in "
        "order, each request's final event exactly once.",
    )
    listen_options(gateway)
    nats_config.add_arguments(gateway)
    gateway.add_argument("--gateway-id", metavar="ID", help="names this gateway's event subjects and consumer (default: a fresh id)")
    gateway.add_argument("--protocol", choices=["auto", "v1", "v0"], default="auto", help="pin the wire protocol (default: detect per connection)")
    gateway.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="event loop (default: uvloop when importable)")
    gateway.add_argument("--jsonl-backend", choices=["auto", "json", "orjson"], default="auto", help="JSON library for v0 (default: orjson when installed)")
    gateway.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="stderr log level")
    glimits = gateway.add_argument_group("limits (as for serve; sizes accept k/M/G suffixes)")
    glimits.add_argument("--max-frame-size", type=_size, default=16 << 20, help="largest v1 frame or v0 line (default 16M)")
    glimits.add_argument("--max-requests", type=int, default=1024, help="requests in flight per session (default 1024)")
    glimits.add_argument("--kill-grace", type=float, default=2.0, help="on shutdown, the workers' grace for running commands (default 2)")
    glimits.add_argument("--max-connections", type=int, default=1024, help="live socket connections and gRPC streams (default 1024)")
    glimits.add_argument("--idle-timeout", type=float, default=300.0, help="seconds without a message or a running request before a connection is closed; 0 = never (default 300)")
    glimits.add_argument("--handshake-timeout", type=float, default=10.0, help="seconds a new connection has to complete its handshake; 0 = forever (default 10)")
    glimits.add_argument("--max-command-size", type=_size, default=256 << 10, help="largest shell command, tool arguments or plan goal (default 256k)")
    gateway.add_argument("--token", metavar="TOKEN", help="shared secret frontends must present in their handshake (default: $SMITH_TOKEN)")


def run(args: argparse.Namespace) -> int:
    """Run ``worker`` or ``gateway`` until SIGTERM/SIGINT; 2 when it cannot start."""
    from ..cli import _pick_loop

    try:
        config = nats_config.from_arguments(args)
    except ValueError as exc:
        print(f"smith-fast: {exc}", file=sys.stderr)
        return 2
    factory, loop_name = _pick_loop(args.loop)
    main = _worker(args, config, loop_name) if args.command == "worker" else _gateway(args, config, loop_name)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    except ImportError as exc:
        print(f"smith-fast: {args.command} needs the nats-py package (pip install 'smith-fast[nats]'): {exc}", file=sys.stderr)
        return 2
    except (OSError, SmithFastError, ValueError) as exc:
        log.error("cannot start", extra={"fields": {"error": str(exc)}})
        print(f"smith-fast: {exc}", file=sys.stderr)
        return 2


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


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


async def _worker(args: argparse.Namespace, config: nats_config.NatsConfig, loop_name: str) -> int:
    from .. import childguard, process, tracing
    from ..hooks import HookLoadError, load_hook_file
    from ..service.config import Limits, ServiceConfig
    from ..service.core import ServiceCore
    from .worker import Worker

    limits = Limits(
        max_output=args.max_output,
        max_processes=args.max_processes,
        max_requests=max(args.concurrency, 1),
        default_timeout_ms=args.timeout_ms,
        kill_grace=args.kill_grace,
        chunk_size=args.chunk_size,
        tool_max_output=args.tool_max_output,
        max_command_size=args.max_command_size,
    )
    service = ServiceConfig(
        root=args.root,
        limits=limits,
        hook_files=tuple(args.hook),
        hook_failure=args.hook_failure,
        planner=args.planner,
        planner_url=args.planner_url,
        planner_model=args.planner_model,
        allow_env=frozenset(args.allow_env),
    )
    core = ServiceCore(service, loop_name=loop_name)
    childguard.start()  # a SIGKILLed worker leaves no commands running
    if tracing.setup_from_env():  # command spans, children of the gateway's session spans
        log.info("tracing exporter configured from OTEL_* variables")
    for path in service.hook_files:
        try:
            core.global_hooks.append(await load_hook_file(path, limits=core.hook_limits))
        except HookLoadError as exc:
            raise SmithFastError(f"--hook {exc}") from None
    stop = _stop_event()
    worker = Worker(core, config, concurrency=args.concurrency, drain_timeout=args.drain_timeout)
    try:
        if await _started(worker.start(), stop):
            await stop.wait()
    finally:
        await worker.stop()
        process.kill_all()
        tracing.shutdown()
        for hook in core.global_hooks:
            with contextlib.suppress(Exception):
                await hook.close()
    return 0


async def _gateway(args: argparse.Namespace, config: nats_config.NatsConfig, loop_name: str) -> int:
    import os

    from ..service.config import Limits, ServiceConfig
    from ..service.server import ListenConfig, serve
    from .gateway import GatewayCore

    token = args.token or os.environ.get("SMITH_TOKEN") or None
    limits = Limits(
        max_frame_size=args.max_frame_size,
        max_requests=args.max_requests,
        kill_grace=args.kill_grace,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        handshake_timeout=args.handshake_timeout,
        max_command_size=args.max_command_size,
    )
    service = ServiceConfig(protocol=args.protocol, jsonl_backend=args.jsonl_backend, limits=limits, token=token)
    listen = ListenConfig(
        stdio=args.stdio, unix=args.unix, tcp=args.tcp, grpc=args.grpc, metrics=args.metrics,
        tls_cert=args.tls_cert, tls_key=args.tls_key, allow_remote=args.allow_remote,
    )
    if not (listen.stdio or listen.unix or listen.tcp or listen.grpc):
        listen.tcp = ["127.0.0.1:7878"]
    core = GatewayCore(service, config, loop_name=loop_name, gateway_id=args.gateway_id)
    try:
        if not await _started(core.bridge.start(), _stop_event()):
            return 0
        return await serve(service, listen, loop_name=loop_name, core=core)
    finally:
        await core.bridge.close()
