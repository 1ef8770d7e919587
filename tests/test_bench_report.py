"""The end-to-end benchmark report (``python -m bench.report``, bench/report/): its machinery, not
its figures.

``python -m bench.report --smoke`` runs every contender (one real ``smith-fast serve`` each, Unix socket
and gRPC, v1 and v0, compiled and pure-Python servers; the MCP front and the official SDK's server on
stdio; the bare-loop floor and the no-server spawn reference) through every workload it answers at a
tiny size, and must write a Markdown report, the raw JSON and PNG charts that parse. The summary, the
noisy-cell rule and the MCP target's verdict are checked on small made-up result sets. No timing is
asserted.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

from bench.report import stats
from bench.report.contenders import CONTENDERS, Contender
from bench.report.runner import Report
from bench.report.wire import OUTPUT, RESULT, STATE, V0Wire, V1Wire, envelope_views
from bench.report.workloads import SCALES, cases
from harness.server import ROOT
from smith_fast.framing import encode_frame
from smith_fast.pb import smith_pb2 as pb

RID = "7b0c6f1e-2f7e-4a53-9d55-0c4c1c2ad0a1"


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("bench-smoke")
    proc = subprocess.run([sys.executable, "-m", "bench.report", "--smoke", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=230)
    return out, proc


def _table(markdown: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table after ``heading``, header included."""
    lines = markdown[markdown.index(heading):].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return [rows[0], *rows[2:]]  # without the alignment row


@pytest.mark.timeout(240)
def test_smoke_run_writes_report_json_and_charts(smoke_report: tuple[pathlib.Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = smoke_report
    assert proc.returncode == 0, proc.stderr[-3000:]
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# smith-fast end-to-end benchmark report")
    assert "`python -m bench.report --smoke`" in markdown

    # the generated summary comes first, before the tables: a table of every workload against each
    # peer (start-up among them, measured at smoke scale too), where it loses, the MCP target's verdict
    assert markdown.index("## In short") < markdown.index("## Headline")
    short = markdown[markdown.index("## In short"):markdown.index("## Headline")]
    table = _table(short, "## In short")
    assert table[0] == ["workload", "smith-fast", "`mcp-sdk`", "`floor`", "`no-server`", "× `mcp-sdk`", "× `floor`",
                        "× `no-server`"]
    rows = {row[0]: row for row in table[1:]}
    pipelined = rows["pipelined small tool calls (72 B `fs.read`), calls/s ↑"]
    assert pipelined[1].endswith("(`v1`)") and pipelined[4] == pipelined[7] == "—"
    assert all(re.fullmatch(r"×[\d.,]+(–[\d.,]+)?|too noisy to rank", cell) for cell in pipelined[5:7]), pipelined
    start = rows["start → first answer (`serve --mcp`: `initialize`), ms ↓"]
    assert start[1].endswith("(`mcp`)") and start[4] == "—" and start[5].startswith(("×", "too noisy"))
    assert "start → first `fs.read` answered (`serve --stdio`: Ready, then the read), ms ↓" in rows
    assert "- **Where it loses** (a rival beats smith-fast): " in short
    assert "- **Below the floor** (a reference does the job faster, checking nothing): " in short
    assert re.search(r"MCP target, `mcp` against `mcp-sdk` in the same run: .*: \*\*(met|not met|not decided)", short)
    assert "## Start: spawn → first answer" in markdown

    # the headline: one row per contender, every cell a number with its spread, too noisy to rank,
    # or "—" where the contender does not run that workload (the MCP servers and the references)
    headline = _table(markdown, "## Headline")
    assert [row[0] for row in headline[1:]] == [f"`{c.name}`" for c in CONTENDERS]
    assert len(headline[0]) == 9  # contender + mixed, lines, bulk, p50, p99, pipelined, true, sessions
    columns = ["mixed", "lines", "bulk", "latency", "latency", "pipelined", "spawn", "sessions"]
    by_contender = {f"`{c.name}`": c for c in CONTENDERS}
    for row in headline[1:]:
        assert len(row) == len(headline[0])
        for group, cell in zip(columns, row[1:]):
            if by_contender[row[0]].answers(group):
                assert re.fullmatch(r"[\d,.]+ ±\d+%|too noisy to rank \(±\d+%\)", cell), (row[0], cell)
            else:
                assert cell == "—", (row[0], cell)
    assert by_contender["`floor`"].answers("pipelined") and by_contender["`mcp-sdk`"].answers("latency")
    assert by_contender["`no-server`"].answers("spawn") and not by_contender["`floor`"].answers("spawn")

    # the MCP section: the front and the SDK server side by side, the ratio, the target
    mcp = _table(markdown, "## MCP: smith-fast's MCP front against the official SDK")
    assert [row[0] for row in mcp[1:]] == ["`mcp`", "`mcp-sdk`", "`floor`", "`v1`"]
    assert mcp[0][1:] == ["pipelined calls/s ↑", "pipelined: CPU µs/call ↓", "sequential p50 µs ↓",
                          "sequential: CPU µs/call ↓", "`seq` final ms ↓", "`seq`: CPU ms/MB ↓", "`true` p50 ms ↓",
                          "`true`: CPU µs/call ↓"]
    section = markdown[markdown.index("## MCP:"):]
    assert re.search(r"\| `mcp` vs `mcp-sdk` \|( (×[\d.,]+(–[\d.,]+)?|too noisy to rank) \|){8}", section)

    # ratios: each baseline against itself is exactly 1
    ratios = _table(markdown, "### Speed-up against")
    by_name = {row[0]: row[1:] for row in ratios[1:]}
    assert all(cell.split(" / ")[0] == "×1.00" for cell in by_name["`v0-json`"])
    assert all(cell.split(" / ")[1] == "×1.00" for cell in by_name["`v0-orjson`"])

    # every server ran the configuration its contender claims
    contenders = {row[0]: row for row in _table(markdown, "## Contenders")[1:]}
    assert contenders["`mcp`"][2] == "smith-fast" and contenders["`mcp-sdk`"][2] == "sdk-contender"
    assert contenders["`v1-py`"][2:] == ["py", "uvloop"]
    assert contenders["`v1-asyncio`"][2:] == ["c", "asyncio"]
    assert contenders["`v1`"][2:] == ["c", "uvloop"]

    # the machine section says what ran where, load included
    machine = {row[0]: row[1] for row in _table(markdown, "## Machine and versions")[1:]}
    assert re.search(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d at the start", machine["load average (1/5/15 min)"])
    for key in ("machine", "python", "protobuf", "grpcio", "smith-fast", "wall time"):
        assert machine[key], key

    # the JSON holds every measured repetition of every case for every contender
    data = json.loads((out / "report.json").read_text())
    assert data["failures"] == []
    scale = SCALES["smoke"]
    got = {(s["case"], s["contender"]): s["repetitions"] for s in data["samples"]}
    assert set(got) == {(case.key, c.name) for case in cases(scale) for c in CONTENDERS if c.answers(case.group)}
    assert {"mcp", "mcp-sdk", "floor", "no-server"} <= {c for _, c in got}
    assert all(len(reps) == scale.reps for reps in got.values())
    assert all(reps[0]["server CPU µs/call"] >= 0 for (case, _), reps in got.items() if case == "pipelined")

    # the charts are linked, exist, are real PNGs of a sensible size, and not blank
    import matplotlib.image

    linked = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", markdown)
    assert linked == ["throughput.png", "ladders.png"]
    for name in linked:
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size < 150_000
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 200 and image.shape[1] > 600
        assert image.std() > 0.05


EVENTS = [
    pb.Event(state_change=pb.StateChangeEvent(request_id=RID, state=pb.SERVICE_STATE_PROCESSING, timestamp=5)),
    pb.Event(tool_result=pb.ToolResultEvent(request_id=RID, success=True, result=b'{"content":"hi"}')),
    pb.Event(tool_result=pb.ToolResultEvent(request_id=RID, success=False, error="no such file")),
    pb.Event(shell_output=pb.ShellOutputEvent(request_id=RID, stdout="line\n")),
    pb.Event(shell_output=pb.ShellOutputEvent(request_id=RID, stderr="warn\n", exit_code=3, finished=True)),
    pb.Event(state_change=pb.StateChangeEvent(request_id=RID, state=pb.SERVICE_STATE_READY, timestamp=6)),
]


def test_v1_and_v0_wires_give_the_drivers_the_same_views() -> None:
    from smith_fast.jsonl import JsonlCodec

    v1_bytes = b"".join(encode_frame(pb.Envelope(event=e).SerializeToString()) for e in EVENTS)
    v0_bytes = b"".join(JsonlCodec("json").encode_event(e) for e in EVENTS)
    v1, v0 = V1Wire(), V0Wire()
    # fed in awkward pieces: the decoders keep partial frames and lines
    v1_views = [view for i in range(0, len(v1_bytes), 7) for view in v1.decode(v1_bytes[i : i + 7])]
    v0_views = [view for i in range(0, len(v0_bytes), 7) for view in v0.decode(v0_bytes[i : i + 7])]
    assert v1_views == v0_views == [
        (STATE, RID, pb.SERVICE_STATE_PROCESSING, None),
        (RESULT, RID, True, None),
        (RESULT, RID, False, "no such file"),
        (OUTPUT, RID, 5, None),
        (OUTPUT, RID, 5, 3),
        (STATE, RID, pb.SERVICE_STATE_READY, None),
    ]


def test_batch_event_envelopes_unpack_in_order() -> None:
    env = pb.Envelope()
    env.batch_event.events.extend(EVENTS[:2])
    assert envelope_views(env.SerializeToString()) == [
        (STATE, RID, pb.SERVICE_STATE_PROCESSING, None),
        (RESULT, RID, True, None),
    ]


def test_stats() -> None:
    s = stats.summarize([10.0, 12.0, 11.0, 30.0, 9.0])
    assert (s.median, s.low, s.high, s.n) == (11.0, 9.0, 30.0, 5)
    assert s.spread == pytest.approx(21 / 11)
    values = sorted(float(i) for i in range(1, 101))
    assert stats.percentile(values, 0.5) == 50.0
    assert stats.percentile(values, 0.99) == 99.0
    assert stats.percentile(values, 1.0) == 100.0
    assert stats.speedup(200.0, 100.0, higher_is_better=True) == 2.0
    assert stats.speedup(50.0, 100.0, higher_is_better=False) == 2.0


def test_tracker_counts_ended_requests_and_refuses_failures() -> None:
    from bench.report.drivers import ProtocolFailure, Tracker
    from bench.report.wire import ERROR

    shell = "0e6c4b0a-8a53-4f57-bb6e-2b36a7f0a3c2"
    tracker = Tracker([RID], [shell])
    processing, ready = pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY
    assert tracker.feed([(STATE, RID, processing, None), (STATE, shell, processing, None),
                         (OUTPUT, shell, 10, None), (RESULT, RID, True, None)]) == 0
    assert tracker.feed([(STATE, RID, ready, None), (OUTPUT, shell, 4, 0)]) == 1
    assert tracker.feed([(STATE, shell, ready, None)]) == 1
    assert (tracker.left, tracker.results, tracker.output, tracker.events) == (0, 1, 14, 7)

    for bad in (
        [(STATE, RID, processing, None), (RESULT, RID, False, "boom")],  # a failed tool
        [(STATE, RID, ready, None)],  # ended before it was answered
        [(RESULT, RID, True, None)],  # answered before it started
        [(ERROR, RID, "nope", None)],
        [(STATE, "not-ours", processing, None)],
    ):
        with pytest.raises(ProtocolFailure):
            Tracker([RID]).feed(bad)
    with pytest.raises(ProtocolFailure, match="exit code 2"):
        Tracker([], [shell]).feed([(STATE, shell, processing, None), (OUTPUT, shell, 1, 2)])


def test_the_runner_is_not_part_of_the_installed_package() -> None:
    """What pip installs (pyproject's package list) is the runtime package alone: the report lives in
    bench/report and what it shares with the tests in harness/, both run from a clone."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    installed = find_packages(str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert "smith_fast" in installed
    assert all(name == "smith_fast" or name.startswith("smith_fast.") for name in installed), installed
    assert not [name for name in installed if "bench" in name or "tests" in name or "harness" in name], installed
    runtime = "\n".join(path.read_text() for path in (ROOT / "smith_fast").rglob("*.py"))
    assert not re.search(r"^\s*(from|import) (bench|tests|harness)\b", runtime, re.M)


def _fake_report(figures: dict[tuple[str, str], list[float]], key_of: dict[str, str]) -> Report:
    """A report with made-up repetitions: ``(case key, contender) -> values of that case's figure``."""
    scale = SCALES["quick"]
    report = Report(scale, list(CONTENDERS), cases(scale))
    for (case, contender), values in figures.items():
        report.samples[(case, contender)] = [{key_of[case]: v} for v in values]
    return report


KEY_OF = {"pipelined": "calls/s", "latency": "p50 µs", "seq": "final ms", "spawn": "p50 ms"}


def test_noisy_cells_are_not_ranked_and_not_run_cells_are_a_dash() -> None:
    from bench.report.render import _cell, _cell_at, _winners, headline_columns

    assert stats.summarize([100.0, 110.0, 120.0]).noisy is False  # ±10%
    assert stats.summarize([100.0, 148.0, 400.0]).noisy is True  # a `148 ±154%` once reported as a figure
    assert stats.summarize([5.0]).noisy is False  # one value has no spread to judge
    assert _cell(stats.summarize([100.0, 110.0, 120.0])) == "110 ±9%"
    assert _cell(stats.summarize([52.0, 148.0, 500.0])) == "too noisy to rank (±151%)"

    report = _fake_report({("pipelined", "v1"): [9000.0, 9100.0, 9200.0],
                           ("pipelined", "v1-batch"): [5000.0, 9500.0, 20000.0],
                           ("pipelined", "v0-json"): [4000.0, 4100.0, 4200.0],
                           ("pipelined", "floor"): [15000.0, 15600.0, 16000.0]}, KEY_OF)
    assert _cell_at(report, "pipelined", "floor", "calls/s") == "15,600 ±3%"
    assert _cell_at(report, "pipelined", "no-server", "calls/s") == "—"  # never run there, not failed
    assert _cell_at(report, "spawn", "floor", "p50 ms") == "—"
    assert _cell_at(report, "pipelined", "v1-py", "calls/s") == "failed"
    pipelined = [col for col in headline_columns(report) if col[0].key == "pipelined"]
    lines = _winners(report, pipelined)
    # the floor is best but a reference, v1-batch's median is higher but too noisy: not ranked
    assert lines[2] == "- pipelined calls/s: too noisy to rank (`v1-batch` and `v1` lead on their medians)"


def _starts(figures: dict[str, list[float]]) -> dict[str, object]:
    """``report.start`` as ``bench.bench_start`` writes it, the first call 1 ms after the first answer."""
    return {"contenders": {name: {"first answer ms": {"all": values}, "first call ms": {"all": [v + 1 for v in values]}}
                           for name, values in figures.items()}}


def test_the_issue_targets_are_judged_from_the_figures_of_the_run() -> None:
    from bench.report.summary import TARGETS, summary_lines, target

    def report_of(samples: dict[tuple[str, str], list[dict[str, float]]]) -> Report:
        scale = SCALES["quick"]
        report = Report(scale, list(CONTENDERS), cases(scale))
        report.samples.update(samples)
        return report

    spawning, call_path = TARGETS[1], TARGETS[2]
    samples = {
        ("spawn", "v1"): [{"calls/s": r, "server CPU µs/call": c} for r, c in ((900.0, 380.0), (950.0, 390.0), (1000.0, 395.0))],
        ("spawn", "no-server"): [{"calls/s": r} for r in (1100.0, 1150.0, 1200.0)],
        ("spawn", "mcp-sdk"): [{"calls/s": r} for r in (550.0, 600.0, 650.0)],
        ("pipelined", "v1"): [{"calls/s": r} for r in (20000.0, 21000.0, 22000.0)],
        ("pipelined", "floor"): [{"calls/s": r} for r in (19000.0, 20000.0, 21000.0)],
        ("latency", "v1"): [{"p50 µs": v} for v in (20.0, 21.0, 22.0)],
        ("latency", "floor"): [{"p50 µs": v} for v in (11.0, 12.0, 13.0)],
    }
    # 950 / 1150 and 950 / 600 of the rates, 390 µs of CPU: every figure of item 1 holds
    assert target(report_of(samples), spawning) == (
        "Spawning target, `v1`'s `true` one after another (sandbox and cgroup on) in the same run: ×0.83 `no-server`'s "
        "rate (target ≥ 0.8x); ×1.58 `mcp-sdk`'s rate (target ≥ 1.5x); 390 µs of service CPU per `true` (target ≤ 400): "
        "**met** in this run.", True)
    # one figure missing its bound is enough
    costly = {**samples, ("spawn", "v1"): [{"calls/s": r, "server CPU µs/call": c} for r, c in ((900.0, 500.0), (950.0, 520.0),
                                                                                                 (1000.0, 540.0))]}
    sentence, met = target(report_of(costly), spawning)
    assert met is False and "520 µs of service CPU per `true` (target ≤ 400): **not met** in this run." in sentence
    # a CPU figure whose range straddles the bound decides nothing
    straddling = {**samples, ("spawn", "v1"): [{"calls/s": r, "server CPU µs/call": c} for r, c in ((900.0, 200.0), (950.0, 390.0),
                                                                                                    (1000.0, 700.0))]}
    sentence, met = target(report_of(straddling), spawning)
    assert met is None and "µs of service CPU per `true`: too noisy to say, 200–700 (target ≤ 400)" in sentence
    # no peer, no verdict
    alone = {k: v for k, v in samples.items() if k != ("spawn", "no-server")}
    assert target(report_of(alone), spawning) == (
        "The spawning target (`true` one after another ≥ 0.8x no-server's rate and ≥ 1.5x the MCP SDK server's, ≤ 400 µs "
        "of service CPU each) was not measured in this run.", None)
    # item 2: pipelined level with the floor, but a round trip slower than its
    assert target(report_of(samples), call_path) == (
        "Call-path target, `v1` against `floor` in the same run: ×1.05 the pipelined calls/s (target ≥ 1x); ×0.57 lower "
        "round-trip p50 (target ≥ 1x): **not met** in this run.", False)
    # the summary states each target
    lines = summary_lines(report_of(samples))
    assert [line.split(",")[0] for line in lines if "target" in line.split(",")[0]] == [
        "- The MCP target (the MCP front ≥ 8x the SDK server's pipelined calls/s and ≥ 4x lower p50) was not measured in this run.",
        "- Spawning target", "- Call-path target"]


def test_the_summary_is_generated_from_the_figures() -> None:
    from bench.report.summary import mcp_target, summary_lines

    figures = {
        ("pipelined", "v1"): [8000.0, 8200.0, 8300.0],
        ("pipelined", "floor"): [15000.0, 15600.0, 16000.0],
        ("pipelined", "mcp-sdk"): [900.0, 1000.0, 1100.0],
        ("pipelined", "v0-json"): [4000.0, 4100.0, 4200.0],
        ("pipelined", "mcp"): [8500.0, 9000.0, 9500.0],
        ("latency", "v1"): [170.0, 175.0, 180.0],
        ("latency", "floor"): [105.0, 109.0, 110.0],
        ("latency", "mcp"): [200.0, 210.0, 215.0],
        ("latency", "mcp-sdk"): [900.0, 950.0, 1000.0],
        ("spawn", "v1"): [0.5, 1.0, 3.0],  # too noisy to say: its range straddles the others'
        ("spawn", "no-server"): [0.8, 0.85, 0.9],
        ("spawn", "mcp"): [1.6, 1.7, 1.8],
        ("spawn", "mcp-sdk"): [1.4, 1.45, 1.5],  # the SDK server starts `true` faster than the MCP front
    }
    report = _fake_report(figures, KEY_OF)
    report.start = _starts({"mcp": [100.0, 102.0, 104.0], "v1": [98.0, 99.0, 100.0], "mcp-sdk": [450.0, 460.0, 470.0],
                            "floor": [17.0, 18.0, 19.0]})
    lines = summary_lines(report)
    text = "\n".join(lines)
    assert lines[0] == "## In short"
    table = _table(text, "## In short")
    assert table[0] == ["workload", "smith-fast", "`mcp-sdk`", "`floor`", "`no-server`", "× `mcp-sdk`", "× `floor`",
                        "× `no-server`"]
    rows = {row[0]: row[1:] for row in table[1:]}
    # the workloads nobody measured in this run (seq, lines) are left out, not shown as failed
    assert list(rows) == [
        "pipelined small tool calls (72 B `fs.read`), calls/s ↑",
        "one call at a time, p50, µs ↓",
        "`true`, request to final event, p50, ms ↓",
        "MCP: pipelined small tool calls, calls/s ↑",
        "MCP: one call at a time, p50, µs ↓",
        "MCP: `true`, p50, ms ↓",
        "start → first answer (`serve --mcp`: `initialize`), ms ↓",
        "start → first `fs.read` answered (`serve --stdio`: Ready, then the read), ms ↓",
    ]
    assert rows["pipelined small tool calls (72 B `fs.read`), calls/s ↑"] == [
        "8,200 (`v1`)", "1,000", "15,600", "—", "×8.20", "×0.53", "—"]
    assert rows["one call at a time, p50, µs ↓"] == ["175 (`v1`)", "950", "109", "—", "×5.43", "×0.62", "—"]
    assert rows["`true`, request to final event, p50, ms ↓"] == [
        "too noisy (±125%) (`v1`)", "1.45", "—", "0.85", "too noisy to rank", "—", "too noisy to rank"]
    assert rows["MCP: `true`, p50, ms ↓"] == ["1.70 (`mcp`)", "1.45", "—", "0.85", "×0.85", "—", "×0.50"]
    assert rows["start → first answer (`serve --mcp`: `initialize`), ms ↓"] == [
        "102 (`mcp`)", "460", "18.0", "—", "×4.51", "×0.18", "—"]
    assert rows["start → first `fs.read` answered (`serve --stdio`: Ready, then the read), ms ↓"] == [
        "100 (`v1`)", "461", "19.0", "—", "×4.61", "×0.19", "—"]
    # a rival that beats us is where it loses; a reference that does is below the floor
    assert "- **Where it loses** (a rival beats smith-fast): MCP: `true`, p50: `mcp` against `mcp-sdk` (×0.85)." in lines
    below = next(line for line in lines if line.startswith("- **Below the floor**"))
    assert "pipelined small tool calls (72 B `fs.read`): `v1` against `floor` (×0.53)" in below
    assert "MCP: `true`, p50: `mcp` against `no-server` (×0.50)" in below
    assert "start → first answer (`serve --mcp`: `initialize`): `mcp` against `floor` (×0.18)" in below
    assert "mcp-sdk" not in below
    assert ("- Too noisy to say in this run: `true`, request to final event, p50 (`v1` against `mcp-sdk`); "
            "`true`, request to final event, p50 (`v1` against `no-server`).") in lines
    # 9000 / 1000 = 9x (≥ 8) and 950 / 210 = 4.5x (≥ 4): met
    assert mcp_target(report)[1] is True
    assert "×9.00 the calls/s (target ≥ 8x); ×4.52 lower p50 (target ≥ 4x): **met** in this run." in text

    # the same run with a slower MCP front: not met, and the sentence changes with the figures
    slower = {**figures, ("pipelined", "mcp"): [6900.0, 7000.0, 7100.0]}
    sentence, met = mcp_target(_fake_report(slower, KEY_OF))
    assert met is False and "×7.00 the calls/s (target ≥ 8x)" in sentence and "**not met**" in sentence
    # a noisy figure decides nothing
    noisy = {**figures, ("latency", "mcp"): [100.0, 210.0, 400.0]}
    sentence, met = mcp_target(_fake_report(noisy, KEY_OF))
    assert met is None and "lower p50: too noisy to say, ×2.25–10.0" in sentence and "**not decided**" in sentence
    # noisy but clear: even the slowest MCP repetition against the fastest SDK one is ≥ 8x
    clear = {**figures, ("pipelined", "mcp"): [9000.0, 10000.0, 15000.0]}
    sentence, met = mcp_target(_fake_report(clear, KEY_OF))
    assert met is True and "×8.18–16.7 the calls/s, noisy (target ≥ 8x)" in sentence
    clear_loss = {**figures, ("spawn", "v1"): [2.0, 3.0, 6.0]}
    assert "`true`, request to final event, p50: `v1` against `no-server` (×0.13–0.45)" in "\n".join(
        summary_lines(_fake_report(clear_loss, KEY_OF)))
    # ours failed where a peer has a figure: the peer's figure stands, the ratio is n/a
    failed = _fake_report({**figures, ("seq", "mcp-sdk"): [30.0, 31.0, 32.0]}, KEY_OF)
    failed.samples[("seq", "mcp")] = []
    seq = next(line for line in summary_lines(failed) if line.startswith("| MCP: `seq"))
    assert seq.split(" | ")[1:] == ["failed (`mcp`)", "31.0", "—", "failed", "n/a", "—", "n/a |"]
    # starts are many and short: one slowed by another process's load does not make the figure noisy
    spiky = _fake_report(figures, KEY_OF)
    spiky.start = _starts({"mcp": [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0, 400.0],
                           "mcp-sdk": [450.0, 460.0, 470.0]})
    assert "| start → first answer (`serve --mcp`: `initialize`), ms ↓ | 104 (`mcp`) | 460 | — | — | ×4.42 | — | — |" \
        in summary_lines(spiky)
    # no rival ahead, nothing below a floor: said so; without start figures, no start rows
    winning = {k: v for k, v in figures.items() if "floor" not in k and k[0] != "spawn"}
    lines = summary_lines(_fake_report(winning, KEY_OF))
    assert "- **Where it loses** (a rival beats smith-fast): nowhere against `mcp-sdk` in this run." in lines
    assert "- **Below the floor** (a reference does the job faster, checking nothing): nowhere in this run." in lines
    assert not [line for line in lines if line.startswith("| start")]


def test_the_floor_and_the_no_server_reference_answer_like_the_others(tmp_path: pathlib.Path) -> None:
    """The floor is a real stdlib loop on stdio, the no-server reference real posix_spawn: both held
    to the tracker's checks (a failed read or command is an error, not a figure)."""
    from bench.report.contenders import CONTENDERS as ALL
    from bench.report.drivers import ProtocolFailure, Tracker
    from bench.report.wire import shell_exec_command, tool_call_command

    (tmp_path / "small.txt").write_text("hello\n")
    floor: Contender = next(c for c in ALL if c.name == "floor")
    server = floor.server(tmp_path, tmp_path)
    server.launch()
    server.wait_ready(10)
    try:
        client = floor.client(server)
        rids = [f"r{i}" for i in range(50)]
        units = client.encode([tool_call_command(r, "fs.read", b'{"path":"small.txt"}') for r in rids])
        tracker = Tracker(rids)
        assert client.pipeline(units, tracker, 8) > 0
        assert (tracker.left, tracker.results) == (0, 50)
        assert len(client.round_trips(units[0], rids[0], 3)) == 3
        bad = client.encode([tool_call_command("bad", "fs.read", b'{"path":"missing.txt"}')])
        with pytest.raises(ProtocolFailure, match="tool failed"):
            client.pipeline(bad, Tracker(["bad"]), 1)
    finally:
        server.stop()

    spawn = next(c for c in ALL if c.name == "no-server").client(next(c for c in ALL if c.name == "no-server").server(tmp_path, tmp_path))
    units = spawn.encode([shell_exec_command("s1", "printf 'abc'; printf 'de' >&2; yes | head -c 100000 >/dev/null")])
    tracker = Tracker((), ("s1",))
    spawn.pipeline(units, tracker, 1)
    assert (tracker.left, tracker.output) == (0, 5)  # yes got SIGPIPE quietly, as a server's child would
    with pytest.raises(ProtocolFailure, match="exit code 3"):
        spawn.pipeline(spawn.encode([shell_exec_command("s2", "exit 3")]), Tracker((), ("s2",)), 1)


def _bench_leftovers(prefix: str = "smith-fast-bench-ws-") -> tuple[set[str], set[int]]:
    """A benchmark's scratch directories under /var/tmp (named ``prefix``...: the workspaces
    benchmark's by default), and the processes whose command line names one (its services)."""
    dirs = {p.name for p in pathlib.Path("/var/tmp").glob(f"{prefix}*")}
    procs = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if prefix.encode() in (entry / "cmdline").read_bytes():
                    procs.add(int(entry.name))
            except OSError:
                continue
    return dirs, procs


@pytest.mark.timeout(300)
def test_the_workspaces_section_is_measured_and_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    # `--only workspaces` at smoke scale: bench/bench_workspaces.py's quick run, real services with
    # workspaces, its 200 MB template generated once under /var/tmp (cached for the next runs)
    dirs_before, procs_before = _bench_leftovers()
    proc = subprocess.run([sys.executable, "-m", "bench.report", "--smoke", "--only", "workspaces", "--no-charts", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=290)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs_after, procs_after = _bench_leftovers()
    assert dirs_after <= dirs_before, "its workspace directories outlived it"
    assert procs_after <= procs_before, "its services outlived it"

    data = json.loads((tmp_path / "report.json").read_text())["workspaces"]
    assert data["templates"]["big"]["files"] == 10_000 and data["templates"]["big"]["bytes"] == 200_000_000
    start = data["session_start"]
    assert set(start) >= {"workspaces", "workspaces, no warm pool", "plain", "spaced", "copy"}
    assert start["copy"]["p50_ms"] > 0 and start["met"] in (True, False)
    for what in ("checkpoint", "fork"):
        assert data["checkpoint_fork"][what]["big"]["p50_ms"] > 0 and data["checkpoint_fork"][what]["small"]["p50_ms"] > 0
    many = data["many_sessions"]
    assert many["alive_at_end"] == many["sessions"] == 100
    assert many["overlay_mounts"]["after"] - many["overlay_mounts"]["before"] >= 100  # a workspace each, all mounted at once
    assert many["rss_kib"]["after"] > many["rss_kib"]["before"] > 0
    assert len(data["changes"]["changes"]["all_ms"]) == len(data["changes"]["no changes"]["all_ms"]) == data["changes"]["reps"]

    markdown = (tmp_path / "report.md").read_text()
    section = markdown[markdown.index("## Workspaces: a copy-on-write workspace per session"):]
    section = section[:section.index("\n## ", 1)]
    rows = [row[0] for row in _table(section, "Session start")[1:]]
    assert rows == ["`workspaces`", "`workspaces, no warm pool`", "`plain`", "`workspaces`, 50 ms apart",
                    "`workspaces, no warm pool`, 50 ms apart", "`plain`, 50 ms apart",
                    "`workspaces`, each session running a command", "`workspaces, no warm pool`, each session running a command",
                    "`plain`, each session running a command", "`cp -a` of the template (p50 of 2)"]
    verdicts = re.findall(r"\*\*(met|not met)\*\*", section)
    assert len(verdicts) == 5  # start ratio, cp -a, checkpoint, fork, changes
    assert "100 sessions alive at once" in section and ("kernel side (kernel memory + tmpfs pages)" in section or "kernel side n/a" in section)


def _egress(on: list[tuple[float, float]], allow: list[tuple[float, float]]) -> dict[str, object]:
    """``report.egress`` as ``bench.bench_egress_download`` writes it, from made-up rounds (seconds, curl's bytes/s)."""
    from bench.bench_egress_download import figures

    return {"scale": "quick", "warmups": 1, "wall_s": 2.0, "load_average": {"start": [0.5, 0.6, 0.7], "end": [0.8, 0.6, 0.7]},
            **figures({"on": on, "allow": allow})}


def test_the_egress_section_states_the_ratio_against_the_target() -> None:
    from bench.report.egress import markdown
    from bench.report.render import to_json, to_markdown

    mb = 100 << 20
    report = _fake_report({}, KEY_OF)
    assert markdown(report) == []  # not measured: no section
    # the rounds' ratios, not the medians' ratio: allow's time over on's, round by round (0.9, 0.85, 0.5)
    report.egress = _egress([(0.10, 1.6e9), (0.10, 1.6e9), (0.10, 1.6e9)], [(0.1 / 0.9, 1.5e9), (0.1 / 0.85, 1.4e9), (0.2, 0.8e9)])
    assert report.egress["ratio"] == {"request": 0.85, "curl": 0.875} and report.egress["met"] is True
    section = markdown(report)
    assert section[0] == "## Egress: a 100 MB download through the proxy"
    rows = _table("\n".join(section), "## Egress")
    assert rows == [["service", "request MB/s ↑", "curl's transfer MB/s ↑"],
                    ["`--network on` (straight out)", f"{mb / 0.1 / 1e6:,.0f}", "1,600"],
                    ["`--network allow` (through the egress proxy)", f"{mb / (0.1 / 0.85) / 1e6:,.0f}", "1,400"]]
    assert "`allow` / `on`: request ×0.85, curl's transfer ×0.88 (target ≥ 0.8x, both): **met**." in section[-2]
    assert "(quick scale, 3 rounds after 1 warm-up, 2.0 s)" in section[2]
    assert "## Egress: a 100 MB download through the proxy" in to_markdown(report, "python -m bench.report", [])
    assert json.loads(to_json(report))["egress"]["ratio"] == {"request": 0.85, "curl": 0.875}

    # one of the two ratios under the target is enough to miss it
    report.egress = _egress([(0.1, 1.6e9)], [(0.1 / 0.95, 1.2e9)])
    assert report.egress["met"] is False
    assert "request ×0.95, curl's transfer ×0.75 (target ≥ 0.8x, both): **not met**." in markdown(report)[-2]

    report.egress, report.egress_failure = None, "RuntimeError: --network allow: curl exited 7: Failed to connect"
    assert markdown(report)[2] == "Not measured: `RuntimeError: --network allow: curl exited 7: Failed to connect`."
    assert json.loads(to_json(report))["egress"] == {"failure": report.egress_failure}


@pytest.mark.timeout(180)
def test_the_egress_section_is_measured_and_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    # `--only egress` at smoke scale: bench/bench_egress_download.py's quick run, two real services
    # (--network on and allow), real curl, a real python3 -m http.server
    dirs_before, procs_before = _bench_leftovers("bench-egress-")
    proc = subprocess.run([sys.executable, "-m", "bench.report", "--smoke", "--only", "egress", "--no-charts", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs_after, procs_after = _bench_leftovers("bench-egress-")
    assert dirs_after <= dirs_before, "its scratch directories outlived it"
    assert procs_after <= procs_before, "its services or its HTTP server outlived it"

    data = json.loads((tmp_path / "report.json").read_text())["egress"]
    assert data["scale"] == "quick" and data["rounds"] == 7 and data["bytes"] == 100 << 20
    for network in ("on", "allow"):
        got = data["networks"][network]
        assert len(got["request_s"]) == len(got["curl_mb_s_all"]) == 7
        assert got["request_mb_s"] > 0 and got["curl_mb_s"] > 0
    assert data["target"] == 0.8 and data["met"] is (min(data["ratio"].values()) >= 0.8)
    assert len(data["load_average"]["start"]) == len(data["load_average"]["end"]) == 3

    markdown = (tmp_path / "report.md").read_text()
    section = markdown[markdown.index("## Egress: a 100 MB download through the proxy"):]
    section = section[:section.index("\n## ", 1)]
    assert [row[0] for row in _table(section, "## Egress")[1:]] == ["`--network on` (straight out)",
                                                                    "`--network allow` (through the egress proxy)"]
    assert len(re.findall(r"\(target ≥ 0\.8x, both\): \*\*(met|not met)\*\*", section)) == 1
    assert "bench.report: egress: " in proc.stderr  # the figures told as they came
