"""Tools: a registry of named, schema-checked tools and the built-ins that work in a workspace.

``default_registry()`` holds ``fs.read``, ``fs.write``, ``fs.list``, ``fs.search``,
``shell.run`` and ``tools.list``, plus the tools of installed distributions that declare the
``smith_fast.tools`` entry-point group (see :mod:`smith_fast.tools.plugins`). The service runs
a ``ToolCallCommand`` with :meth:`ToolRegistry.call`, passing a :class:`ToolContext` for the
workspace root.

Sandbox rules (details in :mod:`smith_fast.tools.workspace`): every path is relative to the root
or absolute inside it; ``..`` and symlinks are resolved before the check; anything that ends up
outside the root raises ``ProtocolError(ERROR_CODE_PERMISSION_DENIED)``. ``shell.run`` confines
its working directory, not the command.

Example::

    registry = default_registry()
    outcome = await registry.call("fs.read", b'{"path": "README.md"}', ToolContext(Path(".")))
"""

from __future__ import annotations

from smith_fast.tools.builtin import builtin_tools, default_registry, tools_list_tool
from smith_fast.tools.plugins import ENTRY_POINT_GROUP, load_entry_point_tools
from smith_fast.tools.registry import Handler, Tool, ToolOutcome, ToolRegistry, encode_result
from smith_fast.tools.schema import ArgumentError
from smith_fast.tools.workspace import DEFAULT_MAX_OUTPUT, ProcessRequest, RunProcess, ToolContext

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "ENTRY_POINT_GROUP",
    "ArgumentError",
    "Handler",
    "ProcessRequest",
    "RunProcess",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolRegistry",
    "builtin_tools",
    "default_registry",
    "encode_result",
    "load_entry_point_tools",
    "tools_list_tool",
]
