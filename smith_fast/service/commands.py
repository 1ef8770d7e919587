"""The command table: everything the service knows per command type, in one row each.

Dispatch (:meth:`Session.handle <smith_fast.service.session.Session.handle>`), the capability and
size checks, the metrics and the local runner all read :data:`COMMANDS`; the v0 name comes from the
v0 codec's own table (``smith_fast.jsonl._fields``). Adding a command type is one row here (and its
handler below, or in a module of its own), plus its schema, its v0 shape and its tests
(ARCHITECTURE.md, "Adding a command type").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .. import tracing
from ..errors import ProtocolError
from ..jsonl._fields import COMMANDS_BY_ONEOF
from ..pb import smith_pb2 as pb
from ..records import record
from ..tools import ToolOutcome
from . import workspace_commands
from .execution import ControlTarget, Execution
from .sizes import command_size, plan_size, too_large, tool_call_size

if TYPE_CHECKING:
    from ..plan import Step
    from ..relaypeek import ToolCall
    from .sinks import EventSink

# The process stack (service/launch.py: spawn, the sandbox's zygotes, shells, egress) and the
# planner are imported by the first command that needs them, not by every start: the first answer
# of `serve --mcp`/`--stdio` (a handshake, a small fs.read) needs neither, and importing them cost
# ~20 ms of it (tests/test_start.py holds them out of the start).

__all__ = ["CommandSpec", "COMMANDS", "Control", "ControlTarget", "Handler", "RequestControl", "shell_exec", "run_tool"]

Handler = Callable[[Execution, str, Any], Coroutine[Any, Any, Any]]
"""Runs one request of its kind: ``handler(execution, request_id, request)``; raises
:class:`~smith_fast.errors.ProtocolError` to end it with an error."""


class RequestControl(Protocol):
    """Where control commands find their target (a
    :class:`~smith_fast.service.runner.RequestRunner` is one)."""

    @property
    def sink(self) -> EventSink: ...

    def target(self, rid: str, what: str) -> ControlTarget | None:
        """The running request (or background process) ``rid`` names, for a command that would
        ``what`` it (``cancel``, ``write stdin to``: the phrase of its errors); None when there
        is nothing to do (a Cancel of a request that ended cancelled).

        Raises:
            ProtocolError: ``rid`` names nothing running (``not_running``, ``unknown_request``),
                or a background process the session may not steer.
        """
        ...


class Admitted(Protocol):
    """What a :data:`Now` shortcut sees of its request (:class:`~smith_fast.service.request.Request`)."""

    id: str
    call: ToolCall | None

    @property
    def command(self) -> Any:
        """The command that asked for it (made of :attr:`call` when the session read one)."""
        ...

    def answer_at_once(self, success: bool, result: bytes, error: str | None, duration_ms: int) -> None:
        """``PROCESSING``, its ``ToolResult`` and ``READY`` in one write."""
        ...


Now = Callable[[Execution, Admitted], "bool | Callable[[Execution, str, Any], Coroutine[Any, Any, Any]] | None"]
"""Runs one request in the step that read it where it can: ``now(execution, request)`` returns True
when it ended (:meth:`Request.answer_at_once <smith_fast.service.request.Request.answer_at_once>`)
and wrote its audit line; a handler to go on with when it started but did not end (the runner then
runs it as any request: ``PROCESSING`` first, so nothing may have been sent yet); None when it
cannot run it so (the row's handler runs)."""

Control = Callable[[RequestControl, Any], None]
"""What a control command does: ``control(runner, request)`` (the request names its target's id)."""


@record(frozen=True, slots=True)
class CommandSpec:
    """One command type.

    Attributes:
        kind: its ``Command.command_type`` member (also its metrics label).
        v0_name: its v0 JSON variant name; None for a command v0 cannot carry (v1 only).
        needs: the capability the request needs granted, or a phrase naming what it needs when no
            capability serves it (a HookLoad of an unknown ``hook_type``); None: nothing.
        size: what ``--max-command-size`` measures of it, or None (not limited).
        handler: how the local runner runs it; None for the commands the session answers itself
            (handshake, shutdown).
        timed: its latency histogram is reported from the start, before one ran.
        control: for a command that addresses a running request (cancel, stdin, resize): what it
            does, which the session hands to its runner at once instead of starting a request.
            Such a command has no states of its own; what it cannot do is an ``ErrorEvent``
            naming the request it addressed.
        now: a shortcut the local runner tries first, for a request it can run and answer in
            the step that read it, with nothing configured that would watch it (no tracing; see
            :data:`Now`); otherwise a request runs as a task.
    """

    kind: str
    v0_name: str | None
    needs: Callable[[Any], int | str] | None = None
    size: Callable[[Any], int] | None = None
    handler: Handler | None = None
    timed: bool = False
    control: Control | None = None
    now: Now | None = None


# ---- handlers ---------------------------------------------------------------------------------


async def shell_exec(ex: Execution, rid: str, cmd: pb.ShellExecCommand) -> int:
    """Through the choke point (service/launch.py): hooks first (a block means the process never
    starts), the checks on what they let through, then the command."""
    from . import launch

    return await launch.stream(ex, rid, cmd)


async def run_tool(ex: Execution, rid: str, tool: str, args: bytes, timeout_ms: int) -> ToolOutcome:
    """One tool call through the hooks; sends its ToolResult and returns the outcome.

    The tool's context carries this request's process runner: a process the tool starts passes
    the same choke point as a ShellExec (``launch.tool_runner``)."""
    if ex.cancelling():  # a plan's step after its plan was cancelled
        raise ProtocolError("request cancelled: the tool was not called", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"})
    ex.audit.note(rid, tool=tool)
    hooks = ex.hooks
    if hooks.handles("before_tool_call"):  # no hook for it: not even the coroutine (most calls)
        tool, args = await hooks.before_tool_call(rid, tool, args)
        ex.audit.note(rid, tool=tool)
    limit = ex.core.limits.max_command_size
    if len(args) > limit:
        raise too_large(f"the arguments of {tool} (after hooks)", len(args), limit, rid)
    span = ex.spans.get(rid)
    if span is not None:
        span.set(tracing.ATTR_TOOL, tool)
    core = ex.core
    from . import launch

    context = core.tool_context.with_process_runner(launch.tool_runner(ex, rid, tool))
    # the tool as the hooks left it: an fs.write gets a layer of its own (PROTOCOL.md, "Workspaces")
    ws = workspace_commands.begin(ex, rid) if tool in workspace_commands.RECORDED_TOOLS else None
    try:
        outcome = await core.tools.call(tool, args, context, timeout=timeout_ms / 1000 if timeout_ms else None)
    finally:
        changes = workspace_commands.end(ex, ws, rid)
    success, result, error = outcome.success, outcome.result, outcome.error
    if hooks.handles("after_tool_result"):
        success, result, error = await hooks.after_tool_result(rid, tool, success, result, error)
    ex.audit.note(rid, success=success)
    if changes is None:
        ex.sink.tool_result(rid, success, result, error, outcome.duration_ms)
    else:
        ex.sink.tool_result_changes(rid, success, result, error, outcome.duration_ms, changes)
    return ToolOutcome(success, result, error, outcome.duration_ms)


def _tool_call(ex: Execution, rid: str, cmd: pb.ToolCallCommand) -> Coroutine[Any, Any, ToolOutcome]:
    # run_tool's coroutine itself, not one awaiting it: a frame less per call
    timeout_ms = cmd.timeout_ms if cmd.HasField("timeout_ms") else ex.core.limits.default_timeout_ms
    return run_tool(ex, rid, cmd.tool, cmd.args, timeout_ms)


def _tool_call_now(ex: Execution, request: Admitted) -> bool | Handler | None:
    """A tool call with no tool hooks, started at once: when the tool ends in that step (a small
    ``fs.read``), ``PROCESSING``, its ``ToolResult`` and ``READY`` go out in one write; when it goes
    on, the rest runs as any request. What it sends and logs is what :func:`run_tool` and the runner
    would (the same events in the same order, the same audit line)."""
    if ex.hooks.tools_hooked:
        return None
    call = request.call
    if call is not None:  # started by Session.start_tool_call: no pb.Command was made
        _rid, tool, args, timeout_ms = call
        if timeout_ms < 0:
            timeout_ms = ex.core.limits.default_timeout_ms
    else:
        cmd: pb.ToolCallCommand = request.command.tool_call
        timeout_ms = cmd.timeout_ms if cmd.HasField("timeout_ms") else ex.core.limits.default_timeout_ms
        tool, args = cmd.tool, cmd.args
    rid = request.id
    # An fs.write in a session that records changes: its own layer, from before it starts until it
    # ended (PROTOCOL.md, "Workspaces"); its ToolResult then carries what it changed.
    ws = workspace_commands.begin(ex, rid) if tool in workspace_commands.RECORDED_TOOLS else None
    try:
        step = ex.core.tools.start(tool, args, ex.tool_context, timeout=timeout_ms / 1000 if timeout_ms else None)
    except BaseException:
        workspace_commands.end(ex, ws, rid)
        raise
    if step is None:
        workspace_commands.end(ex, ws, rid)  # run_tool begins again
        return None  # an unknown tool: run_tool says so, after PROCESSING
    if ws is not None or type(step) is not ToolOutcome:
        going_on: Awaitable[ToolOutcome] | ToolOutcome = step

        async def finish(ex: Execution, rid: str, _cmd: pb.ToolCallCommand) -> None:
            ex.audit.note(rid, tool=tool)
            try:
                done = going_on if isinstance(going_on, ToolOutcome) else await going_on
            finally:
                changes = workspace_commands.end(ex, ws, rid)
            ex.audit.note(rid, success=done.success)
            if changes is None:
                ex.sink.tool_result(rid, done.success, done.result, done.error, done.duration_ms)
            else:
                ex.sink.tool_result_changes(rid, done.success, done.result, done.error, done.duration_ms, changes)

        # A recorded call goes on as a request even when it ended now: its ToolResult is not the
        # one-write answer's (which has no changes), and the runner sends PROCESSING first.
        return finish
    # The events first: the front's flush is then scheduled before the log's, so the answer goes
    # out before the audit line is written (as on the normal path, where PROCESSING comes first).
    request.answer_at_once(step.success, step.result, step.error, step.duration_ms)
    ex.audit.tool_ended(rid, tool, step.success, step.duration_ms)
    return True


async def _plan(ex: Execution, rid: str, cmd: pb.PlanCommand) -> None:
    """Plan (and with ``context["execute"]`` run) a goal; steps report under their node ids."""
    from ..plan import PlanOptions, run_plan_command
    from . import launch

    options = PlanOptions.from_context(cmd.context)
    timeout_ms = options.timeout_ms or ex.core.limits.default_timeout_ms

    async def run_shell(step: Step) -> int:
        await ex.reading()  # a peer that does not read holds the plan's next step (service/flow.py)
        shell = pb.ShellExecCommand(request_id=step.id, command=step.command or "")
        if timeout_ms:
            shell.timeout_ms = timeout_ms
        ex.audit.begin(step.id, "plan_step", parent=rid)
        try:
            code = await launch.stream(ex, step.id, shell, origin="plan_step")
        except BaseException as exc:
            ex.audit.end(step.id, exc)
            raise
        ex.audit.end(step.id)
        return code

    async def step_tool(step: Step) -> ToolOutcome:
        await ex.reading()
        ex.audit.begin(step.id, "plan_step", parent=rid)
        try:
            outcome = await run_tool(ex, step.id, step.tool or "", step.args_json(), timeout_ms)
        except BaseException as exc:
            ex.audit.end(step.id, exc)
            raise
        ex.audit.end(step.id)
        return outcome

    await run_plan_command(cmd, ex.core.planner, emit=ex.sink.event, run_shell=run_shell, run_tool=step_tool)


async def _hook_load(ex: Execution, rid: str, cmd: pb.HookLoadCommand) -> None:
    ex.audit.note(rid, hook_type=cmd.hook_type)
    await ex.hooks.load(rid, cmd)


_HOOK_CAPS = {"js": pb.CAPABILITY_HOOKS_JS, "rust": pb.CAPABILITY_HOOKS_RUST}


def _hook_capability(cmd: pb.HookLoadCommand) -> int | str:
    return _HOOK_CAPS.get(cmd.hook_type) or f"hooks for {cmd.hook_type!r}"


def _shell_capability(_cmd: pb.ShellExecCommand) -> int:
    return pb.CAPABILITY_SHELL_EXEC


async def _list_processes(ex: Execution, rid: str, cmd: pb.ListProcessesCommand) -> None:
    await ex.core.background.list_processes(ex, rid, cmd)


async def _attach(ex: Execution, rid: str, cmd: pb.AttachCommand) -> None:
    await ex.core.background.attach(ex, rid, cmd)


def _background_capability(_cmd: object) -> int:
    return pb.CAPABILITY_SHELL_EXEC  # what a background process runs is a shell's: so is seeing or steering it


def _cancel(runner: RequestControl, cmd: pb.CancelCommand) -> None:
    target = runner.target(cmd.request_id, "cancel")
    if target is not None:
        target.cancel()


def _stdin(runner: RequestControl, cmd: pb.StdinCommand) -> None:
    target = runner.target(cmd.request_id, "write stdin to")
    if target is not None:
        target.write_stdin(cmd.data, cmd.eof)


def _resize(runner: RequestControl, cmd: pb.ResizeCommand) -> None:
    target = runner.target(cmd.request_id, "resize")
    if target is not None:
        target.resize(cmd.rows, cmd.cols)


def _stdin_size(cmd: pb.StdinCommand) -> int:
    return len(cmd.data)


# ---- the table --------------------------------------------------------------------------------


def _spec(kind: str, **columns: Any) -> CommandSpec:
    variant = COMMANDS_BY_ONEOF.get(kind)
    return CommandSpec(kind, variant[0] if variant is not None else None, **columns)


COMMANDS: Mapping[str, CommandSpec] = {
    spec.kind: spec
    for spec in (
        _spec("handshake"),
        _spec("shell_exec", needs=_shell_capability, size=command_size, handler=shell_exec, timed=True),
        _spec("tool_call", size=tool_call_size, handler=_tool_call, timed=True, now=_tool_call_now),
        _spec("hook_load", needs=_hook_capability, handler=_hook_load),
        _spec("plan", size=plan_size, handler=_plan),
        _spec("shutdown"),
        _spec("cancel", control=_cancel),
        _spec("stdin", size=_stdin_size, control=_stdin),
        _spec("resize", control=_resize),
        _spec("list_processes", needs=_background_capability, handler=_list_processes),
        _spec("attach", needs=_background_capability, handler=_attach),
        # PROTOCOL.md, "Workspaces" (v1 only: no v0 name)
        _spec("checkpoint", needs=workspace_commands.needs_workspaces, handler=workspace_commands.checkpoint, timed=True),
        _spec("restore", needs=workspace_commands.needs_workspaces, handler=workspace_commands.restore, timed=True),
        _spec("diff", needs=workspace_commands.needs_workspaces, handler=workspace_commands.diff, timed=True),
        _spec("undo", needs=workspace_commands.needs_workspaces, handler=workspace_commands.undo, timed=True),
    )
}
