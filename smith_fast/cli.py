"""The ``smith-fast`` command: ``serve``, ``exec``, ``call``, ``ping``, ``health``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from . import __version__
from .errors import SmithFastError
from .logs import configure, get_logger

__all__ = ["main", "build_parser"]

log = get_logger("smith_fast.cli")


def _size(text: str) -> int:
    """``65536``, ``64k``, ``16M``, ``1G`` → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def listen_options(p: argparse.ArgumentParser) -> None:
    """The listener options of ``serve`` (``gateway`` takes the same)."""
    listen = p.add_argument_group("listeners")
    listen.add_argument("--stdio", action="store_true", help="speak the protocol on stdin/stdout (one session)")
    listen.add_argument("--unix", action="append", default=[], metavar="PATH", help="listen on a Unix socket, created mode 0600 (repeatable)")
    listen.add_argument(
        "--tcp", action="append", default=[], nargs="?", const="127.0.0.1:7878", metavar="HOST:PORT",
        help="listen on TCP (default 127.0.0.1:7878; port 0 picks a free one; repeatable)",
    )
    listen.add_argument(
        "--grpc", action="append", default=[], nargs="?", const="127.0.0.1:50051", metavar="HOST:PORT",
        help="serve gRPC SmithService and grpc.health.v1 (default 127.0.0.1:50051; port 0 picks a free one; repeatable)",
    )
    listen.add_argument("--tls-cert", metavar="PEM", help="certificate chain: gRPC listeners serve TLS (with --tls-key)")
    listen.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    listen.add_argument(
        "--metrics", action="append", default=[], nargs="?", const="127.0.0.1:9464", metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default 127.0.0.1:9464; repeatable)",
    )
    listen.add_argument("--allow-remote", action="store_true", help="allow TCP, gRPC and metrics on non-loopback addresses")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smith-fast",
        description="A fast backend for the Smith tool-execution protocol (v1 protobuf and v0 JSONL).",
    )
    parser.add_argument("--version", action="version", version=f"smith-fast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the service",
        description="Run the Smith service. Listeners can be combined; with none given it listens on "
        "TCP 127.0.0.1:7878. Logs go to stderr as JSON lines; stdout is only ever the protocol (--stdio).",
    )
    listen_options(serve)
    serve.add_argument("--protocol", choices=["auto", "v1", "v0"], default="auto", help="pin the wire protocol (default: detect per connection)")
    serve.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="event loop (default: uvloop when importable)")
    serve.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd(), help="tool workspace root (default: current directory)")
    serve.add_argument("--jsonl-backend", choices=["auto", "json", "orjson"], default="auto", help="JSON library for v0 (default: orjson when installed)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="stderr log level")
    limits = serve.add_argument_group("limits (sizes accept k/M/G suffixes)")
    limits.add_argument("--max-frame-size", type=_size, default=16 << 20, help="largest v1 frame or v0 line (default 16M)")
    limits.add_argument("--max-output", type=_size, default=64 << 20, help="output forwarded per shell command before truncation (default 64M)")
    limits.add_argument("--max-processes", type=int, default=64, help="shell commands running at once, service-wide (default 64)")
    limits.add_argument("--max-requests", type=int, default=1024, help="requests in flight per session (default 1024)")
    limits.add_argument("--timeout-ms", type=int, default=0, help="default command timeout; 0 = none (default 0)")
    limits.add_argument("--kill-grace", type=float, default=2.0, help="seconds between SIGTERM and SIGKILL (default 2)")
    limits.add_argument("--chunk-size", type=_size, default=64 << 10, help="largest ShellOutput chunk (default 64k)")
    limits.add_argument("--tool-max-output", type=_size, default=1 << 20, help="largest tool output (default 1M)")
    limits.add_argument("--max-connections", type=int, default=1024,
                        help="live socket connections and gRPC streams; one more gets RESOURCE_EXHAUSTED and is closed (default 1024)")
    limits.add_argument("--idle-timeout", type=float, default=300.0,
                        help="seconds without a message or a running request before a connection is closed; 0 = never (default 300)")
    limits.add_argument("--handshake-timeout", type=float, default=10.0,
                        help="seconds a new connection has to complete its handshake; 0 = forever (default 10)")
    limits.add_argument("--max-command-size", type=_size, default=1 << 20,
                        help="largest shell command (+ its env), tool arguments or plan goal; larger: RESOURCE_EXHAUSTED (default 1M)")
    security = serve.add_argument_group("security")
    security.add_argument("--token", metavar="TOKEN",
                          help="shared secret socket and gRPC peers must present in their handshake (default: $SMITH_TOKEN; "
                          "prefer the variable: arguments show in ps)")
    security.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                          help="let requests set this refused environment variable (LD_PRELOAD ...; see README, Security) (repeatable)")
    policy = serve.add_argument_group("hooks, recording, planning")
    policy.add_argument("--hook", action="append", default=[], type=pathlib.Path, metavar="FILE",
                        help="a .js or .rs hook every session runs first; clients cannot unload it (repeatable; see HOOKS.md)")
    policy.add_argument("--hook-failure", choices=["closed", "open"], default="closed",
                        help="a hook that throws, panics, times out or answers nonsense blocks (closed, default) or allows (open)")
    policy.add_argument("--record", type=pathlib.Path, metavar="DIR",
                        help="record every session to DIR (sessions granted `replay` are recorded even without it); see `smith-fast replay`")
    policy.add_argument("--planner", choices=["rules", "llm"], default="rules", help="how PlanCommands are planned (default rules: offline)")
    policy.add_argument("--planner-url", help="OpenAI-compatible chat-completions endpoint for --planner llm (key from SMITH_PLANNER_API_KEY)")
    policy.add_argument("--planner-model", help="model name for --planner llm")

    def client_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--connect", metavar="ADDR", help="unix:PATH, tcp:HOST:PORT or HOST:PORT (default: spawn `smith-fast serve --stdio`)")
        p.add_argument("--protocol", choices=["v1", "v0"], default="v1", help="wire protocol to speak (default v1)")
        token_option(p)

    def token_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--token", metavar="TOKEN", help="the service's shared secret (default: $SMITH_TOKEN)")

    ex = sub.add_parser("exec", help="run a shell command through a service", description="Run CMD through a Smith service, stream its output here and exit with its exit code (128+N when killed by signal N).")
    ex.add_argument("cmd", metavar="CMD", help="the shell command")
    ex.add_argument("--cwd", help="working directory on the service side")
    ex.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment variable (repeatable)")
    ex.add_argument("--shell", help="shell to run CMD with (default /bin/sh)")
    ex.add_argument("--timeout-ms", type=int, help="kill the command after this many milliseconds")
    client_options(ex)

    call = sub.add_parser("call", help="call a tool", description="Call TOOL with JSON arguments and print its JSON result. Exits 1 when the tool fails.")
    call.add_argument("tool", metavar="TOOL", help="tool name, e.g. fs.list (tools.list lists them)")
    call.add_argument("args", metavar="JSON", nargs="?", default="{}", help="arguments as a JSON object (default {})")
    call.add_argument("--timeout-ms", type=int, help="tool timeout")
    client_options(call)

    ping = sub.add_parser("ping", help="measure the round-trip time", description="Handshake with a service COUNT times and print each round-trip time.")
    ping.add_argument("-c", "--count", type=int, default=3, help="round trips (default 3)")
    client_options(ping)

    health = sub.add_parser(
        "health", help="check whether a service is serving",
        description="Ask a service whether it is serving and print its status (and, in-stream, its figures). "
        "grpc:HOST:PORT uses the standard grpc.health.v1 service; unix:PATH and tcp:HOST:PORT ask in-stream. "
        "Exits 0 when SERVING, 1 otherwise, 2 when the service cannot be reached.",
    )
    health.add_argument("address", metavar="ADDR", help="grpc:HOST:PORT, unix:PATH, tcp:HOST:PORT or HOST:PORT")
    health.add_argument("--service", default="", help="service name to ask about (default: the whole service)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)")
    health.add_argument("--tls-ca", metavar="PEM", help="root certificate to verify a gRPC service's TLS certificate with")
    token_option(health)
    from .replay import cli as replay_cli

    replay_cli.add_parser(sub)
    from .bench import cli as bench_cli

    bench_cli.add_parser(sub)
    from .nats import cli as nats_cli

    nats_cli.add_parsers(sub)
    return parser


def _pick_loop(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("smith-fast: --loop uvloop, but uvloop is not installed") from None
            log.warning("uvloop is not importable; using the stdlib asyncio loop")
        else:
            return uvloop.new_event_loop, "uvloop"
    return asyncio.new_event_loop, "asyncio"


def _run(coro: Coroutine[Any, Any, int], loop: str = "auto") -> int:
    factory, _ = _pick_loop(loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def client_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$SMITH_TOKEN``; an empty value means none."""
    return getattr(args, "token", None) or os.environ.get("SMITH_TOKEN") or None


def _serve(args: argparse.Namespace) -> int:
    from .service.config import Limits, ServiceConfig
    from .service.server import ListenConfig, ListenError, serve

    if args.token is not None and not args.token:
        print("smith-fast: --token must not be empty", file=sys.stderr)
        return 2
    limits = Limits(
        max_frame_size=args.max_frame_size,
        max_output=args.max_output,
        max_processes=args.max_processes,
        max_requests=args.max_requests,
        default_timeout_ms=args.timeout_ms,
        kill_grace=args.kill_grace,
        chunk_size=args.chunk_size,
        tool_max_output=args.tool_max_output,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        handshake_timeout=args.handshake_timeout,
        max_command_size=args.max_command_size,
    )
    config = ServiceConfig(
        root=args.root,
        protocol=args.protocol,
        jsonl_backend=args.jsonl_backend,
        limits=limits,
        hook_files=tuple(args.hook),
        hook_failure=args.hook_failure,
        record_dir=args.record,
        planner=args.planner,
        planner_url=args.planner_url,
        planner_model=args.planner_model,
        token=client_token(args),
        allow_env=frozenset(args.allow_env),
    )
    listen = ListenConfig(
        stdio=args.stdio,
        unix=args.unix,
        tcp=args.tcp,
        grpc=args.grpc,
        metrics=args.metrics,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        allow_remote=args.allow_remote,
    )
    if not (listen.stdio or listen.unix or listen.tcp or listen.grpc):
        listen.tcp = ["127.0.0.1:7878"]
    factory, loop_name = _pick_loop(args.loop)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(serve(config, listen, loop_name=loop_name))
    except (ListenError, OSError, SmithFastError) as exc:
        log.error("cannot start", extra={"fields": {"error": str(exc)}})
        print(f"smith-fast: {exc}", file=sys.stderr)
        return 2


async def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from .client import Client

    token = client_token(args)
    if args.connect:
        return await Client.connect(args.connect, protocol=args.protocol, token=token)
    return await Client.spawn("--log-level", "warning", protocol=args.protocol, token=token)


async def _exec(args: argparse.Namespace) -> int:
    from .client import SmithError

    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"smith-fast: --env {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        env[key] = value
    client = await _client(args)
    code = 1
    try:
        await client.handshake(["shell_exec"])
        out, err = sys.stdout, sys.stderr
        async for event in client.shell_exec(args.cmd, cwd=args.cwd, env=env, shell=args.shell, timeout_ms=args.timeout_ms):
            if event.WhichOneof("event_type") != "shell_output":
                continue
            so = event.shell_output
            if so.HasField("stdout"):
                out.write(so.stdout)
                out.flush()
            if so.HasField("stderr"):
                err.write(so.stderr)
                err.flush()
            if so.finished and so.HasField("exit_code"):
                code = so.exit_code if so.exit_code >= 0 else 128 - so.exit_code
    except SmithError as exc:
        print(f"smith-fast: {exc}", file=sys.stderr)
        code = code if code != 0 else 1
    finally:
        await client.close()
    return code


async def _call(args: argparse.Namespace) -> int:
    from .client import SmithError

    try:
        parsed = json.loads(args.args)
    except json.JSONDecodeError as exc:
        print(f"smith-fast: arguments are not valid JSON: {exc}", file=sys.stderr)
        return 2
    client = await _client(args)
    try:
        await client.handshake([])
        result = await client.call_tool(args.tool, parsed, timeout_ms=args.timeout_ms)
    except SmithError as exc:
        print(f"smith-fast: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()
    if not result.success:
        print(f"smith-fast: {args.tool} failed: {result.error}", file=sys.stderr)
        return 1
    text = result.result.decode()
    try:
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pass
    print(text)
    return 0


async def _ping(args: argparse.Namespace) -> int:
    client = await _client(args)
    try:
        await client.handshake([])
        info = dict(client.ready.service_info) if client.ready else {}
        print(f"connected: {info.get('service_name', '?')} {info.get('version', '')} protocol v{client.ready.version if client.ready else '?'}, "
              f"implementation {info.get('implementation', '?')}, loop {info.get('event_loop', '?')}")
        for i in range(args.count):
            rtt = await client.ping()
            print(f"round trip {i + 1}: {rtt * 1e6:.0f} us")
    finally:
        await client.close()
    return 0


async def _health(args: argparse.Namespace) -> int:
    from .client import Client, parse_address

    kind, target = parse_address(args.address)
    try:
        if kind == "grpc":
            status, metrics = await asyncio.wait_for(_grpc_health(target, args), args.timeout)
        else:
            status, metrics = await asyncio.wait_for(_stream_health(Client, args), args.timeout)
    except (OSError, TimeoutError, ConnectionError) as exc:
        print(f"smith-fast: {args.address}: cannot reach the service: {exc or type(exc).__name__}", file=sys.stderr)
        return 2
    except _Unreachable as exc:
        print(f"smith-fast: {args.address}: {exc}", file=sys.stderr)
        return 2
    print(status)
    for key in sorted(metrics):
        print(f"  {key}: {metrics[key]}")
    return 0 if status == "SERVING" else 1


class _Unreachable(Exception):
    pass


async def _grpc_health(target: str, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    import grpc
    from grpc import aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            channel = aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=f.read()))
    else:
        channel = aio.insecure_channel(target)
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = await stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # the standard service's answer for an unknown name
                return "SERVICE_UNKNOWN", {}
            raise _Unreachable(f"{exc.code().name}: {exc.details()}") from None
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status), {}


async def _stream_health(client_cls, args: argparse.Namespace) -> tuple[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    from .client import ConnectionClosed, SmithError
    from .pb import smith_pb2 as pb

    client = await client_cls.connect(args.address, token=client_token(args))
    try:
        await client.handshake([], accept=["health"])
        if "health" not in client.accepted:
            raise _Unreachable("the service does not answer in-stream health checks")
        response = await client.health_check(args.service)
    except (SmithError, ConnectionClosed) as exc:
        raise _Unreachable(str(exc)) from None
    finally:
        await client.close()
    name = pb.HealthCheckResponse.ServingStatus.Name(response.status).removeprefix("SERVING_STATUS_")
    return name, dict(response.metrics)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(getattr(args, "log_level", os.environ.get("SMITH_FAST_LOG_LEVEL", "warning")))
    if args.command == "serve":
        return _serve(args)
    if args.command in ("worker", "gateway"):
        from .nats import cli as nats_cli

        return nats_cli.run(args)
    if args.command == "replay":
        from .replay import cli as replay_cli

        return replay_cli.run(args)
    if args.command == "bench":
        from .bench import cli as bench_cli

        return bench_cli.run(args)
    runner = {"exec": _exec, "call": _call, "ping": _ping, "health": _health}[args.command]
    try:
        return _run(runner(args))
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"smith-fast: {exc}", file=sys.stderr)
        return 2
