"""PNG charts of a report (matplotlib, imported only here and only when charts are drawn).

* ``throughput.png``: one panel per headline figure, a bar per contender (median, with the
  repetitions' min–max as the error bar);
* ``ladders.png``: how the figures move with the ladders' parameter: ``fs.read`` result size,
  concurrent sessions, shell output chunk size (log scales, one line per contender).
"""

from __future__ import annotations

import math
import pathlib

from .render import headline_columns
from .runner import Report

__all__ = ["MissingMatplotlib", "draw"]


class MissingMatplotlib(RuntimeError):
    """matplotlib is not installed (it is in requirements-dev.txt)."""


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib
    except ImportError:
        raise MissingMatplotlib("charts need matplotlib: .venv/bin/pip install -r requirements-dev.txt (or --no-charts)") from None
    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _colors(report: Report) -> dict[str, str]:
    palette = ["#1f77b4", "#17becf", "#9467bd", "#2ca02c", "#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]
    return {c.name: palette[i % len(palette)] for i, c in enumerate(report.contenders)}


def _throughput(report: Report, path: pathlib.Path) -> None:
    plt = _pyplot()
    columns = headline_columns(report)
    colors = _colors(report)
    ncols = 4
    nrows = math.ceil(len(columns) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(15, 3.3 * nrows), squeeze=False)
    for ax, (case, metric, title) in zip(axes.flat, columns):
        names = [c.name for c in report.contenders if c.answers(case.group)]  # no empty rows for "—"
        medians, lows, highs = [], [], []
        for n in names:
            s = report.summary(case.key, n, metric.key)
            medians.append(s.median if s else 0.0)
            lows.append(s.median - s.low if s else 0.0)
            highs.append(s.high - s.median if s else 0.0)
        ypos = range(len(names))
        ax.barh(ypos, medians, xerr=[lows, highs], color=[colors[n] for n in names], capsize=2,
                error_kw={"elinewidth": 0.8})
        ax.set_yticks(list(ypos), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title + ("  (higher is better)" if metric.higher_is_better else "  (lower is better)"),
                     fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        right = max((m + h for m, h in zip(medians, highs)), default=0.0)
        for y, value, high in zip(ypos, medians, highs):
            if value:
                ax.text(value + high, y, f" {value:,.0f}" if value >= 100 else f" {value:.1f}", va="center", fontsize=7)
        ax.set_xlim(0, right * 1.22 or 1)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    fig.suptitle(f"smith-fast end to end: median of {report.scale.reps} runs, bars = min–max "
                 f"({report.meta.get('machine', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


_LADDERS = (
    ("size", "calls/s", "fs.read result size (bytes)", "pipelined fs.read calls/s"),
    ("size", "server CPU µs/call", "fs.read result size (bytes)", "server CPU µs per call (lower is better)"),
    ("sessions", "calls/s", "concurrent sessions", "calls/s over N sessions"),
    ("chunk", "MB/s", "ShellOutput chunk size (bytes)", "shell output MB/s"),
)


def _label(x: float, group: str) -> str:
    n = int(round(x))
    if group == "sessions":
        return str(n)
    return f"{n >> 10}K" if n >= 1024 else str(n)


def _ladders(report: Report, path: pathlib.Path) -> bool:
    panels = [p for p in _LADDERS if sum(c.group == p[0] for c in report.cases) > 1]
    if not panels:
        return False
    plt = _pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    colors = _colors(report)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (group, key, xlabel, title) in zip(axes.flat, panels):
        rungs = sorted((c for c in report.cases if c.group == group), key=lambda c: c.param)
        for contender in report.contenders:
            xs, ys, lo, hi = [], [], [], []
            for case in rungs:
                s = report.summary(case.key, contender.name, key)
                if s and s.median > 0:
                    xs.append(case.param)
                    ys.append(s.median)
                    lo.append(s.median - s.low)
                    hi.append(s.high - s.median)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", markersize=3, linewidth=1.2, capsize=2,
                            color=colors[contender.name], label=contender.name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        params = [c.param for c in rungs]
        ax.xaxis.set_major_locator(FixedLocator(params))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _, g=group: _label(x, g)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, which="both")
    axes.flat[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True


def draw(report: Report, out_dir: pathlib.Path) -> list[str]:
    """Write the charts into ``out_dir``; return their file names.

    Raises:
        MissingMatplotlib: matplotlib is not installed.
    """
    names = ["throughput.png"]
    _throughput(report, out_dir / "throughput.png")
    if _ladders(report, out_dir / "ladders.png"):
        names.append("ladders.png")
    return names
