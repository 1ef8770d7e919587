"""Envelope sequencing: the compiled twin when available, else the pure-Python one.

See ``smith_fast._sequencing_py`` for the API documentation; both twins are built from that file.
"""

from __future__ import annotations

from ._compat import NO_EXTENSIONS

if not NO_EXTENSIONS:
    try:
        from ._sequencing_c import MAX_SEQUENCE, Resequencer, Sequencer

        IMPLEMENTATION = "c"
    except ImportError:  # a source checkout without a build; tests/test_extensions.py catches this
        NO_EXTENSIONS = True

if NO_EXTENSIONS:
    from ._sequencing_py import MAX_SEQUENCE, Resequencer, Sequencer  # noqa: F401

    IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "MAX_SEQUENCE", "Resequencer", "Sequencer"]
