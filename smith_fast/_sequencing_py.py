# cython: language_level=3, annotation_typing=False, boundscheck=True, wraparound=True
"""Envelope sequencing: stamping on the way out, resequencing on the way in.

``Envelope.timestamp`` is Unix time in milliseconds and ``Envelope.sequence`` a per-stream number
that starts at 1 and increases by exactly one per envelope (``smith.proto``, ``Envelope``).
:class:`Sequencer` issues those pairs; :class:`Resequencer` sits behind an at-least-once
transport (NATS redelivery, replay) and turns what arrives back into each item once, in order.

This file is both twins: it runs as ``smith_fast._sequencing_py`` and is compiled unchanged by
Cython as ``smith_fast._sequencing_c``, typed by ``csrc/_sequencing_c.pxd``. The
annotations are for readers and type checkers only (``annotation_typing=False`` above), so the
compiled twin accepts and rejects exactly the same arguments, with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable
from time import time_ns
from types import GenericAlias
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .pb import smith_pb2

__all__ = ["MAX_SEQUENCE", "Resequencer", "Sequencer"]

MAX_SEQUENCE = (1 << 63) - 1
"""The largest sequence number used or accepted.

``Envelope.sequence`` is a ``uint64``, but numbers stay below ``2**63``: peers that hold them in a
signed 64-bit integer (a Java ``long``) see the same values, and one past the last number still
fits the 64-bit counters of the compiled twin.
"""

# Counters and sequence numbers are C ``unsigned long long`` in the compiled twin. Every value is
# range-checked here, in Python terms, before it reaches one of them, so neither twin can wrap or
# raise a conversion error the other would not.
_MISSING = object()


def _checked_sequence(value: object, what: str) -> int:
    """``value`` as a plain int if it is a valid sequence number; the cold path of every check."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_SEQUENCE:
        raise ValueError(f"{what} must be in [1, 2**63), got {value}")
    return int(value)


def _exhausted() -> OverflowError:
    return OverflowError(f"sequence numbers exhausted: {MAX_SEQUENCE} was the last one")


class Sequencer:
    """Issues ``(timestamp_ms, sequence)`` pairs for one outgoing stream of envelopes.

    Sequence numbers start at ``start`` and grow by exactly one per call, so a receiver can tell a
    gap from a reordering. Timestamps never go backwards: if the clock steps back (an NTP
    correction), the last timestamp issued is repeated until the clock catches up.

    Args:
        start: the first sequence number to issue, in ``[1, 2**63)``.
        clock: returns the current Unix time in milliseconds as an ``int``; defaults to
            ``time.time_ns() // 1_000_000``.

    Raises:
        TypeError: ``start`` is not an int.
        ValueError: ``start`` is out of range.
    """

    __slots__ = ("_clock", "_last", "_timestamp")

    def __init__(self, start: int = 1, clock: Callable[[], int] | None = None) -> None:
        start = _checked_sequence(start, "start")
        self._clock: Callable[[], int] | None = clock  # None: time_ns, inlined in next()
        self._last: int = start - 1
        self._timestamp: int = 0

    @property
    def last(self) -> int:
        """The last sequence number issued (``start - 1`` before the first)."""
        return self._last

    def next(self) -> tuple[int, int]:
        """Issue the next ``(timestamp_ms, sequence)`` pair.

        Returns:
            The timestamp (never below any issued before) and the sequence number (one above the
            last).

        Raises:
            OverflowError: all sequence numbers up to :data:`MAX_SEQUENCE` have been issued.
        """
        clock = self._clock
        ts = time_ns() // 1_000_000 if clock is None else clock()
        if ts < self._timestamp:
            ts = self._timestamp
        else:
            self._timestamp = ts
        if self._last == MAX_SEQUENCE:
            raise _exhausted()
        self._last += 1
        return ts, self._last

    def stamp(self, envelope: smith_pb2.Envelope) -> smith_pb2.Envelope:
        """Set ``envelope.timestamp`` and ``envelope.sequence`` from :meth:`next`.

        Args:
            envelope: the envelope to stamp; it is modified in place.

        Returns:
            ``envelope`` itself, for chaining.

        Raises:
            OverflowError: all sequence numbers have been issued.
        """
        ts, seq = self.next()
        envelope.timestamp = ts
        envelope.sequence = seq
        return envelope


class Resequencer:
    """Delivers items pushed with sequence numbers exactly once, in sequence order.

    Meant for the receiving end of an at-least-once transport, where envelopes may arrive twice,
    out of order, or not at all. Each :meth:`push` returns the items it made deliverable:

    - ``sequence == expected``: the item, then every held item that now follows without a gap.
    - ``sequence < expected``, or a sequence already held: a duplicate, dropped and counted in
      :attr:`duplicates`. This includes a straggler whose number was already given up on (counted
      in :attr:`gaps`): once skipped, a number is never delivered late.
    - ``expected < sequence <= expected + window``: held until the numbers before it arrive;
      counted in :attr:`reordered`.
    - ``sequence > expected + window``: the resequencer stops waiting for the oldest missing
      numbers. ``expected`` moves up to ``sequence - window``; held items below that are
      delivered in order, the numbers missing below it are counted in :attr:`gaps`; then the
      item is held (or, with ``window=0``, delivered) and what follows without a gap is
      delivered.

    So every held number lies in ``(expected, expected + window]``: at most ``window`` items are
    held, and memory is bounded whatever arrives. ``window=0`` never holds anything: it delivers
    each item at once and counts every skipped number as a gap.

    At all times ``delivered + gaps == expected - first``.

    Args:
        window: how far ahead of ``expected`` an item may arrive and still be waited for.
        first: the sequence number expected first.

    Raises:
        TypeError: ``window`` or ``first`` is not an int.
        ValueError: ``window`` is negative, or ``first`` is not a valid sequence number.
    """

    __slots__ = (
        "_held",
        "_window",
        "_first",
        "_expected",
        "_delivered",
        "_duplicates",
        "_gaps",
        "_reordered",
    )

    # ``Resequencer[Envelope]`` works at run time in both twins. The class cannot derive from
    # ``typing.Generic``: the compiled twin is an extension type, and those take no Python base
    # (Cython refuses one). So to a type checker it is not generic: its items are ``object``.
    __class_getitem__ = classmethod(GenericAlias)  # type: ignore[var-annotated]  # run-time only: checkers cannot use it

    def __init__(self, window: int = 1024, first: int = 1) -> None:
        if isinstance(window, bool) or not isinstance(window, int):
            raise TypeError(f"window must be an int, got {type(window).__name__}")
        if not 0 <= window <= MAX_SEQUENCE:
            raise ValueError(f"window must be in [0, 2**63), got {window}")
        first = _checked_sequence(first, "first")
        self._held: dict[int, object] = {}
        self._window: int = int(window)
        self._first: int = first
        self._expected: int = first
        self._delivered: int = 0
        self._duplicates: int = 0
        self._gaps: int = 0
        self._reordered: int = 0

    @property
    def window(self) -> int:
        """How far ahead of :attr:`expected` an item is still waited for."""
        return self._window

    @property
    def expected(self) -> int:
        """The next sequence number wanted."""
        return self._expected

    @property
    def delivered(self) -> int:
        """Items returned by :meth:`push` and :meth:`flush` so far."""
        return self._delivered

    @property
    def duplicates(self) -> int:
        """Items dropped because their number was already delivered, skipped or held."""
        return self._duplicates

    @property
    def gaps(self) -> int:
        """Sequence numbers given up on: skipped without ever being delivered."""
        return self._gaps

    @property
    def reordered(self) -> int:
        """Items held on arrival: ahead of :attr:`expected`, after any skipping they forced."""
        return self._reordered

    @property
    def held(self) -> int:
        """Items held now, waiting for the numbers before them."""
        return len(self._held)

    def push(self, sequence: int, item: object) -> list[object]:
        """Accept ``item`` numbered ``sequence``; return the items now deliverable, in order.

        Args:
            sequence: the item's sequence number, in ``[1, 2**63)``.
            item: anything; it is returned as is, once.

        Returns:
            The items delivered by this call, in sequence order (often just ``[item]``, or none).

        Raises:
            TypeError: ``sequence`` is not an int (``bool`` is refused too).
            ValueError: ``sequence`` is below 1 or not below ``2**63``.
        """
        if type(sequence) is not int or not 0 < sequence <= MAX_SEQUENCE:
            sequence = _checked_sequence(sequence, "sequence")
        seq = sequence
        if seq == self._expected:
            self._expected = seq + 1
            self._delivered += 1
            out = [item]
            if self._held:
                self._drain(out)
            return out
        if seq < self._expected or seq in self._held:
            self._duplicates += 1
            return []
        if seq - self._expected <= self._window:
            self._held[seq] = item
            self._reordered += 1
            return []
        out = []
        self._skip_to(seq - self._window, out)
        if seq == self._expected:  # window == 0: nothing is ever held
            self._expected = seq + 1
            self._delivered += 1
            out.append(item)
        else:
            self._held[seq] = item
            self._reordered += 1
        self._drain(out)
        return out

    def flush(self) -> list[object]:
        """Stop waiting: deliver every held item in order, counting the numbers missing between.

        Afterwards :attr:`expected` is one above the highest number seen (if anything was held),
        and nothing is held.

        Returns:
            The held items, in sequence order.
        """
        if not self._held:
            return []
        keys = sorted(self._held)
        last = keys[-1]
        out = [self._held[k] for k in keys]
        self._gaps += last + 1 - self._expected - len(keys)
        self._delivered += len(keys)
        self._expected = last + 1
        self._held.clear()
        return out

    def _drain(self, out: list[object]) -> None:
        """Move held items that continue ``expected`` without a gap to ``out``."""
        held = self._held
        expected = self._expected
        start = expected
        while held:
            item = held.pop(expected, _MISSING)
            if item is _MISSING:
                break
            out.append(item)
            expected += 1
        self._delivered += expected - start
        self._expected = expected

    def _skip_to(self, floor: int, out: list[object]) -> None:
        """Give up on every number below ``floor``: deliver held ones, count the rest as gaps."""
        held = self._held
        expected = self._expected
        span = floor - expected
        found = 0
        count = len(held)
        if span <= count:
            # Few numbers to walk: cheaper than sorting everything held.
            while expected < floor:
                item = held.pop(expected, _MISSING)
                if item is not _MISSING:
                    out.append(item)
                    found += 1
                expected += 1
        else:
            # A long jump: walk the (at most ``window``) held numbers instead of the span.
            for s in sorted([s for s in held if s < floor]):
                out.append(held.pop(s))
                found += 1
        self._delivered += found
        self._gaps += span - found
        self._expected = floor
