"""A whole ``PlanCommand``: plan, report usage, draw the graph, and run it when asked."""

from __future__ import annotations

from collections.abc import Callable

from ..pb import smith_pb2
from .executor import PlanExecutor, RunShell, RunTool
from .graph import plan_deltas, token_usage_event
from .model import Plan, PlanError, Usage
from .options import PlanOptions
from .planners import Planner

__all__ = ["run_plan_command"]


async def run_plan_command(
    command: smith_pb2.PlanCommand,
    planner: Planner,
    *,
    emit: Callable[[smith_pb2.Event], None],
    run_shell: RunShell,
    run_tool: RunTool,
) -> tuple[Plan, dict[str, str] | None]:
    """Handle one ``PlanCommand`` (the session wraps this in its request lifecycle).

    Events, in order: a ``TokenUsageEvent`` when a model was asked (also when its plan was then
    rejected: the tokens were spent), the plan's ``GraphDeltaEvent``\\ s, and, with
    ``context["execute"]``, one ``GraphDeltaEvent`` per status change while it runs.

    Args:
        command: the command.
        planner: the planner.
        emit: receives each event (an ``Event`` with ``token_usage`` or ``graph_delta`` set).
        run_shell: see :class:`~smith_fast.plan.executor.PlanExecutor`.
        run_tool: see :class:`~smith_fast.plan.executor.PlanExecutor`.

    Returns:
        The plan, and step id → final status when it was executed (else ``None``). Failed steps do
        not make this raise: the goal node's status says how the plan went.

    Raises:
        PlanError: no plan could be made (bad context, bad plan, model unreachable ...).
        asyncio.CancelledError: cancelled; a running plan reported its steps ``cancelled`` first.
    """
    rid = command.request_id
    options = PlanOptions.from_context(command.context)
    try:
        plan = await planner.plan(command.goal, command.context)
    except PlanError as exc:
        if isinstance(exc.usage, Usage):  # errors.py holds PlanError below the plan's types
            emit(smith_pb2.Event(token_usage=token_usage_event(exc.usage, rid)))
        raise
    if plan.usage is not None:
        emit(smith_pb2.Event(token_usage=token_usage_event(plan.usage, rid)))
    for delta in plan_deltas(plan, rid):
        emit(smith_pb2.Event(graph_delta=delta))
    if not options.execute:
        return plan, None
    executor = PlanExecutor(
        plan,
        rid,
        run_shell=run_shell,
        run_tool=run_tool,
        emit=lambda delta: emit(smith_pb2.Event(graph_delta=delta)),
        max_parallel=options.max_parallel,
    )
    return plan, await executor.run()
