"""The offline planner: a plan from ``context["steps"]``, or from a goal written as shell commands."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping

from ..pb import smith_pb2
from .model import NOTE, SHELL, Plan, PlanError, Step
from .options import PlanOptions
from .schema import DEFAULT_MAX_STEPS, build_plan, decode_plan_json, label_for
from .shellsplit import split_shell_goal

__all__ = ["RulesPlanner", "steps_plan"]


def steps_plan(
    goal: str,
    options: PlanOptions,
    *,
    planner: str,
    known_tools: Collection[str] | None,
    max_steps: int,
) -> Plan:
    """The plan the client wrote in ``context["steps"]``; shared by every planner.

    Args:
        goal: the goal text.
        options: the parsed context; ``options.steps`` must be set.
        planner: the planner's name, for the goal node's metadata.
        known_tools: when given, tool steps must name one of these.
        max_steps: the most steps allowed.

    Returns:
        The plan.

    Raises:
        PlanError: the JSON is invalid or the plan breaks a rule (see :func:`~.schema.build_plan`).
    """
    assert options.steps is not None
    source = 'context["steps"]'
    value = decode_plan_json(options.steps, source)
    return build_plan(
        value, goal, source=source, known_tools=known_tools, max_steps=max_steps, metadata=_metadata(planner, options)
    )


def _metadata(planner: str, options: PlanOptions) -> dict[str, str]:
    meta = {"planner": planner}
    if options.traceparent:
        meta["traceparent"] = options.traceparent
    return meta


class RulesPlanner:
    """Plans without a model.

    * With ``context["steps"]``: that plan, validated (ids, kinds, dependencies, no cycle).
    * Else, with ``context["goal_kind"] = "note"``: one note step holding the goal.
    * Else (``goal_kind`` ``shell``, the default): the goal is read as ``sh`` commands and cut at its
      top-level ``&&`` (the next step *depends on* the previous one: it runs only if that one
      succeeded), ``;`` and newlines (the next step runs *after* the previous one, whatever its
      result), exactly the order ``sh`` would run them in. See :mod:`~smith_fast.plan.shellsplit`.

    Args:
        known_tools: when given, tool steps in ``context["steps"]`` must name one of these.
        max_steps: the most steps a plan may have.
    """

    name = "rules"

    def __init__(self, *, known_tools: Collection[str] | None = None, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        self.known_tools = None if known_tools is None else frozenset(known_tools)
        self.max_steps = max_steps

    async def plan(self, goal: str, context: Mapping[str, str]) -> Plan:
        """Build the plan.

        Args:
            goal: ``PlanCommand.goal``.
            context: ``PlanCommand.context``.

        Returns:
            The plan.

        Raises:
            PlanError: a bad context value, an invalid ``steps`` plan, a goal that is not valid shell,
                an empty goal, or too many steps.
        """
        return self.plan_now(goal, context)

    def plan_now(self, goal: str, context: Mapping[str, str]) -> Plan:
        """:meth:`plan`, synchronously: the rules planner never waits for anything."""
        options = PlanOptions.from_context(context)
        if options.steps is not None:
            return steps_plan(goal, options, planner=self.name, known_tools=self.known_tools, max_steps=self.max_steps)
        meta = _metadata(self.name, options)
        if not goal.strip():
            raise PlanError("the goal is empty and the context has no \"steps\"")
        if options.goal_kind == NOTE:
            step = Step(id=str(uuid.uuid4()), label=label_for(goal), kind=NOTE, ref="1")
            return Plan(str(uuid.uuid4()), goal, (step,), None, meta)
        segments = split_shell_goal(goal)
        if not segments:
            raise PlanError("the goal holds no shell command (only blank lines or comments)", "invalid_goal")
        if len(segments) > self.max_steps:
            raise PlanError(
                f"the goal has {len(segments)} commands; the limit is {self.max_steps}",
                "too_many_steps",
                code=smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED,
            )
        steps: list[Step] = []
        for position, (command, joiner) in enumerate(segments, 1):
            previous = (steps[-1].id,) if steps else ()
            steps.append(
                Step(
                    id=str(uuid.uuid4()),
                    label=label_for(command),
                    kind=SHELL,
                    command=command,
                    depends_on=previous if joiner == "&&" else (),
                    after=previous if joiner == ";" else (),
                    ref=str(position),
                )
            )
        return Plan(str(uuid.uuid4()), goal, tuple(steps), None, meta)

