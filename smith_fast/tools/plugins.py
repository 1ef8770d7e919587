"""Third-party tools, found through the ``smith_fast.tools`` entry-point group.

A distribution declares, in its ``pyproject.toml``::

    [project.entry-points."smith_fast.tools"]
    my_tools = "my_package.tools:TOOLS"

and the object named there is a :class:`~smith_fast.tools.registry.Tool`, an iterable of tools,
or a zero-argument callable returning either. An entry point that fails to import, returns
something else, or clashes with a tool already registered is logged on the ``smith_fast.tools``
logger and skipped: one broken plug-in must not keep the service from starting.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterable
from typing import Any

from smith_fast.tools.registry import Tool, ToolRegistry

__all__ = ["ENTRY_POINT_GROUP", "load_entry_point_tools"]

ENTRY_POINT_GROUP = "smith_fast.tools"

logger = logging.getLogger("smith_fast.tools")


def load_entry_point_tools(registry: ToolRegistry, group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Register the tools of every entry point in ``group``.

    Args:
        registry: where to register them.
        group: the entry-point group.

    Returns:
        The names of the tools registered, in the order registered.
    """
    added: list[str] = []
    for ep in importlib.metadata.entry_points(group=group):
        origin = _origin(ep)
        try:
            tools = _tools_of(ep.load())
        except Exception:  # noqa: BLE001 - any plug-in failure is logged and skipped
            logger.exception("skipping tool entry point %s: it failed to load", origin)
            continue
        for tool in tools:
            try:
                registry.register(tool)
            except (TypeError, ValueError) as exc:
                logger.warning("skipping a tool of entry point %s: %s", origin, exc)
                continue
            added.append(tool.name)
    return added


def _tools_of(obj: Any) -> list[Tool]:
    if not isinstance(obj, Tool) and callable(obj):
        obj = obj()
    if isinstance(obj, Tool):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes, dict)):
        tools = list(obj)
        for item in tools:
            if not isinstance(item, Tool):
                raise TypeError(f"expected Tool items, found {type(item).__name__}")
        return tools
    raise TypeError(
        f"expected a Tool, a list of Tools or a callable returning them, not {type(obj).__name__}"
    )


def _origin(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"{ep.name} = {ep.value}{where}"
