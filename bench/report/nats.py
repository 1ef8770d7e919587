"""The report's NATS scale-out section: ``bench/bench_nats.py`` run inside ``make bench``, its figures
in ``report.json`` (``nats``) and a section of ``report.md``.

It has topologies of its own (``serve`` against ``gateway + N workers``), not contenders, so it runs
after the contenders' cases, once, at the report's scale (``full`` or ``quick``; ``--smoke`` runs
it only when ``--only nats`` asks for it, at the quick size).
"""

from __future__ import annotations

from typing import Any

from . import section
from .render import fmt
from .runner import Report

__all__ = ["GROUP", "markdown", "run", "wanted"]

GROUP = "nats"


_MEASURED = section.Measured(GROUP, "bench.bench_nats")
wanted = _MEASURED.wanted  # whether this run measures it
run = _MEASURED.run  # measure it into report.nats (report.nats_failure: why not)


def _verdict(met: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "**not decided** (no CPU confinement on this machine)"}[met]


def markdown(report: Report) -> list[str]:
    """The section (empty when the run did not measure it)."""
    out, r = section.opening(report, GROUP, "Scale-out over NATS: session placement")
    if r is None:
        return out
    out += [f"`python -m bench.bench_nats` ({r['scale']} scale, {r['wall_s']} s): a direct `smith-fast serve` and "
            "`smith-fast gateway` + `smith-fast worker`s over a real nats-server, on this machine, the SDK client "
            "(`smith_fast.client.Client`) on Unix sockets. Ratios are within this run.", ""]
    p = r["pipelined"]
    names = [k for k in p if isinstance(p[k], dict) and "calls_per_s" in p[k]]  # the topologies
    procs = list(dict.fromkeys(k for n in names for k in p[n]["cpu_us_per_call"]))
    out += [f"Pipelined `fs.read` of {p['file_bytes']} B, {p['window']} in flight on one session, {p['calls']:,} calls per "
            f"repetition, median of {p['reps']} (interleaved); CPU µs per call of each process (utime + stime):", ""]
    out.append("| topology | calls/s ↑ | " + " | ".join(f"{k} CPU µs/call ↓" for k in procs) + " |")
    out.append("|---|--:|" + "--:|" * len(procs))
    for n in names:
        cpu = p[n]["cpu_us_per_call"]
        rates = p[n]["calls_per_s"]
        out.append(f"| `{n}` | {fmt(p[n]['median'])} [{fmt(min(rates))} – {fmt(max(rates))}] | "
                   + " | ".join(fmt(cpu[k]) if k in cpu else "—" for k in procs) + " |")
    out += ["", f"`{p['ratio_of']}`: ×{p['ratio']:.3f} the calls/s (target ≥ {p['target']:g}x, and the gateway's CPU per call "
            f"at most `serve`'s): {_verdict(p['met'])}.", ""]
    c = p["ceiling"]
    out += [f"At the CPU each process spent per call (the client's included), {c['cpus']} CPU(s) can carry at most "
            f"{fmt(c['direct'])} calls/s through `serve` and {fmt(c['relayed'])} through the relay: a ceiling of ×{c['ratio']:.3f} "
            "for the ratio on this machine (all processes together use at most every CPU, each at most one).", ""]
    s = r["scaling"]
    q = s["quota"]
    counts = [k for k in s if k.isdigit()]
    base = s[counts[0]]["median"]
    whose = "its cell's: itself and its commands" if s.get("worker_cpu_source") == "cell" else "its own and its reaped children's"
    out += [f"Scaling: {s['sessions']} sessions, each running {s['commands_per_session']} CPU-bound command(s) one after another "
            f"(`{s['command']}`, {r['command_cpu_ms_unconfined']:.0f} ms of CPU unconfined), through one gateway, each "
            f"worker confined to {q['fraction']:g} CPU ({q['method']}), median of {s['reps']}:", ""]
    out += [f"| workers | commands/s ↑ | × 1 worker | CPU s per worker ({whose}) |", "|---|--:|--:|---|"]
    for k in counts:
        out.append(f"| {k} | {fmt(s[k]['median'])} | ×{s[k]['median'] / base:.2f} | {', '.join(f'{c:.2f}' for c in s[k]['worker_cpu_s'])} |")
    out += ["", f"`{s['ratio_of']}`: ×{s['ratio']:.2f} (target ≥ {s['target']:g}): {_verdict(s['met'])}.", ""]
    if q["method"] == "none":
        out += [f"**No CPU confinement**: {q['detail']}. The workers shared the machine's CPUs, so the ratio says little.", ""]
    else:
        out += [f"Confinement: {q['detail']}. Commands sampled while they ran: {q['commands_seen_inside']} in their worker's cell, "
                f"{q['commands_seen_outside']} outside.", ""]
    st = r["session_start"]
    out += [f"Session start, `Client.connect` to the handshake's Ready, a fresh connection each ({st['starts']} per topology, "
            "interleaved):", "", "| topology | p50 ms ↓ | p90 ms ↓ |", "|---|--:|--:|"]
    for n in [k for k in st if isinstance(st[k], dict)]:
        out.append(f"| `{n}` | {fmt(st[n]['p50_ms'])} | {fmt(st[n]['p90_ms'])} |")
    out += ["", f"`{st['ratio_of']}`: ×{st['ratio']:.2f} the p50 (target ≤ {st['target']:g}x): {_verdict(st['met'])}.", ""]
    return out
