"""``python -m bench.report``: run the end-to-end report and write it (Markdown, JSON, PNG charts).

Run it from the repository root, in the venv ``make install`` builds (``make bench``,
``make bench-quick``).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

from . import egress as egress_section
from . import meta as meta_mod
from . import nats as nats_section
from . import start as start_section
from . import workspaces as workspaces_section
from .contenders import CONTENDERS
from .render import to_json, to_markdown
from .runner import Report
from .runner import run as run_report
from .workloads import SCALES

PROG = "python -m bench.report"
_DEFAULT_OUT = {"full": "bench/results", "quick": "build/bench-quick", "smoke": "build/bench-smoke"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Start one real `smith-fast serve` per contender (v1 Cython/pure Python, uvloop/asyncio, "
        "v0 JSONL with json/orjson, gRPC single/batched, the MCP front on stdio), the official MCP SDK's "
        "server and the references (a bare stdlib loop, commands with no server), drive the same workloads "
        "through each, and write report.md (opening with a generated summary), report.json and PNG charts. "
        "The full run takes several minutes on 2 cores.",
        epilog=f"examples:\n  {PROG} --out bench/results\n  {PROG} --quick --only latency,bulk --no-charts",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="scale", action="store_const", const="quick", help="smaller workloads, 3 longer repetitions (a few minutes)")
    size.add_argument("--smoke", dest="scale", action="store_const", const="smoke", help="tiny workloads: checks the machinery, measures nothing")
    p.set_defaults(scale="full")
    p.add_argument("--out", type=pathlib.Path, help="output directory (default bench/results; build/bench-quick or build/bench-smoke for --quick/--smoke)")
    p.add_argument("--contenders", help="comma list of contenders to run (default all)")
    p.add_argument("--only", help="comma list of workloads (keys or groups: mixed, lines, bulk, seq, spawn, latency, pipelined, sessions, "
                   "size, chunk, nats, workspaces, start, egress)")
    p.add_argument("--no-nats", action="store_true", help="skip the NATS scale-out section (bench/bench_nats.py: serve against a "
                   "gateway and 1, 2, 4 workers; needs nats-server)")
    p.add_argument("--no-workspaces", action="store_true", help="skip the workspaces section (bench/bench_workspaces.py: serve "
                   "--workspaces against a plain serve; generates its templates under /var/tmp once)")
    p.add_argument("--no-start", action="store_true", help="skip the start-up section (bench/bench_start.py: each stdio server "
                   "spawned afresh until its first answer)")
    p.add_argument("--no-egress", action="store_true", help="skip the egress section (bench/bench_egress_download.py: a 100 MB "
                   "download through serve --network allow's proxy against --network on)")
    p.add_argument("--reps", type=int, help="measured repetitions per workload (default 5 full, 3 quick)")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts (no matplotlib needed)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the report with parsed ``args``; the exit status (1 when a contender failed somewhere)."""
    scale = SCALES[args.scale]
    if args.reps:
        scale = dataclasses.replace(scale, reps=args.reps)
    contenders = list(CONTENDERS)
    if args.contenders:
        wanted = [n.strip() for n in args.contenders.split(",") if n.strip()]
        unknown = set(wanted) - {c.name for c in CONTENDERS}
        if unknown:
            print(f"{PROG}: unknown contenders {sorted(unknown)}; known: {[c.name for c in CONTENDERS]}", file=sys.stderr)
            return 2
        contenders = [c for c in CONTENDERS if c.name in wanted]
    only = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    out = args.out or pathlib.Path(_DEFAULT_OUT[args.scale])
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_charts:
        from .charts import MissingMatplotlib, _pyplot

        try:
            _pyplot()  # fail now, not after minutes of measuring
        except MissingMatplotlib as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2

    facts = meta_mod.collect()
    load_before = meta_mod.load_average()
    started = time.perf_counter()
    report = run_report(scale, contenders, only=only)
    if nats_section.wanted(args.scale, only, args.no_nats):
        nats_section.run(report, args.scale)
    if workspaces_section.wanted(args.scale, only, args.no_workspaces):
        workspaces_section.run(report, args.scale)
    if egress_section.wanted(args.scale, only, args.no_egress):
        egress_section.run(report, args.scale)
    if start_section.wanted(args.scale, only, args.no_start):
        start_section.run(report, args.scale)
    wall = time.perf_counter() - started
    report.meta = {
        **facts,
        "wall time": f"{wall:.0f} s",
        "load average (1/5/15 min)": f"{load_before} at the start, {meta_mod.load_average()} at the end "
        "(the machine is shared: other work ran beside this one)",
        "scale": f"{scale.name}: {scale.reps} measured repetitions after {scale.warmups} warm-up",
    }
    command = PROG + {"full": "", "quick": " --quick", "smoke": " --smoke"}[args.scale]
    charts: list[str] = []
    if not args.no_charts and report.cases:  # `--only nats` / `workspaces` / `egress`: no contender figures to chart
        from .charts import draw

        charts = draw(report, out)
    (out / "report.md").write_text(to_markdown(report, command, charts))
    (out / "report.json").write_text(to_json(report))
    _print_headline(report)
    print(f"\nwrote {out / 'report.md'}, report.json{''.join(', ' + c for c in charts)} in {wall:.0f} s")
    failed = report.nats_failure or report.workspaces_failure or report.start_failure or report.egress_failure
    return 1 if report.failures or failed else 0


def _print_headline(report: Report) -> None:
    text = to_markdown(report, "", [])
    start = text.index("## Headline")
    end = text.index("### Server CPU")
    print(text[start:end].rstrip())


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
