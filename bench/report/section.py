"""What the report's own-topology sections share (``nats``, ``workspaces``, ``egress``): a benchmark module with
``SCALES``, ``measure(scale, say)`` and ``render(result)``, run once after the contenders' cases at
the report's scale, its figures in ``report.<group>`` (or why not in ``report.<group>_failure``)."""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable

from .runner import Report

__all__ = ["measure_into", "wanted"]


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
