"""The JSON form of a plan (``context["steps"]`` and the model's answer) and the checks every plan passes.

The JSON form, as documented in ``docs/PLANS.md``::

    {"steps": [
      {"id": "build", "label": "Build", "kind": "shell", "command": "make"},
      {"id": "test", "kind": "shell", "command": "make test", "depends_on": ["build"]},
      {"id": "read", "kind": "tool", "tool": "fs.read", "args": {"path": "log.txt"}, "after": ["test"]},
      {"id": "tell", "kind": "note", "label": "Tell the team", "depends_on": ["test"]}
    ]}

A bare list of steps is accepted too. ``id`` defaults to the step's 1-based position; ids and
dependency references may be strings or integers (models often write numbers). ``depends_on`` and
``after`` may be a single id instead of a list. Unknown keys are ignored.
"""

from __future__ import annotations

import heapq
import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, overload

from ..pb import smith_pb2
from .model import KINDS, SHELL, TOOL, Plan, PlanError, Step, Usage

__all__ = ["DEFAULT_MAX_STEPS", "LABEL_WIDTH", "build_plan", "decode_plan_json", "label_for", "order_steps"]

DEFAULT_MAX_STEPS = 256
"""The most steps a plan may have: a bound on what one request makes the service track and run."""
LABEL_WIDTH = 80
"""Default labels (a command's first line, a goal) are cut to this many characters."""


def label_for(text: str) -> str:
    """A one-line label for a command or goal: its first non-empty line, cut to :data:`LABEL_WIDTH`.

    Returns:
        The label; ``""`` for blank text.
    """
    lines = text.strip().splitlines()
    line = lines[0].strip() if lines else ""
    if len(line) > LABEL_WIDTH:
        return line[: LABEL_WIDTH - 1].rstrip() + "…"
    if len(lines) > 1:
        return line + " …"
    return line


def decode_plan_json(text: str, source: str) -> Any:
    """Parse the JSON text of a plan.

    Args:
        text: the JSON text.
        source: what the text is, for messages (``'context["steps"]'``, ``"the model's plan"``).

    Returns:
        The decoded value.

    Raises:
        PlanError: ``invalid_json``, saying where the text stops being JSON.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "invalid_json"
        ) from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, lone surrogates
        raise PlanError(f"{source} is not valid JSON: {exc}", "invalid_json") from None


def _ref(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{what} must be a string or an integer, got {_json_type(value)}")
    text = str(value).strip()
    if not text:
        raise ValueError(f"{what} is empty")
    return text


def _refs(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f'"{what}" must be a list of step ids, got {_json_type(value)}')
    return [_ref(item, f'an id in "{what}"') for item in value]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


@overload
def _text(raw: Mapping[str, Any], key: str, required: Literal[True]) -> str: ...
@overload
def _text(raw: Mapping[str, Any], key: str, required: bool) -> str | None: ...
def _text(raw: Mapping[str, Any], key: str, required: bool) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        got = "missing" if key not in raw else f"{_json_type(value)}" if not isinstance(value, str) else "empty"
        raise ValueError(f'needs a non-empty "{key}" string ({got})')
    return value


def _parse_step(raw: Any, position: int, known_tools: Collection[str] | None) -> tuple[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise ValueError(f"must be a JSON object, got {_json_type(raw)}")
    ref = _ref(raw["id"], '"id"') if raw.get("id") is not None else str(position)
    kind = raw.get("kind", SHELL if "command" in raw else TOOL if "tool" in raw else None)
    if isinstance(kind, str):
        kind = kind.strip().lower()  # models write "Shell" now and then
    if kind not in KINDS:
        got = "missing" if kind is None else repr(kind)
        raise ValueError(f'"kind" must be one of {", ".join(KINDS)} ({got})')
    label = raw.get("label")
    if label is not None and not isinstance(label, str):
        raise ValueError(f'"label" must be a string, got {_json_type(label)}')
    fields: dict[str, Any] = {"kind": kind, "command": None, "tool": None, "args": None}
    if kind == SHELL:
        fields["command"] = command = _text(raw, "command", True)
        fields["label"] = label.strip() if label and label.strip() else label_for(command or "")
    elif kind == TOOL:
        fields["tool"] = tool = _text(raw, "tool", True)
        if known_tools is not None and tool not in known_tools:
            raise ValueError(f"uses unknown tool {tool!r} (known: {', '.join(sorted(known_tools)) or 'none'})")
        fields["args"] = {} if raw.get("args") is None else raw["args"]
        fields["label"] = label.strip() if label and label.strip() else tool
    else:
        fields["label"] = _text(raw, "label", True).strip()
    fields["depends_on"] = _refs(raw.get("depends_on"), "depends_on")
    fields["after"] = _refs(raw.get("after"), "after")
    return ref, fields


def build_plan(
    value: Any,
    goal: str,
    *,
    source: str,
    known_tools: Collection[str] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    usage: Usage | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Plan:
    """Validate the decoded JSON form of a plan and turn it into a :class:`Plan`.

    Every step gets a fresh UUID; its JSON id becomes :attr:`Step.ref`.

    Args:
        value: the decoded JSON: ``{"steps": [...]}`` or ``[...]``.
        goal: the goal text.
        source: what the JSON came from, as the first words of error messages.
        known_tools: when given, a tool step must name one of these.
        max_steps: the most steps allowed.
        usage: the model's usage, carried into the plan.
        metadata: goal-node metadata, carried into the plan.

    Returns:
        The plan, steps in topological order.

    Raises:
        PlanError: the plan is malformed (saying which step and what), names an unknown dependency,
            has a duplicate id or a cycle, is empty, or has more than ``max_steps`` steps.
    """
    steps_value = value.get("steps") if isinstance(value, dict) else value
    if not isinstance(steps_value, list):
        if not isinstance(value, dict):
            message = f'{source} must be a JSON object with a "steps" list, or a list of steps; got {_json_type(value)}'
        elif "steps" not in value:
            message = f'{source} is a JSON object without a "steps" list'
        else:
            message = f'{source}: "steps" must be a list, got {_json_type(steps_value)}'
        raise PlanError(message)
    if not steps_value:
        raise PlanError(f"{source} has no steps")
    if len(steps_value) > max_steps:
        raise PlanError(
            f"{source} has {len(steps_value)} steps; the limit is {max_steps}",
            "too_many_steps",
            code=smith_pb2.ERROR_CODE_RESOURCE_EXHAUSTED,
        )
    refs: list[str] = []
    parsed: list[dict[str, Any]] = []
    first_seen: dict[str, int] = {}
    for position, raw in enumerate(steps_value, 1):
        name, key = f"step {position}", str(position)
        if isinstance(raw, dict) and raw.get("id") is not None:
            key = str(raw["id"])
            name += f" (id {key!r})"
        try:
            ref, fields = _parse_step(raw, position, known_tools)
        except ValueError as exc:
            raise PlanError(f"{source}: {name} {exc}", details={"step": key}) from None
        if ref in first_seen:
            raise PlanError(
                f"{source}: step {position} reuses id {ref!r} of step {first_seen[ref]}", details={"step": ref}
            )
        first_seen[ref] = position
        refs.append(ref)
        parsed.append(fields)
    for ref, fields, position in zip(refs, parsed, range(1, len(refs) + 1)):
        for relation in ("depends_on", "after"):
            for dep in fields[relation]:
                if dep == ref:
                    raise PlanError(
                        f"{source}: step {position} (id {ref!r}) depends on itself", details={"step": ref, "cycle": ref}
                    )
                if dep not in first_seen:
                    raise PlanError(
                        f"{source}: step {position} (id {ref!r}) {relation.replace('_', ' ')} unknown step {dep!r}",
                        details={"step": ref, "dependency": dep},
                    )
    ids = {ref: str(uuid.uuid4()) for ref in refs}
    steps: list[Step] = []
    for ref, fields in zip(refs, parsed):
        depends_on = tuple(dict.fromkeys(ids[d] for d in fields["depends_on"]))
        # A step both depended on and waited "after" is a dependency: the stronger relation wins.
        after = tuple(i for i in dict.fromkeys(ids[d] for d in fields["after"]) if i not in depends_on)
        steps.append(
            Step(
                id=ids[ref],
                label=fields["label"],
                kind=fields["kind"],
                command=fields["command"],
                tool=fields["tool"],
                args=fields["args"],
                depends_on=depends_on,
                after=after,
                ref=ref,
            )
        )
    ordered = order_steps(steps, source)
    return Plan(str(uuid.uuid4()), goal, tuple(ordered), usage, dict(metadata or {}))


def order_steps(steps: Sequence[Step], source: str = "the plan") -> list[Step]:
    """Check a set of steps and put them in topological order.

    The order is stable: among the steps that are ready, the one given first comes first.

    Args:
        steps: the steps.
        source: what the steps came from, as the first words of error messages.

    Returns:
        The steps, each after every step it waits for.

    Raises:
        PlanError: a duplicate id, an unknown dependency or a cycle (naming the steps on it).
    """
    index: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.id in index:
            raise PlanError(f"{source}: two steps have id {step.id}", details={"step": _name(step)})
        index[step.id] = i
    waits = [0] * len(steps)
    dependents: list[list[int]] = [[] for _ in steps]
    for i, step in enumerate(steps):
        for dep in dict.fromkeys(step.depends_on + step.after):
            j = index.get(dep)
            if j is None:
                raise PlanError(
                    f"{source}: step {_name(step)!r} waits for unknown step {dep!r}",
                    details={"step": _name(step), "dependency": dep},
                )
            waits[i] += 1
            dependents[j].append(i)
    ready = [i for i, n in enumerate(waits) if n == 0]
    heapq.heapify(ready)
    order: list[Step] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(steps[i])
        for k in dependents[i]:
            waits[k] -= 1
            if waits[k] == 0:
                heapq.heappush(ready, k)
    if len(order) < len(steps):
        cycle = _find_cycle(steps, index, waits)
        names = [_name(steps[i]) for i in cycle]
        text = " -> ".join(repr(n) for n in names)
        raise PlanError(
            f"{source}: dependency cycle: step {text} (each step waits for the next)",
            details={"step": names[0], "cycle": " -> ".join(names)},
        )
    return order


def _find_cycle(steps: Sequence[Step], index: dict[str, int], waits: list[int]) -> list[int]:
    """One cycle among the steps Kahn's algorithm could not order, as indices, first one repeated last."""
    # Every unordered step still waits for at least one unordered step, so walking "waits for"
    # edges among them must come back to a step already on the path.
    stuck = {i for i, n in enumerate(waits) if n > 0}
    current = min(stuck)
    path: list[int] = []
    seen: dict[int, int] = {}
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        step = steps[current]
        current = next(index[d] for d in step.depends_on + step.after if index[d] in stuck)
    return path[seen[current] :] + [current]


def _name(step: Step) -> str:
    return step.ref or step.id
