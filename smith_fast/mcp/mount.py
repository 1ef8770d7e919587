"""``serve --mcp-server NAME=COMMAND`` / ``NAME=URL``: another MCP server's tools in the registry.

Each mounted server's tools are registered as ``NAME.TOOL`` (their input schemas as they are), so
they are listed by ``tools.list`` and the MCP front and called as ordinary ``ToolCall`` requests,
with hooks applied to the calls and their results. A command is spawned and spoken to over stdio,
a URL over Streamable HTTP; the client is the official MCP SDK's (``pip install
'smith-fast[mcp]'``). A server is supervised: its connection is probed with ``ping`` every
:data:`PROBE_INTERVAL` s, and when it dies or stops answering it is started (connected) again
with exponential backoff from :data:`BACKOFF_MIN` to :data:`BACKOFF_MAX` s (a server that does not come up at
start-up fails the start instead); calls meanwhile fail
with a message that says so. Tools it lists after a restart are added; the registry is otherwise
left as it was (a tool that disappeared fails when called).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
from collections.abc import Sequence
from typing import Any

from ..service.lifecycle import StartupError
from ..logs import get_logger
from ..tools import Tool, ToolContext, ToolRegistry

__all__ = ["MountedServer", "MountSpec", "parse_mount", "mount_all", "PROBE_INTERVAL", "BACKOFF_MIN", "BACKOFF_MAX"]

log = get_logger("smith_fast.mcp.mount")

PROBE_INTERVAL = 2.0
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0
FIRST_CONNECT = 30.0  # seconds a server has to come up at start-up
_CONNECTION_CLOSED = -32000  # the SDK's MCPError code for a connection that went away
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_TOOL = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*")


class MountSpec:
    """One ``--mcp-server`` value: a name and a command line or a URL."""

    __slots__ = ("name", "argv", "url")

    def __init__(self, name: str, argv: list[str] | None, url: str | None) -> None:
        self.name = name
        self.argv = argv
        self.url = url

    def __repr__(self) -> str:
        return f"{self.name}={self.url or shlex.join(self.argv or [])}"


def parse_mount(value: str) -> MountSpec:
    """``NAME=COMMAND ARGS...`` or ``NAME=http(s)://...``.

    Raises:
        ValueError: no ``=``, a bad name, an empty command.
    """
    name, sep, target = value.partition("=")
    if not sep or not _NAME.fullmatch(name):
        raise ValueError(f"--mcp-server {value!r}: expected NAME=COMMAND or NAME=URL, NAME letters, digits, _ and -")
    target = target.strip()
    if target.startswith(("http://", "https://")):
        return MountSpec(name, None, target)
    try:
        argv = shlex.split(target)
    except ValueError as exc:
        raise ValueError(f"--mcp-server {name}: cannot split the command line: {exc}") from None
    if not argv:
        raise ValueError(f"--mcp-server {name}: the command is empty")
    return MountSpec(name, argv, None)


def _one_line(text: str | None, fallback: str) -> str:
    line = " ".join((text or "").split())
    return line or fallback


class MountedServer:
    """One mounted MCP server: its supervisor task, its current client, its tools in ``registry``."""

    def __init__(self, spec: MountSpec, registry: ToolRegistry) -> None:
        self.spec = spec
        self.registry = registry
        self.client: Any = None  # mcp.client.client.Client while connected
        self.connected = asyncio.Event()
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None
        self._first_error: BaseException | None = None
        self._settled = asyncio.Event()  # the first attempt connected or failed
        self._ever = False
        self._broken = asyncio.Event()  # a call found the connection gone: restart without waiting for the probe

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    def _target(self) -> Any:
        from mcp import StdioServerParameters

        if self.spec.url is not None:
            return self.spec.url
        argv = self.spec.argv or []
        return StdioServerParameters(command=argv[0], args=argv[1:])

    async def _supervise(self) -> None:
        from mcp.client.client import Client

        backoff = BACKOFF_MIN
        while True:
            try:
                async with Client(self._target(), mode="legacy") as client:
                    listed = await client.list_tools()
                    self._register(listed.tools)
                    self.client = client
                    self.connected.set()
                    self._ever = True
                    self._settled.set()
                    log.info("mounted MCP server", extra={"fields": {"server": self.spec.name, "tools": len(listed.tools), "restarts": self.restarts}})
                    backoff = BACKOFF_MIN
                    self._broken.clear()
                    while True:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._broken.wait(), PROBE_INTERVAL)
                        if self._broken.is_set():
                            raise ConnectionError("a call found the connection closed")
                        await asyncio.wait_for(client.send_ping(), PROBE_INTERVAL * 2)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 (anyio groups, the SDK's errors, a dead process: all mean restart)
                if not self._ever:
                    self._first_error = exc
                    self._settled.set()
                    return  # at start-up a failure is the user's to fix: the start fails
                log.warning(
                    "MCP server unavailable; restarting",
                    extra={"fields": {"server": self.spec.name, "error": _describe(exc), "backoff_s": backoff}},
                )
            finally:
                self.client = None
                self.connected.clear()
            self.restarts += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def wait_first(self, timeout: float) -> None:
        """Wait until the server was connected once.

        Raises:
            StartupError: it did not come up within ``timeout`` s.
        """
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except TimeoutError:
            raise StartupError(f"--mcp-server {self.spec!r}: the server did not come up in {timeout:.0f} s") from None
        if self._first_error is not None:
            raise StartupError(f"--mcp-server {self.spec!r}: the server did not come up: {_describe(self._first_error)}")

    def _register(self, tools: Sequence[Any]) -> None:
        for tool in tools:
            name = f"{self.spec.name}.{tool.name}"
            if name in self.registry:
                continue
            if not _TOOL.fullmatch(name):
                log.warning("MCP tool name not usable; skipped", extra={"fields": {"server": self.spec.name, "tool": tool.name}})
                continue
            try:
                self.registry.register(
                    Tool(
                        name=name,
                        description=_one_line(tool.description, f"{tool.name} of the MCP server {self.spec.name}"),
                        schema=dict(tool.input_schema),
                        handler=self._handler(tool.name),
                    )
                )
            except ValueError as exc:
                log.warning("MCP tool not registered", extra={"fields": {"server": self.spec.name, "tool": tool.name, "error": str(exc)}})

    def _handler(self, tool: str) -> Any:
        async def call(args: Any, _ctx: ToolContext) -> Any:
            client = self.client
            if client is None:
                raise RuntimeError(f"the MCP server {self.spec.name} is not connected (it is being restarted); try again")
            try:
                result = await client.call_tool(tool, args)
            except Exception as exc:
                if getattr(exc, "code", None) == _CONNECTION_CLOSED or isinstance(exc, OSError | EOFError):
                    self._broken.set()
                raise RuntimeError(f"the MCP server {self.spec.name} failed the call: {_describe(exc)}") from None
            content = [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in result.content]
            if result.is_error:
                text = " ".join(str(c.get("text", "")) for c in content) or "the tool failed"
                raise RuntimeError(f"{self.spec.name}.{tool}: {text}")
            out: dict[str, Any] = {"content": content}
            if result.structured_content is not None:
                out["structuredContent"] = result.structured_content
            return out

        return call


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def mount_all(registry: ToolRegistry, values: Sequence[str]) -> list[MountedServer]:
    """Start and wait for every ``--mcp-server``; their tools are in ``registry`` once this returns.

    Raises:
        StartupError: a bad value, the SDK missing, or a server that did not come up.
    """
    if not values:
        return []
    try:
        specs = [parse_mount(v) for v in values]
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    try:
        import mcp.client.client  # noqa: F401
    except ImportError:
        raise StartupError("--mcp-server needs the MCP SDK: pip install 'smith-fast[mcp]'") from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise StartupError(f"--mcp-server names must differ: {', '.join(names)}")
    mounted = [MountedServer(spec, registry) for spec in specs]
    for server in mounted:
        server.start()
    try:
        await asyncio.gather(*(s.wait_first(FIRST_CONNECT) for s in mounted))
    except StartupError:
        await asyncio.gather(*(s.close() for s in mounted))
        raise
    return mounted
