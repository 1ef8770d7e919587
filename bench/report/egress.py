"""The report's egress section: ``bench/bench_egress_download.py`` run inside ``make bench``, a 100 MB
download through ``--network allow``'s proxy against ``--network on``, its figures in ``report.json``
(``egress``) and a section of ``report.md`` with the target's verdict (>= 0.8x, in the same run).

It has services of its own (two real ``serve``, an HTTP server), not contenders, so it runs after the
contenders' cases, once, at the report's scale (``full`` or ``quick``; ``--smoke`` runs it only when
``--only egress`` asks for it, at the quick size).
"""

from __future__ import annotations


from . import section
from .render import fmt
from .runner import Report

__all__ = ["GROUP", "markdown", "run", "wanted"]

GROUP = "egress"
_NETWORKS = {"on": "`--network on` (straight out)", "allow": "`--network allow` (through the egress proxy)"}


_MEASURED = section.Measured(GROUP, "bench.bench_egress_download")
wanted = _MEASURED.wanted  # whether this run measures it
run = _MEASURED.run  # measure it into report.egress (report.egress_failure: why not)


def markdown(report: Report) -> list[str]:
    """The section (empty when the run did not measure it)."""
    out, r = section.opening(report, GROUP, "Egress: a 100 MB download through the proxy")
    if r is None:
        return out
    size = f"{r['bytes'] >> 20} MB"
    out += [f"`python -m bench.bench_egress_download` ({r['scale']} scale, {r['rounds']} rounds after {r['warmups']} warm-up, "
            f"{r['wall_s']} s): `curl` of a {size} file from a `python3 -m http.server` on the host's loopback, as a ShellExec "
            "of two real `smith-fast serve` (the SDK client on Unix sockets), one download through each per round, the order "
            "rotating: `--network on`, and `--network allow` reaching the server by name (`--egress-allow blob.test`, "
            "`--egress-resolve blob.test=127.0.0.1`) through the service's egress proxy. *Request*: the file's size over the "
            "time from the ShellExec to its final event (the command's start included); *curl's transfer*: curl's own "
            "`speed_download`. Medians of the rounds; the ratios are the medians of each round's ratio.", "",
            "| service | request MB/s ↑ | curl's transfer MB/s ↑ |", "|---|--:|--:|"]
    for network, figures in r["networks"].items():
        out.append(f"| {_NETWORKS.get(network, f'`{network}`')} | {fmt(figures['request_mb_s'])} | {fmt(figures['curl_mb_s'])} |")
    ratio, load = r["ratio"], r["load_average"]
    verdict = "**met**" if r["met"] else "**not met**"
    out += ["", f"`allow` / `on`: request ×{ratio['request']:.2f}, curl's transfer ×{ratio['curl']:.2f} (target ≥ {r['target']:g}x, "
            f"both): {verdict}. Load average {' '.join(map(str, load['start']))} at the start, "
            f"{' '.join(map(str, load['end']))} at the end.", ""]
    return out
