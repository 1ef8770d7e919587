"""Plans: a goal becomes a graph of steps, streamed as ``GraphDeltaEvent``\\ s and optionally run.

* :class:`Planner` (``--planner``): :class:`RulesPlanner` (default, offline: ``context["steps"]``
  or a goal written as shell commands) or :class:`LlmPlanner` (any OpenAI-compatible
  chat-completions endpoint); :func:`planner_from_options` picks one.
* :func:`plan_deltas` draws a :class:`Plan`; :class:`PlanExecutor` runs it, one delta per status
  change; :func:`run_plan_command` does both for a ``PlanCommand``.
* :class:`PlanOptions` parses the context keys. Shapes and rules: ``docs/PLANS.md``.

Example::

    planner = planner_from_options("rules")
    plan = await planner.plan("make && make test; make clean", {})
    for delta in plan_deltas(plan, request_id):
        sink.event(smith_pb2.Event(graph_delta=delta))
"""

from __future__ import annotations

from .command import run_plan_command
from .executor import Emit, PlanExecutor, RunShell, RunTool
from .graph import goal_node, plan_deltas, status_delta, step_node, token_usage_event
from .llm import LlmPlanner, chat_completions_url
from .model import (
    AFTER,
    CANCELLED,
    DEPENDS_ON,
    FAILED,
    GOAL,
    NOTE,
    PENDING,
    RUNNING,
    SHELL,
    SKIPPED,
    SUCCEEDED,
    TOOL,
    Plan,
    PlanError,
    Step,
    Usage,
)
from .options import PlanOptions
from .planners import API_KEY_ENV, PLANNERS, Planner, planner_from_options
from .rules import RulesPlanner
from .schema import DEFAULT_MAX_STEPS, build_plan
from .shellsplit import split_shell_goal

__all__ = [
    "AFTER",
    "API_KEY_ENV",
    "CANCELLED",
    "DEFAULT_MAX_STEPS",
    "DEPENDS_ON",
    "FAILED",
    "GOAL",
    "NOTE",
    "PENDING",
    "PLANNERS",
    "RUNNING",
    "SHELL",
    "SKIPPED",
    "SUCCEEDED",
    "TOOL",
    "Emit",
    "LlmPlanner",
    "Plan",
    "PlanError",
    "PlanExecutor",
    "PlanOptions",
    "Planner",
    "RulesPlanner",
    "RunShell",
    "RunTool",
    "Step",
    "Usage",
    "build_plan",
    "chat_completions_url",
    "goal_node",
    "plan_deltas",
    "planner_from_options",
    "run_plan_command",
    "split_shell_goal",
    "status_delta",
    "step_node",
    "token_usage_event",
]
