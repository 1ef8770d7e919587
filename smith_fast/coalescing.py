"""Batch coalescing: the compiled twin when available, else the pure-Python one.

See ``smith_fast._coalescing_py`` for the API documentation; both twins are built from that file.
"""

from __future__ import annotations

from ._compat import NO_EXTENSIONS

if not NO_EXTENSIONS:
    try:
        from ._coalescing_c import CommandBatcher, EventBatcher, WriteCoalescer

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if NO_EXTENSIONS:
    from ._coalescing_py import CommandBatcher, EventBatcher, WriteCoalescer  # noqa: F401

    IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "CommandBatcher", "EventBatcher", "WriteCoalescer"]
