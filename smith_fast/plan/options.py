"""The ``PlanCommand.context`` keys smith-fast reads, parsed and checked in one place.

=================  =========================================================================
key                meaning
=================  =========================================================================
``steps``          the plan as JSON (``schema.py``); any planner then uses it as is
``goal_kind``      rules planner without ``steps``: ``shell`` (default) or ``note``
``execute``        ``true``: run the plan after streaming it (default ``false``)
``max_parallel``   how many steps may run at once, 1 to 64 (default 4)
``timeout_ms``     per-step timeout in ms for shell and tool steps (default: the service's)
``token_budget``   tokens the client allows; ``TokenUsage.tokens_remaining`` = budget - used
``traceparent``    W3C trace context: forwarded to the model endpoint, kept on the goal node
=================  =========================================================================

Every other key is passed to the model (llm planner) as extra context and otherwise ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .model import NOTE, SHELL, PlanError

__all__ = ["KNOWN_KEYS", "MAX_PARALLEL", "PlanOptions"]

MAX_PARALLEL = 64
KNOWN_KEYS = frozenset({"steps", "goal_kind", "execute", "max_parallel", "timeout_ms", "token_budget", "traceparent"})
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", ""})
# W3C Trace Context, version 00: version-traceid-parentid-flags, all-zero ids invalid.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def _invalid(key: str, rule: str, value: str) -> PlanError:
    return PlanError(f'context["{key}"] must be {rule}, got {value!r}', "invalid_field", details={"field": f"context.{key}"})


def _integer(context: Mapping[str, str], key: str, low: int, high: int | None) -> int | None:
    text = context.get(key)
    if text is None or not text.strip():
        return None
    rule = f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise _invalid(key, rule, text) from None
    if value < low or (high is not None and value > high):
        raise _invalid(key, rule, text)
    return value


def _traceparent(text: str | None) -> str | None:
    """The header value if it is a valid W3C ``traceparent``, else ``None``.

    Trace Context says a receiver must ignore a malformed header rather than fail the request, so a
    bad value is dropped, not reported.
    """
    if text is None:
        return None
    text = text.strip().lower()
    match = _TRACEPARENT.fullmatch(text) or (
        # Future versions may append fields; version 00 may not.
        _TRACEPARENT.match(text) if len(text) > 55 and text[55] == "-" and text[:2] != "00" else None
    )
    if match is None or match[1] == "ff" or set(match[2]) == {"0"} or set(match[3]) == {"0"}:
        return None
    return text


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """The context keys of a ``PlanCommand``, parsed.

    Attributes:
        execute: run the plan after building it.
        max_parallel: the most steps running at once.
        timeout_ms: per-step timeout; ``None`` means the service's default.
        token_budget: the client's token budget; ``None`` when not given.
        traceparent: a valid W3C ``traceparent``, or ``None``.
        goal_kind: how the rules planner reads a goal without ``steps``: ``shell`` or ``note``.
        steps: the raw ``steps`` JSON text, or ``None``.
    """

    execute: bool = False
    max_parallel: int = 4
    timeout_ms: int | None = None
    token_budget: int | None = None
    traceparent: str | None = None
    goal_kind: str = SHELL
    steps: str | None = None

    @classmethod
    def from_context(cls, context: Mapping[str, str]) -> PlanOptions:
        """Parse the known keys of a context map.

        Args:
            context: ``PlanCommand.context``.

        Returns:
            The options, defaults for absent keys.

        Raises:
            PlanError: ``invalid_field`` naming the key, the rule and the value.
        """
        execute_text = context.get("execute", "").strip().lower()
        if execute_text not in _TRUE and execute_text not in _FALSE:
            raise _invalid("execute", "true or false", context["execute"])
        goal_kind = context.get("goal_kind", "").strip().lower() or SHELL
        if goal_kind not in (SHELL, NOTE):
            raise _invalid("goal_kind", f"{SHELL} or {NOTE}", context["goal_kind"])
        steps = context.get("steps")
        return cls(
            execute=execute_text in _TRUE,
            max_parallel=_integer(context, "max_parallel", 1, MAX_PARALLEL) or 4,
            timeout_ms=_integer(context, "timeout_ms", 1, None),
            token_budget=_integer(context, "token_budget", 0, None),
            traceparent=_traceparent(context.get("traceparent")),
            goal_kind=goal_kind,
            steps=steps if steps is not None and steps.strip() else None,
        )
