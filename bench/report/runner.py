"""Runs every case against every contender and collects the figures.

Order, for fairness on a shared machine: the contenders' servers all run side by side (idle ones
cost nothing), and a case runs its repetitions round-robin, the contenders' order rotating from one
repetition to the next, so a burst of load from elsewhere falls on all of them alike. The first
``warmups`` repetitions of each case are run and thrown away (the server's caches, the allocator
and the client's lazily built objects warm up there). Server CPU comes from ``/proc`` around each
repetition. A contender that fails a case is reported as failed there; the run goes on. A
contender runs only the cases of the groups it answers (the MCP servers and the references answer a
few); the others are not run, and shown as "—".
"""

from __future__ import annotations

import gc
import os
import pathlib
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contenders import Client, Contender, Endpoint
from .drivers import cpu_seconds_of
from .stats import Summary, summarize
from .workloads import Case, Scale, cases, make_workspace

__all__ = ["Report", "run"]

Figures = dict[str, float]


@dataclass
class Report:
    """Everything one run measured, and what it ran on.

    Attributes:
        scale: the scale it ran at.
        contenders: the contenders, in report order.
        cases: the cases, in run order.
        samples: ``(case key, contender name) -> [figures of each measured repetition]``.
        failures: ``(case key, contender name) -> what went wrong``.
        service_info: ``contender name -> the Ready.service_info of its server``.
        meta: machine, versions, load, times (filled by ``bench.report.meta``).
        nats: the NATS scale-out figures (``bench.report.nats``), None when not measured.
        nats_failure: why they are missing, when that run failed.
        workspaces: the workspaces figures (``bench.report.workspaces``), None when not measured.
        workspaces_failure: why they are missing, when that run failed.
        start: the start-up figures (``bench.report.start``), None when not measured.
        start_failure: why they are missing, when that run failed.
        egress: the egress download figures (``bench.report.egress``), None when not measured.
        egress_failure: why they are missing, when that run failed.
    """

    scale: Scale
    contenders: list[Contender]
    cases: list[Case]
    samples: dict[tuple[str, str], list[Figures]] = field(default_factory=dict)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)
    service_info: dict[str, dict[str, str]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    nats: dict[str, Any] | None = None
    nats_failure: str | None = None
    workspaces: dict[str, Any] | None = None
    workspaces_failure: str | None = None
    start: dict[str, Any] | None = None
    start_failure: str | None = None
    egress: dict[str, Any] | None = None
    egress_failure: str | None = None

    def summary(self, case: str, contender: str, key: str) -> Summary | None:
        """The summary of figure ``key`` of ``case`` for ``contender``; None when not measured."""
        values = [s[key] for s in self.samples.get((case, contender), []) if key in s]
        return summarize(values) if values else None

    def case(self, key: str) -> Case | None:
        return next((c for c in self.cases if c.key == key), None)

    def applies(self, case: str, contender: str) -> bool:
        """Whether ``contender`` runs ``case`` (False: not measured by design, shown as "—")."""
        found, who = self.case(case), next((c for c in self.contenders if c.name == contender), None)
        return found is not None and who is not None and who.answers(found.group)


class _ServerSet:
    """One server and one client per contender, for one set of extra ``serve`` arguments."""

    def __init__(self, contenders: Sequence[Contender], workdir: pathlib.Path, root: pathlib.Path,
                 extra: Sequence[str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.servers: dict[str, Endpoint] = {c.name: c.server(workdir, root, extra) for c in contenders}
        for server in self.servers.values():
            server.launch()  # all at once, then wait for each
        self.clients: dict[str, Client] = {}
        try:
            for server in self.servers.values():
                server.wait_ready(60.0)
        except BaseException:
            self.stop()
            raise

    def client(self, contender: Contender) -> Client:
        if contender.name not in self.clients:
            self.clients[contender.name] = contender.client(self.servers[contender.name])
        return self.clients[contender.name]

    def drop_client(self, name: str) -> None:
        client = self.clients.pop(name, None)
        if client is not None:
            try:
                client.close()
            except Exception:  # a broken connection is what got it dropped
                pass

    def stop(self) -> None:
        for name in list(self.clients):
            self.drop_client(name)
        for server in self.servers.values():
            server.stop()


def run(scale: Scale, contenders: Sequence[Contender], progress: Callable[[str], None] | None = None,
        only: Sequence[str] = ()) -> Report:
    """Measure every case of ``scale`` (or those whose key or group is in ``only``) for ``contenders``.

    Args:
        scale: the workload sizes and repetitions.
        contenders: who runs.
        progress: called with a line of text after each case.
        only: case keys or groups to run (all when empty).

    Returns:
        The :class:`Report` (its ``meta`` not filled in yet).

    Raises:
        harness.server.ServerStartError: a server did not start.
        RuntimeError: a server does not run the configuration its contender claims.
    """
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    selected = [c for c in cases(scale) if not only or c.key in only or c.group in only]
    report = Report(scale, list(contenders), selected)
    with tempfile.TemporaryDirectory(prefix="smith-fast-bench-") as tmp:
        root = pathlib.Path(tmp) / "root"
        make_workspace(root, scale)
        sets: dict[tuple[str, ...], _ServerSet] = {}
        try:
            for index, case in enumerate(selected, 1):
                key = tuple(case.server_args)
                for other in [k for k in sets if k and k != key]:  # ladders' own servers: one set at a time
                    sets.pop(other).stop()
                if key not in sets:
                    # only those that answer a case of this set get a server in it
                    needed = [c for c in contenders
                              if any(c.answers(k.group) for k in selected if tuple(k.server_args) == key)]
                    sets[key] = _ServerSet(needed, pathlib.Path(tmp) / f"set{len(sets)}-{index}", root, key)
                    for c in needed:
                        report.service_info.setdefault(c.name, c.check(sets[key].servers[c.name]))
                # Objects alive now (modules, servers' bookkeeping, clients) are never garbage: frozen
                # out of the collector, so the full collection before each repetition stays cheap.
                gc.collect()
                gc.freeze()
                started = time.perf_counter()
                _run_case(report, case, sets[key], root)
                say(_progress_line(report, case, index, len(selected), time.perf_counter() - started))
        finally:
            for s in sets.values():
                s.stop()
    return report


def _run_case(report: Report, case: Case, servers: _ServerSet, root: pathlib.Path) -> None:
    scale = report.scale
    reps: dict[str, Callable[[], Figures]] = {}
    for contender in report.contenders:
        if not contender.answers(case.group):
            continue
        try:
            reps[contender.name] = case.prepare(servers.client(contender), root)
        except Exception as exc:
            _fail(report, case, contender, servers, exc)
    names = [c.name for c in report.contenders if c.answers(case.group)]
    cpu_key, cpu_scale = case.cpu
    for r in range(scale.warmups + scale.reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            rep = reps.get(name)
            if rep is None:
                continue
            pid = servers.servers[name].pid
            gc.collect()
            try:
                cpu = cpu_seconds_of(pid)
                figures = rep()
                cpu = cpu_seconds_of(pid) - cpu
            except Exception as exc:
                _fail(report, case, next(c for c in report.contenders if c.name == name), servers, exc)
                del reps[name]
                continue
            figures[cpu_key] = cpu * cpu_scale / figures.pop("_work")
            if r >= scale.warmups:
                report.samples.setdefault((case.key, name), []).append(figures)


def _fail(report: Report, case: Case, contender: Contender, servers: _ServerSet, exc: BaseException) -> None:
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    report.failures[(case.key, contender.name)] = detail[:300]
    print(f"bench.report: {case.key} / {contender.name} failed: {detail}", file=sys.stderr)
    if os.environ.get("SMITH_FAST_BENCH_TRACEBACK"):
        traceback.print_exception(exc)
    servers.drop_client(contender.name)  # the next case gets a fresh connection


def _progress_line(report: Report, case: Case, index: int, total: int, seconds: float) -> str:
    metric = case.metrics[0]
    parts = []
    for c in report.contenders:
        if not c.answers(case.group):
            continue
        s = report.summary(case.key, c.name, metric.key)
        figure = "failed" if s is None else f"{s.median:,.0f}" if s.median >= 100 else f"{s.median:.3g}"
        parts.append(f"{c.name} {figure}")
    return f"[{index}/{total}] {case.key} ({metric.key}, {seconds:.1f} s): " + ", ".join(parts)
