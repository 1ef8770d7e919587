"""The end-to-end benchmark report (``python -m bench.report``, bench/report/): its machinery, not
its figures.

``python -m bench.report --smoke`` runs every contender (one real ``smith-fast serve`` each, Unix socket
and gRPC, v1 and v0, compiled and pure-Python servers) through every workload at a tiny size, and
must write a Markdown report, the raw JSON and PNG charts that parse. No timing is asserted.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

from bench.report import stats
from bench.report.contenders import CONTENDERS
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
                          capture_output=True, text=True, cwd=ROOT, timeout=110)
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


@pytest.mark.timeout(120)
def test_smoke_run_writes_report_json_and_charts(smoke_report: tuple[pathlib.Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = smoke_report
    assert proc.returncode == 0, proc.stderr[-3000:]
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# smith-fast end-to-end benchmark report")
    assert "`python -m bench.report --smoke`" in markdown

    # the headline: one row per contender, every cell a number with its spread
    headline = _table(markdown, "## Headline")
    assert [row[0] for row in headline[1:]] == [f"`{c.name}`" for c in CONTENDERS]
    assert len(headline[0]) == 8  # contender + mixed, lines, bulk, p50, p99, pipelined, sessions
    for row in headline[1:]:
        assert len(row) == len(headline[0])
        for cell in row[1:]:
            assert re.fullmatch(r"[\d,.]+ ±\d+%", cell), (row[0], cell)

    # ratios: each baseline against itself is exactly 1
    ratios = _table(markdown, "### Speed-up against")
    by_name = {row[0]: row[1:] for row in ratios[1:]}
    assert all(cell.split(" / ")[0] == "×1.00" for cell in by_name["`v0-json`"])
    assert all(cell.split(" / ")[1] == "×1.00" for cell in by_name["`v0-orjson`"])

    # every server ran the configuration its contender claims
    contenders = {row[0]: row for row in _table(markdown, "## Contenders")[1:]}
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
    assert set(got) == {(case.key, c.name) for case in cases(scale) for c in CONTENDERS}
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
