"""Service configuration and limits. Every limit here is a ``smith-fast serve`` flag (README, "Limits")."""

from __future__ import annotations

import dataclasses
import os
import pathlib

from ..framing import DEFAULT_MAX_FRAME_SIZE

__all__ = ["Limits", "ServiceConfig"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds that keep one peer from exhausting the service.

    Attributes:
        max_frame_size: largest v1 frame / v0 line accepted, in bytes (``--max-frame-size``).
        max_output: bytes of stdout+stderr forwarded per shell command before it is truncated with a
            notice (``--max-output``); the child keeps running and its further output is discarded.
        max_processes: shell commands running at once across the whole service (``--max-processes``);
            one more is answered with ``ERROR_CODE_RESOURCE_EXHAUSTED``.
        max_requests: requests in flight per session (``--max-requests``); likewise.
        default_timeout_ms: timeout for commands that give none; 0 means none (``--timeout-ms``).
        kill_grace: seconds between SIGTERM and SIGKILL when a command is stopped (``--kill-grace``).
        chunk_size: largest ShellOutput chunk, in bytes (``--chunk-size``).
        tool_max_output: cap on a tool's output (``fs.read`` size, ``shell.run`` output).
        max_connections: live network connections (socket connections and gRPC ``Stream`` calls);
            one more is answered with ``ERROR_CODE_RESOURCE_EXHAUSTED`` and closed
            (``--max-connections``).
        idle_timeout: seconds a connection may go without receiving a message while no request
            runs before it is closed; 0 means never (``--idle-timeout``).
        handshake_timeout: seconds a connection has to complete its first (authenticated)
            handshake; 0 means forever (``--handshake-timeout``).
        max_command_size: largest ShellExec command (its command string plus its env), tool
            arguments or plan goal, in bytes (``--max-command-size``).
    """

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_output: int = 64 * 1024 * 1024
    max_processes: int = 64
    max_requests: int = 1024
    default_timeout_ms: int = 0
    kill_grace: float = 2.0
    chunk_size: int = 64 * 1024
    tool_max_output: int = 1 << 20
    max_connections: int = 1024
    idle_timeout: float = 300.0
    handshake_timeout: float = 10.0
    max_command_size: int = 1 << 20


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Everything a service core needs to know.

    Attributes:
        root: the tool workspace; tools may not reach outside it.
        protocol: ``auto`` (sniff v0/v1 per connection), ``v1`` or ``v0``.
        jsonl_backend: JSON library for v0 (``auto``, ``json`` or ``orjson``).
        limits: see :class:`Limits`.
        hook_files: hooks every session runs first (``--hook``), loaded at start-up.
        hook_failure: ``closed`` (a failing hook blocks) or ``open`` (it allows).
        record_dir: record every session there (``--record``); None records only sessions that
            were granted ``replay``, under ``replay_dir``.
        replay_dir: where sessions granted ``replay`` are recorded when ``record_dir`` is None.
        planner, planner_url, planner_model: the planner for PlanCommands (``--planner``).
        token: the shared secret socket and gRPC peers must present in their handshake
            (``--token``/``SMITH_TOKEN``); None lets every peer in.
        allow_env: request environment variables permitted although
            :func:`smith_fast.refused_env.refused_names` would refuse them (``--allow-env``).
    """

    root: pathlib.Path = dataclasses.field(default_factory=pathlib.Path.cwd)
    protocol: str = "auto"
    jsonl_backend: str = "auto"
    limits: Limits = dataclasses.field(default_factory=Limits)
    hook_files: tuple[pathlib.Path, ...] = ()
    hook_failure: str = "closed"
    record_dir: pathlib.Path | None = None
    replay_dir: pathlib.Path = dataclasses.field(
        default_factory=lambda: pathlib.Path(
            os.environ.get("XDG_STATE_HOME", pathlib.Path.home() / ".local" / "state")
        ) / "smith-fast" / "recordings"
    )
    planner: str = "rules"
    planner_url: str | None = None
    planner_model: str | None = None
    token: str | None = dataclasses.field(default=None, repr=False)  # never in a repr, so never in a log
    allow_env: frozenset[str] = frozenset()
