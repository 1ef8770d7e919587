"""The report as Markdown (and the raw figures as JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict

from .contenders import BASELINES
from .runner import Report
from .stats import Summary, speedup
from .summary import Comparison, mcp_target, outcome, ratio_text, summary_lines
from .workloads import Case, Metric

__all__ = ["HEADLINE", "headline_columns", "to_json", "to_markdown"]

# (case group, metric key, column title) of the headline table; ``sessions`` takes its largest rung
HEADLINE = (
    ("mixed", "final ms", "mixed stream, ms"),
    ("lines", "MB/s", "1M lines, MB/s"),
    ("bulk", "MB/s", "bulk output, MB/s"),
    ("latency", "p50 µs", "round trip p50, µs"),
    ("latency", "p99 µs", "round trip p99, µs"),
    ("pipelined", "calls/s", "pipelined calls/s"),
    ("spawn", "p50 ms", "`true` p50, ms"),
    ("sessions", "calls/s", "{n} sessions, calls/s"),
)


def fmt(value: float) -> str:
    """A figure with as many digits as it deserves."""
    if value is None or math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


NOT_RUN = "—"


def _cell(s: Summary | None) -> str:
    """Median with the half-range of the repetitions, relative: ``14,200 ±3%``; too wide a range
    gives no number (``stats.NOISY``)."""
    if s is None:
        return "failed"
    if s.noisy:
        return f"too noisy to rank (±{s.spread * 50:.0f}%)"
    return f"{fmt(s.median)} ±{s.spread * 50:.0f}%" if s.n > 1 else fmt(s.median)


def _cell_at(report: Report, case: str, contender: str, key: str) -> str:
    """:func:`_cell` of one figure, or "—" where the contender does not run the workload."""
    if not report.applies(case, contender):
        return NOT_RUN
    return _cell(report.summary(case, contender, key))


def _arrow(metric: Metric) -> str:
    return "↑" if metric.higher_is_better else "↓"


def headline_columns(report: Report) -> list[tuple[Case, Metric, str]]:
    """The headline table's columns that this report measured: (case, metric, title)."""
    out = []
    for group, key, title in HEADLINE:
        rungs = [c for c in report.cases if c.group == group]
        if not rungs:
            continue
        case = max(rungs, key=lambda c: c.param)
        metric = next(m for m in case.metrics if m.key == key)
        out.append((case, metric, f"{title.format(n=case.param)} {_arrow(metric)}"))
    return out


def _table(header: list[str], rows: list[list[str]], numeric: bool = True) -> Iterator[str]:
    yield "| " + " | ".join(header) + " |"
    yield "|" + "|".join("---" if i == 0 or not numeric else "--:" for i in range(len(header))) + "|"
    for row in rows:
        yield "| " + " | ".join(row) + " |"


def _median(report: Report, case: Case, contender: str, key: str) -> float:
    s = report.summary(case.key, contender, key)
    return s.median if s else math.nan


def _ladder(report: Report, group: str, key: str, label: str) -> Iterator[str]:
    rungs = sorted((c for c in report.cases if c.group == group), key=lambda c: c.param)
    if not rungs:
        return
    header = ["contender", *(label.format(c.param if group == "sessions" else _size(c.param)) for c in rungs)]
    rows = [[f"`{c.name}`", *(_cell_at(report, r.key, c.name, key) for r in rungs)] for c in report.contenders
            if any(c.answers(r.group) for r in rungs)]
    yield from _table(header, rows)
    yield ""


def _size(n: int) -> str:
    return f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def to_markdown(report: Report, command: str, charts: list[str]) -> str:
    """The whole report; ``command`` is how it was produced, ``charts`` the PNG file names beside it."""
    meta, scale = report.meta, report.scale
    names = [c.name for c in report.contenders]
    columns = headline_columns(report)
    out = [
        "# smith-fast end-to-end benchmark report",
        "",
        f"Produced by `{command}` on {meta.get('date', '?')} in {meta.get('wall time', '?')}. "
        f"Scale `{scale.name}`: every figure is the **median of {scale.reps} measured repetitions**, after "
        f"{scale.warmups} warm-up repetition{'s' if scale.warmups != 1 else ''} per contender and workload "
        "that were run and discarded; `±x%` is half the range (max − min) of the repetitions, relative to "
        "the median. ↑: higher is better, ↓: lower is better.",
        "",
    ]
    out += summary_lines(report)
    for chart in charts:
        out += [f"![{chart}]({chart})", ""]
    out += ["## Headline", "",
            "`mcp`, `mcp-sdk`, `floor` and `no-server` run only the workloads they answer (\"—\" elsewhere); "
            "`floor` and `no-server` are references, floors that show what the job costs with (almost) no "
            "server, not competitors: they check nothing and refuse nothing.", ""]
    rows = [[f"`{n}`", *(_cell_at(report, case.key, n, m.key) for case, m, _ in columns)] for n in names]
    out += [*_table(["contender", *(t for _, _, t in columns)], rows), ""]
    out += _winners(report, columns)
    baselines = [b for b in BASELINES if b in names]
    if baselines:
        out += [
            f"### Speed-up against {' and '.join(f'`{b}`' for b in baselines)}",
            "",
            "How many times better each contender is on each headline figure (× > 1: faster, whichever "
            f"direction the figure goes), against {' / '.join(f'`{b}`' for b in baselines)}.",
            "",
        ]
        rows = []
        for n in names:
            row = [f"`{n}`"]
            for case, m, _ in columns:
                value = _median(report, case, n, m.key)
                if not report.applies(case.key, n):
                    row.append(NOT_RUN)
                    continue
                row.append(" / ".join(f"×{fmt(speedup(value, _median(report, case, b, m.key), m.higher_is_better))}"
                                      for b in baselines))
            rows.append(row)
        out += [*_table(["contender", *(t for _, _, t in columns)], rows), ""]
    out += ["### Server CPU per unit of work", "",
            "The server process's own CPU time per unit of work (all its threads, from `/proc/PID/task/*/schedstat`; "
            "the shell commands' own processes are not included), median: what each implementation costs the "
            "machine, whatever the client or the scheduler did. On a shared machine this is the steadier figure; "
            "the speed-up against the baselines follows (× > 1: less CPU than the baseline).", ""]
    cases = list(dict.fromkeys(case for case, _, _ in columns))  # latency has two columns, one CPU figure
    header = ["contender", *(f"{case.key}: {case.cpu[0].removeprefix('server CPU ')}" for case in cases)]
    rows = [[f"`{n}`", *(_cell_at(report, case.key, n, case.cpu[0]) for case in cases)] for n in names]
    out += [*_table(header, rows), ""]
    if baselines:
        rows = []
        for n in names:
            row = [f"`{n}`"]
            for case in cases:
                value = _median(report, case, n, case.cpu[0])
                if not report.applies(case.key, n):
                    row.append(NOT_RUN)
                    continue
                row.append(" / ".join(f"×{fmt(speedup(value, _median(report, case, b, case.cpu[0]), False))}"
                                      for b in baselines))
            rows.append(row)
        out += [*_table(header, rows), ""]
    out += _mcp_section(report)
    from .start import markdown as start_markdown  # it imports this module

    out += start_markdown(report)
    out += _ladder_sections(report)
    from .nats import markdown as nats_markdown  # it imports this module

    out += nats_markdown(report)
    from .workspaces import markdown as workspaces_markdown  # the same

    out += workspaces_markdown(report)
    from .egress import markdown as egress_markdown  # the same

    out += egress_markdown(report)
    out += _contenders_section(report)
    out += _details(report)
    out += _machine(report)
    return "\n".join(out).rstrip() + "\n"


def _winners(report: Report, columns: list[tuple[Case, Metric, str]]) -> list[str]:
    """Who is best on each headline figure, and by how much over the runner-up (overlap said)."""
    out = ["Best median on each figure among the contenders (the references left out), and the runner-up; "
           "\"within the spread\" when their ranges overlap, \"too noisy to rank\" when either spreads over ±25%:", ""]
    for case, metric, title in columns:
        ranked = []
        for c in report.contenders:
            s = report.summary(case.key, c.name, metric.key)
            if s and c.role != "reference":
                ranked.append((s, c.name))
        if len(ranked) < 2:
            continue
        ranked.sort(key=lambda x: x[0].median, reverse=metric.higher_is_better)
        (best, first), (second, runner) = ranked[0], ranked[1]
        clear = best.low > second.high if metric.higher_is_better else best.high < second.low
        if (best.noisy or second.noisy) and not clear:
            out.append(f"- {title.removesuffix(' ↑').removesuffix(' ↓')}: too noisy to rank (`{first}` and `{runner}` "
                       "lead on their medians)")
            continue
        overlap = best.low <= second.high and second.low <= best.high
        noisy = ", noisy, but every repetition of the first beat every one of the second" if best.noisy or second.noisy else ""
        out.append(f"- {title.removesuffix(' ↑').removesuffix(' ↓')}: `{first}` {fmt(best.median)}, then `{runner}` "
                   f"{fmt(second.median)} (×{fmt(speedup(best.median, second.median, metric.higher_is_better))}"
                   f"{', within the spread' if overlap else ''}{noisy})")
    return [*out, ""]


# the MCP comparison's columns: (case key, figure key, column title)
_MCP_COLUMNS = (
    ("pipelined", "calls/s", "pipelined calls/s ↑"),
    ("pipelined", "server CPU µs/call", "pipelined: CPU µs/call ↓"),
    ("latency", "p50 µs", "sequential p50 µs ↓"),
    ("latency", "server CPU µs/call", "sequential: CPU µs/call ↓"),
    ("seq", "final ms", "`seq` final ms ↓"),
    ("seq", "server CPU ms/MB", "`seq`: CPU ms/MB ↓"),
    ("spawn", "p50 ms", "`true` p50 ms ↓"),
    ("spawn", "server CPU µs/call", "`true`: CPU µs/call ↓"),
)
_MCP_ROWS = ("mcp", "mcp-sdk", "floor", "v1")


def _mcp_section(report: Report) -> list[str]:
    """smith-fast's MCP front against the official SDK's server, on the MCP issue's workloads."""
    names = [n for n in _MCP_ROWS if any(c.name == n for c in report.contenders)]
    columns = [col for col in _MCP_COLUMNS if report.case(col[0]) is not None]
    if "mcp" not in names or "mcp-sdk" not in names or not columns:
        return []
    sdk = next(c for c in report.contenders if c.name == "mcp-sdk")
    out = ["## MCP: smith-fast's MCP front against the official SDK", "",
           f"`mcp` is `smith-fast serve --mcp` on stdio; `mcp-sdk` is {sdk.description}. Both are spawned as "
           "MCP clients spawn servers and driven by the same JSON-RPC client (`bench.report.stdio`), the reads "
           "calling `fs.read` and `read_file` on the same 72 B file; `floor` and `v1` (Unix socket) for scale. "
           "Server CPU is the server process's own.", ""]
    rows = [[f"`{n}`", *(_cell_at(report, case, n, key) for case, key, _ in columns)] for n in names]
    out += [*_table(["contender", *(t for _, _, t in columns)], rows), ""]
    ratio = ["`mcp` vs `mcp-sdk`"]
    for case, key, title in columns:
        o = outcome(report, Comparison(case, key, "mcp", "mcp-sdk", title))
        ratio.append("n/a" if o is None else ratio_text(o))
    out += [*_table(["", *(t for _, _, t in columns)], [ratio]), ""]
    sentence, _ = mcp_target(report)
    return [*out, sentence, ""]


def _ladder_sections(report: Report) -> list[str]:
    out: list[str] = []
    if any(c.group == "size" for c in report.cases):
        first = next(c for c in report.cases if c.group == "size")
        out += ["## Size ladder: `fs.read` result size", "",
                f"Pipelined `fs.read` of files of each size, 64 in flight ({first.title.split(' of ')[0]}: "
                f"{report.scale.size_calls:,} calls per repetition). Calls/s:", ""]
        out += _ladder(report, "size", "calls/s", "{}")
        out += ["MB/s of file content:", ""]
        out += _ladder(report, "size", "MB/s", "{}")
        out += ["Server CPU µs per call:", ""]
        out += _ladder(report, "size", "server CPU µs/call", "{}")
    if any(c.group == "sessions" for c in report.cases):
        out += ["## Concurrency ladder: sessions", "",
                f"{report.scale.session_total:,} `fs.read` calls in all, spread over N concurrent sessions, 32 in "
                "flight in each (gRPC: N Streams on one channel). Calls/s:", ""]
        out += _ladder(report, "sessions", "calls/s", "{} sessions")
        out += ["Server CPU µs per call:", ""]
        out += _ladder(report, "sessions", "server CPU µs/call", "{} sessions")
    if any(c.group == "chunk" for c in report.cases):
        out += ["## Shell output chunk ladder", "",
                "`yes … | head -c N` on servers started with `--chunk-size S`, so each ShellOutput event carries "
                f"at most S bytes (about {report.scale.chunk_events:,} chunks, at most "
                f"{report.scale.chunk_cap >> 20} MiB). MB/s delivered:", ""]
        out += _ladder(report, "chunk", "MB/s", "{} chunks")
        out += ["Events/s:", ""]
        out += _ladder(report, "chunk", "events/s", "{} chunks")
        out += ["Server CPU ms per MB:", ""]
        out += _ladder(report, "chunk", "server CPU ms/MB", "{} chunks")
    return out


def _contenders_section(report: Report) -> list[str]:
    out = ["## Contenders", "",
           "Each contender has its own `smith-fast serve` process. The client side is the same fast driver for "
           "every v1 socket contender (compiled framing + upb, one blocking socket, pipelining by writing every "
           "freed request in one `send`), so `v1`, `v1-py` and `v1-asyncio` differ only in the server. The v0 "
           "contenders' client parses each line with orjson and reads the same few fields, for both server "
           "backends; the gRPC contenders use grpc.aio on the stdlib loop. Every smith-fast socket server reported "
           "the wire core and loop its contender claims (checked at start). The stdio contenders (`mcp`, `mcp-sdk`, "
           "`floor`) share one minimal JSON-RPC client on their pipes (orjson, blocking); the MCP ones show the "
           "`serverInfo` name and version they answered `initialize` with.", ""]
    rows = []
    for c in report.contenders:
        info = report.service_info.get(c.name, {})
        rows.append([f"`{c.name}`", c.description, info.get("implementation", info.get("server", "-")),
                     info.get("event_loop", info.get("version", "-"))])
    out += [*_table(["contender", "what", "server wire core", "server loop"], rows, numeric=False), ""]
    return out


def _details(report: Report) -> list[str]:
    out = ["## Every workload in detail", "",
           "Median [min – max] of the measured repetitions.", ""]
    for case in report.cases:
        keys = [m.key for m in case.metrics] + [case.cpu[0]]
        out += [f"### `{case.key}`: {case.title}", ""]
        rows = []
        for c in report.contenders:
            if not c.answers(case.group):
                continue
            if (case.key, c.name) in report.failures:
                rows.append([f"`{c.name}`", f"failed: {report.failures[(case.key, c.name)]}", *([""] * (len(keys) - 1))])
                continue
            row = [f"`{c.name}`"]
            for key in keys:
                s = report.summary(case.key, c.name, key)
                row.append(f"{fmt(s.median)} [{fmt(s.low)} – {fmt(s.high)}]" if s else "n/a")
            rows.append(row)
        arrows = {m.key: f" {_arrow(m)}" for m in case.metrics}
        out += [*_table(["contender", *(f"{k}{arrows.get(k, '')}" for k in keys)], rows), ""]
    return out


def _machine(report: Report) -> list[str]:
    out = ["## Machine and versions", ""]
    out += [*_table(["", ""], [[k, str(v).replace("|", "/")] for k, v in report.meta.items()], numeric=False), ""]
    return out


def to_json(report: Report) -> str:
    """Every measured repetition, the failures and the metadata, as JSON."""
    data = {
        "scale": asdict(report.scale),
        "meta": report.meta,
        "contenders": [{**asdict(c), "groups": None if c.groups is None else sorted(c.groups)}
                       for c in report.contenders],
        "cases": [{"key": c.key, "group": c.group, "title": c.title, "param": c.param,
                   "metrics": [asdict(m) for m in c.metrics], "cpu": c.cpu[0]} for c in report.cases],
        "samples": [{"case": k[0], "contender": k[1], "repetitions": v} for k, v in report.samples.items()],
        "failures": [{"case": k[0], "contender": k[1], "error": v} for k, v in report.failures.items()],
        "service_info": report.service_info,
        "nats": report.nats if report.nats is not None else {"failure": report.nats_failure} if report.nats_failure else None,
        "workspaces": report.workspaces if report.workspaces is not None
        else {"failure": report.workspaces_failure} if report.workspaces_failure else None,
        "start": report.start if report.start is not None else {"failure": report.start_failure} if report.start_failure else None,
        "egress": report.egress if report.egress is not None else {"failure": report.egress_failure} if report.egress_failure else None,
    }
    return json.dumps(data, indent=1, ensure_ascii=False)
