"""What the report's own-topology sections share (``nats``, ``workspaces``, ``egress``): a benchmark module with
``SCALES``, ``measure(scale, say)`` and ``render(result)``, run once after the contenders' cases at
the report's scale, its figures in ``report.<group>`` (or why not in ``report.<group>_failure``)."""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .runner import Report

__all__ = ["Measured", "measure_into", "opening", "wanted"]


def wanted(group: str, scale: str, only: list[str], skip: bool) -> bool:
    """Whether this run measures section ``group``: asked for by ``--only``, else at full and quick scale."""
    if skip:
        return False
    if only:
        return group in only
    return scale != "smoke"


def measure_into(report: Report, group: str, module: str, scale: str, say: Callable[[str], None] | None = None) -> None:
    """Run benchmark ``module`` (imported only now: its harness, servers) into ``report.<group>``;
    a failure goes to ``report.<group>_failure``, whole on stderr (a process's stderr is at its end)."""
    bench = importlib.import_module(module)
    tell = say or (lambda line: print(f"bench.report: {group}: {line}", file=sys.stderr, flush=True))
    try:
        result = bench.measure(bench.SCALES[scale if scale in bench.SCALES else "full" if scale == "full" else "quick"], tell)
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        setattr(report, f"{group}_failure", detail[:500])
        tell(f"failed: {detail}")
        return
    setattr(report, group, result)
    for line in bench.render(result):
        tell(line)


def opening(report: Report, group: str, title: str) -> tuple[list[str], dict[str, Any] | None]:
    """The start of section ``group``'s Markdown and its figures: nothing when the run did not measure
    it; its heading ``## title`` and, when it failed, why (no figures); else the heading and the figures."""
    result, failure = getattr(report, group), getattr(report, f"{group}_failure")
    if result is None and failure is None:
        return [], None
    out = [f"## {title}", ""]
    if result is None:
        return [*out, f"Not measured: `{failure}`.", ""], None
    return out, result


@dataclass(frozen=True)
class Measured:
    """A section measured by benchmark ``module`` into ``report.<group>``, at full and quick scale or
    when ``--only`` names it: its ``wanted`` and ``run`` are the section module's."""

    group: str
    module: str

    def wanted(self, scale: str, only: list[str], skip: bool) -> bool:
        return wanted(self.group, scale, only, skip)

    def run(self, report: Report, scale: str, say: Callable[[str], None] | None = None) -> None:
        measure_into(report, self.group, self.module, scale, say)
