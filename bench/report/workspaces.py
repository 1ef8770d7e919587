"""The report's workspaces section: ``bench/bench_workspaces.py`` run inside ``make bench``, its figures
in ``report.json`` (``workspaces``) and a section of ``report.md``.

It has services of its own (``serve --workspaces`` against a plain ``serve``), not contenders, so it
runs after the contenders' cases, once, at the report's scale (``full`` or ``quick``; ``--smoke`` runs
it only when ``--only workspaces`` asks for it, at the quick size).
"""

from __future__ import annotations

from typing import Any

from . import section
from .render import fmt
from .runner import Report

__all__ = ["GROUP", "markdown", "run", "wanted"]

GROUP = "workspaces"


_MEASURED = section.Measured(GROUP, "bench.bench_workspaces")
wanted = _MEASURED.wanted  # whether this run measures it
run = _MEASURED.run  # measure it into report.workspaces (report.workspaces_failure: why not)


def _verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def _row(name: str, figures: dict[str, Any]) -> str:
    return f"| {name} | {fmt(figures['p50_ms'])} | {fmt(figures['p90_ms'])} |"


def markdown(report: Report) -> list[str]:
    """The section (empty when the run did not measure it)."""
    out, r = section.opening(report, GROUP, "Workspaces: a copy-on-write workspace per session")
    if r is None:
        return out
    t = r["templates"]["big"]
    out += [f"`python -m bench.bench_workspaces` ({r['scale']} scale, {r['wall_s']} s): `smith-fast serve --workspaces` with "
            f"a template of {t['files']:,} files / {t['bytes'] / 1e6:.0f} MB (mostly small files, a few big), on this machine, "
            "the SDK client (`smith_fast.client.Client`) on Unix sockets. Ratios are within this run.", ""]
    st = r["session_start"]
    out += [f"Session start, `Client.connect` + handshake to Ready, a fresh connection each ({st['starts']} per service, "
            "interleaved); `cp -a` of the template for scale:", "", "| service | p50 ms ↓ | p90 ms ↓ |", "|---|--:|--:|"]
    for n in [k for k in st if isinstance(st[k], dict) and "p90_ms" in st[k]]:
        out.append(_row(f"`{n}`", st[n]))
    sp = st["spaced"]
    for n in [k for k in sp if isinstance(sp[k], dict)]:
        out.append(_row(f"`{n}`, {sp['spacing_ms']:g} ms apart", sp[n]))
    us = st.get("used", {})  # runs from before it was measured have none
    for n in [k for k in us if isinstance(us[k], dict)]:
        out.append(_row(f"`{n}`, each session running a command", us[n]))
    cp = st["copy"]
    out += [f"| `cp -a` of the template (p50 of {cp['runs']}) | {fmt(cp['p50_ms'])} | — |", "",
            f"`{st['ratio_of']}`: ×{st['ratio']:.2f} the p50 (target ≤ {st['target']:g}x): {_verdict(st['met'])}. "
            f"`cp -a` / `{st['ratio_of'].split(' / ')[0]}`: ×{st['copy_ratio']:,.0f} (target ≥ {st['copy_target']:g}x): "
            f"{_verdict(st['copy_met'])}. The starts {sp['spacing_ms']:g} ms apart ({sp['starts']} per service; the service quiet "
            f"at each: the last session's workspace unmounted, the warm pool refilled): ×{sp['ratio']:.2f}."
            + (f" These sessions close without a request, so their workspaces go back to the warm pool as they are; each session "
               f"running `{us['command']}` before it closes (not timed; its workspace unmounted and the pool refilled beside the "
               f"next starts): ×{us['ratio']:.2f}." if us else ""), ""]
    cf = r["checkpoint_fork"]
    out += [f"Checkpoint (`client.checkpoint()` round trip) and fork (connect + handshake with `fork=ID` to Ready), the same "
            f"small change written before each, {cf['reps']} of each per template, interleaved:", "",
            f"| | {cf['templates']['big']} p50 ms ↓ | {cf['templates']['small']} p50 ms ↓ | ratio | target |", "|---|--:|--:|--:|---|"]
    for what in ("checkpoint", "fork"):
        x = cf[what]
        out.append(f"| {what} | {fmt(x['big']['p50_ms'])} | {fmt(x['small']['p50_ms'])} | ×{x['ratio']:.2f} | "
                   f"≤ {cf['target']:g}x: {_verdict(x['met'])} |")
    out.append("")
    m = r["many_sessions"]
    out += [f"{m['sessions']} sessions alive at once, each with its own workspace, each running `echo $i > f; cat f` and "
            f"checking its output, opened {m['concurrency']} at a time: all of them in {m['open_wall_s']:.1f} s "
            f"({m['alive_at_end']} still answering at the end). Idle, per session: the service's RSS "
            f"{m['rss_kib_per_session']:.0f} KiB (`VmRSS` {m['rss_kib']['before'] / 1024:.0f} → {m['rss_kib']['after'] / 1024:.0f} MiB)"]
    if "kernel_kib_per_session" in m:
        parts = ", ".join(f"{k} {v:.0f}" for k, v in m["cgroup_kib_per_session"].items())
        out[-1] += (f"; kernel side (kernel memory + tmpfs pages) {m['kernel_kib_per_session']:.0f} KiB, from the service's "
                    f"memory cgroup ({m['memory_cgroup']}; KiB per session: {parts}).")
    else:
        out[-1] += f"; kernel side n/a ({m['memory_cgroup']})."
    fd = m["fds"]
    out[-1] += (f" File descriptors of the service: {fd['per_session']:.1f} per idle session ({fd['before']} → {fd['after']}; "
                f"its soft limit {fd['soft_limit']}, inherited: it does not raise its own).")
    out.append("")
    c = r["changes"]
    out += [f"What a request changed: `{c['command']}` in the {c['template']} template, a session that accepted `changes` "
            f"and one that did not (same service, interleaved, {c['reps']} runs each), request to final event:", "",
            "| session | p50 ms ↓ | p90 ms ↓ |", "|---|--:|--:|", _row("`changes`", c["changes"]), _row("no `changes`", c["no changes"]),
            "", f"`{c['ratio_of']}`: ×{c['ratio']:.2f} the p50 (target ≤ {c['target']:g}x): {_verdict(c['met'])}. "
            f"The first {c['quarter']} runs' p50 against the last {c['quarter']}'s: `changes` {fmt(c['changes']['early_p50_ms'])} → "
            f"{fmt(c['changes']['late_p50_ms'])} ms, no `changes` {fmt(c['no changes']['early_p50_ms'])} → "
            f"{fmt(c['no changes']['late_p50_ms'])} ms."
            + (f" The same runs {c['spaced']['spacing_ms']:g} ms apart (a recorded run's layer is frozen once it ended, on the loop: "
               f"back to back that lands in the next run, whichever session's): `changes` {fmt(c['spaced']['changes']['p50_ms'])} ms, "
               f"no `changes` {fmt(c['spaced']['no changes']['p50_ms'])} ms, ×{c['spaced']['ratio']:.2f}." if "spaced" in c else ""), ""]
    if "commands" in r:  # reports made before it have no such figure
        k = r["commands"]
        names = [n for n in k if isinstance(k[n], dict)]
        out += [f"Commands in a session: `{k['command']}` one after another, one session of each service, {k['rounds']} interleaved "
                f"blocks of {k['block']}: " + ", ".join(f"`{n}` {k[n]['per_s']:,.0f}/s" for n in names)
                + f"; `{k['ratio_of']}` ×{k['ratio']:.2f} (a workspace session's commands are forked in its sandbox built once, "
                "as a plain session's are).", ""]
    return out
