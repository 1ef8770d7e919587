"""The ``smith-fast`` command: ``serve``, ``exec``, ``call``, ``ping``, ``health``, ``ps``, ``attach``, ``kill``,
``checkpoint``, ``restore``, ``diff``, ``undo`` (and ``replay``, ``worker``, ``gateway`` from their packages).

It behaves like the Unix tools it sits beside: ``exec`` takes the rest of the line as the command
(``smith-fast exec ls -l``, as ``ssh host ls -l``), a closed stdout ends it quietly, user errors are one
``smith-fast: ...`` line naming the address or file (never a traceback), and every ``--help`` ends with
examples.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import SmithFastError
from .logs import configure
from .options import (ADDRESS_FORMS, DURATIONS, SIZES, UNITS, HelpFormatter, current_directory, error_text, parse_duration,
                      secret)
from .startup import add_listen_options, add_service_options, enter_workspaces, listen_config, missing_package, pick_loop, run_service, service_config

if TYPE_CHECKING:
    from .client import Client, RemoteProcess

__all__ = ["main", "build_parser", "client_token"]

SIGPIPE_EXIT = 128 + 13  # what a shell reports for a writer killed by SIGPIPE (`seq 1000000 | head -2`)
CONNECT_TIMEOUT = 2.0

EXAMPLES = {
    "serve": """\
  smith-fast serve --unix /run/smith.sock                 # Unix socket, mode 0600
  smith-fast serve --tcp 127.0.0.1:7878 --grpc --metrics  # v0/v1 on TCP, gRPC, Prometheus
  SMITH_TOKEN=s3cret smith-fast serve --tcp 0.0.0.0:7878 --allow-remote --root /srv/work
  smith-fast serve --stdio --timeout 30s --max-output 8M  # one session on stdin/stdout""",
    "exec": """\
  smith-fast exec --connect unix:/run/smith.sock 'make -j2 2>&1 | tail'
  tar c src | smith-fast exec 'tar t | wc -l'             # stdin is forwarded; output is byte-exact
  smith-fast exec -t python3                              # interactive, on a pseudo-terminal (as ssh -t)
  smith-fast exec --connect 127.0.0.1:7878 --template py --checkpoint --keep-session make  # prints checkpoint:, session:""",
    "call": """\
  smith-fast call tools.list
  smith-fast call --connect unix:/run/smith.sock fs.read '{"path": "README.md"}'
  smith-fast call --timeout 500ms fs.list '{"path": "."}'""",
    "ping": """\
  smith-fast ping --connect unix:/run/smith.sock
  smith-fast ping --connect grpc:127.0.0.1:50051 -c 10""",
    "health": """\
  smith-fast health --connect grpc:127.0.0.1:50051
  smith-fast health unix:/run/smith.sock --service smith.v1.SmithService
  smith-fast health --connect 127.0.0.1:7878 --timeout 1s && echo up""",
}


def _command(sub: Any, name: str, *, help: str, description: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog="examples:\n" + EXAMPLES[name],
        formatter_class=HelpFormatter, allow_abbrev=False,
    )
    return parser


def _address_option(p: argparse._ActionsContainer, default: str) -> None:
    p.add_argument("--connect", metavar="ADDR", help=f"where the service listens: {ADDRESS_FORMS} (default: {default})")


def _token_option(p: argparse._ActionsContainer) -> None:
    p.add_argument("--token", metavar="TOKEN", help="the service's shared secret (default: $SMITH_TOKEN; prefer the variable: arguments show in ps)")


def _client_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("connection")
    _address_option(group, "spawn `smith-fast serve --stdio`")
    group.add_argument("--protocol", choices=["v1", "v0"], default="v1", help="wire protocol to speak (default v1; gRPC is v1)")
    group.add_argument("--connect-timeout", type=parse_duration, default=CONNECT_TIMEOUT, metavar="DURATION",
                       help=f"how long the service at --connect has to answer the handshake (default {CONNECT_TIMEOUT:g}s)")
    _token_option(group)


def _timeout_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--timeout", type=UNITS["milliseconds"].parse, dest="timeout_ms", metavar="DURATION",
                   help=f"stop the {what} after this long (default: the service's --timeout)")
    p.add_argument("--timeout-ms", type=int, dest="timeout_ms", metavar="MS", help="the same as --timeout, in whole milliseconds (older spelling)")


# The commands this module defines itself; the others come from their packages (replay, nats, ...).
OWN_COMMANDS = frozenset({"serve", "exec", "call", "ping", "health"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` one of :data:`OWN_COMMANDS` (the line's command
    word), without the other packages' commands: importing them to describe their options would cost
    every ``serve --mcp`` start tens of milliseconds, for commands that line does not run."""
    parser = argparse.ArgumentParser(
        prog="smith-fast", allow_abbrev=False,
        description=f"A fast backend for the Smith tool-execution protocol (v1 protobuf and v0 JSONL). {DURATIONS}; {SIZES}.",
    )
    parser.add_argument("--version", action="version", version=f"smith-fast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(
        sub, "serve", help="run the service",
        description="Run the Smith service. Listeners can be combined; with none given it listens on "
        "TCP 127.0.0.1:7878. Logs go to stderr as JSON lines; stdout is only ever the protocol (--stdio). "
        f"{DURATIONS}; {SIZES}.",
    )
    add_listen_options(serve)
    add_service_options(serve, "serve")

    ex = _command(
        sub, "exec", help="run a shell command through a service",
        description="Run COMMAND through a Smith service, stream its output here and exit with its exit code "
        "(128+N when killed by signal N). As with `ssh host ls -l`, everything after the options is the command: "
        "its words are joined with spaces and run by the service's shell, so `exec ls -l` and `exec 'ls -l'` are "
        "the same; options after COMMAND belong to it (put `--` first when COMMAND itself starts with -). "
        "When stdin is not a terminal it is forwarded to COMMAND (else COMMAND reads /dev/null, unless -t); "
        "output is passed through byte for byte. Ctrl-C cancels COMMAND on the service (exit 130); with -t it "
        f"goes to COMMAND, as every key does. {DURATIONS}.",
    )
    ex.add_argument("-t", "--tty", action="store_true",
                    help="run COMMAND on a pseudo-terminal: this terminal in raw mode, its size and resizes forwarded "
                    "(as ssh -t, docker exec -it); for python3, vi, read -p ...")
    ex.add_argument("-d", "--detach", "--background", dest="detach", action="store_true",
                    help="run COMMAND as a background process of the service and print its id (as docker run -d); "
                    "it outlives this command: smith-fast ps, attach ID, kill ID (needs --connect)")
    ws = ex.add_argument_group("workspaces (a service started with --workspaces; PROTOCOL.md, \"Workspaces\")")
    ws.add_argument("--template", metavar="NAME", help="the session's workspace is a copy of this template (default: the service's)")
    ws.add_argument("--fork", metavar="CHECKPOINT", help="the session's workspace starts as this checkpoint instead")
    ws.add_argument("--checkpoint", action="store_true",
                    help="after COMMAND, freeze the workspace as a checkpoint and print `checkpoint: ID` on stderr (for --fork)")
    ws.add_argument("--keep-session", action="store_true",
                    help="leave the session parked instead of ending it and print `session: HANDLE` (and `request: ID`) on stderr, "
                    "for checkpoint, restore, diff and undo --session HANDLE (it waits for the service's --resume-window)")
    ws.add_argument("--session", metavar="HANDLE",
                    help="run COMMAND in this parked session (what --keep-session printed) instead of a new one; it is parked again")
    ex.add_argument("--cwd", help="working directory on the service side")
    ex.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment variable (repeatable)")
    ex.add_argument("--shell", help="shell to run COMMAND with (default /bin/sh)")
    _timeout_options(ex, "command")
    _client_options(ex)
    ex.add_argument("cmd", metavar="COMMAND ...", nargs=argparse.REMAINDER, help="the shell command")

    call = _command(sub, "call", help="call a tool",
                    description=f"Call TOOL with JSON arguments and print its JSON result. Exits 1 when the tool fails, 2 on usage "
                    f"and connection errors. {DURATIONS}.")
    call.add_argument("tool", metavar="TOOL", help="tool name, e.g. fs.list (tools.list lists them)")
    call.add_argument("args", metavar="JSON", nargs="?", default="{}", help="arguments as a JSON object (default {})")
    _timeout_options(call, "tool")
    _client_options(call)

    ping = _command(sub, "ping", help="measure the round-trip time", description="Handshake with a service COUNT times and print each round-trip time.")
    ping.add_argument("-c", "--count", type=int, default=3, help="round trips (default 3)")
    _client_options(ping)

    health = _command(
        sub, "health", help="check whether a service is serving",
        description="Ask a service whether it is serving and print its status (and, in-stream, its figures). "
        "grpc:HOST:PORT uses the standard grpc.health.v1 service; unix:PATH and tcp:HOST:PORT ask in-stream. "
        f"Exits 0 when SERVING, 1 otherwise, 2 when the service cannot be reached. {DURATIONS}.",
    )
    health.add_argument("address", metavar="ADDR", nargs="?", help="the same as --connect ADDR")
    _address_option(health, "none: an address is needed")
    health.add_argument("--service", default="", help="service name to ask about (default: the whole service)")
    health.add_argument("--timeout", type=parse_duration, default=5.0, metavar="DURATION", help="how long to wait for an answer (default 5s)")
    health.add_argument("--tls-ca", metavar="PEM", help="root certificate to verify a gRPC service's TLS certificate with")
    _token_option(health)
    if command in OWN_COMMANDS:
        return parser
    from .replay import cli as replay_cli

    replay_cli.add_parser(sub)
    from .nats import cli as nats_cli

    nats_cli.add_parsers(sub)
    from .nats import auth as nats_auth

    nats_auth.add_parser(sub)
    from . import background_cli, workspace_cli

    background_cli.add_parsers(sub, _client_options)
    workspace_cli.add_parsers(sub, _client_options)
    return parser


def client_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$SMITH_TOKEN``; an empty value means none."""
    return secret(getattr(args, "token", None))


def _serve(args: argparse.Namespace) -> int:
    try:
        config = service_config(args, "serve")
    except ValueError as exc:
        print(f"smith-fast serve: {exc}", file=sys.stderr)
        return 2
    listen = listen_config(args)
    if not enter_workspaces(config, "serve"):  # before the import below: quickjs starts a thread when imported
        return 2
    if "hooks_rust" in (config.capabilities or ()):  # off by default: then rustc is never asked
        from .hooks.rust_build import start_rustc_version

        start_rustc_version()  # answers while the service is imported: its capabilities need it
    from .service.server import serve

    _started()
    return run_service("serve", lambda loop_name: serve(config, listen, loop_name=loop_name), args.loop)


async def _client(args: argparse.Namespace) -> Client:
    """Connected and handshaken: with ``--connect`` the service must answer within ``--connect-timeout``."""
    from .client import Client

    token = client_token(args)
    if args.connect:
        # resume: a dropped connection (a restarting gateway) is reconnected and carried on
        return await Client.connect(args.connect, protocol=args.protocol, token=token, resume=True,
                                    template=getattr(args, "template", None), fork=getattr(args, "fork", None))
    current_directory("--connect", "ADDR")  # the service started here serves it: said once, before it starts and refuses
    return await Client.spawn("--log-level", "warning", protocol=args.protocol, token=token)


async def _handshake(client: Client, args: argparse.Namespace, capabilities: list[str], **kwargs: Any) -> None:
    timeout = getattr(args, "connect_timeout", CONNECT_TIMEOUT) if client.address is not None else None
    await client.handshake(capabilities, timeout=timeout, **kwargs)


async def _exec(args: argparse.Namespace) -> int:
    from .client import SmithError

    words = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not words:
        print("smith-fast exec: no command given (usage: smith-fast exec [OPTIONS] COMMAND ...)", file=sys.stderr)
        return 2
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"smith-fast exec: --env {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        env[key] = value
    if args.detach and not args.connect:
        print("smith-fast exec: -d needs --connect ADDR: a background process lives in a running service "
              "(without --connect, exec runs a service of its own that ends with it)", file=sys.stderr)
        return 2
    refused = _workspace_refusal(args)
    if refused:
        print(f"smith-fast exec: {refused}", file=sys.stderr)
        return 2
    client = await _client(args)
    keep = args.keep_session or args.session is not None
    parked = False
    try:
        if args.session is not None:
            from . import workspace_cli

            await workspace_cli.resume(client, args.session, args.connect_timeout)
        elif _uses_workspace(args):
            # changes: the session records what each request changed, so that `undo` can put it back
            await _handshake(client, args, ["shell_exec", "workspaces"], accept=["changes"] if keep else [])
        else:
            await _handshake(client, args, ["shell_exec"])
        if args.detach:
            print(await client.background(" ".join(words), cwd=args.cwd, env=env,
                                          shell=args.shell, timeout_ms=args.timeout_ms))
            return 0
        code = await _exec_command(client, " ".join(words), args, env)
        if args.checkpoint and code < 128:  # not when it was interrupted (Ctrl-C, SIGTERM)
            print(f"checkpoint: {await client.checkpoint()}", file=sys.stderr)
        if keep:
            from . import workspace_cli

            await workspace_cli.park(client)
            parked = True
        return code
    except SmithError as exc:
        print(f"smith-fast: {error_text(exc)}", file=sys.stderr)
        return 1
    finally:
        if not parked:
            await client.close()  # on a closed stdout too: the service then stops the command


def _uses_workspace(args: argparse.Namespace) -> bool:
    return bool(args.template or args.fork or args.checkpoint or args.keep_session)


def _workspace_refusal(args: argparse.Namespace) -> str | None:
    """Why exec's workspace options cannot be used as given (a sentence), or None."""
    used = [flag for flag, on in (("--template", args.template), ("--fork", args.fork), ("--checkpoint", args.checkpoint),
                                  ("--keep-session", args.keep_session), ("--session", args.session)) if on]
    if not used:
        return None
    if not args.connect:
        return f"{used[0]} needs --connect ADDR: workspaces live in a running service started with --workspaces"
    if args.protocol != "v1":
        return f"{used[0]} needs protocol v1 (workspaces are v1 only)"
    if args.template and args.fork:
        return "give --template or --fork, not both: a fork's workspace is a copy of its checkpoint"
    if args.session and (args.template or args.fork):
        return "--session runs in an existing session, whose workspace is already made: drop --template/--fork"
    if args.detach and (args.keep_session or args.session or args.checkpoint):
        return "-d does not go with --keep-session, --session or --checkpoint (a background process outlives its request)"
    return None


_STOP_SIGNALS: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


async def _exec_command(client: Client, command: str, args: argparse.Namespace, env: dict[str, str]) -> int:
    """Run ``command`` (stdin forwarded unless it is a terminal; ``-t``: on a pty), mirror its output."""
    from .client import SmithError
    from .terminal import raw_mode, window_size

    loop = asyncio.get_running_loop()
    stdin_tty = os.isatty(0)
    forward = args.tty or not stdin_tty
    pty = window_size(0, 1, 2) if args.tty else None
    proc = await client.start(command, stdin=forward, pty=pty, cwd=args.cwd, env=env, shell=args.shell, timeout_ms=args.timeout_ms)
    if args.keep_session or args.session is not None:
        print(f"request: {proc.request_id}", file=sys.stderr)  # what `smith-fast undo` names
    stopped: list[int] = []

    def stop(sig: int) -> None:  # Ctrl-C (without -t), SIGTERM, SIGHUP: cancel it on the service
        stopped.append(sig)
        proc.cancel()

    handled = [sig for sig in _STOP_SIGNALS if not (args.tty and sig == signal.SIGINT)]
    for sig in handled:
        loop.add_signal_handler(sig, stop, sig)
    if pty is not None:
        loop.add_signal_handler(signal.SIGWINCH, lambda: proc.resize(*window_size(0, 1, 2)))
    feeder: threading.Thread | None = None
    with raw_mode(0) if args.tty and stdin_tty else contextlib.nullcontext(False) as raw:
        if raw:  # keys as they are typed, no flow control needed
            loop.add_reader(0, _typed, proc)
        elif forward:
            feeder = threading.Thread(target=_feed_stdin, args=(loop, proc), name="smith-fast-stdin", daemon=True)
            feeder.start()
        try:
            code = await _mirror(proc)
        except SmithError:
            if stopped:
                code = -1
            else:
                raise
        finally:
            if raw:
                loop.remove_reader(0)
            for sig in handled:
                loop.remove_signal_handler(sig)
            if pty is not None:
                loop.remove_signal_handler(signal.SIGWINCH)
    if stopped:
        print(f"smith-fast: {_STOP_SIGNALS[stopped[0]]}", file=sys.stderr)
        return 128 + stopped[0]
    return code if code >= 0 else 128 - code


async def _mirror(proc: RemoteProcess) -> int:
    """Its output to ours, byte for byte, as it comes; then its exit code."""
    out, err = sys.stdout.buffer, sys.stderr.buffer
    async for chunk in proc:
        stream = out if chunk.stream == "stdout" else err
        stream.write(chunk.data)
        stream.flush()
    return await proc.wait()


def _typed(proc: RemoteProcess) -> None:
    """What was typed on the raw terminal, to the remote terminal."""
    try:
        data = os.read(0, 4096)
    except OSError:
        data = b""
    if data:
        proc.write(data)


def _feed_stdin(loop: asyncio.AbstractEventLoop, proc: RemoteProcess) -> None:
    """A thread: stdin (a pipe, a file: anything ``os.read`` reads, which the loop cannot watch) to
    the command, each piece after the previous ones were taken (``RemoteProcess.send``), then EOF."""
    try:
        while data := os.read(0, 1 << 16):
            asyncio.run_coroutine_threadsafe(proc.send(data), loop).result()
        loop.call_soon_threadsafe(proc.close_stdin)
    except (OSError, RuntimeError, concurrent.futures.CancelledError):  # stdin failed, or we are ending
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(proc.close_stdin)


async def _call(args: argparse.Namespace) -> int:
    from .client import SmithError

    try:
        parsed = json.loads(args.args)
    except json.JSONDecodeError as exc:
        print(f"smith-fast call: the arguments are not valid JSON ({exc}): {args.args!r}", file=sys.stderr)
        return 2
    client = await _client(args)
    try:
        await _handshake(client, args, [])
        result = await client.call_tool(args.tool, parsed, timeout_ms=args.timeout_ms)
    except SmithError as exc:
        print(f"smith-fast: {error_text(exc)}", file=sys.stderr)
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
        await _handshake(client, args, [])
        info = dict(client.ready.service_info) if client.ready else {}
        print(f"connected: {info.get('service_name', '?')} {info.get('version', '')} protocol v{client.ready.version if client.ready else '?'}, "
              f"implementation {info.get('implementation', '?')}, loop {info.get('event_loop', '?')}")
        for i in range(args.count):
            rtt = await client.ping()
            print(f"round trip {i + 1}: {rtt * 1e6:.0f} us")
    finally:
        await client.close()
    return 0


class _Unreachable(Exception):
    pass


async def _health(args: argparse.Namespace) -> int:
    from .client import ConnectError, parse_address

    if args.address and args.connect and args.address != args.connect:
        print("smith-fast health: give the address once (ADDR or --connect ADDR)", file=sys.stderr)
        return 2
    address = args.connect or args.address
    if not address:
        print(f"smith-fast health: which service? give --connect ADDR ({ADDRESS_FORMS})", file=sys.stderr)
        return 2
    kind, target = parse_address(address)
    try:
        if kind == "grpc" and isinstance(target, str):  # a grpc target is always the HOST:PORT text
            status, metrics = await asyncio.wait_for(_grpc_health(address, target, args), args.timeout)
        else:
            status, metrics = await asyncio.wait_for(_stream_health(address, args), args.timeout)
    except ConnectError as exc:
        print(f"smith-fast: {exc}", file=sys.stderr)
        return 2
    except TimeoutError:
        print(f"smith-fast: {address}: no answer within {args.timeout:g}s", file=sys.stderr)
        return 2
    except (OSError, _Unreachable) as exc:
        print(f"smith-fast: {address}: {exc}", file=sys.stderr)
        return 2
    print(status)
    for key in sorted(metrics):
        print(f"  {key}: {metrics[key]}")
    return 0 if status == "SERVING" else 1


async def _grpc_health(address: str, target: str, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    import grpc
    from grpc import aio
    from grpc_health.v1 import health_pb2

    from .client import ConnectError

    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            channel = aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=f.read()))
    else:
        channel = aio.insecure_channel(target)
    async with channel:
        # What grpc_health's HealthStub does, spelled out: its stub (types-grpcio) declares no methods.
        check: aio.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse] = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        try:
            response = await check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # the standard service's answer for an unknown name
                return "SERVICE_UNKNOWN", {}
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise ConnectError(f"cannot connect to {address}: {exc.details()} (is smith-fast serve --grpc running there?)") from None
            raise _Unreachable(f"{exc.code().name}: {exc.details()}") from None
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status), {}


async def _stream_health(address: str, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    from .client import Client, ConnectionClosed, NotASmithService, SmithError
    from .pb import smith_pb2 as pb

    client = await Client.connect(address, token=client_token(args))
    try:
        await client.handshake([], accept=["health"], timeout=min(args.timeout, CONNECT_TIMEOUT))
        if "health" not in client.accepted:
            raise _Unreachable("the service does not answer in-stream health checks")
        response = await client.health_check(args.service)
    except NotASmithService:
        raise
    except (SmithError, ConnectionClosed) as exc:
        raise _Unreachable(str(exc)) from None
    finally:
        await client.close()
    name = pb.HealthCheckResponse.ServingStatus.Name(response.status).removeprefix("SERVING_STATUS_")
    return name, dict(response.metrics)


_CLIENTS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "exec": _exec, "call": _call, "ping": _ping, "health": _health,
}


def _background_command(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    from . import background_cli

    return background_cli.run(args, _client, _handshake, _feed_stdin, _mirror)


for _name in ("ps", "attach", "kill"):
    _CLIENTS[_name] = _background_command


def _workspace_command(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    from . import workspace_cli

    return workspace_cli.run(args, _client, _handshake)


for _name in ("checkpoint", "restore", "diff", "undo"):
    _CLIENTS[_name] = _workspace_command


def _started() -> None:
    """The end of a start from ``smith_fast.__main__``, which turned the garbage collector off for
    it: what the start made is frozen out of the collector, which runs again. A no-op when the
    collector is on (``main`` called in another program, a test)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)  # its start goes on to the service's imports
    _started()
    if args.command in ("worker", "gateway"):
        from .nats import cli as nats_cli

        return nats_cli.run(args)
    if args.command == "nats-auth":
        from .nats import auth as nats_auth

        return nats_auth.run(args)
    if args.command == "replay":
        from .replay import cli as replay_cli

        return replay_cli.run(args)
    factory, _ = pick_loop("auto")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_CLIENTS[args.command](args))


def _quiet_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's last flush of a closed pipe says nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(next((w for w in words if not w.startswith("-")), None)).parse_args(argv)
    configure(getattr(args, "log_level", os.environ.get("SMITH_FAST_LOG_LEVEL", "warning")))
    try:
        code = _dispatch(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as seq does
        _quiet_stdout()
        return SIGPIPE_EXIT
    except KeyboardInterrupt:
        return 130
    except ImportError as exc:  # a package the command needs is not installed: which, and how to get it
        print(f"smith-fast {args.command}: {missing_package(exc)}", file=sys.stderr)
        return 2
    except (SmithFastError, OSError, ValueError) as exc:  # connection and address errors: one line, no traceback
        print(f"smith-fast: {error_text(exc)}", file=sys.stderr)
        return 2
