"""Summaries of repeated measurements: median and spread, percentiles, ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NOISY", "Summary", "percentile", "speedup", "summarize"]

# A figure whose repetitions spread wider than this (max - min, relative to the median; 0.5 is
# ±25%) says more about the machine's other load than about the contender: the report shows "too
# noisy to rank" instead of a number, and ranks and summarises without it.
NOISY = 0.5


@dataclass(frozen=True)
class Summary:
    """Median of the measured repetitions, with their range.

    Attributes:
        median: the median value.
        low: the smallest value.
        high: the largest value.
        n: how many values.
    """

    median: float
    low: float
    high: float
    n: int

    @property
    def spread(self) -> float:
        """``(high - low) / median``: 0.05 means the repetitions lay within 5% of the median."""
        return (self.high - self.low) / self.median if self.median else math.nan

    @property
    def noisy(self) -> bool:
        """The repetitions spread wider than :data:`NOISY` (a single value never is)."""
        return self.n > 1 and not self.spread <= NOISY


def summarize(values: Sequence[float]) -> Summary:
    """The :class:`Summary` of ``values`` (at least one)."""
    return Summary(statistics.median(values), min(values), max(values), len(values))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank; NaN when empty."""
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def speedup(value: float, baseline: float, higher_is_better: bool) -> float:
    """How many times better ``value`` is than ``baseline`` (>1: better), whatever the direction."""
    if not value or not baseline:
        return math.nan
    return value / baseline if higher_is_better else baseline / value
