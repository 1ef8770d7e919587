"""The choke point: every process the service starts on a peer's behalf goes through here.

Four ways in, one way out:

* a ``ShellExecCommand`` (:func:`stream`, from ``commands.shell_exec``);
* a plan's shell step (:func:`stream` with ``origin="plan_step"``);
* the ``shell.run`` tool, and any plug-in tool, through ``ToolContext.run_process``
  (:func:`tool_runner` binds one to the tool call's request: tools never spawn on their own);

each passes :func:`admit` (the ``before_shell_exec`` hooks, then ``--max-command-size`` and the env
policy on what the hooks let through, the span, the audit record), takes a ``--max-processes``
slot, and starts its process with :func:`smith_fast.service.spawn.spawn`, the single call that
creates a peer's process (the sandbox, ``smith_fast/sandbox``, applies there). Output goes through the ``on_shell_output`` hooks either way,
in chunks of at most ``--chunk-size``: as it comes for a stream, once the process ended for a tool. HOOKS.md has the table
of which hook sees what.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from .. import tracing
from ..chunking import OutputChunker
from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from ..process import CappedOutput, Collected, ShellProcess
from ..refused_env import check_env
from . import process_slots
from .shell_exec import run_shell_exec
from .sizes import command_size, too_large
from .egress import open_egress
from .spawn import spawn

if TYPE_CHECKING:
    from ..tools import ProcessRequest, RunProcess
    from .execution import Execution

__all__ = ["admit", "collect", "refuse_nul", "stream", "tool_runner"]


async def admit(ex: Execution, rid: str, cmd: pb.ShellExecCommand, *, origin: str) -> tuple[pb.ShellExecCommand, dict[str, str]]:
    """The hooks, then the checks on what they let through; returns the command and its environment.

    Raises:
        ProtocolError: the service does not offer ``shell_exec`` (``INVALID_CAPABILITY``), a hook
            blocked it (``PERMISSION_DENIED``, ``reason: hook_blocked``), it is larger than
            ``--max-command-size`` after the hooks, or its env is refused.
    """
    ex.audit.note(rid, command=cmd.command, origin=origin)
    if pb.CAPABILITY_SHELL_EXEC not in ex.core.capabilities:
        # The operator left shell_exec out of --capabilities: a tool or a plan step must not start
        # what a ShellExec could not. (Per session it would protect nothing: a peer may ask for it.)
        raise ProtocolError(
            f"{origin} starts a process, which needs capability shell_exec, not offered by this service",
            pb.ERROR_CODE_INVALID_CAPABILITY,
            rid,
            {"reason": "capability_required", "capability": "shell_exec"},
        )
    cmd = await ex.hooks.before_shell_exec(rid, cmd)
    ex.audit.note(rid, command=cmd.command)
    # After the hooks, so a transform cannot bring in what a request may not (sizes.py, refused_env.py).
    limit = ex.core.limits.max_command_size
    if (size := command_size(cmd)) > limit:
        raise too_large("the shell command (after hooks)", size, limit, rid)
    config = ex.core.config
    what = "env" if origin in ("shell_exec", "plan_step") else f"{origin} env"
    asked = cmd.env
    check_env(asked, config.allow_env, policy=config.env_policy, what=what, request_id=rid)
    refuse_nul(cmd, rid, origin)
    if ex.home is not None and (held := await ex.home.bound()):
        # Without --workspaces nothing fills up under a home (session_home.py): it is bounded here.
        limit = ex.home.max_bytes
        ex.sink.log(pb.LOG_LEVEL_WARN, f"the session's home held {held} bytes, more than --max-home-bytes {limit}: it was emptied "
                    "(its caches and configuration) before this command", rid, {"reason": "home_emptied", "bytes": str(held)})
    env = dict(asked) if asked else {}  # dict() of the runtime's map goes through Python-level views
    span = ex.spans.get(rid)
    if span is not None:
        span.set(tracing.ATTR_COMMAND, cmd.command)
        env.update(span.child_env())
    return cmd, env


async def stream(ex: Execution, rid: str, cmd: pb.ShellExecCommand, *, origin: str = "shell_exec") -> int:
    """A ShellExec (or a plan's shell step): admitted, run, its output streamed as ShellOutput events."""
    cmd, env = await admit(ex, rid, cmd, origin=origin)
    if cmd.background and origin == "shell_exec":  # the core's table runs it on (service/background.py)
        return await ex.core.background.start(ex, rid, cmd, env)
    try:
        code = await run_shell_exec(ex, rid, cmd, env)
    except ProtocolError as exc:
        if exc.code == pb.ERROR_CODE_EXECUTION_TIMEOUT:
            ex.audit.process(rid, None, killed="timeout")
        raise
    except asyncio.CancelledError:
        ex.audit.process(rid, None, killed="cancelled")
        raise
    ex.audit.process(rid, code)
    span = ex.spans.get(rid)
    if span is not None:
        span.set(tracing.ATTR_EXIT_CODE, code)
    return code


def refuse_nul(cmd: pb.ShellExecCommand, rid: str, origin: str) -> None:
    """A NUL byte cannot be passed to ``execve`` or ``chdir`` (C strings end there): refused by name,
    before anything is spawned, instead of a ``ValueError`` out of ``subprocess``/``os`` (which a
    peer would see as an internal error).

    Raises:
        ProtocolError: ``ERROR_CODE_UNSPECIFIED``, ``details.reason = invalid_field`` and
            ``details.field`` (``command``, ``shell``, ``cwd``, ``env``).
    """
    fields = [("command", cmd.command)]
    if cmd.HasField("shell"):
        fields.append(("shell", cmd.shell))
    if cmd.HasField("cwd"):
        fields.append(("cwd", cmd.cwd))
    for field, value in fields:
        if "\0" in value:
            raise _nul(origin, field, f"{field} holds a NUL byte at offset {value.index(chr(0))}", rid)
    env = cmd.env
    for name, value in env.items() if env else ():  # names with one are refused by check_env already
        if "\0" in value:
            raise _nul(origin, "env", f"env variable {name[:64]!r} holds a NUL byte", rid)


def _nul(origin: str, field: str, what: str, rid: str) -> ProtocolError:
    return ProtocolError(
        f"{origin}: {what}; a process cannot be given one (nothing was run)",
        pb.ERROR_CODE_UNSPECIFIED,
        rid,
        {"reason": "invalid_field", "field": field},
    )


def tool_runner(ex: Execution, rid: str, tool: str) -> RunProcess:
    """``ToolContext.run_process`` for one call of ``tool`` in request ``rid``."""

    async def run(request: ProcessRequest) -> Collected:
        return await collect(ex, rid, request, origin=tool)

    return run


async def collect(ex: Execution, rid: str, request: ProcessRequest, *, origin: str) -> Collected:
    """A tool's process: admitted like a ShellExec, run to completion, its output collected.

    Output beyond the tool output cap per stream is read (the child never blocks) and dropped.

    Raises:
        ProtocolError: as :func:`admit`; ``RESOURCE_EXHAUSTED`` when every process slot is taken.
        NotADirectoryError: the working directory (after the hooks) is not a directory.
    """
    cmd = pb.ShellExecCommand(request_id=rid, command=request.command, env=dict(request.env), cwd=request.cwd)
    if request.shell is not None:
        cmd.shell = request.shell
    cmd, env = await admit(ex, rid, cmd, origin=origin)
    core = ex.core
    cwd = core.tool_context.resolve(cmd.cwd or ".")  # a tool's process stays in the workspace, after the hooks too
    if not cwd.is_dir():
        raise NotADirectoryError(f"cwd is not a directory: {cmd.cwd!r}")
    output = CappedOutput(core.tool_context.max_output)
    release = process_slots.take(core, ex.slots, rid)
    started = time.monotonic()
    proc: ShellProcess | None = None
    timed_out = False
    try:
        proc = await spawn(
            cmd.command,
            shell=cmd.shell if cmd.HasField("shell") else None,
            cwd=str(cwd),
            env=env,
            on_output=output.on_output,
            sandbox=core.tool_context.sandbox,
            limits=core.limits.command_limits(),
            zygotes=ex.zygotes,
            egress=open_egress(ex, rid),
        )
        ex.processes.add(proc)
        if ex.paused:
            proc.pause_reading()
        timeout = request.timeout_ms / 1000 if request.timeout_ms is not None else None
        try:
            code = await proc.wait(timeout)
        except TimeoutError:
            timed_out = proc.returncode is None
            code = await proc.terminate(core.limits.kill_grace)
        except asyncio.CancelledError:
            ex.audit.process(rid, None, killed="cancelled")
            raise
    finally:
        if proc is not None:
            ex.processes.discard(proc)
            if proc.returncode is None:
                proc.kill()
        release()
    ex.audit.process(rid, code, killed="timeout" if timed_out else None)
    out, err = output.stdout, output.stderr
    if ex.hooks.handles("on_shell_output"):
        out = await _filtered(ex, rid, "stdout", out)
        err = await _filtered(ex, rid, "stderr", err)
    usage = proc.usage if proc is not None else None
    return Collected(code, out, err, output.truncated, timed_out, int((time.monotonic() - started) * 1000), usage)


async def _filtered(ex: Execution, rid: str, stream: str, data: bytes) -> bytes:
    """A collected stream through the output hooks, in the chunks a ShellExec's output would come
    in (at most ``--chunk-size`` bytes, cut on character boundaries); a chunk a hook blocked is left out."""
    if not data:
        return data
    chunker = OutputChunker(ex.core.limits.chunk_size)
    out = []
    for text in [*chunker.feed(data), *chunker.flush()]:
        kept = await ex.hooks.on_shell_output(rid, stream, text)
        if kept is not None:
            out.append(kept)
    return "".join(out).encode()
