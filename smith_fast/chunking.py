"""Shell-output chunking: the compiled twin when available, else the pure-Python one.

See ``smith_fast._chunking_py`` for the API documentation; both twins share it.
"""

from __future__ import annotations

from ._compat import NO_EXTENSIONS

if not NO_EXTENSIONS:
    try:
        from ._chunking_c import DEFAULT_MAX_CHUNK, OutputChunker

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if NO_EXTENSIONS:
    from ._chunking_py import DEFAULT_MAX_CHUNK, OutputChunker  # noqa: F401

    IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "DEFAULT_MAX_CHUNK", "OutputChunker"]
