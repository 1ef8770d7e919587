"""Replacing secret values in a stream that arrives in pieces: :class:`StreamRedactor`.

A replace per read misses a value split across two reads (``...tok`` then ``en...``). The
redactor replaces what is whole in a piece and holds back the piece's end while it could still be
the start of a value, to be replaced (or let go) with the next piece, or given out at the
stream's end. It holds back only a suffix that is a proper prefix of some value, never more: output
that does not end like the start of a secret goes on at once, so a prompt is not delayed.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..split_needles import held_back

__all__ = ["StreamRedactor"]


class StreamRedactor:
    """Replace each ``find`` with its ``replacement`` in one stream (one per stream: the held end is its own).

    Args:
        pairs: (find, replacement) byte strings; an empty ``find`` is ignored. A longer value is
            replaced before a shorter one, so a value that contains another is replaced whole.
    """

    __slots__ = ("_pairs", "_finds", "_held")

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        self._pairs = tuple(sorted(((f, r) for f, r in pairs if f), key=lambda p: -len(p[0])))
        self._finds = tuple(f for f, _ in self._pairs)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """The bytes that can go on now: ``data`` after what was held, values replaced, minus a new held end."""
        if self._held:
            data = self._held + data
            self._held = b""
        for find, replacement in self._pairs:
            if find in data:
                data = data.replace(find, replacement)
        keep = held_back(data, self._finds)
        if keep:
            self._held = data[-keep:]
            return data[:-keep]
        return data

    def end(self) -> bytes:
        """The stream ended: what was held (the start of a value that never came whole)."""
        held, self._held = self._held, b""
        return held
