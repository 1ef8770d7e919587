"""Hook outcomes as ``smith.v1.HookAction`` messages (for ``HookResultEvent``)."""

from __future__ import annotations

from ..pb import smith_pb2 as pb
from .chain import ChainResult
from .model import Hook, dumps

__all__ = ["hook_action", "load_action"]


def hook_action(result: ChainResult, allowed_data: bytes | None = None) -> pb.HookAction:
    """The ``HookAction`` reporting a chain's outcome for an intercepted request.

    Args:
        result: what :meth:`HookChain.run` returned.
        allowed_data: for an allow, the original data to echo (e.g. the request's raw ``args``
            bytes); default: the payload as compact JSON.

    Returns:
        BLOCK with ``block_reason``, TRANSFORM with ``transformed_data`` (the final payload as JSON),
        or ALLOW with ``allowed_data``.
    """
    if result.action == "block":
        return pb.HookAction(type=pb.HOOK_ACTION_TYPE_BLOCK, block_reason=result.reason or "blocked by a hook")
    if result.action == "transform":
        return pb.HookAction(type=pb.HOOK_ACTION_TYPE_TRANSFORM, transformed_data=dumps(result.payload).encode())
    data = allowed_data if allowed_data is not None else dumps(result.payload).encode()
    return pb.HookAction(type=pb.HOOK_ACTION_TYPE_ALLOW, allowed_data=data)


def load_action(hook: Hook) -> pb.HookAction:
    """The ``HookAction`` answering a successful ``HookLoadCommand``: ALLOW, with ``allowed_data``
    the JSON of :meth:`Hook.describe` (``{"hook_id", "kind", "triggers", "source_hash"}``)."""
    return pb.HookAction(type=pb.HOOK_ACTION_TYPE_ALLOW, allowed_data=dumps(hook.describe()).encode())
