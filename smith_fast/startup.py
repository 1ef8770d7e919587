"""The command-line side of ``serve``, ``worker`` and ``gateway``: their shared options, the event
loop, the config they build, and one way to run them and report a failed start.

``smith_fast.cli`` and ``smith_fast.nats.cli`` both use this module; neither imports the other.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .errors import SmithFastError
from .logs import get_logger
from .options import add_options, values
from .service.config import Limits, ServiceConfig

if TYPE_CHECKING:
    from .service.server import ListenConfig

__all__ = [
    "add_listen_options",
    "add_process_options",
    "add_service_options",
    "listen_config",
    "missing_package",
    "pick_loop",
    "run_service",
    "service_config",
]

log = get_logger("smith_fast.startup")

DEFAULT_TCP = "127.0.0.1:7878"  # the original Smith gateway's address

# The third-party modules smith-fast imports → (the distribution that installs it, the extra that
# brings it in; None: a dependency of every install). tests/test_packaging.py checks it against the
# wheel's metadata, so an extra's package cannot be missing here.
PACKAGES: dict[str, tuple[str, str | None]] = {
    "nats": ("nats-py", "nats"),
    "nkeys": ("nkeys", "nats"),
    "mcp": ("mcp", "mcp"),
    "opentelemetry.sdk": ("opentelemetry-sdk", "tracing"),
    "opentelemetry.exporter.otlp": ("opentelemetry-exporter-otlp", "tracing"),
    "opentelemetry": ("opentelemetry-api", None),
    "orjson": ("orjson", None),
    "httptools": ("httptools", None),
    "google.protobuf": ("protobuf", None),
    "grpc_health": ("grpcio-health-checking", None),
    "grpc": ("grpcio", None),
    "prometheus_client": ("prometheus_client", None),
    "uvloop": ("uvloop", None),
    "jsonschema": ("jsonschema", None),
    "quickjs": ("quickjs-ng", None),
}


def missing_package(exc: ImportError) -> str:
    """What to tell an operator whose command failed to import a module: the package to install and
    the extra that installs it (or, for a dependency of every install, that the install is broken)."""
    name = exc.name or ""
    module = max((m for m in PACKAGES if name == m or name.startswith(m + ".")), key=len, default=None)
    if module is None:
        return f"cannot start: {exc}"
    package, extra = PACKAGES[module]
    if extra is not None:
        return f"needs the {package} package, which is not installed: pip install 'smith-fast[{extra}]' ({exc})"
    return (f"cannot start: {exc}: {package} is a dependency of smith-fast, so this installation is incomplete; "
            f"install it again: pip install --force-reinstall smith-fast")


def add_listen_options(p: argparse.ArgumentParser) -> None:
    """The listener options of ``serve`` and ``gateway``."""
    listen = p.add_argument_group("listeners (with none given: TCP 127.0.0.1:7878)")
    listen.add_argument("--stdio", action="store_true", help="speak the protocol on stdin/stdout (one session)")
    listen.add_argument("--unix", action="append", default=[], metavar="PATH", help="listen on a Unix socket, created mode 0600 (repeatable)")
    listen.add_argument(
        "--tcp", action="append", default=[], nargs="?", const=DEFAULT_TCP, metavar="HOST:PORT",
        help=f"listen on TCP (default {DEFAULT_TCP}; port 0 picks a free one; repeatable)",
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
    listen.add_argument(
        "--mcp", action="store_true",
        help="speak MCP (Model Context Protocol) on stdin/stdout, as MCP clients spawn their servers (one session)",
    )
    listen.add_argument(
        "--mcp-http", action="append", default=[], nargs="?", const="127.0.0.1:8765", metavar="HOST:PORT",
        help="serve MCP over Streamable HTTP at http://HOST:PORT/mcp (default 127.0.0.1:8765; port 0 picks a free one; repeatable)",
    )
    listen.add_argument("--allow-remote", action="store_true", help="allow TCP, gRPC, MCP HTTP and metrics on non-loopback addresses")


def add_process_options(p: argparse.ArgumentParser) -> None:
    """``--loop`` and ``--log-level``."""
    group = p.add_argument_group("process")
    group.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="event loop (default auto: uvloop when importable)")
    group.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="level of the JSON log lines on stderr (default info)")


def add_service_options(p: argparse.ArgumentParser, command: str) -> None:
    """The ``ServiceConfig`` and ``Limits`` options ``command`` takes, and ``--loop``/``--log-level``."""
    groups: dict[str, Any] = {}
    add_options(p, ServiceConfig, command, groups)
    add_options(p, Limits, command, groups)
    add_process_options(p)


def service_config(args: argparse.Namespace, command: str, **overrides: Any) -> ServiceConfig:
    """The config the options of :func:`add_service_options` describe.

    ``overrides`` set ``Limits`` fields the command computes itself (``worker``'s ``max_requests``).

    Raises:
        ValueError: ``--token ''``, a ``--root`` that is not a directory.
    """
    limits = Limits(**{**values(args, Limits, command), **overrides})
    config = ServiceConfig(limits=limits, **values(args, ServiceConfig, command))
    if "root" in values(args, ServiceConfig, command) and not config.root.is_dir():
        raise ValueError(f"--root {config.root}: no such directory")
    if config.workspaces is not None:
        config.template_map()  # a wrong --template fails the start, not a session
    return config


def listen_config(args: argparse.Namespace) -> ListenConfig:
    """The ``ListenConfig`` of :func:`add_listen_options`; TCP 127.0.0.1:7878 when none is given."""
    from .service.server import ListenConfig  # the listeners' modules only when a service starts

    listen = ListenConfig(
        stdio=args.stdio, unix=args.unix, tcp=args.tcp, grpc=args.grpc, metrics=args.metrics,
        tls_cert=args.tls_cert, tls_key=args.tls_key, allow_remote=args.allow_remote,
        mcp=args.mcp, mcp_http=args.mcp_http,
    )
    if not (listen.stdio or listen.unix or listen.tcp or listen.grpc or listen.mcp or listen.mcp_http):
        listen.tcp = [DEFAULT_TCP]
    return listen


def pick_loop(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """``auto``/``uvloop``/``asyncio`` → (loop factory, the name of the loop it makes).

    Raises:
        SystemExit: ``uvloop`` asked for and not installed.
    """
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


def run_service(command: str, main: Callable[[str], Coroutine[Any, Any, int]], loop: str) -> int:
    """Run ``main(loop_name)`` on the chosen loop until it returns; 2 when it cannot start.

    A failed start is reported once, as one plain line on stderr that names the command.
    """
    factory, loop_name = pick_loop(loop)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main(loop_name))
    except ImportError as exc:
        print(f"smith-fast {command}: {missing_package(exc)}", file=sys.stderr)
        return 2
    except (OSError, SmithFastError, ValueError) as exc:  # ListenError and StartupError among them
        print(f"smith-fast {command}: cannot start: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def enter_workspaces(config: ServiceConfig, command: str) -> bool:
    """With ``--workspaces``: move this process into its own user and mount namespace now, while it
    is single-threaded (:func:`smith_fast.workspaces.namespace.enter`). False (said on stderr) when
    the kernel does not allow it."""
    if config.workspaces is None:
        return True
    from . import childguard, containment
    from .workspaces import namespace

    # Made now, as the user the service was started as: inside the namespace its uid no longer
    # overrides permissions (host root's is another there), and where its cgroup is a hierarchy's
    # root (0555, as in many containers) it could not make its cells' parents, and commands would
    # run with the v1 memory limit alone: no pids.max, no cgroup.kill, no CPU accounting. The child
    # guard, started now outside the namespace, removes them at the end, which it no longer can
    # (told now: a start that fails after this point, as --sandbox off does, leaves them too).
    containment.available(keep=True)
    childguard.start()
    childguard.remove_at_end(containment.cell_parents())  # (nothing without a guard running)
    try:
        namespace.enter(config.workspaces, tuple(config.template_map().values()))
    except (OSError, SmithFastError) as exc:
        print(f"smith-fast {command}: cannot start: --workspaces {config.workspaces}: {exc}", file=sys.stderr)
        return False
    return True

