"""A needle split across two pieces of a stream: how much of a piece's end to hold back.

A stream read in pieces may cut a marker or a secret in two (``...smith-fa`` then ``st-state...``).
Whoever looks for one (the MCP shell's state markers, :mod:`smith_fast.mcp.shell_state`; the egress
secrets, :mod:`smith_fast.egress.redacting`) handles what is whole in a piece, then holds back the
piece's end while it could still begin a needle, and gives it on with the next piece, never more
than that: output that does not end like the start of a needle goes on at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import AnyStr

__all__ = ["held_back"]


def held_back(data: AnyStr, needles: Sequence[AnyStr]) -> int:
    """The length of the longest end of ``data`` that is a proper prefix of one of ``needles`` (0:
    none; an empty needle is never one). Works on ``str`` and on ``bytes`` alike."""
    longest = 0
    for needle in needles:
        if not needle:
            continue
        first = needle[:1]
        at = data.find(first, max(0, len(data) - len(needle) + 1))
        # the earliest start that matches gives this needle's longest end
        while at >= 0 and len(data) - at > longest:
            if needle.startswith(data[at:]):
                longest = len(data) - at
                break
            at = data.find(first, at + 1)
    return longest
