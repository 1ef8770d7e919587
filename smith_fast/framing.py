"""Varint-delimited framing: the compiled twin when available, else the pure-Python one.

See ``smith_fast._framing_py`` for the API documentation; both twins share it.
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
        from ._framing_c import (
            DEFAULT_MAX_FRAME_SIZE,
            MAX_VARINT_LENGTH,
            FrameDecoder,
            encode_frame,
            encode_frames,
            encode_into,
            encode_varint,
            varint_size,
        )

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if TYPE_CHECKING or NO_EXTENSIONS:
    from ._framing_py import (  # noqa: F401
        DEFAULT_MAX_FRAME_SIZE,
        MAX_VARINT_LENGTH,
        FrameDecoder,
        encode_frame,
        encode_frames,
        encode_into,
        encode_varint,
        varint_size,
    )

    IMPLEMENTATION = "py"

__all__ = [
    "IMPLEMENTATION",
    "DEFAULT_MAX_FRAME_SIZE",
    "MAX_VARINT_LENGTH",
    "FrameDecoder",
    "encode_frame",
    "encode_frames",
    "encode_into",
    "encode_varint",
    "varint_size",
]
