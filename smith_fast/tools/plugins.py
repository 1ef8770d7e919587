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

import importlib.machinery
import logging
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from smith_fast.tools.registry import Tool, ToolRegistry

if TYPE_CHECKING:
    import importlib.metadata

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
    if not _may_declare(group):
        return added
    import importlib.metadata  # some 10 ms to import, and 4 to read every distribution's entry points

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


def _may_declare(group: str) -> bool:
    """Whether a distribution importlib.metadata would find may declare entry points in ``group``:
    False only when every place it looks (the ``*.dist-info``/``*.egg-info`` directories of each
    ``sys.path`` directory) was read and none has the group's header in its ``entry_points.txt``.
    Anything else it could look in (a zip or egg on the path, a finder of distributions besides the
    stdlib's) answers True, and importlib.metadata decides. This look costs a directory listing and
    a few small reads; most services have no plug-in, and so skip importing importlib.metadata at
    every start."""
    if any(hasattr(f, "find_distributions") for f in sys.meta_path if f is not importlib.machinery.PathFinder):
        return True
    header = f"[{group}]"
    for entry in sys.path:
        where = entry or "."
        if where.endswith(".egg") or os.path.isfile(where):
            return True
        try:
            names = os.listdir(where)
        except OSError:  # not there, not a directory: importlib.metadata finds nothing in it either
            continue
        for name in names:
            if name.lower().endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(where, name, "entry_points.txt"), encoding="utf-8", errors="replace") as f:
                        if header in f.read():
                            return True
                except OSError:
                    continue
    return False
