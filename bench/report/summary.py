"""The report's opening summary, in plain words, generated from the figures so it stays true.

Each :class:`Comparison` names two contenders and one figure of one workload; :func:`outcomes`
measures the ones this run has, and :func:`summary_lines` turns them into sentences: what
smith-fast handles against the references and the rivals, where it loses, what was too noisy to
say, and whether the MCP issue's target (the MCP front ≥ 8x the SDK server's pipelined calls/s and
≥ 4x lower p50, in the same run) was met.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .runner import Report
from .stats import Summary, speedup

__all__ = ["COMPARISONS", "Comparison", "MCP_TARGET", "Outcome", "mcp_target", "outcome", "outcomes", "ratio_text",
           "summary_lines"]


@dataclass(frozen=True)
class Comparison:
    """``ours`` against ``theirs`` on figure ``metric`` of case ``case``; ``what`` names it for a reader
    (``{title}``: the case's title, which says the size at this scale)."""

    case: str
    metric: str
    ours: str
    theirs: str
    what: str


COMPARISONS = (
    Comparison("pipelined", "calls/s", "v1", "floor", "pipelined small tool calls"),
    Comparison("pipelined", "calls/s", "v1", "mcp-sdk", "pipelined small tool calls"),
    Comparison("pipelined", "calls/s", "v1", "v0-json", "pipelined small tool calls"),
    Comparison("pipelined", "server CPU µs/call", "v1", "floor", "server CPU per pipelined call"),
    Comparison("latency", "p50 µs", "v1", "floor", "one call at a time, p50"),
    Comparison("latency", "p50 µs", "v1", "mcp-sdk", "one call at a time, p50"),
    Comparison("mixed", "final ms", "v1", "v0-orjson", "the mixed stream"),
    Comparison("spawn", "p50 ms", "v1", "no-server", "`true`, request to final event, p50"),
    Comparison("lines", "MB/s", "v1", "no-server", "output of {title}"),
    Comparison("pipelined", "calls/s", "mcp", "mcp-sdk", "MCP: pipelined small tool calls"),
    Comparison("latency", "p50 µs", "mcp", "mcp-sdk", "MCP: one call at a time, p50"),
    Comparison("seq", "final ms", "mcp", "mcp-sdk", "MCP: {title} in one result"),
    Comparison("spawn", "p50 ms", "mcp", "mcp-sdk", "MCP: `true`, p50"),
)
# (comparison index in COMPARISONS, at least this many times better): the MCP issue's target
MCP_TARGET = ((9, 8.0), (10, 4.0))


@dataclass(frozen=True)
class Outcome:
    """A comparison as measured: ``ratio`` > 1 means ``ours`` is better, whichever way the figure goes.

    ``worst`` and ``best``: the ratio's bounds from the repetitions' ranges (our worst against their
    best, and the other way round). ``verdict``: ``win`` or ``loss`` when even those bounds agree,
    else ``tie`` (the ranges overlap), or ``noisy`` (they overlap and a side spreads too wide to rank).
    A noisy figure still decides when its whole range lies on one side.
    """

    comparison: Comparison
    ours: Summary
    theirs: Summary
    ratio: float
    verdict: str
    unit: str
    worst: float = math.nan
    best: float = math.nan

    @property
    def noisy(self) -> bool:
        return self.ours.noisy or self.theirs.noisy


def _direction(report: Report, case: str, key: str) -> tuple[bool, str] | None:
    found = report.case(case)
    if found is None:
        return None
    for metric in found.metrics:
        if metric.key == key:
            return metric.higher_is_better, metric.unit
    if found.cpu[0] == key:
        return False, key.removeprefix("server CPU ")
    return None


def outcome(report: Report, c: Comparison) -> Outcome | None:
    """``c`` as this run measured it; None when either side did not run it."""
    direction = _direction(report, c.case, c.metric)
    ours, theirs = report.summary(c.case, c.ours, c.metric), report.summary(c.case, c.theirs, c.metric)
    if direction is None or ours is None or theirs is None:
        return None
    higher, unit = direction
    ratio = speedup(ours.median, theirs.median, higher)
    worst = speedup(ours.low if higher else ours.high, theirs.high if higher else theirs.low, higher)
    best = speedup(ours.high if higher else ours.low, theirs.low if higher else theirs.high, higher)
    if math.isnan(ratio) or math.isnan(worst) or math.isnan(best):
        verdict = "noisy"
    elif worst <= 1 <= best:
        verdict = "noisy" if ours.noisy or theirs.noisy else "tie"
    else:
        verdict = "win" if worst > 1 else "loss"
    found = report.case(c.case)
    title = found.title.split(",")[0] if found else c.case
    return Outcome(Comparison(c.case, c.metric, c.ours, c.theirs, c.what.format(title=title)), ours, theirs, ratio,
                   verdict, unit, worst, best)


def outcomes(report: Report) -> list[Outcome]:
    """Every comparison this run measured, in :data:`COMPARISONS` order."""
    return [o for o in (outcome(report, c) for c in COMPARISONS) if o is not None]


def mcp_target(report: Report) -> tuple[str, bool | None]:
    """The MCP target's sentence and whether it was met (None: not measured, or too noisy to say)."""
    parts: list[str] = []
    verdicts: list[bool | None] = []
    for index, need in MCP_TARGET:
        o = outcome(report, COMPARISONS[index])
        if o is None:
            return ("The MCP target (the MCP front ≥ 8x the SDK server's pipelined calls/s and ≥ 4x lower p50) "
                    "was not measured in this run.", None)
        what = "the calls/s" if o.comparison.metric == "calls/s" else "lower p50"
        if not o.noisy:
            parts.append(f"×{_fmt(o.ratio)} {what} (target ≥ {need:g}x)")
            verdicts.append(o.ratio >= need)
        elif o.worst >= need or o.best < need:  # noisy, but its whole range is on one side of the target
            parts.append(f"×{_fmt(o.worst)}–{_fmt(o.best)} {what}, noisy (target ≥ {need:g}x)")
            verdicts.append(o.worst >= need)
        else:
            parts.append(f"{what}: too noisy to say, ×{_fmt(o.worst)}–{_fmt(o.best)} (target ≥ {need:g}x)")
            verdicts.append(None)
    result = False if False in verdicts else None if None in verdicts else True
    verdict = {True: "**met** in this run", False: "**not met** in this run", None: "**not decided**: too noisy"}[result]
    return f"MCP target, `mcp` against `mcp-sdk` in the same run: {'; '.join(parts)}: {verdict}.", result


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def ratio_text(o: Outcome) -> str:
    """The ratio of ``o`` for a table cell: ``×4.1``, ``×3.2–6.0`` (noisy but clear), or too noisy."""
    if o.verdict == "noisy":
        return "too noisy to rank"
    return f"×{_fmt(o.worst)}–{_fmt(o.best)}" if o.noisy else f"×{_fmt(o.ratio)}"


def _times(o: Outcome) -> str:
    if o.verdict == "noisy":
        return "too noisy to rank"
    notes = [note for note, on in (("worse", o.ratio < 1), ("noisy but clear", o.noisy),
                                   ("within the spread", o.verdict == "tie")) if on]
    return ratio_text(o) + (f" ({'; '.join(notes)})" if notes else "")


def summary_lines(report: Report, name: Callable[[str], str] = lambda n: f"`{n}`") -> list[str]:
    """The opening section: a few bullets of plain words, every number taken from ``report``."""
    got = outcomes(report)
    out = ["## In short", "",
           "Generated from this run's figures (medians; \"×N\": N times better, whichever way the figure goes; "
           "where a side's repetitions spread over ±25%, the ratio's range from the repetitions' ranges, "
           "and \"too noisy to rank\" when that range straddles 1):", ""]
    first = [o for o in got if o.comparison.case == "pipelined" and o.comparison.ours == "v1"
             and o.comparison.metric == "calls/s"]
    if first:
        theirs = ", ".join(f"{_times(o)} those of {name(o.comparison.theirs)} ({_fmt(o.theirs.median)})"
                           for o in first)
        out.append(f"- For small tool calls (pipelined `fs.read` of 72 B) smith-fast `v1` handles "
                   f"{_fmt(first[0].ours.median)} calls/s: {theirs}.")
    for o in got:
        if o in first:
            continue
        c = o.comparison
        out.append(f"- {c.what}: {name(c.ours)} {_fmt(o.ours.median)} {o.unit} against {name(c.theirs)} "
                   f"{_fmt(o.theirs.median)}: {_times(o)}.")
    losses = [o for o in got if o.verdict == "loss"]
    out.append("- Where it loses: " + ("; ".join(f"{o.comparison.what}, {name(o.comparison.ours)} against "
                                                f"{name(o.comparison.theirs)} ({ratio_text(o)})" for o in losses)
                                      if losses else "nowhere among these comparisons in this run") + ".")
    noisy = [o for o in got if o.verdict == "noisy"]
    if noisy:
        out.append("- Too noisy to say in this run: " + "; ".join(
            f"{o.comparison.what} ({name(o.comparison.ours)} against {name(o.comparison.theirs)})" for o in noisy) + ".")
    sentence, _ = mcp_target(report)
    out += [f"- {sentence}", ""]
    return out
