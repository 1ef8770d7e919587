"""Varint-delimited framing: the compiled twin when available, else the pure-Python one.

See ``smith_fast._framing_py`` for the API documentation; both twins share it.
"""

from __future__ import annotations

from ._compat import NO_EXTENSIONS

if not NO_EXTENSIONS:
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

if NO_EXTENSIONS:
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
