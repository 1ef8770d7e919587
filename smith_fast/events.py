"""Direct encoders of the hot v1 events: the compiled twin when available, else the pure-Python one.

See ``smith_fast._events_py`` for the API documentation; both twins share it.
"""

from __future__ import annotations

from ._compat import NO_EXTENSIONS

if not NO_EXTENSIONS:
    try:
        from ._events_c import (
            encode_envelope,
            encode_error,
            encode_log,
            encode_shell_output,
            encode_state_change,
            encode_tool_result,
        )

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if NO_EXTENSIONS:
    from ._events_py import (  # noqa: F401
        encode_envelope,
        encode_error,
        encode_log,
        encode_shell_output,
        encode_state_change,
        encode_tool_result,
    )

    IMPLEMENTATION = "py"

__all__ = [
    "IMPLEMENTATION",
    "encode_envelope",
    "encode_error",
    "encode_log",
    "encode_shell_output",
    "encode_state_change",
    "encode_tool_result",
]
