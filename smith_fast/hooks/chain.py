"""Several hooks in load order: a transform feeds the next hook, a block stops the chain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .model import TRIGGERS, Action, Decision, Hook, HookFailure, log

__all__ = ["ChainResult", "HookChain"]


@dataclass(frozen=True, slots=True)
class ChainResult:
    """What a chain decided for one trigger.

    Attributes:
        action: ``"block"`` if a hook blocked (or failed, under ``failure="closed"``); else
            ``"transform"`` if any hook transformed; else ``"allow"``.
        payload: the payload after every transform (the original object when nothing transformed).
        reason: for a block, the reason; for an allow or transform under ``failure="open"`` in which
            a hook failed, the last failure's reason; else None.
        hook_id: the deciding hook: the one that blocked, else the last one that transformed, else None.
        decisions: every hook's decision, in the order they ran (a failure appears as the block or
            allow it was turned into, with the failure as its reason).
    """

    action: Action
    payload: dict[str, Any]
    reason: str | None = None
    hook_id: str | None = None
    decisions: tuple[Decision, ...] = ()


class HookChain:
    """An immutable, ordered set of hooks, run one trigger at a time.

    Build a new chain to add or remove hooks (cheap): e.g. the service's global hooks followed by a
    session's own.

    Args:
        hooks: the hooks, in load order.
        failure: ``"closed"`` (default): a hook that fails blocks; ``"open"``: it allows, and the
            chain goes on with the payload as it was.

    Raises:
        ValueError: ``failure`` is neither ``"closed"`` nor ``"open"``.
    """

    __slots__ = ("hooks", "failure", "_by_trigger", "_closed")

    def __init__(self, hooks: Sequence[Hook], *, failure: Literal["closed", "open"] = "closed") -> None:
        if failure not in ("closed", "open"):
            raise ValueError(f"failure must be 'closed' or 'open', not {failure!r}")
        self.hooks: tuple[Hook, ...] = tuple(hooks)
        self.failure = failure
        self._closed = failure == "closed"
        self._by_trigger: dict[str, tuple[Hook, ...]] = {
            t: tuple(h for h in self.hooks if t in h.triggers) for t in TRIGGERS
        }

    def handles(self, trigger: str) -> bool:
        """Whether any hook defines ``trigger`` (when none does, the caller can skip building the payload).

        Raises:
            ValueError: ``trigger`` is not one of :data:`~smith_fast.hooks.TRIGGERS`.
        """
        try:
            return bool(self._by_trigger[trigger])
        except KeyError:
            raise ValueError(f"unknown hook trigger {trigger!r}") from None

    async def run(self, trigger: str, payload: dict[str, Any]) -> ChainResult:
        """Run the hooks that define ``trigger`` on ``payload``, in order.

        Args:
            trigger: one of :data:`~smith_fast.hooks.TRIGGERS`.
            payload: the trigger's payload (HOOKS.md, "Trigger points and payloads"); it is not modified.

        Returns:
            The chain's :class:`ChainResult`. A failing hook never raises here: it is logged (logger
            ``smith_fast.hooks``) and counts as a block or an allow according to ``failure``.

        Raises:
            ValueError: ``trigger`` is not one of :data:`~smith_fast.hooks.TRIGGERS`.
        """
        try:
            hooks = self._by_trigger[trigger]
        except KeyError:
            raise ValueError(f"unknown hook trigger {trigger!r}") from None
        if not hooks:
            return ChainResult("allow", payload)
        decisions: list[Decision] = []
        current = payload
        transformed_by: str | None = None
        failed: str | None = None
        for hook in hooks:
            try:
                call_sync = hook.call_sync
                decision = call_sync(trigger, current) if call_sync is not None else await hook.call(trigger, current)
            except HookFailure as exc:
                reason = str(exc)
                log.warning(
                    "hook failed",
                    extra={"fields": {"hook_id": hook.id, "trigger": trigger, "reason": exc.reason, "failure": self.failure}},
                )
                if self._closed:
                    decisions.append(Decision("block", reason=reason, hook_id=hook.id))
                    return ChainResult("block", current, reason, hook.id, tuple(decisions))
                decisions.append(Decision("allow", reason=reason, hook_id=hook.id))
                failed = reason
                continue
            decisions.append(decision)
            if decision.action == "block":
                return ChainResult("block", current, decision.reason, hook.id, tuple(decisions))
            if decision.action == "transform":
                current = decision.data
                transformed_by = hook.id
        if transformed_by is not None:
            return ChainResult("transform", current, failed, transformed_by, tuple(decisions))
        return ChainResult("allow", current, failed, None, tuple(decisions))

    async def close(self) -> None:
        """Close every hook of the chain."""
        for hook in self.hooks:
            await hook.close()

    def __repr__(self) -> str:
        return f"<HookChain {[h.id for h in self.hooks]} failure={self.failure}>"
