"""A plan as ``GraphDeltaEvent``\\ s: the nodes and edges, then one delta per status change.

Shapes (``docs/PLANS.md`` has the full contract):

* goal node: ``node_type`` ``goal``, label = the goal's first line; metadata ``status``, ``goal``
  (the full text), ``steps`` (the count), ``planner``, and ``model``/``traceparent`` when known.
* step node: ``node_type`` = the step's kind (``shell``, ``tool``, ``note``), label = the step's
  label; metadata ``status``, ``ref`` (the id the planner wrote), ``index`` (1-based position in
  the plan), ``command`` (shell) or ``tool`` and ``args`` (compact JSON) (tool); once finished also
  ``exit_code`` (shell), ``duration_ms`` and ``error`` when there is one.
* edges: ``from`` the waiting node ``to`` the node it waits for. ``depends_on`` (the waiting step
  is skipped if the other one does not succeed) or ``after`` (it runs once the other one finished,
  whatever the result). The goal node ``depends_on`` every step nothing else waits for.

Every id (node and edge) is a UUID, so the events also go to v0 (JSON lines) peers unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from ..pb import smith_pb2
from .model import AFTER, DEPENDS_ON, GOAL, PENDING, SHELL, TOOL, Plan, Step, Usage
from .schema import label_for, order_steps

__all__ = ["goal_node", "plan_deltas", "status_delta", "step_node", "token_usage_event"]


def goal_node(plan: Plan, status: str = PENDING, extra: Mapping[str, str] | None = None) -> smith_pb2.GraphNode:
    """The goal's node.

    Args:
        plan: the plan.
        status: the goal's status.
        extra: more metadata (the executor adds the step counts when it finishes).

    Returns:
        A new node.
    """
    node = smith_pb2.GraphNode(id=plan.goal_id, label=label_for(plan.goal), node_type=GOAL)
    meta = node.metadata
    meta.update(plan.metadata)
    meta["status"] = status
    meta["goal"] = plan.goal
    meta["steps"] = str(len(plan.steps))
    if extra:
        meta.update(extra)
    return node


def step_node(step: Step, index: int, status: str = PENDING, extra: Mapping[str, str] | None = None) -> smith_pb2.GraphNode:
    """A step's node.

    Args:
        step: the step.
        index: its 1-based position in the plan.
        status: its status.
        extra: more metadata (``exit_code``, ``duration_ms``, ``error``).

    Returns:
        A new node.
    """
    node = smith_pb2.GraphNode(id=step.id, label=step.label, node_type=step.kind)
    meta = node.metadata
    meta["status"] = status
    meta["ref"] = step.ref
    meta["index"] = str(index)
    if step.kind == SHELL and step.command is not None:
        meta["command"] = step.command
    elif step.kind == TOOL and step.tool is not None:
        meta["tool"] = step.tool
        meta["args"] = step.args_json().decode()
    if extra:
        meta.update(extra)
    return node


def _edge(source: str, target: str, edge_type: str) -> smith_pb2.GraphEdge:
    # ``from`` is a Python keyword: the field can only be set through setattr or the kwargs dict.
    return smith_pb2.GraphEdge(**{"id": str(uuid.uuid4()), "from": source, "to": target, "edge_type": edge_type})


def _delta(request_id: str) -> smith_pb2.GraphDeltaEvent:
    delta = smith_pb2.GraphDeltaEvent()
    if request_id:
        delta.request_id = request_id
    return delta


def plan_deltas(plan: Plan, request_id: str) -> list[smith_pb2.GraphDeltaEvent]:
    """The events that draw a plan, in the order it is built.

    The first event adds the goal node; then one event per step (in plan order) adds its node and
    its edges to the steps it waits for, which are already drawn; the last event adds the goal's
    ``depends_on`` edges to the final steps. So no event refers to a node not yet added. All nodes
    are ``pending``.

    Args:
        plan: the plan (its steps need not be in order: they are drawn in a topological order).
        request_id: the ``PlanCommand``'s request id (may be empty: then left unset).

    Returns:
        ``len(plan.steps) + 2`` events.

    Raises:
        PlanError: the plan has an unknown dependency or a cycle (only possible for a hand-made
            :class:`Plan`: planners never return one).
    """
    ordered = order_steps(plan.steps)
    position = {step.id: i for i, step in enumerate(plan.steps, 1)}
    deltas = []
    first = _delta(request_id)
    first.nodes_added.append(goal_node(plan))
    deltas.append(first)
    waited_for: set[str] = set()
    for step in ordered:
        delta = _delta(request_id)
        delta.nodes_added.append(step_node(step, position[step.id]))
        for dep in step.depends_on:
            delta.edges_added.append(_edge(step.id, dep, DEPENDS_ON))
        for dep in step.after:
            delta.edges_added.append(_edge(step.id, dep, AFTER))
        waited_for.update(step.depends_on)
        waited_for.update(step.after)
        deltas.append(delta)
    last = _delta(request_id)
    for step in ordered:
        if step.id not in waited_for:
            last.edges_added.append(_edge(plan.goal_id, step.id, DEPENDS_ON))
    deltas.append(last)
    return deltas


def status_delta(node: smith_pb2.GraphNode, request_id: str) -> smith_pb2.GraphDeltaEvent:
    """One status change: the node removed and re-added (with its new metadata) in one event.

    A client applies an event's removals before its additions; a node removed and added in the same
    event keeps its edges.

    Args:
        node: the node as it is now.
        request_id: the ``PlanCommand``'s request id.

    Returns:
        The event.
    """
    delta = _delta(request_id)
    delta.nodes_removed.append(node.id)
    delta.nodes_added.append(node)
    return delta


def token_usage_event(usage: Usage, request_id: str) -> smith_pb2.TokenUsageEvent:
    """The ``TokenUsageEvent`` for a model's usage.

    Args:
        usage: the usage.
        request_id: the ``PlanCommand``'s request id.

    Returns:
        The event (``tokens_remaining`` set only when a budget was given).
    """
    event = smith_pb2.TokenUsageEvent(request_id=request_id, tokens_used=usage.tokens_used, model=usage.model)
    if usage.tokens_remaining is not None:
        event.tokens_remaining = usage.tokens_remaining
    return event

