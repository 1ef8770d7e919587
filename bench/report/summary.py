"""The report's opening summary, in plain words, generated from the figures so it stays true.

Each :class:`Comparison` names two contenders and one figure of one workload; :func:`outcomes`
measures the ones this run has, and :func:`summary_lines` turns them into sentences: what
smith-fast handles against the references and the rivals, where it loses, what was too noisy to
say, and whether each issue's target (:data:`TARGETS`: the MCP front ≥ 8x the SDK server's pipelined
calls/s and ≥ 4x lower p50; a sandboxed `true` one after another ≥ 0.8x no-server's rate and ≥ 1.5x
the SDK server's at ≤ 400 µs of service CPU; the request path level with the bare loop) was met in
the same run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .runner import Report
from .stats import Summary, percentile, speedup, summarize

__all__ = ["COMPARISONS", "Comparison", "Need", "Outcome", "ROWS", "Row", "START", "TARGETS", "Target", "mcp_target",
           "outcome", "outcomes", "peers", "ratio_text", "row_outcomes", "start_figure", "summary_lines", "target"]


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
    ratio, worst, best, verdict = _judge(ours, theirs, higher)
    found = report.case(c.case)
    title = found.title.split(",")[0] if found else c.case
    return Outcome(Comparison(c.case, c.metric, c.ours, c.theirs, c.what.format(title=title)), ours, theirs, ratio,
                   verdict, unit, worst, best)


def outcomes(report: Report) -> list[Outcome]:
    """Every comparison this run measured, in :data:`COMPARISONS` order."""
    return [o for o in (outcome(report, c) for c in COMPARISONS) if o is not None]


@dataclass(frozen=True)
class Need:
    """One figure of a :class:`Target`: ``comparison`` (its ratio as :class:`Outcome` has it, > 1:
    ours better) at least ``at_least``; or, ``comparison.theirs`` empty, ``ours``'s own figure at most
    ``at_most``. ``what`` names the figure in the sentence."""

    comparison: Comparison
    what: str
    at_least: float = math.nan
    at_most: float = math.nan


@dataclass(frozen=True)
class Target:
    """An issue's target, judged in the run: ``name`` and ``who`` open its sentence, ``stated`` says
    it when the run did not measure it, every one of ``needs`` must hold."""

    name: str
    who: str
    stated: str
    needs: tuple[Need, ...]


def _need(report: Report, need: Need) -> tuple[str, bool | None] | None:
    """``need``'s part of its target's sentence and whether it holds (None: too noisy to say); None
    when the run did not measure it."""
    c = need.comparison
    if not c.theirs:  # a figure of ours against a bound
        direction = _direction(report, c.case, c.metric)
        ours = report.summary(c.case, c.ours, c.metric)
        if direction is None or ours is None:
            return None
        bound = f"(target ≤ {need.at_most:g})"
        if not ours.noisy:
            return f"{_fmt(ours.median)} {need.what} {bound}", ours.median <= need.at_most
        if ours.high <= need.at_most or ours.low > need.at_most:
            return f"{_fmt(ours.low)}–{_fmt(ours.high)} {need.what}, noisy {bound}", ours.high <= need.at_most
        return f"{need.what}: too noisy to say, {_fmt(ours.low)}–{_fmt(ours.high)} {bound}", None
    o = outcome(report, c)
    if o is None:
        return None
    bound = f"(target ≥ {need.at_least:g}x)"
    if not o.noisy:
        return f"×{_fmt(o.ratio)} {need.what} {bound}", o.ratio >= need.at_least
    if o.worst >= need.at_least or o.best < need.at_least:  # noisy, but its whole range is on one side of the target
        return f"×{_fmt(o.worst)}–{_fmt(o.best)} {need.what}, noisy {bound}", o.worst >= need.at_least
    return f"{need.what}: too noisy to say, ×{_fmt(o.worst)}–{_fmt(o.best)} {bound}", None


def target(report: Report, t: Target) -> tuple[str, bool | None]:
    """``t``'s sentence and whether it was met (None: not measured, or too noisy to say)."""
    parts: list[str] = []
    verdicts: list[bool | None] = []
    for need in t.needs:
        got = _need(report, need)
        if got is None:
            named = t.name if t.name[:2].isupper() else t.name[0].lower() + t.name[1:]  # "MCP" stays
            return f"The {named} ({t.stated}) was not measured in this run.", None
        parts.append(got[0])
        verdicts.append(got[1])
    result = False if False in verdicts else None if None in verdicts else True
    verdict = {True: "**met** in this run", False: "**not met** in this run", None: "**not decided**: too noisy"}[result]
    return f"{t.name}, {t.who}: {'; '.join(parts)}: {verdict}.", result


TARGETS = (
    Target("MCP target", "`mcp` against `mcp-sdk` in the same run",
           "the MCP front ≥ 8x the SDK server's pipelined calls/s and ≥ 4x lower p50",
           (Need(COMPARISONS[9], "the calls/s", at_least=8.0), Need(COMPARISONS[10], "lower p50", at_least=4.0))),
    # spawning near the limit: a sandboxed, contained `true` one after another
    Target("Spawning target", "`v1`'s `true` one after another (sandbox and cgroup on) in the same run",
           "`true` one after another ≥ 0.8x no-server's rate and ≥ 1.5x the MCP SDK server's, ≤ 400 µs of service CPU each",
           (Need(Comparison("spawn", "calls/s", "v1", "no-server", "`true` one after another"), "`no-server`'s rate", at_least=0.8),
            Need(Comparison("spawn", "calls/s", "v1", "mcp-sdk", "`true` one after another"), "`mcp-sdk`'s rate", at_least=1.5),
            Need(Comparison("spawn", "server CPU µs/call", "v1", "", "service CPU per `true`"), "µs of service CPU per `true`",
                 at_most=400.0))),
    # the compiled request path against the bare loop
    Target("Call-path target", "`v1` against `floor` in the same run",
           "pipelined small calls ≥ 1.0x the floor's calls/s and a round-trip p50 at most the floor's",
           (Need(COMPARISONS[0], "the pipelined calls/s", at_least=1.0),
            Need(COMPARISONS[4], "lower round-trip p50", at_least=1.0))),
)


def mcp_target(report: Report) -> tuple[str, bool | None]:
    """The MCP target's sentence and whether it was met (None: not measured, or too noisy to say)."""
    return target(report, TARGETS[0])


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def ratio_text(o: Outcome) -> str:
    """The ratio of ``o`` for a table cell: ``×4.1``, ``×3.2–6.0`` (noisy but clear), or too noisy."""
    if o.verdict == "noisy":
        return "too noisy to rank"
    return f"×{_fmt(o.worst)}–{_fmt(o.best)}" if o.noisy else f"×{_fmt(o.ratio)}"


START = "start"  # not a case of the runner: bench.report.start's figures, in report.start


@dataclass(frozen=True)
class Row:
    """One workload of the opening table: figure ``metric`` of case ``case`` (or :data:`START`) of
    smith-fast's contender ``ours``, against each peer's (``{title}`` in ``what``: the case's title)."""

    case: str
    metric: str
    ours: str
    what: str


ROWS = (
    Row("pipelined", "calls/s", "v1", "pipelined small tool calls (72 B `fs.read`)"),
    Row("latency", "p50 µs", "v1", "one call at a time, p50"),
    Row("spawn", "p50 ms", "v1", "`true`, request to final event, p50"),
    Row("seq", "final ms", "v1", "{title}"),
    Row("lines", "MB/s", "v1", "output of {title}"),
    Row("pipelined", "calls/s", "mcp", "MCP: pipelined small tool calls"),
    Row("latency", "p50 µs", "mcp", "MCP: one call at a time, p50"),
    Row("spawn", "p50 ms", "mcp", "MCP: `true`, p50"),
    Row("seq", "final ms", "mcp", "MCP: {title} in one result"),
    Row(START, "first answer ms", "mcp", "start → first answer (`serve --mcp`: `initialize`)"),
    Row(START, "first call ms", "v1", "start → first `fs.read` answered (`serve --stdio`: Ready, then the read)"),
)
REFERENCES = ("floor", "no-server")


def start_figure(report: Report, contender: str, key: str) -> Summary | None:
    """The summary of ``key`` (``first answer ms``, ``first call ms``) of ``contender``'s starts:
    their median, and as its range the middle half of them (a start is short and there are many: one
    that another process's burst of load slowed would otherwise make the whole figure "too noisy")."""
    found = (report.start or {}).get("contenders", {}).get(contender, {}).get(key)
    if not found or not found["all"]:
        return None
    values = sorted(found["all"])
    return Summary(summarize(values).median, percentile(values, 0.25), percentile(values, 0.75), len(values))


def _figure(report: Report, case: str, contender: str, key: str) -> Summary | None:
    return start_figure(report, contender, key) if case == START else report.summary(case, contender, key)


def _runs(report: Report, case: str, contender: str) -> bool:
    if case == START:
        return contender in (report.start or {}).get("contenders", {})
    return report.applies(case, contender)


def _judge(ours: Summary, theirs: Summary, higher: bool) -> tuple[float, float, float, str]:
    """(ratio, worst, best, verdict) as :class:`Outcome` defines them."""
    ratio = speedup(ours.median, theirs.median, higher)
    worst = speedup(ours.low if higher else ours.high, theirs.high if higher else theirs.low, higher)
    best = speedup(ours.high if higher else ours.low, theirs.low if higher else theirs.high, higher)
    if math.isnan(ratio) or math.isnan(worst) or math.isnan(best):
        verdict = "noisy"
    elif worst <= 1 <= best:
        verdict = "noisy" if ours.noisy or theirs.noisy else "tie"
    else:
        verdict = "win" if worst > 1 else "loss"
    return ratio, worst, best, verdict


@dataclass(frozen=True)
class RowResult:
    """A :class:`Row` as this run measured it: what it is (the title filled in), its unit and
    direction, our figure (None: failed), and per peer (the rivals, then the references) its
    :class:`Outcome` (None where the peer does not run the workload, or either side failed)."""

    what: str
    unit: str
    higher_is_better: bool
    ours: Summary | None
    outcomes: dict[str, Outcome | None]


def row_outcomes(report: Report, row: Row) -> RowResult | None:
    """``row`` as this run measured it; None when the run did not measure the workload for us."""
    if row.case == START:
        direction: tuple[bool, str] | None = (False, "ms")
    else:
        direction = _direction(report, row.case, row.metric)
    if direction is None or not _runs(report, row.case, row.ours):
        return None
    higher, unit = direction
    found = report.case(row.case)
    what = row.what.format(title=found.title.split(",")[0] if found else row.case)
    ours = _figure(report, row.case, row.ours, row.metric)
    got: dict[str, Outcome | None] = {}
    for peer in peers(report):
        theirs = _figure(report, row.case, peer, row.metric) if _runs(report, row.case, peer) else None
        if ours is None or theirs is None:
            got[peer] = None
            continue
        ratio, worst, best, verdict = _judge(ours, theirs, higher)
        got[peer] = Outcome(Comparison(row.case, row.metric, row.ours, peer, what), ours, theirs, ratio, verdict, unit,
                            worst, best)
    return RowResult(what, unit, higher, ours, got)


def peers(report: Report) -> list[str]:
    """Whom the opening table compares with: every rival of the run, then the references."""
    rivals = [c.name for c in report.contenders if c.role == "rival"]
    return [*rivals, *(n for n in REFERENCES if any(c.name == n for c in report.contenders))]


def _plain(s: Summary | None) -> str:
    if s is None:
        return "failed"
    return f"too noisy (±{s.spread * 50:.0f}%)" if s.noisy else _fmt(s.median)


def summary_lines(report: Report, name: Callable[[str], str] = lambda n: f"`{n}`") -> list[str]:
    """The opening section: a table of every workload smith-fast and a peer both ran, against each
    peer, and the lists of where a peer beats us; every number taken from ``report``."""
    who = peers(report)
    rivals = [p for p in who if p not in REFERENCES]
    out = ["## In short", "",
           "Generated from this run's figures. Per workload: smith-fast's median, each peer's, and the ratios "
           "(\"×N\": smith-fast is N times better, whichever way the figure goes; below 1, worse). Where a side's "
           "repetitions spread over ±25%, the ratio's range from the repetitions' ranges, \"too noisy to rank\" when "
           f"that range straddles 1. Peers: the rival{'s' if len(rivals) != 1 else ''} "
           f"{', '.join(map(name, rivals)) or '(none in this run)'}, and the references "
           f"{' and '.join(name(n) for n in who if n in REFERENCES)} (floors, not competitors); \"—\": the peer does "
           "not run that workload.", ""]
    header = ["workload", "smith-fast", *(name(p) for p in who), *(f"× {name(p)}" for p in who)]
    rows: list[list[str]] = []
    losses: list[Outcome] = []
    below: list[Outcome] = []
    noisy: list[Outcome] = []
    for row in ROWS:
        measured = row_outcomes(report, row)
        if measured is None or (measured.ours is None and all(_figure(report, row.case, p, row.metric) is None for p in who)):
            continue  # nothing of it measured (a run of other workloads)
        got = measured.outcomes
        cells = [f"{measured.what}, {measured.unit} {'↑' if measured.higher_is_better else '↓'}",
                 f"{_plain(measured.ours)} ({name(row.ours)})"]
        for p in who:  # a peer's figure, whether or not ours was measured
            cells.append(_plain(_figure(report, row.case, p, row.metric)) if _runs(report, row.case, p) else NOT_RUN)
        for p in who:
            o = got[p]
            if o is None:
                cells.append(NOT_RUN if not _runs(report, row.case, p) else "n/a")
                continue
            cells.append(ratio_text(o))
            if o.verdict == "loss":
                (below if p in REFERENCES else losses).append(o)
            elif o.verdict == "noisy":
                noisy.append(o)
        rows.append(cells)
    out += ["| " + " | ".join(header) + " |", "|---|" + "--:|" * (len(header) - 1)]
    out += ["| " + " | ".join(cells) + " |" for cells in rows]
    out.append("")

    def said(o: Outcome) -> str:
        return f"{o.comparison.what}: {name(o.comparison.ours)} against {name(o.comparison.theirs)} ({ratio_text(o)})"

    out.append("- **Where it loses** (a rival beats smith-fast): " + ("; ".join(map(said, losses)) if losses else
               f"nowhere against {', '.join(map(name, rivals)) or 'a rival'} in this run") + ".")
    out.append("- **Below the floor** (a reference does the job faster, checking nothing): "
               + ("; ".join(map(said, below)) if below else "nowhere in this run") + ".")
    if noisy:
        out.append("- Too noisy to say in this run: " + "; ".join(
            f"{o.comparison.what} ({name(o.comparison.ours)} against {name(o.comparison.theirs)})" for o in noisy) + ".")
    out += [f"- {target(report, t)[0]}" for t in TARGETS]
    out.append("")
    return out


NOT_RUN = "—"
