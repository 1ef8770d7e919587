"""A benchmark module's summary, printed after its benchmarks (and shown without ``-s``)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def print_summary(request: pytest.FixtureRequest, lines: Iterable[str]) -> None:
    """Write ``lines`` to the terminal past pytest's output capture; nothing when there are none.

    Call it after the ``yield`` of a module-scoped autouse fixture, with a generator that yields
    nothing when the module's benchmarks did not run (``--benchmark-skip``, deselected).
    """
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    text = list(lines)
    if reporter is None or capture is None or not text:
        return
    with capture.global_and_fixture_disabled():
        for line in text:
            reporter.write_line(line)
