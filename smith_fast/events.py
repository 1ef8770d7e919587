"""Direct encoders of the hot v1 events: the compiled twin when available, else the pure-Python one.

See ``smith_fast._events_py`` for the API documentation; both twins share it.
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
        from ._events_c import (
            encode_envelope,
            encode_error,
            encode_log,
            encode_shell_output,
            encode_shell_output_bytes,
            encode_state_change,
            encode_tool_done,
            encode_tool_result,
        )

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if TYPE_CHECKING or NO_EXTENSIONS:
    from ._events_py import (  # noqa: F401
        encode_envelope,
        encode_error,
        encode_log,
        encode_shell_output,
        encode_shell_output_bytes,
        encode_state_change,
        encode_tool_done,
        encode_tool_result,
    )

    IMPLEMENTATION = "py"

__all__ = [
    "IMPLEMENTATION",
    "encode_envelope",
    "encode_error",
    "encode_log",
    "encode_shell_output",
    "encode_shell_output_bytes",
    "encode_state_change",
    "encode_tool_done",
    "encode_tool_result",
]
