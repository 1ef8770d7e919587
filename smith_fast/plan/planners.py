"""The planner interface and the ``--planner`` choice."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from .llm import LlmPlanner
from .model import Plan, PlanError
from .rules import RulesPlanner
from .schema import DEFAULT_MAX_STEPS

__all__ = ["API_KEY_ENV", "PLANNERS", "Planner", "planner_from_options"]

PLANNERS = ("rules", "llm")
"""The names ``--planner`` accepts; the first is the default."""
API_KEY_ENV = "SMITH_PLANNER_API_KEY"
"""The environment variable the llm planner's API key is read from (never a command-line flag, so it
does not show in ``ps``)."""


@runtime_checkable
class Planner(Protocol):
    """Turns a goal into a :class:`~smith_fast.plan.model.Plan`.

    Attributes:
        name: ``rules`` or ``llm``; shown as the goal node's ``planner`` metadata.
    """

    name: str

    async def plan(self, goal: str, context: Mapping[str, str]) -> Plan:
        """Build a plan.

        Args:
            goal: ``PlanCommand.goal``.
            context: ``PlanCommand.context`` (keys in ``docs/PLANS.md``).

        Returns:
            The checked plan.

        Raises:
            PlanError: the plan cannot be made; the message says why.
        """
        ...


def planner_from_options(
    name: str,
    url: str | None = None,
    model: str | None = None,
    *,
    api_key: str | None = None,
    timeout: float = 60.0,
    tools: Mapping[str, str] | None = None,
    json_mode: bool = True,
    max_steps: int = DEFAULT_MAX_STEPS,
    environ: Mapping[str, str] | None = None,
) -> Planner:
    """The planner the command line asked for.

    Args:
        name: ``--planner``: ``rules`` or ``llm``.
        url: ``--planner-url`` (llm only).
        model: ``--planner-model`` (llm only).
        api_key: the API key; ``None`` reads :data:`API_KEY_ENV` from ``environ``.
        timeout: seconds the llm planner waits for the model.
        tools: tool name → description (``{t.name: t.description for t in registry.tools()}``):
            listed to the model, and tool steps must name one of them.
        json_mode: whether the llm planner asks for ``response_format`` ``json_object``.
        max_steps: the most steps a plan may have.
        environ: where to read the key from; ``None`` means ``os.environ``.

    Returns:
        The planner.

    Raises:
        PlanError: ``planner_config``: an unknown name, or ``llm`` without a URL or model.
    """
    choice = (name or PLANNERS[0]).strip().lower()
    if choice == "rules":
        return RulesPlanner(known_tools=None if tools is None else tools.keys(), max_steps=max_steps)
    if choice == "llm":
        if not url:
            raise PlanError("--planner llm needs --planner-url (an OpenAI-compatible endpoint)", "planner_config")
        if not model:
            raise PlanError("--planner llm needs --planner-model", "planner_config")
        if api_key is None:
            api_key = (os.environ if environ is None else environ).get(API_KEY_ENV) or None
        return LlmPlanner(url, model, api_key, timeout=timeout, tools=tools, json_mode=json_mode, max_steps=max_steps)
    raise PlanError(f"unknown planner {name!r}; choose one of {', '.join(PLANNERS)}", "planner_config")
