"""What a plan is: steps, the plan, the model's token usage, and the error every planner raises.

A plan is a directed acyclic graph of :class:`Step`\\ s under one goal. Steps reference each other by
their ``id`` (a UUID, also the step's graph node id). Two relations order them:

* ``depends_on``: the step starts only after each of these succeeded; if one failed (or was skipped)
  the step is skipped. Written ``a && b`` in a shell goal.
* ``after``: the step starts only after each of these finished, whatever the result. Written
  ``a ; b`` (or a newline) in a shell goal.

:attr:`Plan.steps` is always in a topological order (a step comes after everything it waits for),
stable with respect to the order the planner was given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PlanError

__all__ = [
    "AFTER",
    "CANCELLED",
    "DEPENDS_ON",
    "FAILED",
    "FINAL_STATUSES",
    "GOAL",
    "KINDS",
    "NOTE",
    "PENDING",
    "RUNNING",
    "SHELL",
    "SKIPPED",
    "SUCCEEDED",
    "TOOL",
    "Plan",
    "PlanError",
    "Step",
    "Usage",
]

# Step kinds; also the ``node_type`` of their graph nodes. The goal node's type is GOAL.
SHELL = "shell"
TOOL = "tool"
NOTE = "note"
GOAL = "goal"
KINDS = (SHELL, TOOL, NOTE)

# Edge types (``GraphEdge.edge_type``).
DEPENDS_ON = "depends_on"
AFTER = "after"

# Node statuses (``GraphNode.metadata["status"]``).
PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
SKIPPED = "skipped"
CANCELLED = "cancelled"
FINAL_STATUSES = frozenset({SUCCEEDED, FAILED, SKIPPED, CANCELLED})


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens the planning model reported for one plan.

    Attributes:
        tokens_used: ``usage.total_tokens`` of the reply (prompt plus completion).
        tokens_remaining: ``context["token_budget"]`` minus ``tokens_used`` (never below 0), or
            ``None`` when the context gives no budget.
        model: the model that answered (the reply's ``model``, else the one asked for).
    """

    tokens_used: int
    tokens_remaining: int | None
    model: str


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a plan.

    Attributes:
        id: a fresh UUID; also the step's graph node id and the ``request_id`` its output streams under.
        label: a short human-readable description.
        kind: :data:`SHELL`, :data:`TOOL` or :data:`NOTE`.
        command: the shell command line (shell steps only).
        tool: the tool's name (tool steps only).
        args: the tool's arguments as a decoded JSON value (tool steps only; ``{}`` by default).
        depends_on: ids of steps that must succeed before this one starts.
        after: ids of steps that must finish (with any result) before this one starts.
        ref: the id the planner wrote for this step (``"build"``, ``"2"``): shown in error messages
            and in the node metadata, so a human can match the graph to the plan text.
    """

    id: str
    label: str
    kind: str
    command: str | None = None
    tool: str | None = None
    args: Any = None
    depends_on: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    ref: str = ""

    def args_json(self) -> bytes:
        """The tool arguments as compact UTF-8 JSON, ready for ``ToolRegistry.call``.

        Returns:
            ``b"{}"`` when the step has no arguments.
        """
        if self.args is None:
            return b"{}"
        return json.dumps(self.args, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class Plan:
    """A goal and the steps that reach it.

    Attributes:
        goal_id: a fresh UUID: the goal's graph node id.
        goal: the goal as the client wrote it.
        steps: the steps, in a topological order (see the module docstring).
        usage: the model's token usage; ``None`` when no model was asked or it reported none.
        metadata: extra metadata for the goal node: ``planner`` (``rules`` or ``llm``), and ``model``
            and ``traceparent`` when they apply.
    """

    goal_id: str
    goal: str
    steps: tuple[Step, ...]
    usage: Usage | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    def step(self, step_id: str) -> Step:
        """The step with this id.

        Raises:
            KeyError: no step has this id.
        """
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)
