"""Benchmarks reuse the twin fixtures, so every wire-core benchmark has a [c] and a [py] entry."""

from harness.twins import (  # noqa: F401  (fixtures)
    chunking,
    coalescing,
    events,
    framing,
    impl,
    relaypeek,
    sequencing,
)
