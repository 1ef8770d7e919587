"""The report's start-up section: ``bench/bench_start.py`` run inside ``make bench``, each stdio
contender spawned afresh until its first answer, its figures in ``report.json`` (``start``), a
section of ``report.md`` and the start rows of the opening summary's table.

Starting is not a workload a running server answers, so it runs apart from the contenders' cases,
once, at the report's scale (at ``--smoke`` too: two repetitions take a few seconds).
"""

from __future__ import annotations

from collections.abc import Callable

from . import section
from .render import fmt
from .runner import Report

__all__ = ["GROUP", "markdown", "run", "wanted"]

GROUP = "start"


def wanted(scale: str, only: list[str], skip: bool) -> bool:
    """Whether this run measures start-up: asked for by ``--only``, else always (unless skipped)."""
    return not skip and (GROUP in only if only else True)


def run(report: Report, scale: str, say: Callable[[str], None] | None = None) -> None:
    """Measure it into ``report.start`` (``report.start_failure`` says why not, when it failed)."""
    section.measure_into(report, GROUP, "bench.bench_start", scale, say)


def markdown(report: Report) -> list[str]:
    """The section (empty when the run did not measure it)."""
    out, r = section.opening(report, GROUP, "Start: spawn → first answer")
    if r is None:
        return out
    out += [f"`python -m bench.bench_start` ({r['scale']} scale, {r['reps']} repetitions, interleaved): each stdio "
            "server spawned afresh by `subprocess.Popen`, the clock from the spawn to the answer read. *First answer*: "
            "MCP `initialize` answered (`mcp`, `mcp-sdk`), the v1 handshake's Ready (`v1`, `serve --stdio`), the first "
            "`fs.read` (`floor`, which has no handshake); *first call*: then one `fs.read` of a 72 B file answered. "
            "Median [min – max], ms; the opening summary ranks them on the middle half of the starts (one slowed by "
            "another process's burst of load says nothing of the server).", ""]
    rows = []
    for name, figures in r["contenders"].items():
        rows.append(f"| `{name}` | " + " | ".join(f"{fmt(f['median'])} [{fmt(f['low'])} – {fmt(f['high'])}]"
                                                 for f in figures.values()) + " |")
    return [*out, "| contender | first answer ↓ | first call ↓ |", "|---|--:|--:|", *rows, ""]
