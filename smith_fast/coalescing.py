"""Batch coalescing: the compiled twin when available, else the pure-Python one.

See ``smith_fast._coalescing_py`` for the API documentation; both twins are built from that file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ._compat import NO_EXTENSIONS

IMPLEMENTATION: Literal["c", "py"]

# A type checker takes the second branch only, so it sees the Python twin's typed API (the
# compiled twin has the same one: every twin test runs against both). At run time TYPE_CHECKING
# is false and the choice is the compiled twin unless it is missing or turned off.
if not TYPE_CHECKING and not NO_EXTENSIONS:
    try:
        from ._coalescing_c import CommandBatcher, EventBatcher, WriteCoalescer

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if TYPE_CHECKING or NO_EXTENSIONS:
    from ._coalescing_py import CommandBatcher, EventBatcher, WriteCoalescer  # noqa: F401

    IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "CommandBatcher", "EventBatcher", "WriteCoalescer"]
