"""The ``shell.run`` tool: run a command through the shell and return what it printed.

The tool does not start the process itself: it asks :attr:`ToolContext.run_process
<smith_fast.tools.workspace.ToolContext.run_process>`, which in the service is the one choke point
every process a peer starts goes through (``smith_fast.service.launch``): the ``before_shell_exec``
hooks see the command (and can block or rewrite it) exactly as they see a ShellExec, the
``on_shell_output`` hooks see its output, the env policy (:mod:`smith_fast.refused_env`) refuses
variables that load code (``ERROR_CODE_PERMISSION_DENIED`` naming them), it takes one of the
``--max-processes`` slots, and the audit log records it.

The working directory must lie inside the workspace (default: the root); the command itself is
confined by the service's sandbox (``ToolContext.sandbox``, PROTOCOL.md "Sandbox"). Output is collected up to ``ToolContext.max_output`` bytes per stream and decoded as
UTF-8 (undecodable bytes become U+FFFD). ``usage`` in the result is what the command cost
(:class:`smith_fast.containment.Usage`, the fields PROTOCOL.md lists under "Accounting"); a command
past a ``--max-*-per-command`` limit fails the call with ``ERROR_CODE_RESOURCE_EXHAUSTED`` naming it.
The command's own ``timeout_ms`` ends it with
``timed_out: true`` in a successful result; the call-level timeout of the registry instead
cancels the tool, and the child is killed on cancellation.
"""

from __future__ import annotations

from typing import Any

from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.tools.registry import Tool
from smith_fast.tools.workspace import ProcessRequest, ToolContext

__all__ = ["SHELL_RUN", "run_direct"]

RUN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "minLength": 1, "description": "Shell command line."},
        "cwd": {
            "type": "string",
            "minLength": 1,
            "default": ".",
            "description": "Working directory relative to the workspace root.",
        },
        "env": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Extra environment variables.",
        },
        "timeout_ms": {
            "type": "integer",
            "minimum": 1,
            "description": "Kill the command after this many milliseconds (result: timed_out).",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}


async def run_direct(request: ProcessRequest, ctx: ToolContext) -> Any:
    """A process for a tool used outside a service (no hooks, no slots): the env policy, then
    :func:`smith_fast.process.run_collect`."""
    # Imported here so that the registry (and tools.list) work without the process machinery.
    from smith_fast.process import run_collect
    from smith_fast.refused_env import check_env

    check_env(request.env, ctx.allow_env, policy=ctx.env_policy, what="shell.run env")
    return await run_collect(
        request.command,
        shell=request.shell,
        cwd=str(ctx.resolve(request.cwd)),
        env=request.env,
        timeout=None if request.timeout_ms is None else request.timeout_ms / 1000,
        max_output=ctx.max_output,
        sandbox=ctx.sandbox,
        limits=ctx.command_limits,
    )


async def _run(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    cwd = ctx.resolve(args.get("cwd", "."))
    if not cwd.is_dir():
        raise NotADirectoryError(f"cwd is not a directory: {args.get('cwd')!r}")
    request = ProcessRequest(
        command=args["command"], cwd=args.get("cwd", "."), env=args.get("env") or {}, timeout_ms=args.get("timeout_ms")
    )
    collected = await (ctx.run_process(request) if ctx.run_process is not None else run_direct(request, ctx))
    usage = collected.usage
    if usage is not None and usage.limit_hit is not None:
        raise ProtocolError(
            f"shell.run: the command hit {usage.limit_hit} and was stopped",
            smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED,
            details={"reason": "limit", "limit": usage.limit_hit},
        )
    return {
        "exit_code": collected.exit_code,
        "stdout": collected.stdout.decode("utf-8", "replace"),
        "stderr": collected.stderr.decode("utf-8", "replace"),
        "truncated": collected.truncated,
        "timed_out": collected.timed_out,
        "usage": usage.as_dict() if usage is not None else None,
    }


SHELL_RUN = Tool(
    name="shell.run",
    description=(
        "Run a shell command in the workspace; returns {exit_code, stdout, stderr, truncated, timed_out, usage}."
    ),
    schema=RUN_SCHEMA,
    handler=_run,
)
