"""Service configuration and limits. Every limit here is a ``smith-fast serve`` flag (README, "Limits").

Each field that is a command-line option says so in its metadata (:func:`smith_fast.options.option`):
its flag, help, unit and the commands that take it; ``serve``, ``worker`` and ``gateway`` build
their options from these, so every option has one name and one default.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from ..containment import CommandLimits
from ..framing import DEFAULT_MAX_FRAME_SIZE
from ..options import Alias, current_directory, option
from ..refused_env import ENV_POLICIES
from ..sandbox import DEFAULT_TMP_SIZE
from ..records import record

__all__ = ["Limits", "ServiceConfig"]


_ALL = ("serve", "worker", "gateway")
_RUNNERS = ("serve", "worker")  # the commands that run shell commands and tools
_FRONTS = ("serve", "gateway")  # the commands that accept frontends' connections
_LIMITS = "limits (sizes are bytes with an optional k/M/G suffix; durations are seconds with an optional ms/s/m/h suffix)"
_GENERAL = "service"
_SECURITY = "security"
_POLICY = "hooks, recording, planning"
# What one command may use by default: enough for a large build (a linker of a big C++ program, a
# parallel make), not enough for one session to take the machine from the others.
DEFAULT_COMMAND_MEMORY = 8 << 30
DEFAULT_COMMAND_PIDS = 1024
DEFAULT_FILE_SIZE = 8 << 30


@record(frozen=True)
class Limits:
    """Bounds that keep one peer from exhausting the service.

    Attributes:
        max_frame_size: largest v1 frame / v0 line accepted, in bytes (``--max-frame-size``).
        max_output: bytes of stdout+stderr forwarded per shell command before it is truncated with a
            notice (``--max-output``); its output pipes are then closed (a command that writes more
            gets SIGPIPE), so a flood costs the service nothing more.
        max_processes: shell commands running at once across the whole service (``--max-processes``);
            one more is answered with ``ERROR_CODE_RESOURCE_EXHAUSTED``.
        max_session_processes: of those, what one session may run at once, its background ones
            included (``--max-processes-per-session``), so that one session cannot take every slot;
            one more likewise (:mod:`smith_fast.service.process_slots`).
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
        max_stdin_buffer: bytes written to a command's open stdin that it has not read yet; a
            ``StdinCommand`` that would pass it is refused whole with ``ERROR_CODE_RESOURCE_EXHAUSTED``
            (``--max-stdin-buffer``).
        input_wait_notice: seconds a command with open stdin or a pty may be silent, asleep reading
            that input, before the peer gets one ``LogEvent`` (``fields.reason = waiting_for_input``;
            :mod:`smith_fast.service.input_wait`); 0 turns it off (``--input-wait-notice``).
        max_background: background processes (ShellExec ``background``) the service keeps, running
            or exited (``--max-background``); a new one makes room by dropping the oldest exited
            one, and is refused with ``ERROR_CODE_RESOURCE_EXHAUSTED`` when all are running; 0 turns
            them off (:mod:`smith_fast.service.background`).
        background_buffer: bytes of output kept per background process, a ring that drops the
            oldest (``--background-buffer``).
        max_command_size: largest ShellExec command (its command string plus its env), tool
            arguments or plan goal, in bytes (``--max-command-size``).
        max_memory_per_command, max_pids_per_command, max_cpu_per_command: what one command
            (the shell and all it starts, ShellExec or ``shell.run``) may use: bytes of memory,
            processes at once, CPU seconds; 0 means no limit. A command past one is killed and
            answered with ``ERROR_CODE_RESOURCE_EXHAUSTED`` naming the option
            (:mod:`smith_fast.containment`).
        max_handshake_frame_size: largest v1 frame / v0 line (declared or received) before the
            connection's first accepted handshake (authenticated, with a token), in bytes
            (``--max-handshake-frame-size``); over it, the connection is closed. So a peer that has
            not shown the token cannot make the service hold more than this (plus one read).
        grpc_handshake_reads: gRPC ``Stream`` calls of the whole service whose first message is
            read at once while they have not authenticated (``--grpc-handshake-reads``). gRPC takes a
            message whole, up to ``--max-frame-size``, before the service sees it, so this, times
            ``--max-frame-size``, bounds what unauthenticated calls can make the service hold; a call
            that presents the token in its metadata does not wait.
        max_batch_commands: commands in one ``BatchCommand`` (``--max-batch-commands``); a larger
            batch is refused whole (``ERROR_CODE_RESOURCE_EXHAUSTED``; each readable request id in it
            gets its ``StateChange(ERROR)``).
        max_request_id_size: longest ``request_id``, in bytes (``--max-request-id-size``); a longer
            one is not read as an id: ``ErrorEvent`` without it, nothing runs.
        max_hooks_per_session: hooks one session may load (``--max-hooks-per-session``).
        hook_memory: memory limit of one hook, in bytes (``--hook-memory``): the QuickJS heap of a
            JavaScript hook, the ``RLIMIT_DATA`` of a Rust hook's process.
        max_session_hook_memory: the sum of the memory limits of one session's hooks
            (``--max-session-hook-memory``); a hook that would go over it is refused.
        max_session_buffer: output a session may hold for a peer that is not reading, in bytes:
            what the front still holds for it plus what its running requests may still produce
            (``--max-session-buffer``; :mod:`smith_fast.service.flow`). Further requests wait,
            and its commands are not read, until the peer reads again.
        mcp_sessions_per_connection: MCP sessions one ``--mcp-http`` connection may initialize
            (``--mcp-sessions-per-connection``); one more is answered 429 and the connection
            closed. Sessions of all connections count towards ``--max-connections``; when they
            fill it, the idle session used least recently is ended to make room
            (:mod:`smith_fast.mcp.http`).
        record_max_bytes: the most the session recordings may hold together, in bytes
            (``--record-max-bytes``; :class:`~smith_fast.replay.RecordingStore`): the oldest finished
            recordings are removed to make room; 0 means no bound.
        max_workspace_bytes, max_workspaces, max_checkpoints, max_undo, max_diff_bytes,
            warm_workspaces, checkpoint_ttl: the bounds of ``--workspaces`` (:mod:`smith_fast.workspaces`):
            bytes a session's workspace holds besides its template (a tmpfs: past it, ``ENOSPC``), sessions
            with a workspace at once, checkpoints per session, requests that can still be undone, unified
            diff text per Diff, workspaces mounted ahead per template, and how long the checkpoints of an
            ended session stay usable.
        max_home_bytes: bytes a session's home may hold without ``--workspaces`` (``--max-home-bytes``;
            :mod:`smith_fast.service.session_home`): checked before each of its processes starts, a home
            over it is emptied; 0: no bound.
        mcp_max_result_chars, mcp_default_timeout, mcp_max_timeout: the MCP ``shell`` tool's result
            budget in characters (head and tail kept, the whole output in a file), the timeout of a call
            that gives none, and the longest one a call may ask for (:mod:`smith_fast.mcp.results`).
        egress_max_head, egress_handshake_timeout, egress_connect_timeout, egress_idle_timeout,
            egress_max_connections: the egress proxy's bounds with ``--network allow``
            (:class:`~smith_fast.egress.limits.EgressLimits`): bytes of a request head or SOCKS5
            handshake, seconds to name a destination, to resolve and connect to it, a tunnel may
            carry nothing, and connections at once through one command's listener; a timeout of 0
            is none.
        resume_window: seconds a v1 session that asked for ``resume`` is kept (its requests running,
            its events retained within ``max_session_buffer``) after its connection dropped, for
            the peer to reconnect and resume it; 0 turns resume off (``--resume-window``;
            :mod:`smith_fast.service.resume`).
    """

    max_frame_size: int = option(
        DEFAULT_MAX_FRAME_SIZE, flag="--max-frame-size", unit="bytes", commands=_FRONTS, group=_LIMITS,
        help="largest v1 frame or v0 line")
    max_output: int = option(
        64 * 1024 * 1024, flag="--max-output", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="output forwarded per shell command before truncation")
    max_processes: int = option(
        64, flag="--max-processes", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="shell commands running at once in this process")
    max_session_processes: int = option(
        32, flag="--max-processes-per-session", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="of --max-processes, what one session may run at once (its background ones too); keep it below --max-processes")
    max_requests: int = option(
        1024, flag="--max-requests", unit="count", commands=_FRONTS, group=_LIMITS,
        help="requests in flight per session")
    default_timeout_ms: int = option(
        0, flag="--timeout", unit="milliseconds", commands=_RUNNERS, group=_LIMITS,
        help="default command and tool timeout; 0 = none",
        aliases=(Alias("--timeout-ms", "whole milliseconds", "the same as --timeout, in whole milliseconds (older spelling)"),))
    kill_grace: float = option(
        2.0, flag="--kill-grace", unit="seconds", commands=_ALL, group=_LIMITS,
        help="time between SIGTERM and SIGKILL when a command is stopped")
    chunk_size: int = option(
        64 * 1024, flag="--chunk-size", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="largest ShellOutput chunk")
    tool_max_output: int = option(
        1 << 20, flag="--tool-max-output", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="largest tool output (fs.read, shell.run)")
    max_connections: int = option(
        1024, flag="--max-connections", unit="count", commands=_FRONTS, group=_LIMITS,
        help="live socket connections and gRPC streams; one more gets RESOURCE_EXHAUSTED and is closed")
    idle_timeout: float = option(
        300.0, flag="--idle-timeout", unit="seconds", commands=_FRONTS, group=_LIMITS,
        help="a connection without a message or a running request for this long is closed; 0 = never")
    handshake_timeout: float = option(
        10.0, flag="--handshake-timeout", unit="seconds", commands=_FRONTS, group=_LIMITS,
        help="time a new connection has to complete its handshake; 0 = forever")
    max_command_size: int = option(
        1 << 20, flag="--max-command-size", unit="bytes", commands=_ALL, group=_LIMITS,
        help="largest shell command (+ its env), tool arguments or plan goal; larger: RESOURCE_EXHAUSTED")
    max_stdin_buffer: int = option(
        1 << 20, flag="--max-stdin-buffer", unit="bytes", commands=_ALL, group=_LIMITS,
        help="stdin a command has not read yet, per command; a StdinCommand past it is refused whole")
    input_wait_notice: float = option(
        2.0, flag="--input-wait-notice", unit="seconds", commands=_RUNNERS, group=_LIMITS,
        help="a command with open stdin or a pty that sleeps reading it this long without output: one 'waiting for input' LogEvent; 0 = off")
    max_background: int = option(
        8, flag="--max-background", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="background processes kept (running or exited) in this process; one more running: RESOURCE_EXHAUSTED; 0 = off")
    background_buffer: int = option(
        1 << 20, flag="--background-buffer", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="output kept per background process for attach (a ring: the oldest is dropped)")
    max_memory_per_command: int = option(
        DEFAULT_COMMAND_MEMORY, flag="--max-memory-per-command", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="memory one command and its children may hold, its private /tmp included (cgroup memory.max); past it: "
        "killed, RESOURCE_EXHAUSTED; 0 = none")
    max_pids_per_command: int = option(
        DEFAULT_COMMAND_PIDS, flag="--max-pids-per-command", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="processes one command may have at once (cgroup pids.max); hitting it: RESOURCE_EXHAUSTED; 0 = none")
    max_tmp_per_command: int = option(
        DEFAULT_TMP_SIZE, flag="--max-tmp-per-command", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="bytes a sandboxed command's private /tmp (its TMPDIR) and /dev/shm may each hold; past it: ENOSPC")
    max_file_size: int = option(
        DEFAULT_FILE_SIZE, flag="--max-file-size", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="largest file a sandboxed command may write (RLIMIT_FSIZE); past it: EFBIG; 0 = none")
    max_cpu_per_command: float = option(
        0.0, flag="--max-cpu-per-command", unit="seconds", commands=_RUNNERS, group=_LIMITS,
        help="CPU time one command and its children may use; past it: killed, RESOURCE_EXHAUSTED; 0 = none")

    def command_limits(self) -> CommandLimits:
        """The per-command limits, for :mod:`smith_fast.containment`."""
        return CommandLimits(
            memory=self.max_memory_per_command, pids=self.max_pids_per_command, cpu=self.max_cpu_per_command)
    max_handshake_frame_size: int = option(
        64 * 1024, flag="--max-handshake-frame-size", unit="bytes", commands=_FRONTS, group=_LIMITS,
        help="largest v1 frame or v0 line before the first accepted (authenticated) handshake; larger: closed")
    grpc_handshake_reads: int = option(
        4, flag="--grpc-handshake-reads", unit="count", commands=_FRONTS, group=_LIMITS,
        help="gRPC Stream calls whose first message is read at once before an authenticated handshake "
             "(the others wait); bounds the memory of unauthenticated calls")
    max_batch_commands: int = option(
        1024, flag="--max-batch-commands", unit="count", commands=_FRONTS, group=_LIMITS,
        help="commands in one BatchCommand; a larger batch is refused whole with RESOURCE_EXHAUSTED")
    max_request_id_size: int = option(
        256, flag="--max-request-id-size", unit="bytes", commands=_FRONTS, group=_LIMITS,
        help="longest request_id; a longer one is refused unread (ErrorEvent without it, nothing runs)")
    max_hooks_per_session: int = option(
        16, flag="--max-hooks-per-session", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="hooks one session may load; one more: RESOURCE_EXHAUSTED")
    hook_memory: int = option(
        32 << 20, flag="--hook-memory", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="memory limit of one hook (QuickJS heap; a Rust hook's RLIMIT_DATA)")
    max_session_hook_memory: int = option(
        256 << 20, flag="--max-session-hook-memory", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="the sum of the memory limits of one session's hooks; a hook over it: RESOURCE_EXHAUSTED")
    max_session_buffer: int = option(
        16 << 20, flag="--max-session-buffer", unit="bytes", commands=_FRONTS, group=_LIMITS,
        help="output held per session for a peer that does not read; beyond it requests wait and its commands are not read")
    mcp_sessions_per_connection: int = option(
        8, flag="--mcp-sessions-per-connection", unit="count", commands=_FRONTS, group=_LIMITS,
        help="MCP sessions one HTTP connection may initialize; one more: 429, closed")
    mcp_max_result_chars: int = option(
        30_000, flag="--mcp-max-result-chars", unit="count", commands=("serve",), group=_LIMITS,
        help="characters of output an MCP shell result shows (its head and tail, with a marker); the whole output goes to a file fs.read reads")
    mcp_default_timeout: float = option(
        120.0, flag="--mcp-default-timeout", unit="seconds", commands=("serve",), group=_LIMITS,
        help="timeout of an MCP shell call that gives none; then its process group is terminated")
    mcp_max_timeout: float = option(
        600.0, flag="--mcp-max-timeout", unit="seconds", commands=("serve",), group=_LIMITS,
        help="the longest timeout an MCP shell call may ask for; a longer one is cut to it")
    resume_window: float = option(
        30.0, flag="--resume-window", unit="seconds", commands=_FRONTS, group=_LIMITS,
        help="a dropped v1 session that asked for resume keeps running this long for its peer to reconnect; 0 = off")
    max_workspace_bytes: int = option(
        1 << 30, flag="--max-workspace-bytes", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="with --workspaces: what one session's workspace may hold besides its template (its writes and checkpoints, in RAM: "
             "a tmpfs); a command that writes past it gets ENOSPC")
    max_workspaces: int = option(
        1000, flag="--max-workspaces", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="with --workspaces: sessions with a workspace at once; one more handshake: RESOURCE_EXHAUSTED (reason max_workspaces)")
    max_checkpoints: int = option(
        32, flag="--max-checkpoints", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="checkpoints one session may take; one more: RESOURCE_EXHAUSTED (reason max_checkpoints)")
    max_undo: int = option(
        64, flag="--max-undo", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="requests of a session whose changes can still be undone (the newest); an older one: reason undo_expired")
    max_diff_bytes: int = option(
        1 << 20, flag="--max-diff-bytes", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="unified diff text one Diff answers at most (its max_diff_bytes is capped to it); past it: truncated")
    warm_workspaces: int = option(
        2, flag="--warm-workspaces", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="workspaces kept mounted ahead per template, so that a handshake does not wait for the mounts; 0 = none")
    checkpoint_ttl: float = option(
        3600.0, flag="--checkpoint-ttl", unit="seconds", commands=_RUNNERS, group=_LIMITS,
        help="how long the checkpoints of a session that ended can still be forked, restored or diffed")
    max_home_bytes: int = option(
        1 << 30, flag="--max-home-bytes", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="without --workspaces: what one session's home, its HOME with the npm, pip, cargo and go caches, may hold, "
             "checked before each of its commands; a home found over it is emptied; 0 = no bound. With --workspaces the "
             "home is in the workspace's tmpfs, within --max-workspace-bytes")
    egress_max_head: int = option(
        64 * 1024, flag="--egress-max-head", unit="bytes", commands=_RUNNERS, group=_LIMITS,
        help="with --network allow: a request head or SOCKS5 handshake to the egress proxy larger than this: 431, or closed")
    egress_handshake_timeout: float = option(
        10.0, flag="--egress-handshake-timeout", unit="seconds", commands=_RUNNERS, group=_LIMITS,
        help="with --network allow: time a connection to the egress proxy has to name its destination, and a hook to decide; 0 = none")
    egress_connect_timeout: float = option(
        10.0, flag="--egress-connect-timeout", unit="seconds", commands=_RUNNERS, group=_LIMITS,
        help="with --network allow: time the egress proxy may take to resolve and connect to a destination, then 504 or SOCKS5 0x04; 0 = none")
    egress_idle_timeout: float = option(
        300.0, flag="--egress-idle-timeout", unit="seconds", commands=_RUNNERS, group=_LIMITS,
        help="with --network allow: a tunnel through the egress proxy that carries nothing either way this long is closed; 0 = never")
    egress_max_connections: int = option(
        256, flag="--egress-max-connections", unit="count", commands=_RUNNERS, group=_LIMITS,
        help="with --network allow: connections at once through one command's egress listener; one more is closed at accept")
    record_max_bytes: int = option(
        256 << 20, flag="--record-max-bytes", unit="bytes", commands=_FRONTS, group=_LIMITS,
        help="session recordings kept together; past it the oldest finished ones are removed (rotation), "
             "and a recording that still cannot fit stops; 0 = no bound")


@record(frozen=True)
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
            were granted ``replay``, under ``state_dir/recordings`` (:attr:`recordings_dir`).
        state_dir: the service's own directory (``--state-dir``): its recordings; never the
            workspace, and private (0700).
        home_dir: the directory of the sessions' homes without ``--workspaces`` (``--home-dir``;
            :mod:`smith_fast.service.session_home`); with them a home is in the session's volume.
        planner, planner_url, planner_model: the planner for PlanCommands (``--planner``).
        token: the shared secret socket and gRPC peers must present in their handshake
            (``--token``/``SMITH_TOKEN``); None lets every peer in.
        mcp_allow_hosts: names an ``--mcp-http`` request's ``Host`` may give besides loopback
            addresses, ``localhost`` and the address the connection arrived on
            (``--mcp-allow-host``); any other is refused, against DNS rebinding.
        mcp_allow_origins: the browser origins allowed to call ``--mcp-http``
            (``--mcp-allow-origin``); a request with any other ``Origin`` is refused.
        mcp_expose_all_tools: list ``shell.run`` and ``tools.list`` to MCP clients as well
            (``--mcp-expose-all-tools``); by default they see ``shell`` and the file tools.
        mcp_discover: answer ``server/discover`` (``--mcp-discover``): negotiating clients then
            speak the stateless 2026-07-28 revision, where the shell keeps no state between calls.
        mcp_servers: ``NAME=COMMAND`` / ``NAME=URL`` MCP servers whose tools are registered as
            ``NAME.TOOL`` at start-up (``--mcp-server``; :mod:`smith_fast.mcp.mount`).
        allow_env: request environment variables permitted although
            :func:`smith_fast.refused_env.refused_names` would refuse them (``--allow-env``).
        env_policy: ``denylist`` (refuse the variable classes that load code) or ``allowlist``
            (refuse all but the safe and the ``--allow-env`` names); :mod:`smith_fast.refused_env`.
        capabilities: the capabilities this service may grant (``--capabilities``, names); None:
            every available one except ``hooks_rust``, which is granted only when listed here.
        sandbox: how the processes started for peers are confined (``--sandbox``; PROTOCOL.md,
            "Sandbox"): ``workspace-write``, ``read-only`` or ``off``.
        network: their network (``--network``): ``on``, ``off``, ``loopback`` or ``allow`` (only through
            the egress proxy, by name: :mod:`smith_fast.service.egress`).
        egress_allow, egress_deny: the proxy's rules (``--egress-allow``/``--egress-deny``: names,
            ``*.`` wildcards, optional ports, CIDRs; :mod:`smith_fast.egress.rules`).
        egress_secrets: ``NAME@HOST=ENV`` (``--egress-secret``): the command's ``NAME`` holds a
            placeholder the proxy replaces with ``$ENV`` in plain-HTTP requests to HOST.
        egress_resolve: ``HOST=ADDR[,ADDR...]`` answered before DNS by the proxy (``--egress-resolve``; for tests).
        sandbox_deny_read: paths those processes may not read (``--sandbox-deny-read``).
        workspaces: the directory of the sessions' workspaces (``--workspaces``), None for one
            shared root.
        templates: ``NAME=PATH`` of the templates (``--template``), the first the default.
    """

    root: pathlib.Path = option(
        default_factory=lambda: current_directory("--root"), flag="--root", unit="path", commands=_RUNNERS, group=_GENERAL,
        metavar="DIR", default_text="the current directory",
        help="tool workspace root")
    protocol: str = option(
        "auto", flag="--protocol", unit="choice", choices=("auto", "v1", "v0"), commands=_FRONTS, group=_GENERAL,
        help="pin the wire protocol; auto detects it per connection")
    jsonl_backend: str = option(
        "auto", flag="--jsonl-backend", unit="choice", choices=("auto", "json", "orjson"), commands=_FRONTS, group=_GENERAL,
        help="JSON library for v0; auto takes orjson when installed")
    limits: Limits = dataclasses.field(default_factory=Limits)
    hook_files: tuple[pathlib.Path, ...] = option(
        (), flag="--hook", unit="path", repeat=True, metavar="FILE", commands=_RUNNERS, group=_POLICY,
        help="a .js or .rs hook every session runs first; clients cannot unload it (see HOOKS.md)")
    hook_failure: str = option(
        "closed", flag="--hook-failure", unit="choice", choices=("closed", "open"), commands=_RUNNERS, group=_POLICY,
        help="a hook that throws, panics, times out or answers nonsense blocks (closed) or allows (open)")
    record_dir: pathlib.Path | None = option(
        None, flag="--record", unit="path", metavar="DIR", commands=("serve",), group=_POLICY,
        help="record every session to DIR (made 0700; one other users may enter is refused) instead of --state-dir's "
             "recordings, where only sessions granted replay are recorded; see `smith-fast replay`")
    state_dir: pathlib.Path = option(
        default_factory=lambda: pathlib.Path(os.environ.get("XDG_STATE_HOME") or pathlib.Path.home() / ".local" / "state") / "smith-fast",
        flag="--state-dir", unit="path", metavar="DIR", commands=_FRONTS, group=_POLICY,
        default_text="$XDG_STATE_HOME/smith-fast, else ~/.local/state/smith-fast",
        help="the service's own state: recordings of sessions granted replay go to DIR/recordings (made 0700); keep it out of --root")
    home_dir: pathlib.Path = option(
        default_factory=lambda: pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "smith-fast" / "homes",
        flag="--home-dir", unit="path", metavar="DIR", commands=_RUNNERS, group=_GENERAL,
        default_text="$XDG_CACHE_HOME/smith-fast/homes, else ~/.cache/smith-fast/homes",
        help="without --workspaces, with --sandbox workspace-write: each session's home (HOME, the tool caches) is a "
             "directory of DIR (made 0700), removed when the session ends; keep it out of --root and --state-dir")
    planner: str = option(
        "rules", flag="--planner", unit="choice", choices=("rules", "llm"), commands=_RUNNERS, group=_POLICY,
        help="how PlanCommands are planned; rules works offline")
    planner_url: str | None = option(
        None, flag="--planner-url", unit="text", metavar="URL", commands=_RUNNERS, group=_POLICY,
        help="OpenAI-compatible chat-completions endpoint for --planner llm (key from $SMITH_PLANNER_API_KEY)")
    planner_model: str | None = option(
        None, flag="--planner-model", unit="text", metavar="NAME", commands=_RUNNERS, group=_POLICY,
        help="model name for --planner llm")
    # never in a repr, so never in a log
    token: str | None = option(
        None, repr=False, flag="--token", unit="text", metavar="TOKEN", env="SMITH_TOKEN", commands=_FRONTS, group=_SECURITY,
        help="shared secret socket and gRPC peers must present in their handshake; prefer the variable: arguments show in ps")
    mcp_allow_hosts: tuple[str, ...] = option(
        (), flag="--mcp-allow-host", unit="text", repeat=True, metavar="NAME", commands=_FRONTS, group=_SECURITY,
        help="a name --mcp-http requests may give in Host besides loopback addresses, localhost and the "
             "listener's own address (DNS rebinding: any other is refused with 421)")
    mcp_allow_origins: tuple[str, ...] = option(
        (), flag="--mcp-allow-origin", unit="text", repeat=True, metavar="ORIGIN", commands=_FRONTS, group=_SECURITY,
        help="a browser Origin (scheme://host[:port]) whose pages may call --mcp-http; any other Origin is refused with 403")
    mcp_expose_all_tools: bool = option(
        False, flag="--mcp-expose-all-tools", unit="switch", commands=("serve",), group=_GENERAL,
        help="list shell.run and tools.list to MCP clients too (by default they see shell and the fs tools: one way to run a command)")
    mcp_discover: bool = option(
        False, flag="--mcp-discover", unit="switch", commands=("serve",), group=_GENERAL,
        help="answer server/discover, so MCP clients that negotiate (the official SDKs do) use the stateless 2026-07-28 "
             "revision; without it they fall back to initialize and a session (2026-07-28 requests are served either way)")
    mcp_servers: tuple[str, ...] = option(
        (), flag="--mcp-server", unit="text", repeat=True, metavar="NAME=COMMAND|URL", commands=("serve", "worker"), group=_POLICY,
        help="mount an MCP server's tools as NAME.TOOL: a command line (spawned, supervised, spoken to over stdio) "
             "or an http(s) URL (Streamable HTTP); needs smith-fast[mcp]")
    allow_env: frozenset[str] = option(
        frozenset(), flag="--allow-env", unit="text", repeat=True, metavar="NAME", commands=_RUNNERS, group=_SECURITY,
        help="let requests set this refused environment variable (LD_PRELOAD ...; see README, Security)")
    env_policy: str = option(
        "denylist", flag="--env-policy", unit="choice", choices=ENV_POLICIES, commands=_RUNNERS, group=_SECURITY,
        help="denylist refuses the variables that make programs load code; allowlist refuses all but locale/terminal ones and --allow-env")
    capabilities: frozenset[str] | None = option(
        None, flag="--capabilities", unit="names", commands=_ALL, group=_SECURITY, metavar="LIST",
        default_text="all available but hooks_rust and replay",
        help="comma list of the capabilities peers may be granted (shell_exec,hooks_js,hooks_rust,replay,tracing,nats); "
             "hooks_rust and replay only when listed")
    sandbox: str = option(
        "workspace-write", flag="--sandbox", unit="choice", choices=("workspace-write", "read-only", "off"),
        commands=_RUNNERS, group=_SECURITY,
        help="confine commands, shell.run, plan steps and Rust hooks (namespaces, a read-only view of the host, "
        "Landlock): write only the root and a private /tmp (workspace-write), only the /tmp (read-only), or anywhere (off)")
    network: str = option(
        "on", flag="--network", unit="choice", choices=("on", "off", "loopback", "allow"), commands=_RUNNERS, group=_SECURITY,
        help="network for those processes: on, off (none, loopback included), loopback (a private loopback only) or allow "
             "(a private loopback, and the hosts --egress-allow lets through the service's egress proxy; README, Network egress)")
    egress_allow: tuple[str, ...] = option(
        (), flag="--egress-allow", unit="text", repeat=True, metavar="PATTERN", commands=_RUNNERS, group=_SECURITY,
        help="with --network allow: a destination commands may reach through the proxy: a host name (pypi.org), *.name for "
             "its subdomains, * for any name, an optional :PORT, or a CIDR (10.0.0.0/8); loopback, link-local, private and "
             "the host's own addresses need a CIDR rule even when the name is allowed")
    egress_deny: tuple[str, ...] = option(
        (), flag="--egress-deny", unit="text", repeat=True, metavar="PATTERN", commands=_RUNNERS, group=_SECURITY,
        help="with --network allow: a destination refused whatever --egress-allow says (the same patterns)")
    egress_secrets: tuple[str, ...] = option(
        (), flag="--egress-secret", unit="text", repeat=True, metavar="NAME@HOST=ENV", commands=_RUNNERS, group=_SECURITY,
        help="with --network allow: commands get a placeholder in $NAME; the proxy puts the service's $ENV in its place in "
             "plain-HTTP request headers to HOST only (HTTPS is opaque to it: README, Network egress)")
    egress_resolve: tuple[str, ...] = option(
        (), flag="--egress-resolve", unit="text", repeat=True, metavar="HOST=ADDR[,ADDR]", commands=_RUNNERS, group=_SECURITY,
        help="the egress proxy answers HOST with these addresses before asking DNS (for tests: a made-up name for a local server)")
    sandbox_deny_read: tuple[pathlib.Path, ...] = option(
        (), flag="--sandbox-deny-read", unit="path", repeat=True, metavar="PATH", commands=_RUNNERS, group=_SECURITY,
        help="commands may not read PATH (e.g. ~/.ssh, or ROOT/.env): it is an empty, unreadable file or directory in "
        "their view, and the file tools refuse it")
    workspaces: pathlib.Path | None = option(
        None, flag="--workspaces", unit="path", metavar="DIR", commands=_RUNNERS, group=_GENERAL,
        help="give each session a copy-on-write workspace of its own under DIR, made from a --template (the root of its "
             "tools, its commands' cwd, the only place they write), with checkpoints, fork, diff and undo; see README, Workspaces")
    templates: tuple[str, ...] = option(
        (), flag="--template", unit="text", repeat=True, metavar="NAME=PATH", commands=_RUNNERS, group=_GENERAL,
        help="a template a session may start from (client_info smith_fast.template=NAME); the first is the default; "
             "without one, --root is the template 'default'")
    allow_service_files_in_root: bool = option(
        False, flag="--allow-service-files-in-root", unit="switch", commands=_RUNNERS, group=_SECURITY,
        help="start even when --root holds the service's own installation, socket, recordings or state: commands can "
        "then replace the code the service runs, or listen in its socket's place; only for a root nothing hostile writes to")

    @property
    def recordings_dir(self) -> pathlib.Path:
        """Where sessions are recorded: ``--record DIR``, else ``--state-dir``'s ``recordings``."""
        return self.record_dir if self.record_dir is not None else self.state_dir / "recordings"

    def template_map(self) -> dict[str, pathlib.Path]:
        """``--template NAME=PATH`` as a dict in the order given (the first is the default); without
        any, ``--root`` as the template ``default``.

        Raises:
            ValueError: a value without ``=``, an empty or repeated name, a path that is not a directory.
        """
        if not self.templates:
            return {"default": self.root.resolve()}
        out: dict[str, pathlib.Path] = {}
        for text in self.templates:
            name, sep, path = text.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--template {text!r}: expected NAME=PATH")
            if name in out:
                raise ValueError(f"--template {name}: given twice")
            where = pathlib.Path(path).expanduser().resolve()
            if not where.is_dir():
                raise ValueError(f"--template {name}={path}: no such directory")
            out[name] = where
        return out
