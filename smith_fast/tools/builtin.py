"""The built-in tools, and ``tools.list``, which describes whatever a registry holds."""

from __future__ import annotations

from typing import Any

from smith_fast.tools.fs import FS_LIST, FS_READ, FS_WRITE
from smith_fast.tools.plugins import load_entry_point_tools
from smith_fast.tools.registry import Tool, ToolRegistry, _Encoded, encode_result
from smith_fast.tools.search import FS_SEARCH
from smith_fast.tools.shell import SHELL_RUN
from smith_fast.tools.workspace import ToolContext

__all__ = ["builtin_tools", "default_registry", "tools_list_tool"]

LIST_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def tools_list_tool(registry: ToolRegistry) -> Tool:
    """The ``tools.list`` tool for ``registry``.

    Args:
        registry: the registry whose tools it lists (including tools registered later).

    Returns:
        The tool; its result is ``{"tools": [{"name", "description", "schema"}, ...]}`` sorted by
        name.
    """

    # Encoding the schemas is most of the cost of a call, so the encoding is kept for as long as
    # the registry holds the same Tool objects (tools are frozen; their schemas are taken to be
    # left alone once registered, as the validators compiled from them are).
    cache: list[Any] = [(), b""]

    def _list(args: Any, ctx: ToolContext) -> dict[str, Any]:
        tools = registry.tools()
        listing = {
            "tools": [{"name": tool.name, "description": tool.description, "schema": tool.schema} for tool in tools]
        }
        cached, encoded = cache
        if len(cached) != len(tools) or any(a is not b for a, b in zip(cached, tools)):
            encoded = encode_result(listing)
            cache[:] = [tuple(tools), encoded]
        return _Encoded(listing, encoded)

    return Tool(
        name="tools.list",
        description=(
            "List the available tools with their descriptions and argument JSON Schemas; "
            "returns {tools: [{name, description, schema}]}."
        ),
        schema=LIST_SCHEMA,
        handler=_list,
    )


def builtin_tools(registry: ToolRegistry) -> list[Tool]:
    """``fs.read``, ``fs.write``, ``fs.list``, ``fs.search``, ``shell.run`` and ``tools.list``.

    Args:
        registry: the registry ``tools.list`` describes.

    Returns:
        The tools, not yet registered.
    """
    return [FS_READ, FS_WRITE, FS_LIST, FS_SEARCH, SHELL_RUN, tools_list_tool(registry)]


def default_registry(*, entry_points: bool = True) -> ToolRegistry:
    """A registry with the built-in tools and, optionally, the installed third-party ones.

    Args:
        entry_points: also load the tools of the ``smith_fast.tools`` entry-point group. A
            broken entry point is logged (logger ``smith_fast.tools``) and skipped.

    Returns:
        The registry.
    """
    registry = ToolRegistry()
    for tool in builtin_tools(registry):
        registry.register(tool)
    if entry_points:
        load_entry_point_tools(registry)
    return registry
